"""The dashboard's pages tell the truth (issue 38), looked at in Chromium on the small real lab of
tests/plugins/dashboard.py: the run page plots every iteration in order with the distribution beside it, says the
board's conditions in words and sums its operators by type; the overview's pulled runs carry what tells them apart,
with filters; the compare picker filters and never defaults both sides to one run; the trend page's axes start at
zero and its legend names every marker. Full-page screenshots of each go to the test's tmp dir (and
$ETLAB_SCREENSHOTS)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from orchestrator.lab.history import History
from orchestrator.results.bundle_reader import read_bundle
from orchestrator.results.ops_record import load_ops
from orchestrator.servers.dashboard import data
from orchestrator.servers.dashboard.app import DashboardServer, Sources, start_dashboard
from tests.plugins.artifacts import ARTIFACT_CACHE
from tests.plugins.browser import screenshot
from tests.plugins.dashboard import EVIL, LAB_BOARD, NIGHTS, RUN_IDS, DashboardLab, write_history
from tests.plugins.explorer import free_port
from tests.servers.test_dashboard_browser import Watched, graph


@pytest.fixture(scope="module")
def server(dashboard_lab: DashboardLab) -> Iterator[DashboardServer]:
    sources = Sources(dashboard_lab.results, dashboard_lab.history_url, ARTIFACT_CACHE, (LAB_BOARD,))
    handle = start_dashboard(sources, port=free_port(), explorer_port=free_port())
    try:
        yield handle
    finally:
        handle.stop()


@pytest.fixture
def watched(browser_page: Any) -> Watched:
    return Watched(browser_page)


def test_run_page_plots_every_iteration_in_order_says_conditions_in_words_and_sums_operators_by_type(
    server: DashboardServer, dashboard_lab: DashboardLab, watched: Watched, tmp_path: Path
) -> None:
    page = watched.page
    run = dashboard_lab.runs["distilbert_b"]
    timings = read_bundle(run).timings
    warm, timed = timings["warmup_ms"], timings["iterations_ms"]
    watched.open(server.url + f"run/{RUN_IDS['distilbert_b']}")
    # One bar per iteration, in the order the board ran them: the warm-up first, marked as its own trace.
    timed_trace, warm_trace = graph(page, "run-latency")
    assert timed_trace["type"] == warm_trace["type"] == "bar"
    assert warm_trace["x"] == list(range(1, len(warm) + 1)) and warm_trace["y"] == warm
    assert timed_trace["x"] == list(range(len(warm) + 1, len(warm) + len(timed) + 1)) and timed_trace["y"] == timed
    traces = "Array.from(document.querySelectorAll('#run-latency .barlayer .trace'))"
    bars = page.evaluate(f"{traces}.map(t => t.querySelectorAll('.point').length)")
    assert sorted(bars) == sorted([len(timed), len(warm)]), bars
    # The y-range is the timed iterations', from zero: a slow warm-up cannot squash them.
    y_range = page.evaluate("document.getElementById('run-latency').layout.yaxis.range")
    assert y_range[0] == 0 and max(timed) <= y_range[1] <= max(timed) * 1.2
    # Beside it, the timed iterations' distribution (no warm-up in it).
    (distribution,) = graph(page, "run-distribution")
    assert distribution["type"] == "histogram" and distribution["x"] == timed
    # Board conditions in sentences; the raw keys only a click away.
    said = page.locator("#conditions-said li").all_inner_texts()
    assert any(s.startswith("CPU governor:") for s in said) and any(s.startswith("Temperature:") for s in said), said
    assert not any("_before" in s or "_after" in s for s in said)
    assert (
        page.locator("#conditions details").count() == 1 and not page.locator("#conditions details table").is_visible()
    )
    # Operators by type: every row of ops.json summed by its operator.
    types = page.locator("#operator-types tr.operator-type")
    assert types.count() > 0
    ops = load_ops(run)
    fully_connected = [n for d in ops.delegates for n in d.nodes if n.type == "XNNFullyConnected" and n.mean_ms > 0]
    row = page.locator("#operator-types tr.operator-type", has_text="XNNFullyConnected").first
    assert f"×{len(fully_connected)}" in row.inner_text()
    watched.check()
    screenshot(page, tmp_path, "dashboard-run")


@pytest.fixture(scope="module")
def advised_server(dashboard_lab: DashboardLab, tmp_path_factory: pytest.TempPathFactory) -> Iterator[DashboardServer]:
    """The lab's runs with a history of two cells: a model as exported and its advised program (its rewrites'
    name), the exported cell's latest night the pulled run that has the advisor's findings."""
    root = tmp_path_factory.mktemp("advised-lab")
    exported = (LAB_BOARD, "distilbert-tiny", "xnnpack")
    advised = (LAB_BOARD, "distilbert-tiny.fold-weight-norm", "xnnpack")
    named = {(exported, NIGHTS - 1): RUN_IDS["distilbert_a"]}
    write_history(root / "history.sqlite", [exported, advised], NIGHTS, run_ids=named).close()
    sources = Sources(dashboard_lab.results, f"sqlite:///{root / 'history.sqlite'}", ARTIFACT_CACHE, (LAB_BOARD,))
    handle = start_dashboard(sources, port=free_port(), explorer_port=free_port())
    try:
        yield handle
    finally:
        handle.stop()


def test_overview_lists_pulled_runs_with_what_tells_them_apart_and_filters_them(
    server: DashboardServer, dashboard_lab: DashboardLab, watched: Watched, tmp_path: Path
) -> None:
    page = watched.page
    watched.open(server.url)
    rows = page.locator("#runs-table tr.pulled-run")
    assert rows.count() == len(RUN_IDS)
    header = page.locator("#runs-table thead").inner_text()
    for column in ("date", "night", "model", "backend", "median", "validity"):
        assert column in header
    newest = rows.first.inner_text()  # newest first: the gpt2 run of night 2026-11-10
    assert RUN_IDS["gpt2"] in newest and "2026-11-10" in newest and "gpt2-tiny" in newest
    median = data.pulled_runs(data.Lab(dashboard_lab.results))[0].median_ms
    assert median is not None and f"{median:.3f} ms" in newest
    # Filters: by model, then by night.
    page.select_option("#runs-filters select[data-field='model']", "distilbert-tiny")
    shown = [row for row in rows.all() if row.is_visible()]
    assert len(shown) == 2 and all("distilbert-tiny" in row.inner_text() for row in shown)
    page.select_option("#runs-filters select[data-field='night']", "2026-11-09")
    shown = [row for row in rows.all() if row.is_visible()]
    assert len(shown) == 1 and RUN_IDS["distilbert_a"] in shown[0].inner_text()
    watched.check()
    screenshot(page, tmp_path, "dashboard-overview")


def test_overview_shows_an_advised_program_s_ratio_and_a_cell_s_findings(
    advised_server: DashboardServer, watched: Watched, tmp_path: Path
) -> None:
    page = watched.page
    watched.open(advised_server.url)
    # The latest night: as exported 10 + 0.5 × 9 ms, advised 11 + 0.5 × 9 ms.
    ratio = page.locator("#night-grid .advised-ratio")
    assert ratio.count() == 1 and ratio.inner_text() == f"{15.5 / 14.5:.3f}× as exported"
    findings = page.locator("#night-grid details.findings")
    assert findings.count() == 1 and "1 finding" in findings.inner_text()
    findings.locator("summary").click()
    assert f"use 4 threads {EVIL}" in findings.locator("li").inner_text()
    watched.check()
    screenshot(page, tmp_path, "dashboard-overview-advised")


def test_compare_picker_filters_and_never_defaults_both_sides_to_one_run(
    server: DashboardServer, watched: Watched, tmp_path: Path
) -> None:
    page = watched.page
    watched.open(server.url + "compare")
    a, b = page.locator("#pick-a").input_value(), page.locator("#pick-b").input_value()
    # The newest run, against the run before it of its own cell (or else the next newest).
    assert a != b and b == RUN_IDS["gpt2"] and a == RUN_IDS["distilbert_b"]
    page.select_option("#pick-filters select[data-field='model']", "distilbert-tiny")
    a, b = page.locator("#pick-a").input_value(), page.locator("#pick-b").input_value()
    assert {a, b} == {RUN_IDS["distilbert_a"], RUN_IDS["distilbert_b"]}
    visible = page.evaluate("Array.from(document.querySelectorAll('#pick-b option')).filter(o => !o.hidden).length")
    assert visible == 2
    page.fill("#pick-filters input[data-op='from']", "2026-11-10")
    visible = page.evaluate(
        "Array.from(document.querySelectorAll('#pick-a option')).filter(o => !o.hidden).map(o => o.value)"
    )
    assert visible == [RUN_IDS["distilbert_b"]]
    page.fill("#pick-filters input[data-op='from']", "")
    page.select_option("#pick-a", RUN_IDS["distilbert_a"])
    page.select_option("#pick-b", RUN_IDS["distilbert_b"])
    page.locator("#pick button[type=submit]").click()
    page.wait_for_url("**/compare?*")
    assert page.locator("#verdict").count() == 1
    watched.check()
    screenshot(page, tmp_path, "dashboard-compare")


def test_trend_axes_start_at_zero_and_the_legend_names_every_marker(
    server: DashboardServer, dashboard_lab: DashboardLab, lab_history: History, watched: Watched, tmp_path: Path
) -> None:
    page = watched.page
    cell = dashboard_lab.cells[0]
    stored = lab_history.records(cell=cell)
    watched.open(server.url + f"trend/{data.cell_key(cell)}")
    for plot in ("trend-latency", "trend-memory"):
        graph(page, plot)
        low, high = page.evaluate(f"document.getElementById('{plot}')._fullLayout.yaxis.range")
        assert low == 0 and high > 0, plot
    # The memory axis spans its values from zero: 100–109 MB nights are not drawn as a cliff.
    peaks = [r.peak_rss_bytes / 1e6 for r in stored if r.peak_rss_bytes]
    assert page.evaluate("document.getElementById('trend-memory')._fullLayout.yaxis.range")[1] >= max(peaks)
    # Every marker drawn is named in the legend: each verdict that marks a night, the program lines, the baseline.
    legend = set(
        page.evaluate("Array.from(document.querySelectorAll('#trend-latency .legendtext')).map(t => t.textContent)")
    )
    marked = {r.verdict for r in stored} & {"regression", "improvement", "drift", "unconfirmed", "inconclusive"}
    assert marked and marked | {"median", "p90", "new program (.pte)", "baseline window"} <= legend, legend
    # A short verdict; its detail a click away; the medians with the digits that explain a change.
    assert page.locator("#latest-detail").count() == 1 and not page.locator("#latest-detail p").is_visible()
    latest = max(stored, key=lambda r: r.night)
    assert f"{latest.median_ms:.4f} ms" in page.locator("#latest-verdict").inner_text()
    watched.check()
    screenshot(page, tmp_path, "dashboard-trend")
