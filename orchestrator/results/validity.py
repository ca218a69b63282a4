"""The bundle around the profile: latency, board conditions, correctness of the outputs, and validity."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np

from orchestrator.results.stats import distribution
from orchestrator.results.summary import Accuracy, Latency, Reason, Validity, WarmLatency
from orchestrator.tensorfile import TensorFileError, read_tensors

CV_LIMIT = 0.05  # warm iterations varying more than this make a run "degraded"
HOT_CELSIUS = 80.0
TIMING_AGREEMENT = 0.25  # ETDump's Method::execute vs timings.json, relative
OUTPUT_RTOL = 1e-2  # relative to the reference output's largest magnitude
OUTPUT_ATOL = 1e-4


def number_list(value: Any) -> list[float]:
    """The finite numbers of a board's JSON list (anything else in it is skipped); [] when it is no list."""
    if not isinstance(value, list):
        return []
    return [x for x in map(number, value) if x is not None]


def number(value: Any) -> float | None:
    """A board's JSON number as a finite float, else None (an integer too big for a float is None too)."""
    if not isinstance(value, int | float) or isinstance(value, bool):
        return None
    try:
        result = float(value)
    except OverflowError:
        return None
    return result if math.isfinite(result) else None


def latency_summary(timings: dict[str, Any] | None) -> Latency:
    timings = timings or {}
    warmup = number_list(timings.get("warmup_ms"))
    iterations = number_list(timings.get("iterations_ms"))
    first = warmup[0] if warmup else (iterations[0] if iterations else None)
    warm = distribution(iterations)
    requested, stopped, threads = (timings.get(k) for k in ("iterations_requested", "stopped_early", "threads"))
    return Latency(
        load_ms=number(timings.get("load_ms")),
        method_init_ms=number(timings.get("method_init_ms")),
        first_run_ms=first,
        warmup_runs=len(warmup),
        iterations=len(iterations),
        iterations_requested=requested if isinstance(requested, int) and not isinstance(requested, bool) else None,
        stopped_early=stopped if isinstance(stopped, bool) else None,
        threads=threads if isinstance(threads, int) and not isinstance(threads, bool) else None,
        warm=WarmLatency(warm.min, warm.median, warm.mean, warm.p90, warm.max, warm.cv) if warm else None,
    )


def _throttle(info: dict[str, Any] | None) -> dict[str, Any] | None:
    throttled = info.get("throttled") if isinstance(info, dict) else None
    if not isinstance(throttled, dict):
        return None
    active = throttled.get("active")
    if not isinstance(active, list):
        flags = throttled.get("flags")
        active = [name for name, on in flags.items() if on] if isinstance(flags, dict) else []
    return {"raw": throttled.get("raw"), "active": [str(flag) for flag in active]}


def board_conditions(before: dict[str, Any] | None, after: dict[str, Any] | None) -> dict[str, Any]:
    """Governor, temperature and throttling around the run, read defensively (any field may be missing)."""

    def get(info: dict[str, Any] | None, key: str) -> Any:
        return info.get(key) if isinstance(info, dict) else None

    throttled_before, throttled_after = _throttle(before), _throttle(after)
    seen_before = set(throttled_before["active"]) if throttled_before else set()
    during = []
    if throttled_after:
        during = [f for f in throttled_after["active"] if f.endswith("_now") or f not in seen_before]
    if throttled_before:
        during += [f for f in throttled_before["active"] if f.endswith("_now") and f not in during]
    return {
        "hostname": get(after, "hostname") or get(before, "hostname"),
        "board_model": get(after, "model") or get(before, "model"),
        "arch": get(after, "arch") or get(before, "arch"),
        "cores_online": get(after, "cores_online") or get(before, "cores_online"),
        "governor_before": get(before, "governor"),
        "governor_after": get(after, "governor"),
        "temperature_c_before": number(get(before, "temperature_c")),
        "temperature_c_after": number(get(after, "temperature_c")),
        "throttled_before": throttled_before,
        "throttled_after": throttled_after,
        "throttling_during_run": sorted(set(during)),
    }


