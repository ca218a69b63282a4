"""The HTTP guard in front of the real Model Explorer server (servers/guard.py): DNS rebinding, cross-site and
same-site requests, files it was not started with, what it passes upstream, a foreign page in a real browser, and the
host rule."""

from __future__ import annotations

import contextlib
import html
import http.client
import http.server
import io
import json
import os
import threading
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, quote

import pytest

from orchestrator.servers.explorer import (
    PTE_ADAPTER,
    ExplorerHandle,
)
from orchestrator.servers.guard import FORBIDDEN, MAX_COMMAND_BYTES, LocalOnly, ServedFiles, host_allowed
from tests.plugins.analysis import BundleCase
from tests.plugins.explorer import REFUSED, guard_log

pytestmark = pytest.mark.slow  # lowers and runs real models (session fixtures)


PT2_ADAPTER = "builtin_pytorch_exportedprogram"  # upstream's adapter for .pt2: torch.export.load


def raw_request(
    port: int,
    path: str,
    *,
    host: str,
    origin: str | None = None,
    method: str = "GET",
    body: bytes | None = None,
    headers: dict[str, str] | None = None,
) -> tuple[int, bytes]:
    """One request to the server on 127.0.0.1 with exactly these Host and Origin headers, as a browser would send."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    sent = {"Host": host, **({"Origin": origin} if origin else {})}
    if body is not None:
        sent["Content-Type"] = "application/json"
    sent.update(headers or {})
    try:
        connection.request(method, path, body=body, headers=sent)
        response = connection.getresponse()
        return response.status, response.read()
    finally:
        connection.close()


def convert_command(model: Path, extension: str = PTE_ADAPTER, **fields: Any) -> dict[str, Any]:
    """What the UI POSTs to convert a model."""
    return {
        "cmdId": "convert", "extensionId": extension, "modelPath": str(model), "settings": {},
        "deleteAfterConversion": False, **fields,
    }  # fmt: skip


def poisoned_pt2(path: Path, marker: Path) -> Path:
    """A real exported program whose sample inputs are a pickle that creates `marker` when unpickled.

    torch.export.load tries weights_only first and falls back to a full unpickling: loading this file runs code,
    which is what a .pt2 a web page got the browser to download could do to a server that loads any path."""
    import torch

    class Touch:
        def __reduce__(self) -> tuple[Any, ...]:
            return (open, (str(marker), "w"))

    class AddOne(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x + 1

    clean = path.with_name(f"clean-{path.name}")
    torch.export.save(torch.export.export(AddOne(), (torch.ones(2),)), clean)
    payload = io.BytesIO()
    torch.save(Touch(), payload)
    with zipfile.ZipFile(clean) as source, zipfile.ZipFile(path, "w") as poisoned:
        for entry in source.infolist():
            data = source.read(entry)
            poisoned.writestr(entry, payload.getvalue() if entry.filename.endswith("sample_inputs/model.pt") else data)
    clean.unlink()
    return path


def test_a_rebinding_page_gets_403_and_no_file(server: ExplorerHandle, explored: BundleCase) -> None:
    overlay = (explored.path / "model_explorer" / "me_overlay_median_ms.json").resolve()
    secret = overlay.read_text()  # a file this server serves, so the refusals below are the Host/Origin guard's
    port = server.port
    read = f"/api/v1/read_text_file?path={overlay}"
    # The workstation's own names read it.
    for name in ("127.0.0.1", "localhost", "LOCALHOST", "[::1]"):
        status, body = raw_request(port, read, host=f"{name}:{port}")
        assert status == 200 and json.loads(body)["content"] == secret, (name, status, body)
    # A DNS-rebinding page sends its own host name; a loopback name with another port is not this server either.
    for host in (f"evil.example:{port}", "evil.example", f"127.0.0.1.evil.example:{port}", f"127.0.0.1:{port + 1}"):
        for path in (read, "/", "/check_health"):
            status, body = raw_request(port, path, host=host)
            assert status == 403 and body == FORBIDDEN, (host, path, status)
    # Another site's page (an Origin that is not this server's) gets no API answer; the page's own origin does.
    for origin in ("http://evil.example", f"http://evil.example:{port}", "null", f"https://127.0.0.1:{port}"):
        status, body = raw_request(port, read, host=f"127.0.0.1:{port}", origin=origin)
        assert status == 403 and body == FORBIDDEN, (origin, status)
        command = json.dumps(convert_command(explored.model.pte.resolve())).encode()
        status, _ = raw_request(
            port, "/apipost/v1/send_command", host=f"127.0.0.1:{port}", origin=origin, method="POST", body=command
        )
        assert status == 403, origin
    status, body = raw_request(port, read, host=f"localhost:{port}", origin=f"http://localhost:{port}")
    assert status == 200 and json.loads(body)["content"] == secret


def test_cross_site_and_same_site_requests_get_403_on_every_route(server: ExplorerHandle, explored: BundleCase) -> None:
    """Browsers send no Origin on an <img> or <script> GET, but they do send Sec-Fetch-Site: that is the rule."""
    port, own = server.port, f"127.0.0.1:{server.port}"
    overlay = (explored.path / "model_explorer" / "me_overlay_median_ms.json").resolve()
    convert = json.dumps(convert_command(explored.model.pte.resolve())).encode()  # a model it serves
    requests = [
        ("GET", "/", None),
        ("GET", "/check_health", None),
        ("GET", "/index.html", None),
        ("GET", f"/api/v1/read_text_file?path={overlay}", None),
        ("GET", "/api/v1/get_extensions", None),
        ("GET", f"/api/v1/send_command?json={quote(convert)}", None),
        ("HEAD", f"/api/v1/send_command?json={quote(convert)}", None),
        ("POST", "/apipost/v1/send_command", convert),
    ]
    start = server.log_path.stat().st_size
    for site in ("cross-site", "same-site", "CROSS-SITE"):
        for method, path, body in requests:
            status, answer = raw_request(
                port, path, host=own, method=method, body=body, headers={"Sec-Fetch-Site": site}
            )
            # 403 with the guard's own body: the request never reached upstream's handler (no conversion ran).
            assert status == 403 and answer in (FORBIDDEN, b""), (site, method, path, status, answer[:200])
    log = guard_log(server, start)
    assert f"{REFUSED} POST '/apipost/v1/send_command': Sec-Fetch-Site 'cross-site'" in log
    assert f"{REFUSED} GET '/api/v1/send_command': Sec-Fetch-Site 'same-site'" in log
    assert f"{REFUSED} GET '/': Sec-Fetch-Site 'cross-site'" in log
    # The page's own requests (same-origin) and the user's own navigation (none, or no header) are served.
    for headers in ({"Sec-Fetch-Site": "same-origin"}, {"Sec-Fetch-Site": "none"}, {}):
        status, answer = raw_request(port, f"/api/v1/read_text_file?path={overlay}", host=own, headers=headers)
        assert status == 200 and json.loads(answer)["content"] == overlay.read_text(), headers
        assert raw_request(port, "/", host=own, headers=headers)[0] == 200
    status, answer = raw_request(
        port, "/apipost/v1/send_command", host=own, method="POST", body=convert,
        origin=f"http://{own}", headers={"Sec-Fetch-Site": "same-origin"},
    )  # fmt: skip
    assert status == 200 and json.loads(answer)["graphCollections"], answer[:200]


def test_files_it_was_not_started_with_are_refused(
    server: ExplorerHandle, explored: BundleCase, tmp_path: Path
) -> None:
    """The file and convert endpoints serve the models and overlays the server was started with, nothing else."""
    port, own = server.port, f"127.0.0.1:{server.port}"
    page = {"Sec-Fetch-Site": "same-origin"}  # as the UI's own requests: only the allowlist refuses these
    secret = tmp_path / "secret.txt"
    secret.write_text("etlab-secret-9f3a")
    overlay = (explored.path / "model_explorer" / "me_overlay_median_ms.json").resolve()
    disguised = tmp_path / overlay.name  # a served file's name, elsewhere
    disguised.symlink_to(secret)
    for path in (
        str(secret),
        str(disguised),
        f"{overlay.parent}/../../{os.path.relpath(secret, overlay.parent.parent)}",
        os.path.relpath(secret, Path.cwd()),
        f"{overlay}\x00",
        "/etc/passwd",
        str(overlay.parent),
    ):
        status, body = raw_request(port, f"/api/v1/read_text_file?path={quote(path)}", host=own, headers=page)
        assert status == 403 and b"etlab-secret-9f3a" not in body and b"root:" not in body, (path, status, body)
    status, _ = raw_request(port, "/api/v1/read_text_file", host=own, headers=page)
    assert status == 403
    # Real paths are compared: a link to a served file is that file.
    alias = tmp_path / "alias.json"
    alias.symlink_to(overlay)
    status, body = raw_request(port, f"/api/v1/read_text_file?path={quote(str(alias))}", host=own, headers=page)
    assert status == 200 and json.loads(body)["content"] == overlay.read_text()

    marker = tmp_path / "unpickled"
    poisoned = poisoned_pt2(tmp_path / explored.model.exported.name, marker)  # a served model's name, elsewhere
    served = explored.model.pte.resolve()
    for command in (
        convert_command(poisoned, PT2_ADAPTER),
        convert_command(secret),
        convert_command(served, deleteAfterConversion=True),  # upstream would delete the model's folder at exit
        {**convert_command(served), "cmdId": "run", "graphId": "forward", "configValues": {}},
        [convert_command(served)],
    ):
        body = json.dumps(command).encode()
        status, answer = raw_request(port, "/apipost/v1/send_command", host=own, method="POST", body=body, headers=page)
        assert (status, answer) == (403, FORBIDDEN), (command, status, answer[:300])
    status, _ = raw_request(
        port, "/apipost/v1/send_command", host=own, method="POST", body=b"{", headers=page
    )  # not JSON
    assert status == 403
    # A command sent without the UI's JSON content type (a form can send that from any page) is refused too.
    status, _ = raw_request(
        port, "/apipost/v1/send_command", host=own, method="POST", body=json.dumps(convert_command(served)).encode(),
        headers={**page, "Content-Type": "text/plain"},
    )  # fmt: skip
    assert status == 403
    # Uploading a model, or swapping the served config, would serve files it was not started with.
    config = {"graphs_list": "[]", "model_sources": [{"url": str(poisoned)}], "node_data_sources": [],
              "node_data_target_models": []}  # fmt: skip
    for route, data in (("/apipost/v1/upload", b"--x--"), ("/apipost/v1/update_config", json.dumps(config).encode())):
        status, _ = raw_request(port, route, host=own, method="POST", body=data, headers=page)
        assert status == 403, route
    # The UI names each model it loads (upstream watches it with --watch): a served model only.
    notify = "/api/v1/notify_user_provided_model_path?path="
    assert raw_request(port, notify + quote(str(poisoned)), host=own, headers=page)[0] == 403
    assert raw_request(port, notify + quote(str(served)), host=own, headers=page)[0] == 200
    assert not marker.exists(), "the poisoned .pt2 was unpickled"
    assert "etlab-secret-9f3a" not in guard_log(server)


def test_the_guard_passes_upstream_only_what_it_checked(tmp_path: Path) -> None:
    """The guard on its own, in front of a stand-in for upstream that records every request it is given."""
    model, overlay = tmp_path / "m_xnnpack.pte", tmp_path / "me_overlay_pct.json"
    model.write_bytes(b"pte")
    overlay.write_text("{}")
    (tmp_path / "link.pte").symlink_to(model)
    upstream: list[dict[str, Any]] = []

    def app(environ: dict[str, Any], start_response: Any) -> list[bytes]:
        upstream.append(environ)
        start_response("200 OK", [])
        return [b"upstream"]

    files = ServedFiles.from_config({"models": [{"url": str(model)}], "node_data": [{"path": str(overlay)}]})
    guard = LocalOnly(app, 8081, files=files)

    def call(path: str, query: str = "", body: bytes | None = None, **environ: Any) -> tuple[str, dict[str, Any]]:
        request = {
            "REQUEST_METHOD": "GET" if body is None else "POST", "PATH_INFO": path, "QUERY_STRING": query,
            "HTTP_HOST": "127.0.0.1:8081", "wsgi.input": io.BytesIO(body or b""),
            **({"CONTENT_TYPE": "application/json", "CONTENT_LENGTH": str(len(body))} if body is not None else {}),
            **environ,
        }  # fmt: skip
        statuses: list[str] = []
        b"".join(guard(request, lambda status, headers: statuses.append(status)))
        return statuses[0], request

    convert = json.dumps(convert_command(tmp_path / "link.pte")).encode()
    chunked: dict[str, Any] = {"CONTENT_LENGTH": None, "wsgi.input_terminated": True}  # a body with no length
    refused = [
        call("/", HTTP_SEC_FETCH_SITE="cross-site"),
        call("/", HTTP_SEC_FETCH_SITE="no-such-value"),
        call("//api//v1/read_text_file", "path=/etc/passwd"),  # routing merges slashes: so does the guard
        call("/api/v1/read_text_file/", f"path={quote(str(overlay.with_name('x.json')))}"),
        # Two paths: which one would upstream read?
        call("/api/v1/read_text_file", f"path={quote(str(overlay))}&path=/etc/passwd"),
        call("/api/v1/send_command", f"json={quote(convert)}"),  # a GET, as an <img> sends
        call("/apipost/v1/send_command", body=convert, CONTENT_LENGTH=str(MAX_COMMAND_BYTES + 1)),
        call("/apipost/v1/send_command", body=convert, CONTENT_LENGTH="-1"),
        call(  # chunked (no length), longer than any command
            "/apipost/v1/send_command",
            body=b" " * MAX_COMMAND_BYTES + convert,
            **chunked,
        ),
        call("/apipost/v1/send_command", body=convert, CONTENT_TYPE="text/plain"),
        call("/api/v1/load_graphs_json", "graph_index=0"),
    ]
    assert [status for status, _ in refused] == ["403 Forbidden"] * len(refused)
    assert upstream == [], "a refused request never reaches upstream"

    status, read = call("/api/v1/read_text_file", f"path={quote(str(tmp_path / '.' / overlay.name))}")
    assert status == "200 OK" and parse_qs(read["QUERY_STRING"]) == {"path": [str(overlay.resolve())]}
    for environ in ({}, chunked):
        status, command = call("/apipost/v1/send_command", body=convert, **environ)
        assert status == "200 OK", environ
        assert json.loads(command["wsgi.input"].read()) == {**convert_command(model.resolve())}, "the real path"
    assert len(upstream) == 3


@contextlib.contextmanager
def foreign_site(host: str, page: str) -> Iterator[str]:
    """Another site: a tiny web server on `host` whose every page is `page`. Yields its URL."""

    class Page(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = page.encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/html; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    site = http.server.ThreadingHTTPServer((host, 0), Page)
    thread = threading.Thread(target=site.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://{host}:{site.server_address[1]}/"
    finally:
        site.shutdown()
        site.server_close()
        thread.join()


@pytest.mark.parametrize(
    ("page_host", "site"), [("127.0.0.2", "cross-site"), ("127.0.0.1", "same-site")], ids=["other-site", "other-port"]
)
def test_a_foreign_page_cannot_make_the_browser_load_a_model(
    server: ExplorerHandle, browser_page: Any, tmp_path: Path, page_host: str, site: str
) -> None:
    """The attack: a page's <img> GETs send_command (no Origin) for a .pt2 the page made the browser download."""
    marker = tmp_path / "unpickled"
    poisoned = poisoned_pt2(tmp_path / "download.pt2", marker)
    command = json.dumps(convert_command(poisoned, PT2_ADAPTER))
    target = f"http://127.0.0.1:{server.port}/api/v1/send_command?json={quote(command)}"
    start = server.log_path.stat().st_size
    with foreign_site(page_host, f'<!doctype html><img id="probe" src="{html.escape(target)}">') as url:
        browser_page.goto(url)  # returns at the load event: the image's request has been answered
        browser_page.wait_for_function("document.getElementById('probe').complete")
    assert f"{REFUSED} GET '/api/v1/send_command': Sec-Fetch-Site '{site}'" in guard_log(server, start)
    assert not marker.exists(), "the page made Model Explorer unpickle its .pt2"


