"""Nightly reports: an HTML page with latency trend plots, a markdown summary, and JUnit XML for CI.

Plots are rendered with matplotlib (Agg) to PNG and embedded as data URIs, so the report is one
self-contained file that can be mailed or archived.

A reports folder holds the reports of one history: `nightly-<night>.*` and `dashboard-<night>/` are named by the
night alone, so two histories sharing a folder would overwrite each other's nights. The first nightly to write a
folder names its history in `history.json` there (claim_folder); a nightly of another history is refused before it
runs anything, and a re-run of the same history rewrites only its own night.
"""

from __future__ import annotations

import base64
import html
import io
import os
import xml.etree.ElementTree as ET
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from orchestrator.errors import UsageError
from orchestrator.fsutil import atomic_write_json, atomic_write_text, read_json
from orchestrator.lab.history_url import describe_url, history_id
from orchestrator.lab.run_record import RunRecord
from orchestrator.results.verdicts import Kind
from orchestrator.strictjson import JsonDataError

OWNER_FILE = "history.json"  # in a reports folder: the history whose reports it holds


class ReportsFolderTaken(UsageError):
    """The reports folder holds the nightly reports of another history (exit 64: give each history its own)."""

    def __init__(self, message: str, marker: Path) -> None:
        super().__init__(message)
        self.marker = marker  # the folder's history.json: whose reports it holds


@dataclass(frozen=True)
class PlaceWait:
    """A board that is a labgrid place: which place, and how long its cells waited for the place's lock (they all
    ran under one lock, so they waited together)."""

    place: str
    coordinator: str
    waited: float | None  # None when the place was never held
    error: str | None = None

    @property
    def waited_text(self) -> str:
        return f"{self.waited:.1f} s" if self.waited is not None else f"not held: {self.error or '?'}"


@dataclass
class CellVerdict:
    """The outcome of one nightly cell against its baseline."""

    record: RunRecord
    verdict: Kind
    detail: str = ""
    baseline_median_ms: float | None = None
    ratio: float | None = None
    slower_ops: list[dict] = field(default_factory=list)
    suspect: str | None = None  # "slower"/"faster": a changed program that needs the interleaved re-test
    reference: RunRecord | None = None  # the baseline night whose program is the A side of a re-test
    drift: float | None = None  # unchanged program: tonight's median / the baseline's, the board's doing
    retest: dict[str, Any] | None = None  # abtest.Interleaved.to_dict()
    remeasured: dict[str, Any] | None = None  # the degraded first run that was re-measured
    memory: dict[str, Any] | None = None  # peak RSS vs the baseline nights' (judging.judge_memory)

    def __post_init__(self) -> None:
        self.verdict = Kind(self.verdict)

    @property
    def cell(self) -> tuple[str, str, str]:
        return self.record.cell

    def info(self) -> dict[str, Any]:
        """What the history keeps of a verdict (history.set_verdict)."""
        return {
            "detail": self.detail,
            "baseline_median_ms": self.baseline_median_ms,
            "ratio": self.ratio,
            "slower_ops": self.slower_ops,
            "drift": self.drift,
            "retest": self.retest,
            "remeasured": self.remeasured,
            "memory": self.memory,
        }

    @classmethod
    def stored(cls, record: RunRecord) -> CellVerdict:
        """The verdict a cell got when it was judged (a resumed night, or an earlier night in a report)."""
        info = record.verdict_info or {}
        return cls(
            record,
            Kind(record.verdict),
            str(info.get("detail") or ""),
            info.get("baseline_median_ms"),
            info.get("ratio"),
            list(info.get("slower_ops") or []),
            drift=info.get("drift"),
            retest=info.get("retest"),
            remeasured=info.get("remeasured"),
            memory=info.get("memory"),
        )

    @property
    def change(self) -> str | None:
        """Tonight's median against the baseline's, e.g. "+12.5%"."""
        return None if self.ratio is None else f"{(self.ratio - 1) * 100:+.1f}%"


