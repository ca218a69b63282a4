"""The counters pass of a bundle (counters.json + counters_etdump.etdp) as per-instruction figures.

counters.json holds, per execution of the counters pass, one row per profiled instruction: its event index in that
pass's own ETDump "Execute" block, its (chain, instruction), and the counter deltas the runner read around it. Every
row is checked against that ETDump (the event at that index must be the same instruction's OPERATOR_CALL or
DELEGATE_CALL); rows that do not match are dropped and counted. Figures are medians over the measured executions
(the warmup ones are skipped, as for latency); derived metrics are ratios of the per-instruction sums.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from orchestrator.counters import COUNTERS, DERIVED, derived_metrics
from orchestrator.errors import AnalysisError
from orchestrator.fsutil import read_json, unreadable
from orchestrator.results.etdump import read_etdump
from orchestrator.results.generation import DECODE, GenerationTimings
from orchestrator.results.summary import Counters

COUNTERS_FILE = "counters.json"
COUNTERS_ETDUMP = "counters_etdump.etdp"
COUNTERS_TIMINGS = "counters_timings.json"
INSTRUCTION_EVENTS = ("OPERATOR_CALL", "DELEGATE_CALL")
MAX_DELTA = 2**63  # no real counter gets there; a delta that wrapped below zero does


@dataclass
class CounterProfile:
    method: str
    captured: list[str]
    missing: list[dict[str, str]]
    derived: list[str]
    threads: int | None
    scope: str
    multiplexed: bool
    scaling: str
    executions: int
    values: dict[str, dict[str, float]] = field(default_factory=dict)  # metric -> node id -> value
    totals: dict[str, float] = field(default_factory=dict)  # metric -> whole-method value per execution
    dropped_rows: int = 0

    @property
    def metrics(self) -> list[str]:
        return [*self.captured, *self.derived]


def _missing(entries: Any) -> list[dict[str, str]]:
    found = []
    for entry in entries if isinstance(entries, list) else []:
        if isinstance(entry, dict) and isinstance(entry.get("name"), str):
            found.append({key: str(entry.get(key) or "") for key in ("name", "error", "reason")})
    return found


def _valid_row(row: Any, width: int, slots: Iterable[int]) -> bool:
    """A row of `width` integers whose counter values are deltas the runner could have read."""
    if not isinstance(row, list) or len(row) < width or not all(isinstance(v, int) for v in row):
        return False
    return all(0 <= row[slot] < MAX_DELTA for slot in slots)


def read_counter_profile(bundle: Path, method: str = "forward") -> CounterProfile | None:
    """The bundle's counters pass, or None when it had none. Raises AnalysisError when the files are unusable."""
    path = Path(bundle) / COUNTERS_FILE
    if not path.is_file():
        return None
    try:
        document = read_json(path, max_magnitude=2**64 - 1)  # uint64 deltas: a wrapped one is dropped below
    except (OSError, ValueError) as exc:
        raise AnalysisError(unreadable(path, exc)) from None
    captured = document.get("captured") if isinstance(document, dict) else None
    columns = document.get("columns") if isinstance(document, dict) else None
    executions = document.get("executions") if isinstance(document, dict) else None
    if not isinstance(captured, list) or not isinstance(columns, list) or not isinstance(executions, list):
        raise AnalysisError(f"{path}: needs captured, columns and executions lists")
    captured = [name for name in captured if isinstance(name, str) and name in COUNTERS]  # unknown: not painted
    if columns[:3] != ["event_index", "chain", "instruction"]:
        raise AnalysisError(f"{path}: columns must start with event_index, chain, instruction")
    slots = {name: columns.index(name) for name in captured if name in columns}
    timings_path = Path(bundle) / COUNTERS_TIMINGS
    warmup = 0
    decode_steps = None  # a text-generation run: the counters of its timed decode steps
    if timings_path.is_file():
        try:
            timings = read_json(timings_path)
        except (OSError, ValueError) as exc:
            raise AnalysisError(unreadable(timings_path, exc)) from None
        if not isinstance(timings, dict):
            raise AnalysisError(f"{timings_path}: not a JSON object")
        warm = timings.get("warmup_ms")
        warmup = len(warm) if isinstance(warm, list) else 0
        generated = GenerationTimings.from_timings(timings)
        if generated is not None and len(generated.executions) == len(executions):
            decode_steps = generated.execution_indices(DECODE)
    etdump_path = Path(bundle) / COUNTERS_ETDUMP
    blocks = read_etdump(etdump_path).execute_blocks if etdump_path.is_file() else []
    measured = list(range(warmup if len(executions) > warmup else 0, len(executions)))
    if decode_steps:  # one decode step, as ops.json: a prefill's counts are another operator's work
        measured = decode_steps

    sums: dict[str, dict[tuple[int, int], list[float]]] = {name: {} for name in slots}
    dropped = 0
    for e in measured:
        rows = executions[e] if isinstance(executions[e], list) else []
        block = blocks[e] if e < len(blocks) else None
        per_execution: dict[str, dict[tuple[int, int], float]] = {name: {} for name in slots}
        for row in rows:
            if not _valid_row(row, len(columns), slots.values()):
                dropped += 1
                continue
            event, chain, index = row[0], row[1], row[2]
            if block is None or not (
                0 <= event < len(block)
                and block.event_names[event] in INSTRUCTION_EVENTS
                and int(block.chain[event]) == chain
                and int(block.instruction[event]) == index
            ):
                dropped += 1
                continue
            for name, slot in slots.items():
                per_execution[name][(chain, index)] = per_execution[name].get((chain, index), 0.0) + float(row[slot])
        for name in slots:
            for key, value in per_execution[name].items():
                sums[name].setdefault(key, []).append(value)

    values: dict[str, dict[str, float]] = {}
    totals: dict[str, float] = {}
    for name in slots:
        values[name] = {f"{method}_{c}_{i}": float(np.median(v)) for (c, i), v in sorted(sums[name].items())}
        totals[name] = float(sum(values[name].values()))
    derived = derived_metrics(list(slots))
    for metric in derived:
        numerator, denominator, scale = DERIVED[metric]
        values[metric] = {}
        for key, num in sums[numerator].items():
            den = sum(sums[denominator].get(key, []))
            if den > 0:
                values[metric][f"{method}_{key[0]}_{key[1]}"] = sum(num) / den * scale
        total_den = totals.get(denominator, 0.0)
        if total_den > 0:
            totals[metric] = totals[numerator] / total_den * scale
    return CounterProfile(
        method=method,
        captured=list(slots),
        missing=_missing(document.get("missing")),
        derived=derived,
        threads=document.get("threads") if isinstance(document.get("threads"), int) else None,
        scope=str(document.get("scope") or ""),
        multiplexed=document.get("multiplexed") is True,
        scaling=str(document.get("scaling") or ""),
        executions=len(measured),
        values=values,
        totals=totals,
        dropped_rows=dropped,
    )