def check_outputs(outputs: Path, reference: Path) -> dict[str, Any]:
    """Board outputs vs eager reference outputs: max abs error and top-1 agreement per output."""
    try:
        got, want = read_tensors(outputs), read_tensors(reference)
    except TensorFileError as exc:
        return {"checked": False, "ok": False, "reason": str(exc), "outputs": []}
    if len(got) != len(want):
        return {"checked": True, "ok": False, "reason": f"{len(got)} outputs, reference has {len(want)}", "outputs": []}
    rows, problems = [], []
    for position, (board, eager) in enumerate(zip(got, want, strict=True)):
        name = eager.name or board.name or f"output {position}"
        if board.shape != eager.shape:
            problems.append(f"{name}: shape {board.shape}, reference {eager.shape}")
            rows.append({"name": name, "shape": board.shape, "reference_shape": eager.shape})
            continue
        a, b = board.array.astype(np.float64), eager.array.astype(np.float64)
        # Every comparison with NaN is false: non-finite board values must be caught before any threshold.
        finite = np.isfinite(b)
        bad = int(np.count_nonzero(finite & ~np.isfinite(a)))
        both = finite & np.isfinite(a)
        error = float(np.max(np.abs(a - b)[both])) if both.any() else 0.0
        scale = float(np.max(np.abs(b[finite]))) if finite.any() else 0.0
        row: dict[str, Any] = {"name": name, "shape": board.shape, "max_abs_error": error, "reference_max_abs": scale}
        if bad:
            row["max_abs_error"] = None  # NaN/Inf have no error figure (and are not valid JSON)
            row["non_finite"] = bad
            problems.append(f"{name}: {bad} non-finite value(s) (NaN or Inf) where the reference is finite")
            rows.append(row)
            continue
        if np.issubdtype(eager.array.dtype, np.floating) and b.ndim >= 1 and b.shape[-1] > 1:
            flat_a, flat_b = a.reshape(-1, a.shape[-1]), b.reshape(-1, b.shape[-1])
            top_a, top_b = flat_a.argmax(axis=1), flat_b.argmax(axis=1)
            rows_ref = np.arange(len(flat_b))
            # A flip between near-equal reference logits is a tie, not a disagreement.
            margin = flat_b[rows_ref, top_b] - flat_b[rows_ref, top_a]
            genuine = (top_a != top_b) & (margin > 2 * error)
            row["top1_agreement"] = float(np.mean(top_a == top_b))
            if genuine.any():
                problems.append(f"{name}: top-1 differs from the reference in {int(genuine.sum())} row(s)")
        if error > OUTPUT_ATOL + OUTPUT_RTOL * scale:
            problems.append(f"{name}: max abs error {error:.3g} exceeds {OUTPUT_ATOL + OUTPUT_RTOL * scale:.3g}")
        rows.append(row)
    errors = [r["max_abs_error"] for r in rows if r.get("max_abs_error") is not None]
    agreements = [r["top1_agreement"] for r in rows if "top1_agreement" in r]
    non_finite = sum(r.get("non_finite", 0) for r in rows)
    return {
        "checked": True,
        "ok": not problems,
        "reason": "; ".join(problems) or None,
        "max_abs_error": None if non_finite else max(errors) if errors else None,
        "non_finite": non_finite,
        "top1_agreement": min(agreements) if agreements else None,
        "outputs": rows,
    }


def accuracy_figures(outputs: Path, reference: Path) -> dict[str, float | None] | str:
    """Max abs error, top-1 agreement, SQNR (dB) and top-5 overlap of the outputs against the reference.

    Over every floating-point output of the reference's shape; the last axis is the class (vocabulary) axis.
    Returns a reason string when the outputs cannot be compared.
    """
    try:
        got, want = read_tensors(outputs), read_tensors(reference)
    except TensorFileError as exc:
        return str(exc)
    if len(got) != len(want):
        return f"{len(got)} outputs, reference has {len(want)}"
    signal = noise = 0.0
    errors: list[float] = []
    top1: list[float] = []
    top1_within_noise: list[float] = []
    top5: list[float] = []
    for board, eager in zip(got, want, strict=True):
        if board.shape != eager.shape:
            return f"output {eager.name}: shape {board.shape}, reference {eager.shape}"
        a, b = board.array.astype(np.float64), eager.array.astype(np.float64)
        if not a.size or not np.issubdtype(eager.array.dtype, np.floating):
            continue
        if not np.all(np.isfinite(a)):
            return f"output {eager.name} holds NaN or infinite values"
        errors.append(float(np.max(np.abs(a - b))))
        signal += float(np.sum(b * b))
        noise += float(np.sum((a - b) ** 2))
        if b.ndim >= 1 and b.shape[-1] > 1:
            flat_a, flat_b = a.reshape(-1, a.shape[-1]), b.reshape(-1, b.shape[-1])
            top_a, top_b = flat_a.argmax(axis=1), flat_b.argmax(axis=1)
            top1.append(float(np.mean(top_a == top_b)))
            # A flip between reference logits closer than twice the RMS error is a tie the noise decides.
            rms = float(np.sqrt(np.mean((a - b) ** 2)))
            rows = np.arange(len(flat_b))
            margin = flat_b[rows, top_b] - flat_b[rows, top_a]
            top1_within_noise.append(float(np.mean((top_a == top_b) | (margin <= 2 * rms))))
            k = min(5, flat_b.shape[-1])
            best_a, best_b = np.argsort(-flat_a, axis=1)[:, :k], np.argsort(-flat_b, axis=1)[:, :k]
            top5.append(float(np.mean([len(set(x) & set(y)) / k for x, y in zip(best_a, best_b, strict=True)])))
    if not errors:
        return "no floating-point outputs to compare"
    if noise == 0.0:
        sqnr = math.inf
    elif signal == 0.0:
        sqnr = -math.inf
    else:
        sqnr = 10.0 * math.log10(signal / noise)
    return {
        "max_abs_error": max(errors),
        "top1_agreement": min(top1) if top1 else None,
        "top1_within_noise": min(top1_within_noise) if top1_within_noise else None,
        "sqnr_db": sqnr if math.isfinite(sqnr) else (999.0 if sqnr > 0 else -999.0),
        "top5_overlap": min(top5) if top5 else None,
    }