@dataclass
class NightReport:
    night: str
    verdicts: list[CellVerdict]
    history: dict[tuple[str, str, str], list[RunRecord]]  # per cell, oldest first
    exit_code: int
    skipped: list[tuple[str, str, str]] = field(default_factory=list)  # recorded earlier the same night
    outputs: dict[str, Path] = field(default_factory=dict)  # the report files written (html, md, junit)
    places: dict[str, PlaceWait] = field(default_factory=dict)  # per board that is a labgrid place
    # Measured but not recorded (the history failed): kept in pending_dir until `fab nightly --record-pending`.
    pending: list[tuple[str, str, str]] = field(default_factory=list)
    pending_dir: Path | None = None
    # (as exported, advised) program names of the matrix's `advised` entries: shown side by side
    advised: list[tuple[str, str]] = field(default_factory=list)
    # Earlier nights' pending results this nightly could not record (a malformed file, kept): why, one per result
    left_behind: list[str] = field(default_factory=list)

    @property
    def pending_note(self) -> str | None:
        if not self.pending:
            return None
        return (
            f"{len(self.pending)} cell(s) measured tonight are not in the history yet: the history failed to record "
            f"them. They are kept in {self.pending_dir}; `fab nightly --record-pending` (or the next nightly) "
            f"records them: {', '.join(_label(cell) for cell in self.pending)}."
        )

    @property
    def left_behind_note(self) -> str | None:
        if not self.left_behind:
            return None
        reasons = "; ".join(self.left_behind)
        return f"{len(self.left_behind)} result(s) of earlier nights are still pending, not recorded: {reasons}"

    @property
    def regressions(self) -> list[CellVerdict]:
        return [v for v in self.verdicts if v.verdict == Kind.REGRESSION]

    @property
    def failures(self) -> list[CellVerdict]:
        return [v for v in self.verdicts if v.verdict in (Kind.FAILED, Kind.INFRA)]

    @property
    def warnings(self) -> list[CellVerdict]:
        """Drift, unconfirmed and inconclusive cells: worth reading, not a red build."""
        return [v for v in self.verdicts if v.verdict.is_warning and v.verdict != Kind.NOT_COMPARED]


def _label(cell: tuple[str, str, str]) -> str:
    return " / ".join(cell)


def trend_png(cell: tuple[str, str, str], records: Sequence[RunRecord], night: str) -> bytes:
    """Median latency per night with the p10-p90 band; invalid and failed nights marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    fig, ax = plt.subplots(figsize=(7.5, 2.8), dpi=110)
    ok = [r for r in records if r.status == "ok" and r.latencies_ms]
    if ok:
        xs = [r.night for r in ok]
        medians = [float(np.median(r.latencies_ms)) for r in ok]
        low = [float(np.percentile(r.latencies_ms, 10)) for r in ok]
        high = [float(np.percentile(r.latencies_ms, 90)) for r in ok]
        ax.fill_between(xs, low, high, color="#9ecae1", alpha=0.5, label="p10–p90")
        ax.plot(xs, medians, marker="o", color="#08519c", label="median")
        for record, x, y in zip(ok, xs, medians, strict=True):
            if record.validity != "valid":
                ax.plot([x], [y], marker="x", color="#e6550d", markersize=10)
            if record.night == night:
                ax.plot([x], [y], marker="o", color="#de2d26", markersize=9, fillstyle="none")
    for record in records:
        if record.status != "ok":
            # matplotlib's stub takes only a float, but on this categorical axis a night's label is its x
            ax.axvline(record.night, color="#de2d26", alpha=0.3, linestyle="--")  # type: ignore[arg-type]
    with_memory = [(r.night, r.peak_rss_bytes) for r in ok if r.peak_rss_bytes]
    if with_memory:  # peak memory per night on its own axis: a growth shows next to the latency
        memory_ax = ax.twinx()
        memory_ax.plot([when for when, _ in with_memory], [peak / 1e6 for _, peak in with_memory],
                       marker="s", color="#756bb1", linestyle=":", label="peak memory")  # fmt: skip
        memory_ax.set_ylabel("peak memory (MB)", color="#756bb1")
        memory_ax.legend(fontsize=8, loc="upper right")
    ax.set_title(_label(cell), fontsize=10)
    ax.set_ylabel("latency (ms)")
    ax.grid(alpha=0.3)
    ax.tick_params(axis="x", labelrotation=30, labelsize=8)
    if ok:
        ax.legend(fontsize=8, loc="upper left")
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png")
    plt.close(fig)
    return buffer.getvalue()


def _peak_mb(record: RunRecord) -> float | None:
    return record.peak_rss_bytes / 1e6 if record.peak_rss_bytes else None


def _fmt(value: float | None, unit: str = "") -> str:
    return "—" if value is None else f"{value:,.2f}{unit}"


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


def _reasons_html(reasons: Sequence[str]) -> str:
    return ": " + html.escape(", ".join(reasons)) if reasons else ""


def _html_section(title: str, table_id: str, headers: Sequence[str], rows: list[str]) -> list[str]:
    """A report section: its heading, then "None." or a table of the ready-made <tr> rows."""
    if not rows:
        return [f"<h2>{title}</h2>", "<p>None.</p>"]
    head = "".join(f"<th>{header}</th>" for header in headers)
    return [f"<h2>{title}</h2>", f"<table id='{table_id}'><tr>{head}</tr>", *rows, "</table>"]


def _retest_text(item: CellVerdict) -> str:
    """The interleaved re-test in one line, for the reports (per cell: its rounds and time)."""
    retest = item.retest
    if not retest:
        return "—"
    if retest.get("error"):
        return f"stopped after {retest.get('seconds', 0):.0f} s: {retest['error']}"
    ratio = retest.get("ratio")
    shift = f"{ratio - 1:+.1%}" if isinstance(ratio, float) else "?"
    state = "confirmed" if retest.get("confirmed") else "not confirmed"
    budget = retest.get("budget_seconds")
    of_budget = f" of {budget:g} s" if isinstance(budget, int | float) else ""
    return f"{state}: {shift} over {retest.get('rounds')} rounds in {retest.get('seconds', 0):.0f} s{of_budget}"


_HEALTH_KEYS = ("board", "night", "cells", "drift", "degraded", "max_temperature", "governor", "throttling")


def board_health(report: NightReport) -> list[dict[str, str]]:
    """Per board and night (oldest first): cells run, the median drift of unchanged programs, degraded runs,
    the hottest temperature, the governors and any throttling, from the cells' histories in the report."""
    import numpy as np

    nights: dict[tuple[str, str], list[RunRecord]] = {}
    seen: set[str] = set()
    for records in report.history.values():
        for record in records:
            if record.run_id not in seen:
                seen.add(record.run_id)
                nights.setdefault((record.board, record.night), []).append(record)
    rows = []
    for (board, night), records in sorted(nights.items()):
        drifts = [drift for r in records if isinstance(drift := r.verdict_info.get("drift"), float)]
        temps = [
            t
            for r in records
            for t in (r.conditions.get("temperature_c_before"), r.conditions.get("temperature_c_after"))
            if isinstance(t, int | float)
        ]
        governors = sorted(
            {str(r.conditions.get("governor_before")) for r in records if r.conditions.get("governor_before")}
        )
        throttling = sorted({f for r in records for f in r.conditions.get("throttling_during_run") or []})
        rows.append(
            {
                "board": board,
                "night": night,
                "cells": str(len(records)),
                "drift": f"{float(np.median(drifts)) - 1:+.1%}" if drifts else "—",
                "degraded": str(sum(r.validity == "degraded" for r in records)),
                "max_temperature": f"{max(temps):.1f}" if temps else "—",
                "governor": ", ".join(governors) or "—",
                "throttling": ", ".join(throttling) or "none",
            }
        )
    return rows