def hottest(profile: CounterProfile) -> tuple[str, str] | None:
    """(metric, node id) of the hottest instruction by cycles where captured, else task-clock."""
    for metric in ("cycles", "task_clock"):
        values = profile.values.get(metric)
        if values:
            return metric, max(values, key=lambda node: values[node])
    return None


def consistency(profile: CounterProfile, top_layers: list[dict[str, Any]], timing_threads: int | None) -> dict:
    """Is the hottest instruction on cycles (else task-clock) the timing pass's top layer? If not, say why."""
    found = hottest(profile)
    top = top_layers[0]["node_id"] if top_layers and isinstance(top_layers[0], dict) else None
    if found is None or top is None:
        return {"checked": False, "reason": "no task-clock or cycles figures" if found is None else "no timing profile"}
    metric, node = found
    result: dict[str, Any] = {
        "checked": True,
        "metric": metric,
        "hottest": node,
        "top_layer": top,
        "agrees": node == top,
    }
    if node != top:
        values = profile.values[metric]
        ranked = sorted(values, key=lambda n: -values[n])
        rank = ranked.index(top) + 1 if top in ranked else None
        share = values[node] / sum(values.values()) * 100 if sum(values.values()) else 0.0
        top_share = values.get(top, 0.0) / sum(values.values()) * 100 if sum(values.values()) else 0.0
        why = [f"the timing pass's top layer {top} ranks #{rank} on {metric} ({top_share:.1f}% vs {share:.1f}%)"]
        if timing_threads and profile.threads and timing_threads != profile.threads:
            why.append(
                f"the counters pass runs on {profile.threads} thread(s), the timing pass on {timing_threads}: "
                "multi-threaded operators rank lower there"
            )
        if abs(share - top_share) < 5.0:
            why.append("the two are within 5 percentage points: run-to-run noise can swap them")
        result["reason"] = "; ".join(why)
    return result


def counters_summary(
    profile: CounterProfile | None,
    counters_pass: dict[str, Any] | None,
    top_layers: list[dict[str, Any]],
    timing_threads: int | None,
) -> Counters | None:
    """summary.json's `counters` section, or None when the run had no counters pass."""
    if profile is None and not isinstance(counters_pass, dict):
        return None
    requested = tuple(str((counters_pass or {}).get("requested") or "").split(",")) if counters_pass else ()
    if profile is None:
        error = (counters_pass or {}).get("error") or "the counters pass wrote no counters.json"
        return Counters(status="failed", error=str(error), requested=requested)
    return Counters(
        status="ok",
        requested=requested or tuple(profile.captured + [m["name"] for m in profile.missing]),
        captured=tuple(profile.captured),
        derived=tuple(profile.derived),
        missing=tuple(profile.missing),
        threads=profile.threads,
        scope=profile.scope,
        multiplexed=profile.multiplexed,
        scaling=profile.scaling,
        executions=profile.executions,
        totals=profile.totals,
        consistency=consistency(profile, top_layers, timing_threads),
    )
