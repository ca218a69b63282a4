"""`fab nightly`'s tables: tonight's cells against their baselines, language models, labgrid places, verdicts."""

from __future__ import annotations

from orchestrator import console
from orchestrator.commands.render import megabytes
from orchestrator.lab.night_report import NightReport
from orchestrator.lab.report_rows import GENERATION_HEADERS, GENERATION_KEYS, generation_rows, place_rows


def print_night(report: NightReport) -> None:
    rows = [
        [*item.cell, item.record.median_ms, item.baseline_median_ms, item.change,
         megabytes(item.record.peak_rss_bytes), item.verdict.value, item.record.validity]
        for item in report.verdicts
    ]  # fmt: skip
    console.table(
        f"Nightly {report.night}",
        ["board", "model", "backend", "median ms", "baseline ms", "change", "peak MB", "verdict", "validity"],
        rows,
        caption=f"exit code {report.exit_code}",
    )
    if any(item.record.generation for item in report.verdicts):
        console.table(
            "Generation",
            list(GENERATION_HEADERS),
            [[row[key] for key in GENERATION_KEYS] for row in generation_rows(report)],
            caption="language models: the median above is one whole generation",
            whole=["model", "prompt+new/ctx", "ids vs eager"],
        )
    if report.places:
        console.table(
            "labgrid places",
            ["board", "model", "backend", "place", "coordinator", "waited for the place"],
            [[*cell, place.place, place.coordinator, place.waited_text] for cell, place in place_rows(report)],
        )
    for item in report.regressions:
        console.error(f"REGRESSION {' / '.join(item.cell)}: {item.detail}")
    for item in report.warnings:
        console.warn(f"{item.verdict.value.upper()} {' / '.join(item.cell)}: {item.detail}")
    for item in report.failures:
        where = f"{' / '.join(item.cell)} at {item.record.stage}"
        console.error(f"{item.verdict.value.upper()} {where}: {item.record.error}")
    if report.lost_note:
        console.error(report.lost_note)
    for kind, path in report.outputs.items():
        console.info(console.escape(f"{kind}: {path}"))
