"""The nightly's verdict on one cell: drift, a suspected shift, a confirmed regression (README "Nightly runs").

`judge` compares tonight's record with the baseline nights (the same program and versions: drift, never a
regression; a changed program: a suspicion that `confirm` settles with the interleaved A/B re-test);
`judge_memory` does the same for peak memory.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from orchestrator.deploy.abtest import Interleaved
from orchestrator.lab.matrix import MIN_BASELINE_NIGHTS
from orchestrator.lab.night_report import CellVerdict
from orchestrator.lab.run_record import RunRecord
from orchestrator.records import to_data
from orchestrator.results.stats import compare_samples
from orchestrator.results.validity import condition_changes
from orchestrator.results.verdicts import Kind

OP_MIN_SHARE = 0.005  # an operator must move at least 0.5% of the total to be named


def same_program(a: RunRecord, b: RunRecord) -> bool:
    """The same .pte and versions (workstation, runtime, runner, board image) on both sides.

    An environment field missing on one side (a history row from an older etlab) is not a difference.
    """
    if not a.pte_sha256 or a.pte_sha256 != b.pte_sha256 or a.versions != b.versions:
        return False
    shared = a.environment.keys() & b.environment.keys()
    return all(a.environment[key] == b.environment[key] for key in shared)


def changed_conditions(record: RunRecord, baseline: RunRecord) -> list[str]:
    """The board conditions that differ between the baseline night and tonight, as readable phrases."""
    changes = condition_changes(baseline.conditions, record.conditions)
    if record.cv is not None and baseline.cv is not None and record.cv > max(2 * baseline.cv, 0.02):
        changes.append(f"timing spread (CV) {baseline.cv:.1%} → {record.cv:.1%}")
    return changes


def judge(
    record: RunRecord, baseline: Sequence[RunRecord], min_effect: float, *, min_nights: int = MIN_BASELINE_NIGHTS
) -> CellVerdict:
    """Compare one cell with its baseline nights (valid runs on the same board, model, backend and versions).

    A shift needs all of: a statistically real shift of the per-iteration samples (stats.compare_samples), an
    effect of at least `min_effect` and at least the night-to-night spread of the baseline, and a median outside
    the range of every baseline night. Nights differ more than iterations within a night, so one baseline night is
    not enough to call anything. What a shift means depends on the program (see the module docstring): for an
    unchanged program it is drift; for a changed one it is a suspicion (`suspect`) the caller re-tests.
    """
    if record.status == "infra":
        return CellVerdict(record, Kind.INFRA, record.error or "")
    if record.status != "ok":
        return CellVerdict(record, Kind.FAILED, record.error or "")
    if record.validity == "invalid":
        return CellVerdict(record, Kind.NOT_COMPARED, "this run is invalid: " + "; ".join(record.reasons))
    usable = [b for b in baseline if b.latencies_ms]
    pooled = [v for b in usable for v in b.latencies_ms]
    current = float(np.median(record.latencies_ms))
    baseline_median = float(np.median(pooled)) if pooled else None
    ratio = current / baseline_median if baseline_median else None
    if len(usable) < min_nights:
        detail = f"building a baseline: {len(usable)} valid night(s) so far, {min_nights} needed"
        return CellVerdict(record, Kind.NEW, detail, baseline_median, ratio)
    degraded = record.validity == "degraded"
    degraded_note = "tonight's run is degraded (" + "; ".join(record.reasons) + ")"
    reference = usable[0]

    if same_program(record, reference):
        # Only the nights of this very program say what it should do; the rest is the board's doing.
        nights = [b for b in usable if same_program(record, b)]
        shift = _shift(record, nights, min_effect)
        same_pooled = [v for b in nights for v in b.latencies_ms]
        drift = current / float(np.median(same_pooled))
        conditions = changed_conditions(record, reference)
        where = "; conditions changed: " + ", ".join(conditions) if conditions else "; no recorded condition changed"
        if degraded:
            detail = f"{degraded_note}, even after a re-measure; no program change, {drift - 1:+.1%} vs baseline"
            return CellVerdict(record, Kind.INCONCLUSIVE, detail + where, baseline_median, ratio, drift=drift)
        if shift is not None:
            detail = f"no program change: {shift} is board drift" + where
            return CellVerdict(record, Kind.DRIFT, detail, baseline_median, ratio, drift=drift)
        return CellVerdict(record, Kind.OK, "no program change; within noise", baseline_median, ratio, drift=drift)

    shift = _shift(record, usable, min_effect)
    if shift is None:
        if degraded:
            return CellVerdict(record, Kind.INCONCLUSIVE, f"{degraded_note}, even after a re-measure")
        return CellVerdict(record, Kind.OK, "program changed; within noise of the baseline", baseline_median, ratio)
    suspect = "slower" if current > (baseline_median or 0) else "faster"
    detail = f"program changed and looks {shift} against the baseline"
    if degraded:
        detail += f"; {degraded_note}"
    verdict = CellVerdict(record, Kind.UNCONFIRMED, detail, baseline_median, ratio, suspect=suspect)
    verdict.reference = reference
    if suspect == "slower":
        verdict.slower_ops = _slower_ops(record, usable, min_effect)
    return verdict


# Verdicts a memory finding may replace: it never hides a failure, a regression or a pending re-test.
_MEMORY_MAY_REPLACE = (Kind.OK, Kind.NEW, Kind.DRIFT, Kind.IMPROVEMENT)


def judge_memory(verdict: CellVerdict, baseline: Sequence[RunRecord], min_effect: float) -> CellVerdict:
    """Peak memory against the baseline nights, with the latency rules: a growth of at least `min_effect` beyond
    every baseline night is board drift for the same program and a regression for a changed one.

    Peak RSS of one program hardly moves between runs, so no interleaved re-test is needed to believe it; the
    verdict info keeps the figures either way, for the report.
    """
    record = verdict.record
    nights = [b.peak_rss_bytes for b in baseline if b.peak_rss_bytes and b.status == "ok"]
    if record.status != "ok" or not record.peak_rss_bytes or not nights:
        return verdict
    reference = float(np.median(nights))
    growth = record.peak_rss_bytes / reference - 1
    verdict.memory = {"peak_rss_bytes": record.peak_rss_bytes, "baseline_peak_rss_bytes": reference, "growth": growth}
    if len(nights) < MIN_BASELINE_NIGHTS or growth < min_effect or record.peak_rss_bytes <= max(nights):
        return verdict
    same = bool(baseline) and same_program(record, baseline[0])
    detail = (
        f"peak memory {record.peak_rss_bytes / 1e6:.1f} MB is {growth:+.1%} over the baseline's "
        f"{reference / 1e6:.1f} MB"
    )
    if verdict.verdict not in _MEMORY_MAY_REPLACE:
        verdict.detail += f"; {detail}"
        return verdict
    if same:
        verdict.verdict = Kind.DRIFT
        verdict.detail = f"no program change: {detail}, board drift" + (f"; {verdict.detail}" if verdict.detail else "")
    else:
        verdict.verdict = Kind.REGRESSION
        verdict.detail = f"program changed: {detail}" + (f"; {verdict.detail}" if verdict.detail else "")
    return verdict


def _shift(record: RunRecord, nights: Sequence[RunRecord], min_effect: float) -> str | None:
    """ "12.0% slower (p=…, CI …); baseline: …" when tonight is beyond the baseline nights, else None."""
    pooled = [v for b in nights for v in b.latencies_ms]
    medians = [float(np.median(b.latencies_ms)) for b in nights]
    spread = (max(medians) - min(medians)) / float(np.median(medians)) if len(medians) > 1 else 0.0
    threshold = max(min_effect, spread)
    verdict = compare_samples(pooled, record.latencies_ms, min_effect=threshold)
    current = float(np.median(record.latencies_ms))
    beyond = current > max(medians) if verdict.change == "slower" else current < min(medians)
    if not (verdict.is_change and beyond):
        return None
    return f"{verdict.reason}; baseline: {len(nights)} nights, {len(pooled)} samples, threshold {threshold:.1%}"


def confirm(verdict: CellVerdict, result: Interleaved | None, *, why_not: str | None = None) -> CellVerdict:
    """Settle a suspected cell with its interleaved re-test (None with `why_not` when it could not run)."""
    if result is None or result.error:
        reason = why_not or (result.reason if result else "no re-test")
        verdict.detail += f"; not confirmed: {reason}"
        verdict.retest = to_data(result.outcome) if result else None
        return verdict
    verdict.retest = to_data(result.outcome)
    figures = (
        f"interleaved re-test: baseline program {result.median_a_ms:.3f} ms, tonight's {result.median_b_ms:.3f} ms "
        f"({(result.ratio or 1) - 1:+.1%}, {result.timing})"
    )
    if result.confirmed and result.change == verdict.suspect:
        verdict.verdict = Kind.REGRESSION if result.change == "slower" else Kind.IMPROVEMENT
        verdict.detail += f"; confirmed by the {figures}: {result.reason}"
        if verdict.verdict == Kind.REGRESSION and verdict.slower_ops:
            verdict.detail += "; slower operators: " + ", ".join(op["op"] for op in verdict.slower_ops[:5])
        return verdict
    verdict.slower_ops = []
    verdict.detail += f"; not confirmed by the {figures}: {result.reason}"
    return verdict


def _slower_ops(record: RunRecord, baseline: Sequence[RunRecord], min_effect: float) -> list[dict[str, Any]]:
    total = record.median_ms or 0.0
    rows = []
    for key, (name, current) in record.ops.items():
        before = [b.ops[key][1] for b in baseline if key in b.ops]
        if not before:
            continue
        reference = float(np.median(before))
        delta = current - reference
        if reference > 0 and current / reference - 1 >= min_effect and delta >= OP_MIN_SHARE * total:
            rows.append({"op": f"{name} [{key}]", "baseline_ms": reference, "current_ms": current, "delta_ms": delta})
    return sorted(rows, key=lambda row: -row["delta_ms"])
