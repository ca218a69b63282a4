"""`fab compare`'s output: the verdict first (both medians, the ratio and its CI, the verdict word), then the
operators whose own test found a change (top-level and inside the delegates), the rest folded into one line, the
time by operator type with the rest of the method (its Δ column adds up to the median change), generation and memory
side by side."""

from __future__ import annotations

from typing import TYPE_CHECKING

from orchestrator import console
from orchestrator.commands.render import megabytes
from orchestrator.results.compare import MATERIAL_SHARE
from orchestrator.results.numerics import DIVERGENCE_DB, NumericsComparison, OperatorRecord
from orchestrator.results.store import LocalRun
from orchestrator.results.verdicts import Kind

if TYPE_CHECKING:  # the types only: of what produced the comparison, the table takes the floor alone
    from orchestrator.results.compare import Comparison, OpDelta
    from orchestrator.results.stats import Verdict

OP_TYPES_SHOWN = 10
REST_OF_METHOD = "rest of the method"  # each median beyond its operators': the caption says what it is


def _figure(value: float | None, *, sign: bool = False) -> str | None:
    """Milliseconds to the tenth of a microsecond below 1 ms (0.0565, not 0.057), four digits above."""
    if value is None:
        return None
    shown = f"{value:.4f}" if abs(value) < 1 else f"{value:.4g}"
    return f"+{shown}" if sign and value >= 0 else shown


def _ms(value: float | None) -> str:
    return f"{value:.4g} ms" if value is not None else "—"


def _ci(verdict: Verdict) -> str:
    if verdict.ci_low is None or verdict.ci_high is None:
        return ""
    p = f", p={verdict.p_value:.2g}" if verdict.p_value is not None else ""
    return f" (95% CI ×{verdict.ci_low:.3f}–×{verdict.ci_high:.3f}{p})"


def verdict_lines(comparison: Comparison) -> list[str]:
    """The answer, first: both runs' medians, B / A with its confidence interval, and the verdict with its reason."""
    total = comparison.total
    ratio = f"B / A ×{total.ratio:.3f}{_ci(total)}" if total.ratio is not None else total.reason
    return [
        f"A {comparison.run_id_a}: median {_ms(comparison.median_a_ms)}   B {comparison.run_id_b}: median "
        f"{_ms(comparison.median_b_ms)}   {ratio}",
        f"overall: {comparison.verdict.value}: {comparison.verdict_detail}",
    ]


def _change(op: OpDelta) -> str:
    """The row's own test, in words that agree with its numbers: its direction and its CI."""
    verdict = op.verdict
    return f"{verdict.change}{_ci(verdict)}" if verdict is not None else "not tested"


def _percent(op: OpDelta) -> str | None:
    return f"{(op.median_b_ms or 0) / op.median_a_ms * 100 - 100:+.1f}%" if op.median_a_ms else None


def render_comparison(comparison: Comparison, limit: int = 15) -> None:
    """Through the console: the verdict on stdout first, then the tables; a confirmed regression also on stderr."""
    for line in verdict_lines(comparison):
        console.plain(line, stderr=False)
    if comparison.verdict == Kind.REGRESSION:
        console.error(verdict_lines(comparison)[1])
    for note in comparison.notes:
        console.warn(note)
    if comparison.conditions:  # not a verdict on the program: what else differed on the board
        console.warn("board conditions changed: " + ", ".join(comparison.conditions))
    every = [op for op in [*comparison.ops, *comparison.delegate_ops] if op.delta_ms is not None]
    changed = sorted((op for op in every if comparison.changed(op)), key=lambda op: -abs(op.delta_ms or 0))
    small = [op for op in every if op.verdict and op.verdict.is_change and not comparison.changed(op)]
    if changed:
        console.table(
            f"Operators that changed: {comparison.run_id_b} vs {comparison.run_id_a}",
            ["node", "op", "A median ms", "B median ms", "Δ ms", "Δ %", "change (its own test)"],
            [
                [
                    op.where,
                    op.op,
                    _figure(op.median_a_ms),
                    _figure(op.median_b_ms),
                    _figure(op.delta_ms, sign=True),
                    _percent(op),
                    _change(op),
                ]
                for op in changed[:limit]
            ],
            caption=f"per operator, over {comparison.per_operator_scope}; `#N`: XNNPACK node N inside that "
            "delegate call; each row tested on its own samples (alpha shared out over every operator tested)",
        )
    console.plain(
        f"per operator, over {comparison.per_operator_scope}: {_folded(every, changed, small, limit)}", stderr=False
    )
    _render_op_types(comparison)
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
            ["", "A MB", "B MB", "Δ MB", "Δ %"],
            [
                [
                    row.label or row.figure,
                    megabytes(row.a),
                    megabytes(row.b),
                    megabytes(row.delta),
                    f"{row.ratio * 100:+.1f}%" if row.ratio is not None else None,
                ]
                for row in comparison.memory
            ],
        )


