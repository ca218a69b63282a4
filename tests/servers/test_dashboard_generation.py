"""The dashboard on a language model's nights (two real nights of smollm2-gen-tiny on the local board,
tests/plugins/generation.py), in Chromium: the run page's Generation section shows the run's summary.json figures
(time to first token, decode speed, decode step latency, token agreement and first divergence), the overview's grid
and the trend show decode tokens/s for the cell, and the compare page the generation ratios. The other pages:
test_dashboard_browser.py."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from orchestrator.console import format_bytes
from orchestrator.lab.run_record import RunRecord
from orchestrator.results.documents import load_summary
from orchestrator.servers.dashboard import data
from orchestrator.servers.dashboard.app import DashboardServer, Sources, start_dashboard
from tests.plugins.browser import SCREENSHOTS
from tests.plugins.explorer import free_port
from tests.plugins.generation import GENERATION_MODEL, GenerationNights
from tests.servers.test_dashboard_browser import Watched, graph


@pytest.fixture(scope="module")
def server(generation_nights: GenerationNights) -> Iterator[DashboardServer]:
    sources = Sources(generation_nights.results, generation_nights.history_url, generation_nights.root / "artifacts",
                      ("local",))  # fmt: skip
    handle = start_dashboard(sources, port=free_port(), explorer_port=free_port())
    try:
        yield handle
    finally:
        handle.stop()


@pytest.fixture
def watched(browser_page: Any) -> Watched:
    return Watched(browser_page)


def latest(nights: GenerationNights) -> RunRecord:
    record = nights.records()[0]  # newest night first
    assert record.generation is not None and record.bundle_path
    return record


def test_the_run_page_shows_the_generation_figures(
    server: DashboardServer, generation_nights: GenerationNights, watched: Watched
) -> None:
    record = latest(generation_nights)
    generation = load_summary(Path(str(record.bundle_path))).generation
    assert generation is not None and generation.ttft_ms and generation.decode_tokens_per_s
    watched.open(server.url + f"run/{record.run_id}")
    page = watched.page
    section = page.locator("#generation")
    assert section.count() == 1
    assert page.locator("#generation-ttft").inner_text() == f"{generation.ttft_ms:.2f} ms"
    assert page.locator("#generation-decode").inner_text() == f"{generation.decode_tokens_per_s:.1f} tokens/s"
    assert page.locator("#generation-ids").inner_text() == "100 % agreement over 8 tokens · no divergence"
    text = section.inner_text()
    steps = " / ".join(f"{generation.token_ms[key]:.2f} ms" for key in ("median", "p90", "max"))
    assert steps in text and "a prompt of 8 tokens, then 8 new ones" in text
    # 32 kB, never rounded to "0.0 MB" (a peak RSS of "10.0 MB" is no such figure)
    assert format_bytes(generation.kv_cache_bytes or 0) in text and not re.search(r"(?<![\d.])0\.0 MB", text)
    assert "Top operators (one decode step)" in page.locator("#operators h2").inner_text()
    page.screenshot(path=str(SCREENSHOTS / "dashboard-generation-run.png"), full_page=True)
    watched.check()


def test_the_overview_and_the_trend_show_decode_speed(
    server: DashboardServer, generation_nights: GenerationNights, watched: Watched
) -> None:
    record = latest(generation_nights)
    decode = f"{record.generation.decode_tokens_per_s:.1f} tok/s"  # type: ignore[union-attr]
    page = watched.page
    watched.open(server.url)
    key = data.cell_key(record.cell)
    cell = page.locator(f"#night-grid a.cell-link[href='/trend/{key}']")
    assert decode in cell.inner_text() and " ms" not in cell.inner_text()
    cell.click()
    page.wait_for_url(f"**/trend/{key}")
    watched.check()
    headers = page.locator("#trend-table thead th").all_inner_texts()
    assert "decode tok/s" in headers and "TTFT" in headers
    shown = page.locator("#trend-table tbody td.decode").all_inner_texts()
    stored = generation_nights.records()
    assert shown == [f"{r.generation.decode_tokens_per_s:.1f}" for r in stored]  # type: ignore[union-attr]
    assert all(r.model == GENERATION_MODEL for r in stored)
    (plotted,) = graph(page, "trend-decode")
    oldest_first = list(reversed(stored))
    assert plotted["x"] == [r.night for r in oldest_first]
    assert plotted["y"] == [r.generation.decode_tokens_per_s for r in oldest_first]  # type: ignore[union-attr]


def test_the_compare_page_shows_the_generation_ratios(
    server: DashboardServer, generation_nights: GenerationNights, watched: Watched
) -> None:
    newer, older = generation_nights.records()
    watched.open(server.url + f"compare?a={older.run_id}&b={newer.run_id}")
    page = watched.page
    rows = page.locator("#generation-compare tbody tr").all_inner_texts()
    assert [row.split("\t")[0] for row in rows] == [
        "time to first token ms", "decode tokens/s", "decode step median ms",
    ]  # fmt: skip
    a, b = older.generation, newer.generation
    assert a is not None and b is not None and a.decode_tokens_per_s and b.decode_tokens_per_s
    assert rows[1].split("\t")[1:] == [
        f"{a.decode_tokens_per_s:.2f}", f"{b.decode_tokens_per_s:.2f}",
        f"{b.decode_tokens_per_s / a.decode_tokens_per_s:.3f}×",
    ]  # fmt: skip
    assert "one decode step" in page.locator("body").inner_text()
    watched.check()