_ADVISED_KEYS = ("board", "model", "backend", "exported_ms", "advised", "advised_ms", "ratio")


def advised_rows(report: NightReport) -> list[dict[str, str]]:
    """Per board, model and backend of an `advised` entry: tonight's median as exported and advised, and their
    ratio (advised / as exported: below 1 the rewrites save time), where both cells ran tonight."""
    medians = {v.cell: v.record.median_ms for v in report.verdicts}
    rows = []
    for (board, model, backend), exported in medians.items():
        for plain, advised in report.advised:
            rewritten = medians.get((board, advised, backend)) if plain == model else None
            if rewritten is None:
                continue
            ratio = f"{rewritten / exported:.3f}" if exported and rewritten else "—"
            rows.append({"board": board, "model": model, "backend": backend, "exported_ms": _fmt(exported),
                         "advised": advised, "advised_ms": _fmt(rewritten), "ratio": ratio})  # fmt: skip
    return rows


GENERATION_KEYS = ("board", "model", "backend", "prompt_new_context", "ttft_ms", "prefill_tok_s", "decode_tok_s",
                    "token_ms_median", "decode_peak_mb", "ids")  # fmt: skip
GENERATION_HEADERS = ("board", "model", "backend", "prompt+new/ctx", "TTFT ms", "prefill tok/s", "decode tok/s",
                       "token ms (median)", "decode peak MB", "ids vs eager")  # fmt: skip


