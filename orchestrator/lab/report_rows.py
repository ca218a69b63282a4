"""The rows a night's reports and its terminal table show beyond the cells: board health, advised programs side by
side, language models' figures, labgrid places; and the figures' text (a re-test in one line, a number or a dash)."""

from __future__ import annotations

from orchestrator.lab.night_report import CellVerdict, NightReport, PlaceWait
from orchestrator.lab.run_record import RunRecord


def peak_mb(record: RunRecord) -> float | None:
    """A run's peak RSS in MB, None when not measured."""
    return record.peak_rss_bytes / 1e6 if record.peak_rss_bytes else None


def figure(value: float | None, unit: str = "", digits: int = 2) -> str:
    """A number for a report's cell: `digits` decimals (medians: 3, enough to explain a change of a few tenths of a
    percent), thousands separated; a dash when unknown."""
    return "—" if value is None else f"{value:,.{digits}f}{unit}"


def retest_text(item: CellVerdict) -> str:
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


HEALTH_KEYS = ("board", "night", "cells", "drift", "degraded", "max_temperature", "governor", "throttling")


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


ADVISED_KEYS = ("board", "model", "backend", "exported_ms", "advised", "advised_ms", "ratio")


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
            rows.append({"board": board, "model": model, "backend": backend, "exported_ms": figure(exported),
                         "advised": advised, "advised_ms": figure(rewritten), "ratio": ratio})  # fmt: skip
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
            "ttft_ms": figure(generation.ttft_ms), "prefill_tok_s": figure(generation.prefill_tokens_per_s),
            "decode_tok_s": figure(generation.decode_tokens_per_s),
            "token_ms_median": figure(generation.token_ms.get("median")),
            "decode_peak_mb": figure(decode_peak / 1e6 if decode_peak else None), "ids": generation.ids_text,
        })  # fmt: skip
    return rows


def place_rows(report: NightReport) -> list[tuple[tuple[str, str, str], PlaceWait]]:
    """Tonight's cells on labgrid places, each with its place and how long it waited for it."""
    return [(v.cell, report.places[v.cell[0]]) for v in report.verdicts if v.cell[0] in report.places]
