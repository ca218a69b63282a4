"""explore: the real Model Explorer server with the PTE adapter, driven over HTTP and in a real browser: the preloaded
URL, the page, stopping and signals, inputs, errors and hints. Its HTTP guard: test_explorer_guard.py."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import pytest

from orchestrator.commands.common import naming_port
from orchestrator.errors import UsageError
from orchestrator.paths import PROJECT_ROOT
from orchestrator.servers.explorer import (
    PTE_ADAPTER,
    ExplorerError,
    ExplorerHandle,
    artifact_models,
    check_host,
    ensure_port_free,
    launch_explorer,
    overlay_target,
    run_overlays,
)
from orchestrator.servers.guard import is_loopback
from tests.plugins.analysis import BundleCase, adapter_graphs
from tests.plugins.browser import SCREENSHOTS, screenshot
from tests.plugins.explorer import (
    REFUSED,
    free_port,
    get,
    guard_log,
    models_and_overlays,
    post_json,
    url_data,
    wait_for_graph,
)
from tests.plugins.processes import reaped

pytestmark = pytest.mark.slow  # lowers and runs real models (session fixtures)


ARTIFACTS = SCREENSHOTS


def test_server_answers_and_converts_with_the_pte_adapter(server: ExplorerHandle, explored: BundleCase) -> None:
    base = f"http://127.0.0.1:{server.port}"
    assert get(f"{base}/check_health") == "model_explorer_ok"
    converted = post_json(
        f"{base}/apipost/v1/send_command",
        {
            "cmdId": "convert",
            "extensionId": PTE_ADAPTER,
            "modelPath": str(explored.model.pte),
            "settings": {},
            "deleteAfterConversion": False,
        },
    )
    graphs = {g["id"]: {n["id"] for n in g["nodes"]} for c in converted["graphCollections"] for g in c["graphs"]}
    for metric in ("median_ms", "advice", "advice_saving_ms"):  # the advice paints real nodes, delegates' too
        overlay = json.loads((explored.path / "model_explorer" / f"me_overlay_{metric}.json").read_text())
        for graph_id, data in overlay.items():
            assert data["results"] and set(data["results"]) <= graphs[graph_id], (metric, graph_id)


def test_url_preloads_the_program_overlays_and_expanded_layer(server: ExplorerHandle, explored: BundleCase) -> None:
    data = url_data(server.url)
    assert urlparse(server.url).hostname == "127.0.0.1"
    assert Path(data["models"][0]["url"]).name == explored.model.pte.name, "the run's program comes first"
    assert {m.get("adapterId") for m in data["models"] if m["url"].endswith(".pte")} == {PTE_ADAPTER}
    label = f"{explored.model.pte.name} ({explored.model.pte.name})"
    # The run's program and its delegates, and the exported .pt2 it was lowered from (its one graph).
    exported = explored.model.exported.name
    assert set(data["nodeDataTargets"]) == {label, f"{explored.model.pte.name} (delegates)", exported}
    targets = dict(zip((Path(p).name for p in data["nodeData"]), data["nodeDataTargets"], strict=True))
    timings = ("median_ms", "mean_ms", "pct")
    assert set(targets) == {
        *(f"me_overlay_{metric}.json" for metric in (*timings, "live_bytes", "advice", "advice_saving_ms")),
        *(f"me_overlay_exported_{metric}.json" for metric in (*timings, "lowering")),
    }
    assert all((target == exported) == name.startswith("me_overlay_exported_") for name, target in targets.items())
    (pane,) = data["uiState"]["paneStates"]
    assert pane["deepestExpandedGroupNodeIds"] == ["forward___group___"]
    assert (pane["selectedGraphId"], pane["selectedCollectionLabel"]) == ("forward", label)


def test_page_renders_the_graph_with_its_overlays(
    server: ExplorerHandle, explored: BundleCase, browser_page: Any, tmp_path: Path
) -> None:
    run_id = json.loads((explored.path / "analysis" / "summary.json").read_text())["run_id"]
    graphs = adapter_graphs(explored.model.pte)
    delegate = max((g for g in graphs if "::" in g), key=lambda g: len(graphs[g]))  # the largest delegate
    delegate_url = server.url_for(delegate)
    page = browser_page
    start = server.log_path.stat().st_size
    overlays = explored.path / "model_explorer"
    advised = {
        name: set(json.loads((overlays / f"me_overlay_{metric}.json").read_text()))
        for name, metric in (("advice", "advice"), ("predicted saving ms", "advice_saving_ms"))
    }
    exported = explored.model.exported.name
    exported_url = server.exported_url
    assert exported_url is not None and exported_url == server.url_for("graph", exported)
    for url, name, expected in (
        # the .pt2 as the model's modules nest, painted with the same run and told what lowering split
        (exported_url, "explore_exported", f"lowering: split or fused nodes ({run_id})"),
        (server.url, "explore_forward", "aten::"),
        (delegate_url, "explore_delegate", "XNN"),  # last: its page's text is checked below
    ):
        page.goto(url)
        wait_for_graph(page, server)
        page.wait_for_function("text => document.body.innerText.includes(text)", arg=f"pct ({run_id})", timeout=60_000)
        text = page.inner_text("body")
        # The UI lists the node data that covers the graph shown; the advice covers the graphs of its findings.
        graph = {delegate_url: delegate, exported_url: "graph"}.get(url, "forward")
        advice = [name for name, graphs in advised.items() if graph in graphs]
        assert graph != "forward" or len(advice) == 2, "the SDPA finding paints the top level"
        for metric in ("median_ms", "mean_ms", "pct", *advice):
            assert f"{metric} ({run_id})" in text, f"{metric} overlay is listed"
        assert expected in text
        assert (graph == "graph") == (f"pct ({run_id}) on {exported}" in text), "the .pt2's own overlays, there only"
        page.screenshot(path=str(ARTIFACTS / f"{name}.png"))
        assert (ARTIFACTS / f"{name}.png").stat().st_size > 10_000
        screenshot(page, tmp_path, name, full_page=False)
    assert f"{explored.model.pte.name} (delegates)" in text and delegate in text
    assert REFUSED not in guard_log(server, start), "the UI's own requests (same-origin) are all served"


def test_stop_ends_the_server_and_frees_the_port(explored: BundleCase, analysis_bundles: dict[str, BundleCase]) -> None:
    models, overlays = models_and_overlays(explored, analysis_bundles)
    port = free_port()
    handle = launch_explorer(models[2:], overlays, port=port, open_browser=False, block=False)
    group = handle.process.pid
    handle.stop()
    assert not handle.running
    with pytest.raises(ProcessLookupError):
        os.killpg(group, 0)
    ensure_port_free("127.0.0.1", port)


def explore_in_subprocess(models: list[Path], overlays: list[Path], port: int, **popen: Any) -> subprocess.Popen:
    """`launch_explorer(...)` (blocking) in a child Python, as `fab explore` runs it."""
    script = (
        "from pathlib import Path; from orchestrator.servers.explorer import launch_explorer; "
        f"launch_explorer([Path(p) for p in {[str(m) for m in models]!r}], "
        f"[Path(p) for p in {[str(o) for o in overlays]!r}], port={port}, open_browser=False)"
    )
    return subprocess.Popen([sys.executable, "-c", script], cwd=PROJECT_ROOT, **popen)


def wait_until_ready(launcher: subprocess.Popen) -> None:
    assert launcher.stderr is not None
    seen = ""
    while "Model Explorer is ready" not in seen:  # steady state: serving and waiting
        line = launcher.stderr.readline()
        assert line, f"explore exited before it was ready: {seen}"
        seen += line


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["sigterm", "ctrl-c"])
def test_blocking_explore_stops_cleanly_on_signal(
    explored: BundleCase, analysis_bundles: dict[str, BundleCase], signum: int
) -> None:
    models, overlays = models_and_overlays(explored, analysis_bundles)
    port = free_port()
    launcher = explore_in_subprocess(models[2:], overlays, port, stderr=subprocess.PIPE, text=True)
    with reaped(launcher):
        wait_until_ready(launcher)
        assert get(f"http://127.0.0.1:{port}/check_health") == "model_explorer_ok"
        launcher.send_signal(signum)
        assert launcher.wait(timeout=30) == 0
        assert launcher.stderr is not None
        rest = launcher.stderr.read()
        assert "stopped Model Explorer" in rest and "Traceback" not in rest
        with pytest.raises(OSError):
            get(f"http://127.0.0.1:{port}/check_health")
        ensure_port_free("127.0.0.1", port)


def test_signal_during_startup_leaves_no_server(explored: BundleCase) -> None:
    port = free_port()
    launcher = explore_in_subprocess([explored.model.pte], [], port, stderr=subprocess.DEVNULL)
    with reaped(launcher):
        time.sleep(1.5)  # Model Explorer takes several seconds to come up
        launcher.send_signal(signal.SIGTERM)
        launcher.wait(timeout=30)
        time.sleep(8)  # long enough for an orphaned server to have started listening
        with pytest.raises(OSError):
            get(f"http://127.0.0.1:{port}/check_health")
        ensure_port_free("127.0.0.1", port)


def test_a_killed_launcher_takes_its_server_with_it(explored: BundleCase) -> None:
    port = free_port()
    launcher = explore_in_subprocess([explored.model.pte], [], port, stderr=subprocess.PIPE, text=True)
    with reaped(launcher):
        wait_until_ready(launcher)
        assert get(f"http://127.0.0.1:{port}/check_health") == "model_explorer_ok"
        launcher.kill()  # no chance to stop the server: it must notice on its own
        launcher.wait()
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            get(f"http://127.0.0.1:{port}/check_health")
        except OSError:
            break
        time.sleep(0.2)
    with pytest.raises(OSError):
        get(f"http://127.0.0.1:{port}/check_health")
    ensure_port_free("127.0.0.1", port)


def test_run_and_artifact_inputs_are_found(explored: BundleCase, tmp_path: Path) -> None:
    assert [p.name for p in run_overlays(explored.path)] == [
        "me_overlay_advice.json", "me_overlay_advice_saving_ms.json", "me_overlay_exported_lowering.json",
        "me_overlay_exported_mean_ms.json", "me_overlay_exported_median_ms.json", "me_overlay_exported_pct.json",
        "me_overlay_live_bytes.json", "me_overlay_mean_ms.json", "me_overlay_median_ms.json", "me_overlay_pct.json",
    ]  # fmt: skip
    models = artifact_models(explored.model.pte.parent)
    assert explored.model.pte in models and explored.model.exported in models
    assert all(m.suffix in (".pt2", ".pte") for m in models)
    with pytest.raises(ExplorerError, match="analyse the run first"):
        run_overlays(tmp_path)
    with pytest.raises(ExplorerError, match="lower the model first"):
        artifact_models(tmp_path)


def test_port_in_use_is_a_clear_error(explored: BundleCase) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        with pytest.raises(ExplorerError, match=f"cannot listen on 127.0.0.1:{port}") as caught:
            launch_explorer([explored.model.pte], [], port=port, open_browser=False, block=False)
        assert "--" not in str(caught.value)  # the library names no option; the command layer adds it:
        with pytest.raises(ExplorerError, match="cannot listen") as named, naming_port():
            launch_explorer([explored.model.pte], [], port=port, open_browser=False, block=False)
    assert named.value.hint is not None and "--port" in named.value.hint


def test_missing_or_wrong_inputs_are_clear_errors(explored: BundleCase, tmp_path: Path) -> None:
    with pytest.raises(ExplorerError, match=r"missing file.*nothing\.pte"):
        launch_explorer([tmp_path / "nothing.pte"], [], port=free_port(), block=False)
    with pytest.raises(ExplorerError, match=r"me_overlay_gone\.json"):
        launch_explorer([explored.model.pte], [tmp_path / "me_overlay_gone.json"], port=free_port(), block=False)
    with pytest.raises(UsageError, match=r"not a \.pt2 or \.pte"):
        launch_explorer([explored.path / "timings.json"], [], port=free_port(), block=False)
    with pytest.raises(UsageError, match="no model files"):
        launch_explorer([], [], port=free_port(), block=False)


def test_only_loopback_is_quiet(capsys: pytest.CaptureFixture[str]) -> None:
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("0.0.0.0") and not is_loopback("192.168.1.20")
    check_host("127.0.0.1")
    assert capsys.readouterr().err == ""
    check_host("0.0.0.0")
    err = capsys.readouterr().err
    assert "WARNING" in err and "anyone who can reach" in err and "0.0.0.0" in err


def test_ssh_sessions_get_a_tunnel_hint(
    explored: BundleCase, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("SSH_CONNECTION", "10.0.0.5 50022 10.0.0.9 22")
    monkeypatch.setenv("USER", "alice")
    port = free_port()
    handle = launch_explorer([explored.model.pte], [], port=port, open_browser=False, block=False)
    handle.stop()
    err = capsys.readouterr().err
    assert f"ssh -L {port}:127.0.0.1:{port} alice@10.0.0.9" in err
    assert handle.url in err.splitlines(), "the URL is printed on one line"


@pytest.mark.parametrize(
    ("index", "expected"),
    [
        ('{"pte": "m_xnnpack.pte"}', "m_xnnpack.pte"),
        ("[1, 2]", None),
        ('{"pte": ["m_xnnpack.pte"]}', None),
        ('{"pte": "../../secret/m.pte"}', None),
        ('{"pte": "m_xnnpack.pte\\u001b[2J"}', None),
        ("[" * 100000, None),
    ],
)
def test_overlay_index_from_a_bundle_is_untrusted(tmp_path: Path, index: str, expected: str | None) -> None:
    (tmp_path / "overlays.json").write_text(index)
    assert overlay_target(tmp_path / "me_overlay_median_ms.json") == expected


def test_short_url_opens_the_run_and_its_delegates_by_cost_and_a_one_node_delegate_is_painted(
    server: ExplorerHandle, explored: BundleCase, browser_page: Any, tmp_path: Path
) -> None:
    index = json.loads((explored.path / "model_explorer" / "overlays.json").read_text())
    run_id = index["run_id"]
    # The short local URL is the one printed; it redirects to Model Explorer's long one.
    assert server.short_url == f"http://127.0.0.1:{server.port}/run/{run_id}"
    assert len(server.short_url) < 80 < 1000 < len(server.url)
    page = browser_page
    response = page.goto(server.short_url)
    assert response.url == server.url and response.request.redirected_from.url == server.short_url
    wait_for_graph(page, server)  # as a user would: the run's page drawn (its conversions done) before the next
    # The delegates by cost (their calls' medians), the costliest first, each with its own short URL.
    costs: list[float] = []
    for delegate in server.delegates:
        assert delegate.median_ms is not None
        costs.append(delegate.median_ms)
    assert len(costs) > 2 and costs == sorted(costs, reverse=True)
    assert [d["median_ms"] for d in index["delegates"] if d["placed"]] == costs
    assert index["delegate_graphs"] == [d.graph for d in server.delegates]
    one = next(d for d in server.delegates if d.nodes == 1)
    assert page.goto(one.url).url == server.url_for(one.graph)
    wait_for_graph(page, server)
    shown = "text => document.body.innerText.includes(text)"
    page.wait_for_function(shown, arg=f"median_ms ({run_id})", timeout=60_000)
    # Model Explorer's node-data table: the one node's row, a cell per overlay, each with the colour it is painted
    # (a graph of one value has no range for the gradient: unpainted until etlab gives it its colour).
    # The last table holding values is "Node data" (above it: the aggregated and the root-level stats). Which
    # one-node delegate ranks first depends on the run's timings, so its operator is whichever XNN node it holds.
    rows = (
        "() => Array.from(document.querySelectorAll('table')).filter(t => t.querySelector('td.value-col'))"
        ".slice(-1).flatMap(t => Array.from(t.querySelectorAll('tr')))"
        ".filter(tr => tr.querySelector('td.value-col'))"
    )
    cells = f"() => ({rows})().flatMap(tr => Array.from(tr.querySelectorAll('td.value-col')))" + (
        ".map(td => getComputedStyle(td).backgroundColor)"
    )
    page.wait_for_function(f"({cells})().length >= 3", timeout=60_000)
    shown_rows = page.evaluate(f"() => ({rows})().map(tr => tr.innerText)")
    assert len(shown_rows) == 1 and "XNN" in shown_rows[0], shown_rows
    colours = page.evaluate(cells)
    assert colours and all(colour not in ("rgba(0, 0, 0, 0)", "transparent") for colour in colours), colours
    screenshot(page, tmp_path, "explore-one-node-delegate")