def _folded(every: list[OpDelta], changed: list[OpDelta], small: list[OpDelta], limit: int) -> str:
    """One line for the rows below the noise, those changed by too little to matter, and those past the limit."""
    quiet = [op for op in every if op.verdict is not None and not op.verdict.is_change]
    untested = len(every) - len(quiet) - len(changed) - len(small)
    parts = []
    if quiet:
        largest = max(quiet, key=lambda op: abs(op.delta_ms or 0.0))
        parts.append(
            f"{len(quiet)} operators within noise by their own tests (the largest: {largest.where} {largest.op} "
            f"{_percent(largest) or ''}{_ci(largest.verdict) if largest.verdict else ''})"
        )
    if small:
        parts.append(f"{len(small)} changed by less than {MATERIAL_SHARE:.1%} of A's median each (not listed)")
    if len(changed) > limit:
        parts.append(f"{len(changed) - limit} more changed, smaller")
    if untested:
        parts.append(f"{untested} not tested (too few samples)")
    return "; ".join(parts) if parts else "no operator to compare"


def _render_op_types(comparison: Comparison) -> None:
    """The largest changes by type, the other types in one row, then the rest of the method and the medians, so the
    Δ column adds up to the median change."""
    if not comparison.op_types:
        return
    rows: list[list[object]] = [
        [row.op_type, row.count, _figure(row.a_ms), _figure(row.b_ms), _figure(row.delta_ms, sign=True),
         f"{row.share_a:.0%}" if row.share_a is not None else None,
         f"{row.share_b:.0%}" if row.share_b is not None else None]
        for row in comparison.op_types[:OP_TYPES_SHOWN]
    ]  # fmt: skip
    others = comparison.op_types[OP_TYPES_SHOWN:]
    if others:
        sums = [sum(row.a_ms for row in others), sum(row.b_ms for row in others)]
        rows.append([f"{len(others)} other types", sum(row.count for row in others), _figure(sums[0]),
                     _figure(sums[1]), _figure(sums[1] - sums[0], sign=True), None, None])  # fmt: skip
    rest = comparison.rest
    if rest is not None:
        rows.append([REST_OF_METHOD, None, _figure(rest.a_ms), _figure(rest.b_ms), _figure(rest.delta_ms, sign=True),
                     None, None])  # fmt: skip
    if comparison.median_a_ms is not None and comparison.median_b_ms is not None:
        change = comparison.median_b_ms - comparison.median_a_ms
        rows.append(["median (the whole run)", None, _figure(comparison.median_a_ms), _figure(comparison.median_b_ms),
                     _figure(change, sign=True), None, None])  # fmt: skip
    console.table(
        "By operator type",
        ["operator type", "×", "A ms", "B ms", "Δ ms", "% of A", "% of B"],
        rows,
        caption="sums of medians, largest change first; %: of each run's median; the rest of the method: each "
        "run's median beyond its operators' (time between operators, the runner's overhead), so Δ adds up to the "
        "median's change",
    )


def print_numerics_comparison(first: LocalRun, second: LocalRun, comparison: NumericsComparison) -> None:
    """Where two runs' values part ways: the first operator that diverges, then the largest differences."""

    def place(row: OperatorRecord) -> str:
        return f"{row.module or row.node} ({row.source or 'no source line'})"

    rows = [
        [pair.a.op, pair.a.module or pair.a.node, pair.a.source or "—", f"{pair.a.sqnr_db:.1f}",
         f"{pair.b.sqnr_db:.1f}", f"{pair.delta_db:+.1f}", f"{pair.a.introduced_db:.1f}", f"{pair.b.introduced_db:.1f}"]
        for pair in comparison.largest()
    ]  # fmt: skip
    unmatched = (
        f"; measured in one run only: {comparison.only_a} (A), {comparison.only_b} (B)"
        if comparison.only_a or comparison.only_b
        else ""
    )
    console.table(
        f"Numerics: {first.run_id} (A) against {second.run_id} (B), SQNR against fp32 eager",
        ["op", "module", "source", "A dB", "B dB", "B - A", "A added dB", "B added dB"],
        rows,
        caption=f"{len(comparison.pairs)} operators in both, the largest differences first{unmatched}; added dB: the "
        "SQNR of the error the operator added itself (lower: worse)",
    )
    outputs = " / ".join(
        ", ".join(f"{value:.1f}" for value in values) or "—" for values in (comparison.outputs_a, comparison.outputs_b)
    )
    console.info(f"outputs' SQNR against fp32 eager, A / B: {outputs} dB")
    diverged = comparison.first_divergence
    if diverged is None:
        console.info(f"[green]✓[/] no operator differs by {DIVERGENCE_DB:g} dB or more: the runs agree")
        return
    named = diverged.b if diverged.b.fused else diverged.a  # a fused pair is named by its operator's module
    fused = f" (with {', '.join(named.fused)} before it)" if named.fused else ""
    console.warn(
        f"first divergence: {named.op}{fused} in {place(named)}: {diverged.a.sqnr_db:.1f} dB in A, "
        f"{diverged.b.sqnr_db:.1f} dB in B; the error it adds itself: {diverged.a.introduced_db:.1f} dB in A, "
        f"{diverged.b.introduced_db:.1f} dB in B"
    )