def judge_accuracy(
    outputs: Path | None, reference: Path | None, scheme: str, thresholds: dict[str, float], weights: str | None
) -> Accuracy:
    """The accuracy gate: pass when SQNR, top-1 agreement and top-5 overlap reach their thresholds."""
    meaningful = weights in ("pretrained", "own")  # "own": a factory's module, weights as its maker gave them
    note = None if meaningful else f"weights {weights or 'unknown'}: accuracy figures are not meaningful"
    if outputs is None or reference is None or not outputs.is_file() or not reference.is_file():
        return Accuracy(scheme, "unchecked", meaningful, thresholds=thresholds, note="no outputs or reference")
    figures = accuracy_figures(outputs, reference)
    if isinstance(figures, str):
        return Accuracy(scheme, "fail", meaningful, thresholds=thresholds, reasons=(figures,), note=note)
    reasons = []
    sqnr, top1, top5 = figures["sqnr_db"], figures["top1_agreement"], figures["top5_overlap"]
    if sqnr is not None and sqnr < thresholds["min_sqnr_db"]:
        reasons.append(f"SQNR {sqnr:.1f} dB < {thresholds['min_sqnr_db']:g} dB")
    within = figures["top1_within_noise"]
    if within is not None and within < thresholds["min_top1_agreement"]:
        reasons.append(
            f"top-1 agreement {within:.2f} < {thresholds['min_top1_agreement']:g} (ties within noise forgiven)"
        )
    if top5 is not None and top5 < thresholds["min_top5_overlap"]:
        reasons.append(f"top-5 overlap {top5:.2f} < {thresholds['min_top5_overlap']:g}")
    return Accuracy(
        scheme,
        "fail" if reasons else "pass",
        meaningful,
        max_abs_error=figures["max_abs_error"],
        top1_agreement=top1,
        top1_within_noise=within,
        sqnr_db=sqnr,
        top5_overlap=top5,
        thresholds=dict(thresholds),
        reasons=tuple(reasons),
        note=note,
    )


def judge_validity(
    manifest: dict[str, Any],
    latency: Latency,
    board: dict[str, Any],
    correctness: dict[str, Any],
    notes: list[tuple[str, str]],
    *,
    quantized: bool = False,
) -> Validity:
    """valid / degraded / invalid, with every reason. `notes` are (level, reason) pairs found along the way.

    A quantized program's outputs differ from fp32 by design: they are judged by the accuracy gate instead.
    """
    reasons = list(notes)
    status = manifest.get("status")
    if status != "ok":
        error = manifest.get("error") or f"exit code {manifest.get('runner_exit_code')}"
        reasons.append(("invalid", f"runner status {status!r}: {error}"))
    if not latency.iterations:
        reasons.append(("invalid", "no measured iterations"))
    if correctness.get("checked") and not correctness.get("ok") and not quantized:
        reasons.append(("invalid", f"output mismatch: {correctness.get('reason')}"))
    if board["throttling_during_run"]:
        reasons.append(("degraded", f"throttling: {', '.join(board['throttling_during_run'])}"))
    for moment in ("before", "after"):
        governor = board[f"governor_{moment}"]
        if governor is not None and governor != "performance":
            reasons.append(("degraded", f"cpufreq governor {governor!r} {moment} the run (want 'performance')"))
            break
    hottest = max(
        (t for t in (board["temperature_c_before"], board["temperature_c_after"]) if t is not None), default=None
    )
    if hottest is not None and hottest >= HOT_CELSIUS:
        reasons.append(("degraded", f"SoC temperature reached {hottest:.1f} °C"))
    warm = latency.warm
    if warm and warm.cv > CV_LIMIT:
        reasons.append(("degraded", f"unstable timings: CV {warm.cv * 100:.1f}% > {CV_LIMIT * 100:.0f}%"))
    levels = {level for level, _ in reasons}
    verdict = "invalid" if "invalid" in levels else "degraded" if "degraded" in levels else "valid"
    return Validity(verdict, tuple(Reason(level, reason) for level, reason in reasons))
