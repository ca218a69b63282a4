"""Nightly reports: an HTML page with latency trend plots, a markdown summary, and JUnit XML for CI.

Plots are rendered with matplotlib (Agg) to PNG and embedded as data URIs, so the report is one
self-contained file that can be mailed or archived. What they report is night_report.py's NightReport; the rows they
share with the terminal's table are report_rows.py's; whose reports a folder holds, reports_folder.py's.
"""

from __future__ import annotations

import base64
import html
import io
import math
import xml.etree.ElementTree as ET
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from orchestrator.advice.documents import finding_lines
from orchestrator.fsutil import atomic_write_text
from orchestrator.lab.night_report import NightReport, label
from orchestrator.lab.report_rows import (
    ADVISED_KEYS,
    GENERATION_HEADERS,
    GENERATION_KEYS,
    HEALTH_KEYS,
    advised_rows,
    board_health,
    figure,
    generation_rows,
    peak_mb,
    place_rows,
    retest_text,
)
from orchestrator.lab.run_record import RunRecord, host_name
from orchestrator.results.verdicts import Kind


def trend_figure(cell: tuple[str, str, str], records: Sequence[RunRecord], night: str) -> Any:
    """Median latency per night with the p10-p90 band, and below it, each on its own axis from zero, peak memory per
    night (a second axis beside the latency spanned only its own few kilobytes and made them look dramatic), then,
    once some night measured them, energy (J per inference; a language model's mJ per generated token) and a
    language model's decode share of its board's memory roofline: a night that did not measure one is a gap, never
    0. Every marker is in a legend: tonight's ring, a degraded or invalid night's cross, a failed night's dashed
    line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    ok = [r for r in records if r.status == "ok" and r.latencies_ms]
    with_memory = [(r.night, r.peak_rss_bytes) for r in ok if r.peak_rss_bytes]
    panels = [panel for panel in _measured_panels(ok) if any(value is not None for value in panel[2])]
    rows = 1 + bool(with_memory) + len(panels)
    fig, axes = plt.subplots(rows, 1, figsize=(7.5, 2.8 + 1.6 * (rows - 1)), dpi=110, sharex=True, squeeze=False,
                             gridspec_kw={"height_ratios": [2] + [1] * (rows - 1)})  # fmt: skip
    ax = axes[0][0]
    if ok:
        xs = [r.night for r in ok]
        medians = [float(np.median(r.latencies_ms)) for r in ok]
        low = [float(np.percentile(r.latencies_ms, 10)) for r in ok]
        high = [float(np.percentile(r.latencies_ms, 90)) for r in ok]
        ax.fill_between(xs, low, high, color="#9ecae1", alpha=0.5, label="p10–p90")
        ax.plot(xs, medians, marker="o", color="#08519c", label="median")
        flagged = [(x, y) for record, x, y in zip(ok, xs, medians, strict=True) if record.validity != "valid"]
        if flagged:
            ax.plot(*zip(*flagged, strict=True), linestyle="none", marker="x", color="#e6550d", markersize=10,
                    label="degraded or invalid night")  # fmt: skip
        tonight = [(x, y) for record, x, y in zip(ok, xs, medians, strict=True) if record.night == night]
        if tonight:
            ax.plot(*zip(*tonight, strict=True), linestyle="none", marker="o", color="#de2d26", markersize=9,
                    fillstyle="none", label="tonight")  # fmt: skip
    failed = [record for record in records if record.status != "ok"]
    for k, record in enumerate(failed):
        # on this categorical axis a night's label is its x
        ax.axvline(record.night, color="#de2d26", alpha=0.3, linestyle="--", label="failed night" if k == 0 else None)
    ax.set_title(label(cell), fontsize=10)
    ax.set_ylabel("latency (ms)")
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    if ok or failed:
        ax.legend(fontsize=7, loc="lower left", ncol=3)
    if with_memory:
        memory_ax = axes[1][0]
        memory_ax.plot([when for when, _ in with_memory], [peak / 1e6 for _, peak in with_memory],
                       marker="s", color="#756bb1", label="peak memory")  # fmt: skip
        memory_ax.set_ylim(bottom=0, top=max(peak for _, peak in with_memory) / 1e6 * 1.15)
        memory_ax.set_ylabel("peak MB")
        memory_ax.grid(alpha=0.3)
        memory_ax.legend(fontsize=7, loc="lower left")
    for row, (name, unit, values, colour) in enumerate(panels, start=1 + bool(with_memory)):
        panel_ax = axes[row][0]
        ys = [math.nan if value is None else value for value in values]  # not measured: a gap in the line
        panel_ax.plot([r.night for r in ok], ys, marker="D", color=colour, label=name)
        panel_ax.set_ylim(bottom=0, top=max(value for value in values if value is not None) * 1.15 or 1)
        panel_ax.set_ylabel(unit)
        panel_ax.grid(alpha=0.3)
        panel_ax.legend(fontsize=7, loc="lower left")
    axes[-1][0].tick_params(axis="x", labelrotation=30, labelsize=8)
    fig.tight_layout()
    return fig


def _measured_panels(ok: Sequence[RunRecord]) -> list[tuple[str, str, list[float | None], str]]:
    """The trend's energy and roofline panels (name, unit, a value or None per night, colour)."""
    if not any(r.generation is not None for r in ok):
        return [("energy per inference", "J per inference", [r.joules_per_inference for r in ok], "#31a354")]
    return [
        ("energy per generated token", "mJ per token", [r.mj_per_token for r in ok], "#31a354"),
        ("decode share of the memory roofline", "% of roofline",
         [None if r.roofline_share is None else r.roofline_share * 100 for r in ok], "#e6550d"),
    ]  # fmt: skip


