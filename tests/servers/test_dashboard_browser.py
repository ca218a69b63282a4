"""The dashboard's pages in Chromium, on a small real lab (analysed runs of the tiny models, a nightly history):
every page loads without console errors, the plotted points are the history's and the bundle's values, the links
(overview → trend → run → compare → Model Explorer) work, board-controlled strings stay inert, and the static
export opens from file:// with every network request refused. The server without a browser:
test_dashboard_server.py."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from orchestrator.lab.history import History
from orchestrator.results.bundle_reader import read_bundle
from orchestrator.servers.dashboard import data
from orchestrator.servers.dashboard.app import DashboardServer, Sources, start_dashboard
from orchestrator.servers.dashboard.static import write_static
from tests.plugins.artifacts import ARTIFACT_CACHE
from tests.plugins.browser import SCREENSHOTS
from tests.plugins.dashboard import EVIL, EVIL_BOARD, LAB_BOARD, RUN_IDS, DashboardLab
from tests.plugins.explorer import free_port

if TYPE_CHECKING:
    from playwright.sync_api import ConsoleMessage, Dialog


@pytest.fixture(scope="module")
def server(dashboard_lab: DashboardLab) -> Iterator[DashboardServer]:
    sources = Sources(dashboard_lab.results, dashboard_lab.history_url, ARTIFACT_CACHE, (LAB_BOARD,))
    handle = start_dashboard(sources, port=free_port(), explorer_port=free_port())
    try:
        yield handle
    finally:
        handle.stop()


class Watched:
    """A page whose console errors, uncaught exceptions and dialogs (an injected alert()) are collected."""

    def __init__(self, page: Any) -> None:
        self.page = page
        self.problems: list[str] = []
        page.on("console", self._console)
        page.on("pageerror", lambda error: self.problems.append(f"uncaught: {error}"))
        page.on("dialog", self._dialog)

    def _console(self, message: ConsoleMessage) -> None:
        if message.type == "error":
            self.problems.append(message.text)

    def _dialog(self, dialog: Dialog) -> None:
        self.problems.append(f"dialog: {dialog.message}")
        dialog.dismiss()

    def open(self, url: str) -> Any:
        response = self.page.goto(url)
        self.page.wait_for_load_state("load")
        self.check()
        return response

    def check(self) -> None:
        """No errors so far, and no element any board string could have made."""
        assert not self.problems, self.problems
        injected = self.page.evaluate("document.querySelectorAll('img[src=x], script:not([src]):not([type])').length")
        assert injected == 0


@pytest.fixture
def watched(browser_page: Any) -> Watched:
    return Watched(browser_page)


def graph(page: Any, element: str) -> list[dict[str, Any]]:
    """The traces Plotly drew in `element`, as the page holds them."""
    page.wait_for_function(f"document.getElementById('{element}') && document.getElementById('{element}').data")
    return page.evaluate(f"document.getElementById('{element}').data")


def test_every_page_loads_clean_and_board_strings_are_inert(
    server: DashboardServer, dashboard_lab: DashboardLab, watched: Watched
) -> None:
    watched.open(server.url)
    assert EVIL_BOARD in watched.page.locator("#night-grid .board-name").all_inner_texts()  # shown as text
    for cell in dashboard_lab.cells:
        watched.open(server.url + f"trend/{data.cell_key(cell)}")
        assert graph(watched.page, "trend-latency")
    for run_id in RUN_IDS.values():
        watched.open(server.url + f"run/{run_id}")
        assert graph(watched.page, "run-latency")
        assert any(EVIL in text for text in watched.page.locator("#conditions .condition").all_inner_texts())
        advice = watched.page.locator("#advice").inner_text()
        assert (f"use 4 threads {EVIL}" in advice) == (run_id == RUN_IDS["distilbert_a"])
    watched.open(server.url + "compare")
    watched.open(server.url + f"compare?a={RUN_IDS['distilbert_a']}&b={RUN_IDS['distilbert_b']}")
    assert graph(watched.page, "compare-ops")
    # the table lists only operators whose own test found a change; the rest fold into one line a click away,
    # and the op-type roll-up adds every call up
    listed = watched.page.locator("#ops-table tr.op-row td:last-child").all_inner_texts()
    assert set(listed) <= {"slower", "faster"}
    folded = watched.page.locator("#ops-quiet tr.op-row td:last-child").all_text_contents()  # folded: hidden
    assert folded and set(folded) <= {"no change", "not tested", "insufficient data"}
    summary = watched.page.locator("#ops-quiet summary").inner_text()
    assert summary.startswith(f"{len(folded)} operators within noise")
    types = watched.page.locator("#op-types tr.op-type").all_inner_texts()
    assert types and all("×" in row for row in types)
    watched.page.screenshot(path=str(SCREENSHOTS / "dashboard-compare.png"), full_page=True)


def test_plotted_points_are_the_history_values(
    server: DashboardServer, dashboard_lab: DashboardLab, lab_history: History, watched: Watched
) -> None:
    cell = dashboard_lab.cells[0]
    stored = list(reversed(lab_history.records(cell=cell)))
    watched.open(server.url + f"trend/{data.cell_key(cell)}")
    median, p90, *marked = graph(watched.page, "trend-latency")
    assert median["x"] == [r.night for r in stored]
    assert median["y"] == [r.median_ms for r in stored]
    assert p90["y"] == [r.p90_ms for r in stored]
    flagged = [r for r in stored if r.verdict in ("regression", "improvement", "drift", "unconfirmed", "inconclusive")]
    # one trace per verdict, named by it (the legend names every marker)
    by_verdict = {trace["name"]: trace["x"] for trace in marked if trace["name"] in {r.verdict for r in flagged}}
    assert by_verdict == {v: [r.night for r in flagged if r.verdict == v] for v in {r.verdict for r in flagged}}
    (memory,) = graph(watched.page, "trend-memory")
    assert memory["y"] == [r.peak_rss_bytes / 1e6 for r in stored]  # type: ignore[operator]
    layout = watched.page.evaluate("document.getElementById('trend-latency').layout")
    lines = [s["x0"] for s in layout["shapes"] if s["type"] == "line"]
    changed = [b.night for a, b in itertools.pairwise(stored) if a.pte_sha256 != b.pte_sha256]
    assert lines == changed and len(changed) == 1
    (window,) = [s for s in layout["shapes"] if s["type"] == "rect"]
    # The latest night's baseline ends on the last night before it that may be one (an inconclusive one is not).
    assert window["x1"] == [r.night for r in stored[:-1] if r.verdict != "inconclusive"][-1]
    watched.check()


def test_links_from_the_overview_to_a_run_a_compare_and_model_explorer(
    server: DashboardServer, dashboard_lab: DashboardLab, watched: Watched
) -> None:
    page = watched.page
    watched.open(server.url)
    # The README's screenshots (docs/images/) are these two, copied from test-artifacts/ by hand.
    page.screenshot(path=str(SCREENSHOTS / "dashboard-overview.png"), full_page=True)
    real = data.cell_key(dashboard_lab.cells[0])
    page.locator(f"#night-grid a.cell-link[href='/trend/{real}']").click()
    page.wait_for_url(f"**/trend/{real}")
    page.locator("#trend-table a.run-link", has_text="2026-11-10").click()
    page.wait_for_url(f"**/run/{RUN_IDS['distilbert_b']}")
    watched.check()
    # Every iteration the board ran, in order: the warm-up first, then the timed ones.
    timings = read_bundle(dashboard_lab.runs["distilbert_b"]).timings
    timed, warmup = graph(page, "run-latency")
    assert timed["y"] == timings["iterations_ms"] and warmup["y"] == timings["warmup_ms"]
    assert page.locator("#operators table tbody tr").count() > 0
    page.screenshot(path=str(SCREENSHOTS / "dashboard-run.png"), full_page=True)
    page.locator("#compare-previous").click()
    page.wait_for_url("**/compare?*")
    watched.check()
    assert page.locator("#verdict").inner_text() in {"ok", "drift", "inconclusive", "unconfirmed"}
    assert page.locator("#ops-table tbody tr, #ops-quiet tbody tr").count() > 0  # changed, or folded within noise
    # Model Explorer opens in a new tab, started by the dashboard, on this run's programs and overlays.
    page.goto(server.url + f"run/{RUN_IDS['distilbert_b']}")
    with page.context.expect_page(timeout=180_000) as opened:
        page.locator("#open-explorer").click()
    explorer = opened.value
    explorer.wait_for_load_state("load", timeout=180_000)
    assert explorer.url.startswith(f"http://127.0.0.1:{server.app.explorer.port}/?data=")
    assert "me_overlay_" in explorer.url  # its overlays are loaded with it
    assert server.app.explorer.handle is not None and server.app.explorer.handle.running
    explorer.close()


def test_static_export_opens_from_file_with_no_network(
    dashboard_lab: DashboardLab, lab_history: History, tmp_path: Path, watched: Watched
) -> None:
    lab = data.Lab(dashboard_lab.results, lab_history)
    written = write_static(lab, tmp_path / "site")
    requested: list[str] = []

    def only_files(route: Any) -> None:
        requested.append(route.request.url)
        if route.request.url.startswith("file://"):
            route.continue_()
        else:
            route.abort()

    page = watched.page
    page.route("**/*", only_files)
    watched.open(written[0].as_uri())
    cell = data.cell_key(dashboard_lab.cells[0])
    page.locator(f"#night-grid a.cell-link[href='trend-{cell}.html']").click()
    page.wait_for_url(f"**/trend-{cell}.html")
    median = graph(page, "trend-latency")[0]
    assert median["y"] == [r.median_ms for r in reversed(lab_history.records(cell=dashboard_lab.cells[0]))]
    page.locator("#trend-table a.run-link", has_text="2026-11-10").click()
    page.wait_for_url(f"**/run-{RUN_IDS['distilbert_b']}.html")
    assert graph(page, "run-latency")[0]["x"]
    page.locator("#compare-previous").click()
    page.wait_for_url(f"**/compare-{RUN_IDS['distilbert_a']}--{RUN_IDS['distilbert_b']}.html")
    assert graph(page, "compare-ops")
    watched.check()
    assert requested and all(url.startswith("file://") for url in requested)
