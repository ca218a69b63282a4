"""The nightly's reports tell the truth (issue 38), on two real nights of a language model on the local board
(tests/plugins/generation.py): the advisor's findings are recorded with each cell and shown, the trend plot puts
peak memory on its own axis from zero with every marker in its legend, bundles are links, a verdict is short with
its detail a click away, and medians carry the digits that explain their change."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from orchestrator.advice.documents import load_advice
from orchestrator.advice.findings import shown_findings
from orchestrator.lab.report import trend_figure
from tests.plugins.browser import screenshot
from tests.plugins.generation import GENERATION_NIGHTS, GenerationNights


def test_the_nightly_records_the_advisor_s_findings_with_each_cell(generation_nights: GenerationNights) -> None:
    for night, proc in generation_nights.outputs.items():
        assert proc.returncode == 0, f"{night}: {proc.stdout}{proc.stderr}"
    for record in generation_nights.records():
        assert record.bundle_path
        advice = load_advice(Path(record.bundle_path))
        assert advice is not None, f"{record.night}: no advice.json in {record.bundle_path}"
        assert advice.run_id == record.run_id


def test_the_report_s_trend_has_honest_axes_and_a_legend_for_every_marker(generation_nights: GenerationNights) -> None:
    records = sorted(generation_nights.records(), key=lambda r: r.night)
    cell = records[0].cell
    figure = trend_figure(cell, records, GENERATION_NIGHTS[-1])
    # no second y-axis sharing the latency's plot; energy and the roofline share, once measured, on axes of their own
    latency, memory, *measured = figure.axes
    assert {axis.get_ylabel() for axis in measured} <= {"mJ per token", "% of roofline"}
    assert memory.get_ylim()[0] == 0 and latency.get_ylim()[0] == 0
    peaks = [r.peak_rss_bytes / 1e6 for r in records if r.peak_rss_bytes]
    assert memory.get_ylim()[1] >= max(peaks)
    labels = [text.get_text() for text in latency.get_legend().get_texts()]
    assert {"median", "p10–p90", "tonight"} <= set(labels), labels
    if any(r.validity != "valid" for r in records):
        assert "degraded or invalid night" in labels
    drawn = [line for line in latency.get_lines() if not line.get_label().startswith("_")]
    assert {line.get_label() for line in drawn} <= set(labels), "every marker drawn is in the legend"


def test_the_html_report_is_short_with_details_a_click_away(
    generation_nights: GenerationNights, browser_page: Any, tmp_path: Path
) -> None:
    night = GENERATION_NIGHTS[-1]
    (record,) = [r for r in generation_nights.records() if r.night == night]
    page = browser_page
    page.goto((generation_nights.reports / f"nightly-{night}.html").as_uri())
    row = page.locator("#tonight tr").nth(1)
    # The median with three decimals (a change of a few tenths of a percent shows in its digits).
    assert record.median_ms is not None and f"{record.median_ms:,.3f}" in row.inner_text()
    # The bundle is a link to its folder.
    link = row.locator("a.bundle")
    assert link.get_attribute("href") == Path(record.bundle_path or "").as_uri()
    # The verdict is a word; why, a click away.
    verdict = row.locator("td.verdict")
    if verdict.locator("details").count():
        assert not verdict.locator("details small").is_visible()
        verdict.locator("summary").click()
        assert verdict.locator("details small").is_visible()
    # The advisor's findings are in the cell (a nightly records them), each a click away.
    findings = row.locator("td.findings")
    advice = load_advice(Path(record.bundle_path or ""))
    assert advice is not None
    if advice.findings:
        shown = shown_findings(advice)  # what an analysis prints, counted as listed (of how many, when not all)
        assert f"{len(shown)}{f' of {len(advice.findings)}' if len(shown) < len(advice.findings) else ''} finding" in (
            findings.inner_text()
        )
        findings.locator("summary").click()
        assert advice.findings[0].id in findings.locator("li").first.inner_text()
    else:
        assert findings.inner_text().strip() == "—"
    screenshot(page, tmp_path, "nightly-report")
