"""Two runs' time by module of the model, side by side (the dashboard's compare page): each module's operators'
medians summed up the module tree, as every other figure of a comparison is a median, joined by module path.

Unlike `compare`, any two runs with source maps compare here, different programs included (an XNNPACK run against a
portable one: which modules got faster).
"""

from __future__ import annotations

from dataclasses import dataclass

from orchestrator.results.ops_record import OpsRecord


@dataclass(frozen=True)
class ModuleDelta:
    """One module of both runs: the sum of its operators' medians (descendants included) on each side."""

    module: str
    a_ms: float
    b_ms: float
    delta_ms: float  # B - A
    ratio: float | None  # B / A; None when A took no time


def module_medians(ops: OpsRecord) -> dict[str, float] | None:
    """Each module's time, the medians of its operators and its descendants' summed (results/modules.py's rules,
    with medians: a delegate call's placed nodes count for their modules, the rest of the call for the call's);
    None when no row has a module (a program without a source map)."""
    pieces: list[tuple[str | None, float]] = []
    placed = {d.node_id: d for d in ops.delegates if d.placed}
    for row in ops.instructions:
        nodes = placed[row.node_id].nodes if row.node_id in placed else ()
        pieces += [(node.module, node.ms) for node in nodes]
        pieces.append((row.module, max(0.0, row.median_ms - sum(node.ms for node in nodes))))
    if all(module is None for module, _ in pieces):
        return None
    totals: dict[str, float] = {}
    for module, ms in (piece for piece in pieces if piece[1] > 0):  # the modules that took time
        parts = module.split(".") if module else []
        for depth in range(1, len(parts) + 1):
            path = ".".join(parts[:depth])
            totals[path] = totals.get(path, 0.0) + ms
    return totals


def module_deltas(a: OpsRecord, b: OpsRecord) -> tuple[list[ModuleDelta], str | None]:
    """The modules both runs have, joined by path (medians A and B, B - A, B / A), largest absolute change first; or
    why there are none. Works on any two runs with source maps, programs that differ included."""
    times_a, times_b = module_medians(a), module_medians(b)
    if times_a is None or times_b is None:
        side = "A" if times_a is None else "B"
        return [], f"No modules compared: run {side} was analysed without a source map (no time by module)."
    deltas = [
        ModuleDelta(module, ms, times_b[module], times_b[module] - ms, times_b[module] / ms if ms > 0 else None)
        for module, ms in times_a.items()
        if module in times_b
    ]
    if not deltas:
        return [], "No modules compared: the two runs have no module in common."
    return sorted(deltas, key=lambda delta: (-abs(delta.delta_ms), delta.module)), None