def generation_rows(report: NightReport) -> list[dict[str, str]]:
    """Tonight's language-model cells as they are used: time to first token, decode speed, per-token latency (their
    median latency is one whole generation, which says little on its own)."""
    rows = []
    for item in report.verdicts:
        generation = item.record.generation
        if generation is None:
            continue
        decode_peak = generation.memory.get("decode")
        rows.append({
            "board": item.record.board, "model": item.record.model, "backend": item.record.backend,
            "prompt_new_context": f"{generation.prompt_len}+{generation.new_tokens}/{generation.context or '?'}",
            "ttft_ms": _fmt(generation.ttft_ms), "prefill_tok_s": _fmt(generation.prefill_tokens_per_s),
            "decode_tok_s": _fmt(generation.decode_tokens_per_s),
            "token_ms_median": _fmt(generation.token_ms.get("median")),
            "decode_peak_mb": _fmt(decode_peak / 1e6 if decode_peak else None), "ids": generation.ids_text,
        })  # fmt: skip
    return rows


def place_rows(report: NightReport) -> list[tuple[tuple[str, str, str], PlaceWait]]:
    """Tonight's cells on labgrid places, each with its place and how long it waited for it."""
    return [(v.cell, report.places[v.cell[0]]) for v in report.verdicts if v.cell[0] in report.places]


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
        f"<p id='pending' class='failed'>{html.escape(report.pending_note)}</p>" if report.pending_note else "",
        f"<p id='left-behind' class='failed'>{html.escape(report.left_behind_note)}</p>"
        if report.left_behind_note
        else "",
        "<h2>Tonight</h2><table id='tonight'><tr><th>board</th><th>model</th><th>backend</th><th>median ms</th>"
        "<th>baseline ms</th><th>change</th><th>peak MB</th><th>verdict</th><th>validity</th><th>bundle</th></tr>",
    ]
    for item in report.verdicts:
        record = item.record
        change = item.change or "—"
        parts.append(
            f"<tr><td>{html.escape(record.board)}</td><td>{html.escape(record.model)}</td>"
            f"<td>{html.escape(record.backend)}</td><td class='num'>{_fmt(record.median_ms)}</td>"
            f"<td class='num'>{_fmt(item.baseline_median_ms)}</td><td class='num'>{change}</td>"
            f"<td class='num'>{_fmt(_peak_mb(record))}</td>"
            f"<td class='{html.escape(item.verdict.replace(' ', '-'))}'>{html.escape(item.verdict)}"
            f"{'<br><small>' + html.escape(item.detail) + '</small>' if item.detail else ''}</td>"
            f"<td>{html.escape(record.validity)}{_reasons_html(record.reasons)}</td>"
            f"<td><code>{html.escape(record.bundle_path or '—')}</code></td></tr>"
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
        parts.append(f"<h3 class='regression'>{html.escape(_label(item.cell))}</h3><p>{html.escape(item.detail)}</p>")
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
        f"<tr><td>{html.escape(_label(item.cell))}</td><td class='{item.verdict.value}'>{item.verdict.value}"
        f"</td><td>{html.escape(item.detail)}</td><td>{html.escape(_retest_text(item))}</td></tr>"
        for item in report.warnings
    ]
    parts += _html_section("Warnings", "warnings", ("cell", "verdict", "why", "re-test"), warnings)

    advised = advised_rows(report)
    if advised:
        parts.append("<h2>Advised programs</h2><p>Each model as exported and with the rewrites etlab advises, "
                     "tonight's medians side by side (ratio: advised / as exported).</p>")  # fmt: skip
        parts.append("<table id='advised'><tr>" + "".join(f"<th>{key.replace('_', ' ')}</th>" for key in _ADVISED_KEYS)
                     + "</tr>")  # fmt: skip
        for row in advised:
            parts.append("<tr>" + "".join(f"<td>{html.escape(row[key])}</td>" for key in _ADVISED_KEYS) + "</tr>")
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
        parts.append("<tr>" + "".join(f"<td>{html.escape(str(row[key]))}</td>" for key in _HEALTH_KEYS) + "</tr>")
    parts.append("</table>")

    failures = [
        f"<tr><td>{html.escape(_label(item.cell))}</td><td class='{item.verdict}'>{item.verdict}</td>"
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
                f"<tr><td>{html.escape(_label(cell))}</td><td>{html.escape(place.place)}</td>"
                f"<td>{html.escape(place.coordinator)}</td><td>{html.escape(place.waited_text)}</td></tr>"
            )
        parts.append("</table>")

    parts.append("<h2>Latency trends</h2>")
    for cell, records in sorted(report.history.items()):
        png = base64.b64encode(trend_png(cell, records, report.night)).decode()
        parts.append(
            f"<figure><img class='trend' alt='latency trend {html.escape(_label(cell))}' "
            f"src='data:image/png;base64,{png}'><figcaption>{html.escape(_label(cell))}</figcaption></figure>"
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
        *([f"**Not recorded**: {report.pending_note}", ""] if report.pending_note else []),
        *([f"**Still pending**: {report.left_behind_note}", ""] if report.left_behind_note else []),
        "| board | model | backend | median ms | baseline ms | change | peak MB | verdict | validity |",
        "|---|---|---|---:|---:|---:|---:|---|---|",
    ]
    for item in report.verdicts:
        r = item.record
        change = item.change or "—"
        lines.append(
            f"| {r.board} | {r.model} | {r.backend} | {_fmt(r.median_ms)} | {_fmt(item.baseline_median_ms)} | "
            f"{change} | {_fmt(_peak_mb(r))} | {item.verdict} | {r.validity} |"
        )
    generation = generation_rows(report)
    if generation:
        lines += ["", "## Generation", "", "| " + " | ".join(GENERATION_HEADERS) + " |",
                  "|---|---|---|---|" + "---:|" * (len(GENERATION_HEADERS) - 5) + "---|"]  # fmt: skip
        lines += ["| " + " | ".join(row[key] for key in GENERATION_KEYS) + " |" for row in generation]
    for item in report.regressions:
        lines += ["", f"## Regression: {_label(item.cell)}", "", item.detail]
        if item.slower_ops:
            lines += ["", "| operator | baseline ms | tonight ms | Δ ms |", "|---|---:|---:|---:|"]
            lines += [
                f"| {op['op']} | {op['baseline_ms']:.3f} | {op['current_ms']:.3f} | {op['delta_ms']:+.3f} |"
                for op in item.slower_ops
            ]
    if report.warnings:
        lines += ["", "## Warnings", ""]
        lines += [
            f"- {_label(i.cell)}: **{i.verdict.value}**: {i.detail} (re-test: {_retest_text(i)})"
            for i in report.warnings
        ]
    advised = advised_rows(report)
    if advised:
        lines += ["", "## Advised programs", "", "| " + " | ".join(k.replace("_", " ") for k in _ADVISED_KEYS) + " |",
                  "|" + "---|" * len(_ADVISED_KEYS)]  # fmt: skip
        lines += ["| " + " | ".join(row[key] for key in _ADVISED_KEYS) + " |" for row in advised]
    lines += ["", "## Board health", "", "| " + " | ".join(_HEALTH_KEYS) + " |", "|" + "---|" * len(_HEALTH_KEYS)]
    lines += ["| " + " | ".join(row[key] for key in _HEALTH_KEYS) + " |" for row in board_health(report)]
    if report.places:
        lines += [
            "",
            "## Labgrid places",
            "",
            "| cell | place | coordinator | waited for the place |",
            "|---|---|---|---|",
        ]
        lines += [f"| {_label(c)} | {p.place} | {p.coordinator} | {p.waited_text} |" for c, p in place_rows(report)]
    if report.failures:
        lines += ["", "## Failures", ""]
        lines += [
            f"- {_label(i.cell)}: {i.verdict} at {i.record.stage or '?'}: {i.record.error}" for i in report.failures
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
            ET.SubElement(case.find("properties"), "property", name="retest", value=_retest_text(item))  # type: ignore[arg-type]
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


def claim_folder(folder: Path, history_url: str) -> None:
    """Make sure `folder` holds this history's reports: claimed by the first nightly to write there (history.json,
    created at once, so two nightlies starting together cannot both claim it); ReportsFolderTaken when another
    history holds it, before the nightly runs anything."""
    marker = folder / OWNER_FILE
    mine = history_id(history_url)
    if not marker.exists():
        folder.mkdir(parents=True, exist_ok=True)
        draft = folder / f".{OWNER_FILE}.{os.getpid()}"
        atomic_write_json(draft, {"schema": 1, "history": mine, "where": describe_url(history_url)})
        try:
            os.link(draft, marker)  # fails if another nightly claimed it meanwhile: its claim stands
        except FileExistsError:
            pass
        finally:
            draft.unlink(missing_ok=True)
    try:
        owner = read_json(marker)
    except (OSError, JsonDataError) as exc:
        raise JsonDataError(str(marker), f"cannot say whose reports {folder} holds ({exc})") from None
    if not isinstance(owner, dict) or not isinstance(owner.get("history"), str):
        raise JsonDataError(str(marker), f"cannot say whose reports {folder} holds (no history id)", "history")
    if owner["history"] != mine:
        raise ReportsFolderTaken(
            f"the reports folder {folder} holds the nightly reports of the history {owner.get('where') or '?'}; "
            f"this nightly's history is {describe_url(history_url)}: its reports of a night would overwrite theirs",
            marker,
        )


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