def trend_png(cell: tuple[str, str, str], records: Sequence[RunRecord], night: str) -> bytes:
    """The trend figure as a PNG (embedded in the report as a data URI)."""
    import matplotlib.pyplot as plt

    fig = trend_figure(cell, records, night)
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png")
    plt.close(fig)
    return buffer.getvalue()


_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:2rem;color:#222;max-width:1100px}
h1{font-size:1.5rem} h2{font-size:1.2rem;margin-top:2rem;border-bottom:1px solid #ddd}
table{border-collapse:collapse;margin:.5rem 0;font-size:.9rem} th,td{border:1px solid #ddd;padding:.3rem .6rem}
th{background:#f5f5f5;text-align:left} td.num{text-align:right;font-variant-numeric:tabular-nums}
.regression{color:#b30000;font-weight:600} .improvement{color:#006d2c} .failed,.infra{color:#b30000}
.drift,.unconfirmed,.inconclusive{color:#a35200}
.badge{display:inline-block;padding:.1rem .5rem;border-radius:.6rem;font-size:.85rem;background:#eee}
figure{margin:1rem 0} img.trend{max-width:100%;border:1px solid #eee}
"""


def _count(number: int, noun: str, css: str) -> str:
    """Counts of bad things are red only when there are some."""
    return f"<span class='{css}'>{number} {noun}</span>" if number else f"{number} {noun}"


def _details(short: str, detail: str) -> str:
    """A short word, its detail a click away."""
    if not detail:
        return html.escape(short)
    return f"<details><summary>{html.escape(short)}</summary><small>{html.escape(detail)}</small></details>"


def _bundle_link(bundle: str | None, host: str | None = None) -> str:
    """A recorded run's bundle: a link to its folder (file://) when the path is absolute and on this host, else the
    text, with the lab host that holds it."""
    if not bundle:
        return "—"
    path = Path(bundle)
    name = html.escape(path.name or bundle)
    if host and host != host_name():
        return f"<code title='{html.escape(bundle)}'>{name}</code> on {html.escape(host)}"
    if not path.is_absolute():
        return f"<code>{html.escape(bundle)}</code>"
    return f"<a class='bundle' href='{html.escape(path.as_uri())}' title='{html.escape(bundle)}'>{name}</a>"


def _findings_html(bundle: str | None) -> str:
    """The advisor's findings for tonight's run of a cell: how many, each a click away."""
    found = finding_lines(bundle)
    if not found.lines:
        return "—"
    items = "".join(f"<li>{html.escape(line)}</li>" for line in found.lines)
    if found.more:
        items += f"<li class='more'>{html.escape(found.more)}</li>"
    return f"<details><summary>{html.escape(found.said)}</summary><ul>{items}</ul></details>"


def _html_section(title: str, table_id: str, headers: Sequence[str], rows: list[str]) -> list[str]:
    """A report section: its heading, then "None." or a table of the ready-made <tr> rows."""
    if not rows:
        return [f"<h2>{title}</h2>", "<p>None.</p>"]
    head = "".join(f"<th>{header}</th>" for header in headers)
    return [f"<h2>{title}</h2>", f"<table id='{table_id}'><tr>{head}</tr>", *rows, "</table>"]


def render_html(report: NightReport) -> str:
    parts = [
        "<!doctype html><html><head><meta charset='utf-8'>",
        f"<title>etlab nightly {html.escape(report.night)}</title><style>{_CSS}</style></head><body>",
        f"<h1>etlab nightly — {html.escape(report.night)}</h1>",
        f"<p><span class='badge'>exit code {report.exit_code}</span> "
        f"{len(report.verdicts)} cells run, {len(report.skipped)} already recorded, "
        f"{_count(len(report.regressions), 'regressions', 'regression')}, "
        f"{_count(len(report.warnings), 'warnings (drift, unconfirmed, inconclusive)', 'drift')}, "
        f"{_count(len(report.failures), 'failures', 'failed')}</p>",
        f"<p id='lost' class='failed'>{html.escape(report.lost_note)}</p>" if report.lost_note else "",
        f"<p id='pending' class='failed'>{html.escape(report.pending_note)}</p>" if report.pending_note else "",
        f"<p id='left-behind' class='failed'>{html.escape(report.left_behind_note)}</p>"
        if report.left_behind_note
        else "",
        "<h2>Tonight</h2><table id='tonight'><tr><th>board</th><th>model</th><th>backend</th><th>median ms</th>"
        "<th>baseline ms</th><th>change</th><th>peak MB</th><th>verdict</th><th>validity</th><th>findings</th>"
        "<th>bundle</th></tr>",
    ]
    for item in report.verdicts:
        record = item.record
        change = item.change or "—"
        parts.append(
            f"<tr><td>{html.escape(record.board)}</td><td>{html.escape(record.model)}</td>"
            f"<td>{html.escape(record.backend)}</td><td class='num'>{figure(record.median_ms, digits=3)}</td>"
            f"<td class='num'>{figure(item.baseline_median_ms, digits=3)}</td><td class='num'>{change}</td>"
            f"<td class='num'>{figure(peak_mb(record), digits=3)}</td>"
            f"<td class='verdict {html.escape(item.verdict.replace(' ', '-'))}'>"
            f"{_details(item.verdict, item.detail)}</td>"
            f"<td>{_details(record.validity, ', '.join(record.reasons))}</td>"
            f"<td class='findings'>{_findings_html(record.bundle_path)}</td>"
            f"<td>{_bundle_link(record.bundle_path, record.host)}</td></tr>"
        )
    parts.append("</table>")

    generation = generation_rows(report)
    if generation:
        parts.append(
            "<h2>Generation</h2><p>Language models: time to first token (the prefill), decode speed and the decode "
            "step's latency; ids: the generated tokens against eager greedy generation.</p>"
        )
        parts.append("<table id='generation'><tr>" + "".join(f"<th>{h}</th>" for h in GENERATION_HEADERS) + "</tr>")
        for row in generation:
            parts.append("<tr>" + "".join(f"<td>{html.escape(row[key])}</td>" for key in GENERATION_KEYS) + "</tr>")
        parts.append("</table>")

    parts.append("<h2>Regressions</h2>")
    if not report.regressions:
        parts.append("<p>None.</p>")
    for item in report.regressions:
        parts.append(f"<h3 class='regression'>{html.escape(label(item.cell))}</h3><p>{html.escape(item.detail)}</p>")
        if item.slower_ops:
            parts.append(
                "<table class='ops'><tr><th>operator</th><th>baseline ms</th><th>tonight ms</th><th>Δ ms</th></tr>"
            )
            for op in item.slower_ops:
                parts.append(
                    f"<tr><td>{html.escape(op['op'])}</td><td class='num'>{op['baseline_ms']:.3f}</td>"
                    f"<td class='num'>{op['current_ms']:.3f}</td><td class='num'>{op['delta_ms']:+.3f}</td></tr>"
                )
            parts.append("</table>")

    warnings = [
        f"<tr><td>{html.escape(label(item.cell))}</td><td class='{item.verdict.value}'>{item.verdict.value}"
        f"</td><td>{html.escape(item.detail)}</td><td>{html.escape(retest_text(item))}</td></tr>"
        for item in report.warnings
    ]
    parts += _html_section("Warnings", "warnings", ("cell", "verdict", "why", "re-test"), warnings)

    advised = advised_rows(report)
    if advised:
        parts.append("<h2>Advised programs</h2><p>Each model as exported and with the rewrites etlab advises, "
                     "tonight's medians side by side (ratio: advised / as exported).</p>")  # fmt: skip
        parts.append("<table id='advised'><tr>" + "".join(f"<th>{key.replace('_', ' ')}</th>" for key in ADVISED_KEYS)
                     + "</tr>")  # fmt: skip
        for row in advised:
            parts.append("<tr>" + "".join(f"<td>{html.escape(row[key])}</td>" for key in ADVISED_KEYS) + "</tr>")
        parts.append("</table>")

    parts.append("<h2>Board health</h2>")
    parts.append(
        "<p>Drift: tonight's median against the baseline's, for cells whose program did not change "
        "(so the change is the board's).</p>"
    )
    parts.append(
        "<table id='board-health'><tr><th>board</th><th>night</th><th>cells</th><th>drift</th><th>degraded</th>"
        "<th>max °C</th><th>governor</th><th>throttling</th></tr>"
    )
    for row in board_health(report):
        parts.append("<tr>" + "".join(f"<td>{html.escape(str(row[key]))}</td>" for key in HEALTH_KEYS) + "</tr>")
    parts.append("</table>")

    failures = [
        f"<tr><td>{html.escape(label(item.cell))}</td><td class='{item.verdict}'>{item.verdict}</td>"
        f"<td>{html.escape(item.record.stage or '—')}</td><td>{html.escape(item.record.error or '')}</td></tr>"
        for item in report.failures
    ]
    parts += _html_section("Failures", "failures", ("cell", "kind", "stage", "reason"), failures)

    if report.places:
        parts.append("<h2>Labgrid places</h2>")
        parts.append(
            "<table id='places'><tr><th>cell</th><th>place</th><th>coordinator</th><th>waited for the place</th></tr>"
        )
        for cell, place in place_rows(report):
            parts.append(
                f"<tr><td>{html.escape(label(cell))}</td><td>{html.escape(place.place)}</td>"
                f"<td>{html.escape(place.coordinator)}</td><td>{html.escape(place.waited_text)}</td></tr>"
            )
        parts.append("</table>")

    parts.append("<h2>Latency trends</h2>")
    parts.append("<p>Below each cell's latency, on axes of their own from zero: peak memory and, once a night "
                 "measured them, energy and a language model's decode share of its board's memory roofline; a night "
                 "that did not measure them is a gap.</p>")  # fmt: skip
    for cell, records in sorted(report.history.items()):
        png = base64.b64encode(trend_png(cell, records, report.night)).decode()
        parts.append(
            f"<figure><img class='trend' alt='latency trend {html.escape(label(cell))}' "
            f"src='data:image/png;base64,{png}'><figcaption>{html.escape(label(cell))}</figcaption></figure>"
        )
    parts.append("</body></html>")
    return "\n".join(parts)


def render_markdown(report: NightReport) -> str:
    lines = [
        f"# etlab nightly {report.night}",
        "",
        f"Exit code {report.exit_code}: {len(report.verdicts)} cells run, {len(report.regressions)} regressions, "
        f"{len(report.warnings)} warnings, {len(report.failures)} failures, {len(report.skipped)} already recorded.",
        "",
        *([f"**Scheduler lost**: {report.lost_note}", ""] if report.lost_note else []),
        *([f"**Not recorded**: {report.pending_note}", ""] if report.pending_note else []),
        *([f"**Still pending**: {report.left_behind_note}", ""] if report.left_behind_note else []),
        "| board | model | backend | median ms | baseline ms | change | peak MB | verdict | validity |",
        "|---|---|---|---:|---:|---:|---:|---|---|",
    ]
    for item in report.verdicts:
        r = item.record
        change = item.change or "—"
        lines.append(
            f"| {r.board} | {r.model} | {r.backend} | {figure(r.median_ms, digits=3)} | "
            f"{figure(item.baseline_median_ms, digits=3)} | {change} | {figure(peak_mb(r), digits=3)} | "
            f"{item.verdict} | {r.validity} |"
        )
    generation = generation_rows(report)
    if generation:
        lines += ["", "## Generation", "", "| " + " | ".join(GENERATION_HEADERS) + " |",
                  "|---|---|---|---|" + "---:|" * (len(GENERATION_HEADERS) - 5) + "---|"]  # fmt: skip
        lines += ["| " + " | ".join(row[key] for key in GENERATION_KEYS) + " |" for row in generation]
    for item in report.regressions:
        lines += ["", f"## Regression: {label(item.cell)}", "", item.detail]
        if item.slower_ops:
            lines += ["", "| operator | baseline ms | tonight ms | Δ ms |", "|---|---:|---:|---:|"]
            lines += [
                f"| {op['op']} | {op['baseline_ms']:.3f} | {op['current_ms']:.3f} | {op['delta_ms']:+.3f} |"
                for op in item.slower_ops
            ]
    if report.warnings:
        lines += ["", "## Warnings", ""]
        lines += [
            f"- {label(i.cell)}: **{i.verdict.value}**: {i.detail} (re-test: {retest_text(i)})" for i in report.warnings
        ]
    advised = advised_rows(report)
    if advised:
        lines += ["", "## Advised programs", "", "| " + " | ".join(k.replace("_", " ") for k in ADVISED_KEYS) + " |",
                  "|" + "---|" * len(ADVISED_KEYS)]  # fmt: skip
        lines += ["| " + " | ".join(row[key] for key in ADVISED_KEYS) + " |" for row in advised]
    lines += ["", "## Board health", "", "| " + " | ".join(HEALTH_KEYS) + " |", "|" + "---|" * len(HEALTH_KEYS)]
    lines += ["| " + " | ".join(row[key] for key in HEALTH_KEYS) + " |" for row in board_health(report)]
    if report.places:
        lines += [
            "",
            "## Labgrid places",
            "",
            "| cell | place | coordinator | waited for the place |",
            "|---|---|---|---|",
        ]
        lines += [f"| {label(c)} | {p.place} | {p.coordinator} | {p.waited_text} |" for c, p in place_rows(report)]
    if report.failures:
        lines += ["", "## Failures", ""]
        lines += [
            f"- {label(i.cell)}: {i.verdict} at {i.record.stage or '?'}: {i.record.error}" for i in report.failures
        ]
    return "\n".join(lines) + "\n"


def render_junit(report: NightReport) -> str:
    suite = ET.Element(
        "testsuite",
        name=f"etlab-nightly-{report.night}",
        tests=str(len(report.verdicts)),
        failures=str(sum(v.verdict.is_failure for v in report.verdicts)),
        errors=str(sum(v.verdict == Kind.INFRA for v in report.verdicts)),
    )
    for item in report.verdicts:
        board, model, backend = item.cell
        case = ET.SubElement(suite, "testcase", classname=f"etlab.{board}", name=f"{model}/{backend}")
        case.set("time", f"{(item.record.median_ms or 0) / 1000:.6f}")
        ET.SubElement(ET.SubElement(case, "properties"), "property", name="verdict", value=item.verdict.value)
        if item.retest:
            ET.SubElement(case.find("properties"), "property", name="retest", value=retest_text(item))  # type: ignore[arg-type]
        if item.verdict.is_warning:
            # Not a failure: CI shows it, the build stays green.
            ET.SubElement(case, "system-out").text = f"{item.verdict.value}: {item.detail}"
        if item.verdict == "regression":
            ET.SubElement(case, "failure", message=item.detail, type="regression").text = item.detail
        elif item.verdict == "failed":
            ET.SubElement(case, "failure", message=item.record.error or "", type=item.record.stage or "failed")
        elif item.verdict == "infra":
            ET.SubElement(case, "error", message=item.record.error or "", type=item.record.stage or "infra")
    return ET.tostring(suite, encoding="unicode", xml_declaration=True) + "\n"


def write_reports(report: NightReport, folder: Path) -> dict[str, Path]:
    folder.mkdir(parents=True, exist_ok=True)
    outputs = {
        "html": folder / f"nightly-{report.night}.html",
        "markdown": folder / f"nightly-{report.night}.md",
        "junit": folder / f"nightly-{report.night}.junit.xml",
    }
    atomic_write_text(outputs["html"], render_html(report))
    atomic_write_text(outputs["markdown"], render_markdown(report))
    atomic_write_text(outputs["junit"], render_junit(report))
    return outputs
