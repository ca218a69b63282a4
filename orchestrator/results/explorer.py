"""`explore`: Model Explorer with the PTE adapter, preloaded with a model's programs and a run's overlays.

Model Explorer's `visualize_from_config` blocks and serves until killed, so it runs in a child process (its own
process group, stopped with SIGTERM, then SIGKILL). Upstream's server reads any file it is asked for
(`/api/v1/read_text_file`) and converts any model path (`send_command`; a .pt2 is unpickled by torch.export.load,
so converting a file a web page made the browser download runs that page's code). It binds to 127.0.0.1 unless
the caller explicitly asks for another address.

Binding to loopback does not stop a web page from reaching it. So the child wraps the upstream WSGI app (the
package itself is left unmodified) in `LocalOnly`, which answers 403, before upstream sees the request, to:
- a Host that is not this server's loopback name (DNS rebinding points a page's own host name at 127.0.0.1);
- `Sec-Fetch-Site: cross-site` or `same-site` (another page's <img> or <script> GET sends no Origin, but browsers
  mark every request with where it comes from), and an API request whose Origin is another site;
- an API route the UI does not need, a command other than a POSTed JSON `convert` of a model it was started with,
  and a read of any file but its overlays (real paths compared: the allowlist is `ServedFiles`).
Each refusal is one line in the server's log. The parent checks that the guard answers before it announces the
server.
"""

from __future__ import annotations

import contextlib
import http.client
import io
import ipaddress
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
import webbrowser
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, quote, urlencode

from orchestrator import console
from orchestrator.errors import EtlabError, UsageError
from orchestrator.fsutil import read_json
from orchestrator.lowering.artifacts import ArtifactPaths
from orchestrator.paths import PROJECT_ROOT
from orchestrator.results.overlays import INDEX_NAME, OVERLAY_DIR

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8081
PTE_ADAPTER = "pte_adapter_model_explorer"
MODEL_SUFFIXES = (".pt2", ".pte")
HEALTH_TIMEOUT_S = 120.0
STOP_TIMEOUT_S = 10.0


class ExplorerError(EtlabError):
    """Model Explorer could not be started."""