def test_host_rule_for_loopback_and_explicit_binds() -> None:
    assert host_allowed("127.0.0.1:8081", 8081) and host_allowed("[::1]:8081", 8081)
    assert not host_allowed("127.0.0.1:8082", 8081) and not host_allowed("evil.example:8081", 8081)
    assert not host_allowed("192.168.1.20:8081", 8081), "a loopback server answers only loopback names"
    # Bound to a LAN address on purpose: IP literals only (rebinding needs a host name).
    assert host_allowed("192.168.1.20:8081", 8081, "0.0.0.0") and host_allowed("[fe80::1]:8081", 8081, "::")
    assert not host_allowed("evil.example:8081", 8081, "0.0.0.0") and not host_allowed("192.168.1.20", 8081, "0.0.0.0")


def test_a_servers_own_start_up_check_is_not_logged_as_a_refusal(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """The dashboard serves in this process: its start-up check of the guard (guard_answers' two foreign probes)
    printed "etlab-guard: refused GET '/check_health'" twice. Its probes are still refused, and any other foreign
    request, the probe's header with another value included, is refused and logged."""
    from orchestrator.servers.dashboard.app import Sources, start_dashboard
    from orchestrator.servers.guard import PROBE_HEADER, guard_answers
    from tests.plugins.explorer import free_port

    server = start_dashboard(Sources(tmp_path / "results", None), port=free_port())
    try:
        assert REFUSED not in capfd.readouterr().err
        assert guard_answers("127.0.0.1", server.port), "the probes are refused (403) as before"
        assert REFUSED not in capfd.readouterr().err
        for headers in ({"Host": f"evil.example:{server.port}"}, {"Host": "evil.example", PROBE_HEADER: "guess"}):
            connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
            connection.request("GET", "/check_health", headers=headers)
            assert connection.getresponse().status == 403
            connection.close()
        assert capfd.readouterr().err.count(f"{REFUSED} GET '/check_health'") == 2
    finally:
        server.stop()
