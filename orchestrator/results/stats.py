"""Statistics shared by analysis, compare and the nightly regression detector.

Percentiles use numpy's default (linear interpolation), the same as ExecuTorch's Inspector, so figures agree.

The change verdict (`compare_samples`) answers "did this get slower or faster, or is it noise?" from the
per-iteration samples of two runs. Latency samples are skewed and often carry outliers (a preempted iteration),
so it uses rank- and median-based tools rather than a t-test:

1. Mann-Whitney U (two-sided): are B's samples shifted relative to A's? Rank based, no normality assumption.
2. A bootstrap confidence interval (percentile method, seeded, so results are reproducible) of the ratio
   median(B) / median(A): how large is the shift, and is it clearly away from 1?
3. A minimum effect size (default 5%): a statistically real 1% change is not worth a regression alarm.

A change is reported only when all three agree: p < alpha, the CI excludes 1, and |ratio - 1| >= min_effect.
With fewer than `MIN_SAMPLES` samples per side the verdict is "insufficient data", never a change.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

MIN_SAMPLES = 5
DEFAULT_MIN_EFFECT = 0.05
DEFAULT_ALPHA = 0.01
DEFAULT_CONFIDENCE = 0.95
DEFAULT_BOOTSTRAP = 2000


@dataclass(frozen=True)
class Distribution:
    """Summary of a set of samples (milliseconds unless stated)."""

    n: int
    min: float
    p10: float
    median: float
    mean: float
    p90: float
    max: float
    stdev: float
    cv: float  # coefficient of variation: stdev / mean (0 when the mean is 0)


def _percentile_of_sorted(values: np.ndarray, q: float) -> float:
    """np.percentile's default (linear) method on already sorted values."""
    position = q / 100.0 * (values.size - 1)
    low = int(position)
    high = min(low + 1, values.size - 1)
    low_value, high_value = float(values[low]), float(values[high])
    return low_value + (high_value - low_value) * (position - low)


def distribution(samples: Sequence[float] | np.ndarray) -> Distribution | None:
    """Summarise samples; None when there are none."""
    values = np.sort(np.asarray(samples, dtype=np.float64), axis=None)
    if values.size == 0:
        return None
    mean = float(values.mean())
    stdev = float(values.std(ddof=1)) if values.size > 1 else 0.0
    # One sort serves every percentile: np.percentile per call costs more than the rest (hundreds of ops a run).
    p10, median, p90 = (_percentile_of_sorted(values, q) for q in (10, 50, 90))
    return Distribution(
        n=int(values.size),
        min=float(values[0]),
        p10=p10,
        median=median,
        mean=mean,
        p90=p90,
        max=float(values[-1]),
        stdev=stdev,
        cv=stdev / mean if mean else 0.0,
    )


@dataclass(frozen=True)
class Verdict:
    """Whether B differs from A. `change` is "slower", "faster", "no change" or "insufficient data"."""

    change: str
    ratio: float | None  # median(B) / median(A)
    ci_low: float | None
    ci_high: float | None
    p_value: float | None
    n_a: int
    n_b: int
    min_effect: float
    alpha: float
    reason: str

    @property
    def is_change(self) -> bool:
        return self.change in ("slower", "faster")


def bootstrap_median_ratio(
    a: np.ndarray,
    b: np.ndarray,
    *,
    resamples: int = DEFAULT_BOOTSTRAP,
    confidence: float = DEFAULT_CONFIDENCE,
    seed: int = 0,
) -> tuple[float, float]:
    """Percentile-bootstrap CI of median(b) / median(a)."""
    rng = np.random.default_rng(seed)
    medians_a = np.median(rng.choice(a, size=(resamples, a.size), replace=True), axis=1)
    medians_b = np.median(rng.choice(b, size=(resamples, b.size), replace=True), axis=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratios = medians_b / medians_a
    ratios = ratios[np.isfinite(ratios)]
    if ratios.size == 0:
        return float("nan"), float("nan")
    tail = (1.0 - confidence) / 2.0 * 100.0
    low, high = np.percentile(ratios, [tail, 100.0 - tail])
    return float(low), float(high)


def compare_samples(
    a: Sequence[float] | np.ndarray,
    b: Sequence[float] | np.ndarray,
    *,
    min_effect: float = DEFAULT_MIN_EFFECT,
    alpha: float = DEFAULT_ALPHA,
    confidence: float = DEFAULT_CONFIDENCE,
    resamples: int = DEFAULT_BOOTSTRAP,
    seed: int = 0,
) -> Verdict:
    """Is B (new) slower or faster than A (baseline), or is the difference noise? See the module docstring."""
    from scipy.stats import mannwhitneyu

    values_a = np.asarray(a, dtype=np.float64)
    values_b = np.asarray(b, dtype=np.float64)
    values_a = values_a[np.isfinite(values_a)]
    values_b = values_b[np.isfinite(values_b)]

    def verdict(
        change: str, ratio: float | None, low: float | None, high: float | None, p_value: float | None, reason: str
    ) -> Verdict:
        return Verdict(
            change, ratio, low, high, p_value, n_a=int(values_a.size), n_b=int(values_b.size),
            min_effect=min_effect, alpha=alpha, reason=reason,
        )  # fmt: skip

    if values_a.size < MIN_SAMPLES or values_b.size < MIN_SAMPLES:
        return verdict(
            "insufficient data", None, None, None, None,
            reason=f"need at least {MIN_SAMPLES} samples per run (have {values_a.size} and {values_b.size})",
        )  # fmt: skip
    median_a, median_b = float(np.median(values_a)), float(np.median(values_b))
    if median_a <= 0:
        return verdict("insufficient data", None, None, None, None, reason="baseline median is not positive")
    ratio = median_b / median_a
    if np.array_equal(np.unique(values_a), np.unique(values_b)) and np.unique(values_a).size == 1:
        p_value = 1.0  # identical constant samples: mannwhitneyu would warn
    else:
        p_value = float(mannwhitneyu(values_a, values_b, alternative="two-sided").pvalue)
    low, high = bootstrap_median_ratio(values_a, values_b, resamples=resamples, confidence=confidence, seed=seed)
    significant = p_value < alpha and (low > 1.0 or high < 1.0)
    material = abs(ratio - 1.0) >= min_effect
    if significant and material:
        change = "slower" if ratio > 1.0 else "faster"
        reason = f"{abs(ratio - 1) * 100:.1f}% {change} (p={p_value:.2g}, CI {low:.3f}-{high:.3f})"
    elif significant:
        change = "no change"
        reason = f"shift of {abs(ratio - 1) * 100:.1f}% is below the {min_effect * 100:.0f}% minimum effect"
    else:
        change = "no change"
        reason = f"within noise (p={p_value:.2g}, CI {low:.3f}-{high:.3f})"
    return verdict(change, ratio, low, high, p_value, reason=reason)