@dataclass
class ExplorerHandle:
    """A running Model Explorer server (a child process group)."""

    url: str
    host: str
    port: int
    process: subprocess.Popen[bytes]
    log_path: Path
    config: dict[str, Any] = field(default_factory=dict, repr=False)
    focus: str | None = None  # the .pte whose graphs the overlays paint
    _workdir: tempfile.TemporaryDirectory[str] | None = field(default=None, repr=False)

    def url_for(self, graph: str) -> str:
        """A URL opening another graph of the focus program, e.g. a delegate ("<pte>::forward_0_28")."""
        return explorer_url(self.host, self.port, self.config, self.focus, graph=graph)

    @property
    def running(self) -> bool:
        return self.process.poll() is None

    def stop(self, timeout: float = STOP_TIMEOUT_S) -> None:
        """Stop the server and everything it started (its whole process group)."""
        if self.process.poll() is None:
            _signal_group(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                _signal_group(self.process.pid, signal.SIGKILL)
                self.process.wait(timeout)
        if self._workdir is not None:
            self._workdir.cleanup()
            self._workdir = None

    def wait(self) -> int:
        """Block until the server exits or Ctrl+C / SIGTERM arrives; then stop it cleanly. Returns its exit code
        (130 when interrupted)."""
        with _sigterm_interrupts():
            try:
                return self.process.wait()
            except KeyboardInterrupt:
                console.info("stopping Model Explorer …")
                return 130
            finally:
                self.stop()


@contextlib.contextmanager
def _sigterm_interrupts() -> Iterator[None]:
    """Within the block, SIGTERM raises KeyboardInterrupt like Ctrl+C, so the server is always stopped."""

    def interrupt(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    try:
        previous = signal.signal(signal.SIGTERM, interrupt)
    except ValueError:  # not the main thread: leave signals alone
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _signal_group(pid: int, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signum)


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_host(host: str) -> None:
    """Any non-loopback address was asked for explicitly: allow it, but say loudly what it exposes."""
    if not is_loopback(host):
        console.loud_warning(
            f"Model Explorer will listen on {host}: anyone who can reach this address can read the models and "
            "overlays it serves, with no login. Prefer 127.0.0.1 with an SSH tunnel."
        )


def ensure_port_free(host: str, port: int) -> None:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        # As the server does: connections left in TIME_WAIT by a previous server do not block the port.
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as exc:
            raise ExplorerError(
                f"cannot listen on {host}:{port}: {exc.strerror or exc} (is another Model Explorer running?)",
                hint="stop it, or choose another port with --port",
            ) from None


def run_overlays(run_dir: Path, *, required: bool = True) -> list[Path]:
    """An analysed run's overlays (median_ms, mean_ms, pct, and any compare diffs); [] if none and not required."""
    found = sorted((Path(run_dir) / OVERLAY_DIR).glob("me_overlay_*.json"))
    if not found and required:
        raise ExplorerError(f"{run_dir} has no Model Explorer overlays", hint="analyse the run first")
    return found


def program_models(paths: ArtifactPaths) -> tuple[list[Path], list[Path]]:
    """A model's programs to show: those present, and those missing.

    The exported .pt2 and both fp32 .pte files are expected; the quantized variants (xnnpack-<scheme>) that were
    lowered are shown next to them.
    """
    from orchestrator.lowering.artifacts import QUANTIZED_BACKENDS

    expected = [paths.exported_program, paths.pte("portable"), paths.pte("xnnpack")]
    variants = [paths.pte(backend) for backend in QUANTIZED_BACKENDS if paths.pte(backend).is_file()]
    return [m for m in expected if m.is_file()] + variants, [m for m in expected if not m.is_file()]


def artifact_models(artifact_dir: Path) -> list[Path]:
    """A model's lowered artifacts to show: its exported .pt2 and every .pte beside it."""
    folder = Path(artifact_dir)
    found = sorted(folder.glob("*.pt2")) + sorted(folder.glob("*.pte"))
    if not found:
        raise ExplorerError(f"no .pt2 or .pte in {folder}", hint="lower the model first")
    return found


def overlay_target(overlay: Path) -> str | None:
    """The .pte file name an overlay was made for, from the overlays.json index next to it (None if unknown)."""
    index = Path(overlay).parent / INDEX_NAME
    if not index.is_file():
        return None
    with contextlib.suppress(OSError, ValueError, RecursionError):
        document = read_json(index)
        pte = document.get("pte") if isinstance(document, dict) else None
        # A file name, nothing else: it only selects which loaded model an overlay paints.
        return pte if isinstance(pte, str) and pte.endswith(".pte") and Path(pte).name == pte else None
    return None


def _collection_labels(model_file: str) -> list[str]:
    """The UI's labels for the collections the PTE adapter makes from one file: the program and its delegates."""
    return [f"{model_file} ({model_file})", f"{model_file} (delegates)"]


def build_config(models: list[Path], overlays: list[Path]) -> dict[str, Any]:
    """What the child loads: models with their adapters, and node data with the collections they target."""
    model_entries = [
        {"url": str(path.resolve()), **({"adapterId": PTE_ADAPTER} if path.suffix == ".pte" else {})} for path in models
    ]
    loaded = {path.name for path in models}
    node_data: list[dict[str, str]] = []
    for overlay in overlays:
        target = overlay_target(overlay)
        if target is not None and target in loaded:
            node_data += [{"path": str(overlay.resolve()), "model_name": label} for label in _collection_labels(target)]
        else:
            node_data.append({"path": str(overlay.resolve()), "model_name": ""})
    return {"models": model_entries, "node_data": node_data}


def explorer_url(
    host: str, port: int, config: dict[str, Any], focus: str | None, graph: str = "forward", method: str = "forward"
) -> str:
    """The page URL. Its `?data=` state opens `graph` of the focus program (its `forward` graph by default, or one
    of its delegate graphs by id) with the method's layer expanded."""
    data: dict[str, Any] = {
        "models": config["models"],
        "nodeData": [entry["path"] for entry in config["node_data"]],
        "nodeDataTargets": [entry["model_name"] for entry in config["node_data"]],
    }
    if focus is not None:
        data["uiState"] = {
            "paneStates": [
                {
                    # The adapter puts XNN nodes in a "forward" layer too, so expanding it suits every graph.
                    "deepestExpandedGroupNodeIds": [f"{method}___group___"],
                    "selectedNodeId": "",
                    "selectedGraphId": graph,
                    "selectedCollectionLabel": _collection_labels(focus)[0 if graph == method else 1],
                    "widthFraction": 1,
                }
            ]
        }
    shown_host = f"[{host}]" if ":" in host else host
    return f"http://{shown_host}:{port}/?data={quote(json.dumps(data, separators=(',', ':')))}"


LOOPBACK_NAMES = ("127.0.0.1", "localhost", "[::1]")
API_PREFIX = "/api"  # /api/v1/..., /apipost/v1/..., /apistream/...
FORBIDDEN = b"forbidden: this Model Explorer serves only its own page, on its loopback address, its own files\n"
GUARD_LOG = "etlab-guard: refused"  # the server log's line for each refused request
_PROBE_HOST = "etlab-guard-check.invalid"

# Sec-Fetch-Site values of the page's own requests and of the user's own navigation (typed URL, bookmark).
# cross-site and same-site (another port on this host) are other pages; a value we do not know is refused too.
SEC_FETCH_SERVED = frozenset({"same-origin", "none"})

# Routes of upstream's Flask app (model_explorer/server.py) and how each is served. Every other API route is
# refused, so a route a later release adds stays closed until someone reads it. Refused on purpose: upload (writes
# files, then converts them), update_config (swaps the models served), refresh_page, load_graphs_json and
# load_node_data (for graphs and node data held in memory: we serve files), GET send_command (any <img> sends a GET).
READ_TEXT_ROUTE = "/api/v1/read_text_file"  # ?path=: only the overlays
NOTIFY_ROUTE = "/api/v1/notify_user_provided_model_path"  # ?path=: the UI names each model it loads (for --watch)
COMMAND_ROUTE = "/apipost/v1/send_command"  # POSTed JSON: only `convert` of the models
OPEN_API_ROUTES = frozenset({"/api/v1/get_extensions", "/api/v1/check_new_version", "/apistream/server_director"})
MAX_COMMAND_BYTES = 1 << 20  # the UI's commands are a few hundred bytes

StartResponse = Callable[..., Any]
WsgiApp = Callable[[dict[str, Any], StartResponse], Iterable[bytes]]


def real_path(path: str) -> str | None:
    """`path` as upstream opens it (`~` expanded, relative to the server's folder), resolved through every
    symbolic link; None when no path can be made of it (e.g. a NUL byte)."""
    try:
        return os.path.realpath(os.path.expanduser(path))
    except (ValueError, OSError):
        return None


@dataclass(frozen=True)
class ServedFiles:
    """The files a server was started with, by real path: the only ones its file and convert endpoints serve."""

    models: frozenset[str] = frozenset()
    texts: frozenset[str] = frozenset()  # the overlays (node data), which the UI reads through read_text_file

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> ServedFiles:
        def real(paths: Iterable[str]) -> frozenset[str]:
            return frozenset(filter(None, map(real_path, paths)))

        return cls(real(m["url"] for m in config["models"]), real(e["path"] for e in config["node_data"]))


def host_allowed(host: str, port: int, bind_host: str = DEFAULT_HOST) -> bool:
    """Whether a Host header names this server: a loopback name with its port. A server deliberately bound to
    another address also accepts IP literals (a rebinding attack needs a host name, never an IP literal)."""
    host = host.strip().lower()
    if host in {f"{name}:{port}" for name in LOOPBACK_NAMES}:
        return True
    if is_loopback(bind_host):
        return False
    name, sep, given_port = host.rpartition(":")
    if not sep or given_port != str(port):
        return False
    name = name[1:-1] if name.startswith("[") and name.endswith("]") else name
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


def origin_allowed(origin: str, port: int, bind_host: str = DEFAULT_HOST) -> bool:
    """Whether an Origin header is this server's own page (http://<an allowed Host>)."""
    scheme, sep, rest = origin.strip().lower().partition("://")
    return scheme == "http" and bool(sep) and "/" not in rest and host_allowed(rest, port, bind_host)


class LocalOnly:
    """WSGI middleware in front of Model Explorer: refuses with 403, before the upstream app sees the request,
    anything but this server's own page asking for the files it was started with (see the module's docstring)."""

    def __init__(
        self, app: WsgiApp, port: int, bind_host: str = DEFAULT_HOST, files: ServedFiles | None = None
    ) -> None:
        self.app = app
        self.port = port
        self.bind_host = bind_host
        self.files = files or ServedFiles()

    def __call__(self, environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        reason = self.refusal(environ)
        if reason is None:
            return self.app(environ, start_response)
        # Only the method and path: a query can hold anything, and the log is read in a terminal.
        print(
            f"{GUARD_LOG} {environ.get('REQUEST_METHOD')} {str(environ.get('PATH_INFO'))!a}: {reason}",
            file=sys.stderr,
            flush=True,
        )
        start_response(
            "403 Forbidden",
            [
                ("Content-Type", "text/plain; charset=utf-8"),
                ("Content-Length", str(len(FORBIDDEN))),
                ("Connection", "close"),  # a refused POST's body is left unread: never parse it as a request
            ],
        )
        return [FORBIDDEN]

    def refusal(self, environ: dict[str, Any]) -> str | None:
        """Why a request is refused, or None to serve it. A served API request is rewritten to carry exactly what
        was checked (the real path), so upstream never parses anything the guard did not."""
        host = environ.get("HTTP_HOST")
        if host is None or not host_allowed(host, self.port, self.bind_host):
            return f"Host {host!a}"
        site = environ.get("HTTP_SEC_FETCH_SITE")
        if site is not None and site.strip().lower() not in SEC_FETCH_SERVED:
            return f"Sec-Fetch-Site {site!a}"
        # Repeated slashes merged, as routing merges them, so no spelling of an API route escapes its check.
        route = "/" + "/".join(part for part in str(environ.get("PATH_INFO", "")).split("/") if part)
        if not route.startswith(API_PREFIX):
            return None  # the page and its static files (upstream refuses paths out of its folder)
        origin = environ.get("HTTP_ORIGIN")
        if origin is not None and not origin_allowed(origin, self.port, self.bind_host):
            return f"Origin {origin!a}"
        if route in OPEN_API_ROUTES:
            return None
        if route == READ_TEXT_ROUTE:
            return _path_query(environ, self.files.texts, "read_text_file")
        if route == NOTIFY_ROUTE:
            return _path_query(environ, self.files.models, "notify_user_provided_model_path")
        if route == COMMAND_ROUTE:
            return self._command(environ)
        return "not a route etlab serves"

    def _command(self, environ: dict[str, Any]) -> str | None:
        if environ.get("REQUEST_METHOD") != "POST":
            return "send_command that is not a POST"
        # The UI's content type; a page can send it elsewhere only after a CORS preflight, which this server fails.
        if str(environ.get("CONTENT_TYPE", "")).split(";")[0].strip().lower() != "application/json":
            return "send_command that is not JSON"
        body = _request_body(environ)
        try:
            command = json.loads(body) if body is not None else None
        except (ValueError, RecursionError):
            command = None
        if not isinstance(command, dict):
            return "send_command that is not a JSON object"
        if command.get("cmdId") != "convert":
            return "send_command other than convert"
        if command.get("deleteAfterConversion"):  # upstream would delete the model's folder when it stops
            return "convert with deleteAfterConversion"
        model = command.get("modelPath")
        path = real_path(model) if isinstance(model, str) else None
        if path is None or path not in self.files.models:
            return "convert of a model this server was not started with"
        checked = json.dumps({**command, "modelPath": path}).encode()
        environ["wsgi.input"] = io.BytesIO(checked)
        environ["CONTENT_LENGTH"] = str(len(checked))
        environ.pop("HTTP_TRANSFER_ENCODING", None)
        return None


def _path_query(environ: dict[str, Any], served: frozenset[str], route: str) -> str | None:
    """Serve a `?path=` route only for a path in `served`; the query passed on is that real path alone."""
    # WSGI hands the query over as latin-1 text of its bytes; browsers percent-encode UTF-8.
    raw = str(environ.get("QUERY_STRING", "")).encode("latin-1", "replace").decode("utf-8", "replace")
    paths = parse_qs(raw, keep_blank_values=True).get("path", [])
    path = real_path(paths[0]) if len(paths) == 1 else None
    if path is None or path not in served:
        return f"{route} of a file this server was not started with"
    environ["QUERY_STRING"] = urlencode({"path": path})
    return None


def _request_body(environ: dict[str, Any]) -> bytes | None:
    """The request's body, read whole; None when it is larger than any command (or its length is not a number)."""
    stream = environ["wsgi.input"]
    length = str(environ.get("CONTENT_LENGTH") or "").strip()
    if length:
        if not length.isdigit() or int(length) > MAX_COMMAND_BYTES:
            return None
        body = stream.read(int(length))
    elif environ.get("wsgi.input_terminated"):  # chunked: the server ends the stream
        body = stream.read(MAX_COMMAND_BYTES + 1)
    else:
        body = b""
    return body if len(body) <= MAX_COMMAND_BYTES else None


def _guard_server(port: int, bind_host: str, files: ServedFiles) -> None:
    """Child process: every app werkzeug serves here (Flask's `app.run` calls `run_simple`) goes behind
    LocalOnly. Upstream builds its app inside `server.start`, so this is the one place to wrap it."""
    import werkzeug.serving

    serve = werkzeug.serving.run_simple

    def guarded(hostname: str, port_: int, application: WsgiApp, *args: Any, **kwargs: Any) -> None:
        serve(hostname, port_, LocalOnly(application, port, bind_host, files), *args, **kwargs)

    werkzeug.serving.run_simple = guarded  # type: ignore[assignment]


def _guard_answers(handle: ExplorerHandle) -> bool:
    """Whether the server refuses a foreign Host (as a DNS-rebinding page would send) and a request from another
    site: the guard is in place, and it is this version of it."""
    shown_host = f"[{handle.host}]" if ":" in handle.host else handle.host
    probes = (
        {"Host": f"{_PROBE_HOST}:{handle.port}"},
        {"Host": f"{shown_host}:{handle.port}", "Sec-Fetch-Site": "cross-site"},
    )
    for headers in probes:
        connection = http.client.HTTPConnection(handle.host, handle.port, timeout=10)
        try:
            connection.request("GET", "/check_health", headers=headers)
            if connection.getresponse().status != 403:
                return False
        finally:
            connection.close()
    return True


def _wait_healthy(handle: ExplorerHandle, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    shown_host = f"[{handle.host}]" if ":" in handle.host else handle.host
    health = f"http://{shown_host}:{handle.port}/check_health"
    while time.monotonic() < deadline:
        if not handle.running:
            log = handle.log_path.read_text(errors="replace")[-2000:] if handle.log_path.is_file() else ""
            raise ExplorerError(f"Model Explorer exited with code {handle.process.returncode} while starting:\n{log}")
        with contextlib.suppress(urllib.error.URLError, OSError), urllib.request.urlopen(health, timeout=2) as answer:
            if answer.status == 200:
                if not _guard_answers(handle):  # fail closed: never announce an unguarded file server
                    handle.stop()
                    raise ExplorerError("Model Explorer answered a foreign Host header; refusing to serve it")
                return
        time.sleep(0.2)
    handle.stop()
    raise ExplorerError(f"Model Explorer did not answer {health} within {timeout:.0f} s")


def launch_explorer(
    models: list[Path],
    overlays: list[Path],
    *,
    host: str = DEFAULT_HOST,
    port: int = DEFAULT_PORT,
    open_browser: bool = True,
    block: bool = True,
    health_timeout: float = HEALTH_TIMEOUT_S,
) -> ExplorerHandle:
    """Serve `models` (.pt2 / .pte) with `overlays` in Model Explorer; return once it answers its health check.

    With block=True, also wait until Ctrl+C / SIGTERM and stop the server before returning."""
    models = [Path(m) for m in models]
    overlays = [Path(o) for o in overlays]
    if not models:
        raise UsageError("nothing to explore: no model files given")
    missing = [str(p) for p in [*models, *overlays] if not p.is_file()]
    if missing:
        raise ExplorerError(f"missing file(s): {', '.join(missing)}", hint="lower the model and analyse the run first")
    unknown = [p.name for p in models if p.suffix not in MODEL_SUFFIXES]
    if unknown:
        raise UsageError(f"not a .pt2 or .pte model: {', '.join(unknown)}")
    check_host(host)
    ensure_port_free(host, port)

    targets = [overlay_target(o) for o in overlays]
    focus = next((t for t in targets if t and t in {m.name for m in models}), None)
    if focus is None:
        focus = next((m.name for m in models if m.suffix == ".pte"), None)
    # The UI renames a repeated graph id ("forward" -> "forward (2)") in load order, so the program the overlays
    # paint is loaded first and keeps the ids they are keyed by.
    models = sorted(models, key=lambda m: (m.name != focus, m.suffix != ".pte"))
    config = build_config(models, overlays)
    url = explorer_url(host, port, config, focus)

    guard = _sigterm_interrupts() if block else contextlib.nullcontext()
    with guard:
        handle = _spawn(host, port, config, url, focus)
        try:
            _wait_healthy(handle, health_timeout)
            _announce(url, host, port)
            if open_browser:
                webbrowser.open_new_tab(url)
            if block:
                handle.process.wait()
        except KeyboardInterrupt:
            handle.stop()
            if not block:
                raise
            console.info("stopped Model Explorer")
        except BaseException:
            handle.stop()
            raise
        if block:
            handle.stop()
    return handle


def _spawn(host: str, port: int, config: dict[str, Any], url: str, focus: str | None) -> ExplorerHandle:
    workdir = tempfile.TemporaryDirectory(prefix="etlab-explorer-")
    config_path = Path(workdir.name) / "config.json"
    config_path.write_text(json.dumps({**config, "host": host, "port": port}))
    log_path = Path(workdir.name) / "model_explorer.log"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(PROJECT_ROOT), os.environ.get("PYTHONPATH")])))
    with open(log_path, "wb") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "orchestrator.results.explorer", str(config_path), str(os.getpid())],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,  # its own process group, so stop() reaches everything it starts
        )
    return ExplorerHandle(url, host, port, process, log_path, config, focus, _workdir=workdir)


