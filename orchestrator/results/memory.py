"""Memory of a run: the runner's RSS at each phase (timings.json), set against what the program plans.

The program side (planned arenas, constants, live bytes per instruction) is orchestrator/programs/memory.py.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from orchestrator.programs.memory import ProgramMemory
from orchestrator.results.summary import Memory

# "decode": a text-generation run, after its first generation's decode steps (first_execution is its prefill)
PHASES = ("start", "load", "method_init", "first_execution", "decode", "end")

MAX_ARENAS = 64  # a board's timings.json is untrusted: a method has a handful of planned arenas


def _phase_int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def run_memory(timings: dict[str, Any]) -> dict[str, Any] | None:
    """The runner's memory record in timings.json, checked: {"peak_reset", "phases": {phase: {...}}}, or None."""
    memory = timings.get("memory") if isinstance(timings, dict) else None
    if not isinstance(memory, dict) or not isinstance(memory.get("phases"), list):
        return None
    phases: dict[str, dict[str, int | None]] = {}
    for entry in memory["phases"]:
        if isinstance(entry, dict) and entry.get("phase") in PHASES:
            phases[str(entry["phase"])] = {
                key: _phase_int(entry.get(key)) for key in ("peak_rss_bytes", "rss_bytes", "maxrss_bytes")
            }
    return {"peak_reset": memory.get("peak_reset") is True, "phases": phases}


def _byte_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2**63


def _byte_counts(value: Any) -> bool:
    return isinstance(value, list) and len(value) <= MAX_ARENAS and all(_byte_count(a) for a in value)


# What the runner reports of the program (timings.json `program_memory`), checked against the program's own plan:
# key -> (what it must be, its check, the note when it differs). Absent or null (an older runner, an unreadable
# program) is unknown; anything else is unknown and noted.
_RUNNER_FIGURES: dict[str, tuple[str, Callable[[Any], bool], str]] = {
    "planned_arenas": (
        "a list of byte counts",
        _byte_counts,
        "the runner planned arenas of {} bytes, the program's plan says {}",
    ),
    "constants_bytes": ("a byte count", _byte_count, "the runner read {} bytes of constant data, the program says {}"),
}


def _runner_figures(runner_program: Any, program: ProgramMemory | None, notes: list[str]) -> dict[str, Any]:
    """The runner's figures of the program, validated, each compared with the program's; notes appended."""
    figures = {}
    for key, (kind, valid, mismatch) in _RUNNER_FIGURES.items():
        value = runner_program.get(key) if isinstance(runner_program, dict) else None
        if value is not None and not valid(value):
            notes.append(f"the runner's {key} is not {kind}: {str(value)[:60]!r}")
            value = None
        if value is not None and program is not None and value != getattr(program, key):
            notes.append(mismatch.format(value, getattr(program, key)))
        figures[key] = value
    return figures


def memory_summary(timings: dict[str, Any], program: ProgramMemory | None) -> tuple[Memory | None, list[str]]:
    """summary.json's `memory` section from the runner's phases and the program's plan; plus notes on mismatches."""
    run = run_memory(timings)
    notes: list[str] = []
    runner_program = timings.get("program_memory") if isinstance(timings, dict) else None
    figures = _runner_figures(runner_program, program, notes)
    runner_arenas, runner_constants = figures["planned_arenas"], figures["constants_bytes"]
    if run is None and program is None:
        return None, notes
    phases = run["phases"] if run else {}
    peaks = [p["peak_rss_bytes"] for p in phases.values() if p.get("peak_rss_bytes") is not None]
    maxrss = [p["maxrss_bytes"] for p in phases.values() if p.get("maxrss_bytes") is not None]
    peak = max(peaks + maxrss) if peaks or maxrss else None
    baseline = (phases.get("start") or {}).get("rss_bytes")
    arenas = program.planned_arenas if program else list(runner_arenas or [])
    planned = sum(arenas) if arenas or program else None
    constants = program.constants_bytes if program else runner_constants
    other = None
    if peak is not None and baseline is not None and planned is not None and constants is not None:
        other = max(0, peak - baseline - planned - constants)
    pte_bytes = program.pte_bytes if program else None
    if pte_bytes is None and isinstance(runner_program, dict) and _byte_count(runner_program.get("pte_bytes")):
        pte_bytes = runner_program["pte_bytes"]
    memory = Memory(
        peak_rss_bytes=peak,
        phases=phases,
        peak_reset=bool(run and run["peak_reset"]),
        baseline_rss_bytes=baseline,
        planned_arenas=tuple(arenas),
        planned_bytes=planned,
        constants_bytes=constants,
        delegate_data_bytes=program.delegate_data_bytes if program else None,
        pte_bytes=pte_bytes,
        peak_live_bytes=program.peak_live_bytes if program and program.live_bytes else None,
        other_bytes=other,
    )
    return memory, notes
