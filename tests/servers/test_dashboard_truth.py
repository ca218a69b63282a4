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

from orchestrator.results.bundle_reader import read_bundle
from orchestrator.results.ops_record import load_ops
from orchestrator.servers.dashboard.app import DashboardServer, Sources, start_dashboard
from tests.plugins.artifacts import ARTIFACT_CACHE
from tests.plugins.browser import screenshot
from tests.plugins.dashboard import LAB_BOARD, RUN_IDS, DashboardLab
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
