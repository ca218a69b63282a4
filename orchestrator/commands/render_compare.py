"""`fab compare`'s tables: the biggest per-operator changes, generation and memory side by side, one verdict."""

from __future__ import annotations

from typing import TYPE_CHECKING

from orchestrator import console
from orchestrator.commands.render import megabytes
from orchestrator.results.verdicts import Kind

if TYPE_CHECKING:  # the types only: rendering a table must not import what produced it
    from orchestrator.results.compare import Comparison


def render_comparison(comparison: Comparison, limit: int = 15) -> None:
    """The biggest per-operator changes and the overall verdict, through the console."""
    changed = [op for op in comparison.ops if op.delta_ms is not None]
    changed.sort(key=lambda op: -abs(op.delta_ms or 0.0))
    rows = [
        [
            op.node_id,
            op.op,
            op.median_a_ms,
            op.median_b_ms,
            op.delta_ms,
            f"{((op.median_b_ms or 0) / op.median_a_ms - 1) * 100:+.1f}%" if op.median_a_ms else None,
            op.verdict.change if op.verdict else None,
        ]
        for op in changed[:limit]
    ]
    console.table(
        f"{comparison.run_id_b} vs {comparison.run_id_a}",
        ["node", "op", "A median ms", "B median ms", "Δ ms", "Δ %", "change"],
        rows,
        caption=f"per operator, over {comparison.per_operator_scope}: the measured change of each instruction; "
        "the overall verdict follows",
    )
    if comparison.generation:
        console.table(
            "Generation",
            ["figure", "A", "B", "B / A"],
            [
                [row.label, row.a, row.b, f"{row.ratio:.3f}×" if row.ratio is not None else None]
                for row in comparison.generation
            ],
            caption="tokens/s: above 1× is faster; milliseconds: above 1× is slower",
        )
    if comparison.memory:
        console.table(
            "Memory",
            ["figure", "A MB", "B MB", "Δ MB", "Δ %"],
            [
                [
                    row.figure,
                    megabytes(row.a),
                    megabytes(row.b),
                    megabytes(row.delta),
                    f"{row.ratio * 100:+.1f}%" if row.ratio is not None else None,
                ]
                for row in comparison.memory
            ],
        )
    for note in comparison.notes:
        console.warn(note)
    # One verdict, said once: the measured figure is its detail, never a claim of its own.
    line = f"overall: {comparison.verdict.value}: {comparison.verdict_detail}"
    if comparison.verdict == Kind.REGRESSION:
        console.error(line)
    elif comparison.verdict.is_warning:
        console.warn(line)
    else:
        console.info(console.escape(line))