def _announce(url: str, host: str, port: int) -> None:
    console.info("Model Explorer is ready:")
    console.plain(url)  # one unbroken line, for copy and paste
    ssh = os.environ.get("SSH_CONNECTION", "").split()
    if ssh and is_loopback(host):
        user = os.environ.get("USER") or "user"
        server = ssh[2] if len(ssh) > 2 else "host"
        console.info(f"over SSH? forward the port first:  ssh -L {port}:127.0.0.1:{port} {user}@{server}")


def _serve(config_path: Path, parent: int | None = None) -> None:
    """Child process: load the config and serve until killed, or until `parent` (the etlab process) is gone."""
    if parent is not None:
        threading.Thread(target=_exit_with_parent, args=(parent,), daemon=True).start()
    import model_explorer

    config = json.loads(Path(config_path).read_text())
    _guard_server(config["port"], config["host"], ServedFiles.from_config(config))
    explorer_config = model_explorer.config()
    for model in config["models"]:
        explorer_config.add_model_from_path(model["url"], adapterId=model.get("adapterId", ""))
    for entry in config["node_data"]:
        explorer_config.add_node_data_from_path(entry["path"], entry["model_name"] or None)
    model_explorer.visualize_from_config(
        config=explorer_config,
        host=config["host"],
        port=config["port"],
        extensions=[PTE_ADAPTER],
        no_open_in_browser=True,
    )


def _exit_with_parent(parent: int) -> None:
    """Child process: a parent that dies without stopping us (SIGKILL, a crash) must not leave the port taken."""
    while os.getppid() == parent:
        time.sleep(0.5)
    if os.getpgrp() == os.getpid():  # our own group (as _spawn starts us): take everything we started along
        os.killpg(os.getpid(), signal.SIGKILL)
    os._exit(0)


if __name__ == "__main__":
    _serve(Path(sys.argv[1]), int(sys.argv[2]) if len(sys.argv) > 2 else None)
