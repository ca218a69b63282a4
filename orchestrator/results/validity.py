"""The bundle around the profile: latency, board conditions, correctness of the outputs, and validity."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from orchestrator.errors import AnalysisError
from orchestrator.lowering.outputs import LOGITS, kind_from_shape, output_kind
from orchestrator.lowering.sidecar import Sidecar
from orchestrator.results.stats import distribution
from orchestrator.results.summary import Latency, Reason, Validity, ValidityStatus, WarmLatency
from orchestrator.results.summary_outputs import Accuracy, Correctness, OutputCheck
from orchestrator.tensorfile import TensorFileError, read_tensors

CV_LIMIT = 0.05  # warm iterations varying more than this make a run "degraded"
HOT_CELSIUS = 80.0
TIMING_AGREEMENT = 0.25  # ETDump's Method::execute vs timings.json, relative
# An fp32 program against its eager model, judged at each output's own scale (a random-weight model's logits may be
# 1e-8: no absolute tolerance fits every model). Measured with the native runner, fp32 vs eager on the tiny models
# (distilbert, gpt2, mobilenet-v2, resnet-18): XNNPACK 98.8-130.8 dB, portable 119.7-132.1 dB, max relative error
# at most 7.4e-6; a 1% error everywhere is 40 dB, a wrong program (shuffled logits, scaled weights) under 20 dB.
MIN_SQNR_DB = 40.0
OUTPUT_RTOL = 1e-2  # the largest error, relative to the reference output's largest magnitude


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


def _time(value: Any, field: str) -> float | None:
    """A board's time in ms: a finite number, else unknown; a negative one is impossible, and refused."""
    time = number(value)
    if time is not None and time < 0:
        raise AnalysisError(f"timings.json: {field}: {value!r} is a negative time")
    return time


def _times(value: Any, field: str) -> list[float]:
    """A board's list of times: its finite numbers (anything else skipped); a negative one refuses the bundle."""
    items = value if isinstance(value, list) else []
    return [time for index, item in enumerate(items) if (time := _time(item, f"{field}[{index}]")) is not None]


def _board_count(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def latency_summary(timings: dict[str, Any] | None) -> Latency:
    """timings.json's latency figures, as summary.json records them (what its reader accepts back)."""
    timings = timings or {}
    warmup = _times(timings.get("warmup_ms"), "warmup_ms")
    iterations = _times(timings.get("iterations_ms"), "iterations_ms")
    first = warmup[0] if warmup else (iterations[0] if iterations else None)
    warm = distribution(iterations)
    stopped = timings.get("stopped_early")
    return Latency(
        load_ms=_time(timings.get("load_ms"), "load_ms"),
        method_init_ms=_time(timings.get("method_init_ms"), "method_init_ms"),
        first_run_ms=first,
        warmup_runs=len(warmup),
        iterations=len(iterations),
        iterations_requested=_board_count(timings.get("iterations_requested")),
        stopped_early=stopped if isinstance(stopped, bool) else None,
        threads=_board_count(timings.get("threads")),
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


def _cores(value: Any) -> int | None:
    """A board's count of online cores, if it is one (readers multiply by it)."""
    return value if isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= 4096 else None


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
        "cores_online": _cores(get(after, "cores_online")) or _cores(get(before, "cores_online")),
        "load_1m_before": number(get(before, "load_1m")),
        "governor_before": get(before, "governor"),
        "governor_after": get(after, "governor"),
        "temperature_c_before": number(get(before, "temperature_c")),
        "temperature_c_after": number(get(after, "temperature_c")),
        "throttled_before": throttled_before,
        "throttled_after": throttled_after,
        "throttling_during_run": sorted(set(during)),
        # what the board ran on: a firmware, kernel or config.txt change moves results by 8-20% on a Pi
        "kernel": _text(get(before, "kernel")),
        "firmware": _text(get(before, "firmware")),
        "config_txt_sha256": _text((get(before, "config_txt") or {}).get("sha256"))
        if isinstance(get(before, "config_txt"), dict)
        else None,
    }


def _text(value: Any) -> str | None:
    return value[:200] if isinstance(value, str) else None


# The board conditions a comparison names when they differ, with their words (`load` is a night's record's).
CONDITIONS = (
    ("governor_before", "governor"),
    ("temperature_c_after", "temperature °C"),
    ("throttling_during_run", "throttling"),
    ("load", "load"),
    ("kernel", "kernel"),
    ("firmware", "firmware"),
    ("config_txt_sha256", "config.txt"),
)


def condition_changes(before: Mapping[str, Any], after: Mapping[str, Any]) -> list[str]:
    """The board conditions that differ between two runs, as readable phrases ("kernel 6.6.20 → 6.6.31")."""
    changes = []
    for key, label in CONDITIONS:
        was, now = before.get(key), after.get(key)
        if isinstance(was, float) and isinstance(now, float):
            if abs(now - was) >= 2.0:  # a couple of degrees is the sensor's noise
                changes.append(f"{label} {was:.1f} → {now:.1f}")
        elif was != now and (was or now):
            if label == "config.txt":  # a digest: its start says enough
                was, now = (value[:12] if isinstance(value, str) else value for value in (was, now))
            changes.append(f"{label} {was or '—'} → {now or '—'}")
    return changes


def output_kinds(sidecar: Sidecar | None) -> tuple[list[str], str | None]:
    """The kind of each output by position, from the sidecar, and a note when they were not recorded there.

    Sidecars written before kinds were recorded give them from their task when it says, else from the shape (logits
    iff a rank-2 float [batch, classes] output: `OutputRecord` guesses that when it reads one); without a sidecar
    (a program lowered elsewhere) [] and the shape rule applies to every output.
    """
    shape_rule = "logits iff rank-2 float [batch, classes]"
    if sidecar is None:
        return [], f"no sidecar: output kinds guessed from their shapes ({shape_rule})"
    if all(output.kind_recorded for output in sidecar.outputs):
        return [output.kind for output in sidecar.outputs], None
    task_kind = output_kind(sidecar.task)
    if task_kind is not None:
        return [task_kind] * len(sidecar.outputs), f"the sidecar records no output kinds: {task_kind} from its task"
    return [output.kind for output in sidecar.outputs], f"the sidecar records no output kinds: guessed ({shape_rule})"


def _sqnr_db(board: np.ndarray, eager: np.ndarray) -> float:
    """Signal (the reference) to noise (the difference) in dB; ±999 stands for no noise / no signal (JSON has no
    infinity)."""
    signal, noise = float(np.sum(eager * eager)), float(np.sum((board - eager) ** 2))
    if noise == 0.0:
        return 999.0
    if signal == 0.0:
        return -999.0
    return max(-999.0, min(999.0, 10.0 * math.log10(signal / noise)))


def _top_k(rows: np.ndarray, k: int) -> np.ndarray:
    """Each row's k largest entries' indices, in no order: a partition, not a sort (a full sort of every
    position's vocabulary, [128, 30522] for DistilBERT, cost more than the rest of the analysis)."""
    return np.argpartition(rows, -k, axis=1)[:, -k:]


def _class_figures(board: np.ndarray, eager: np.ndarray, rms: float) -> dict[str, Any]:
    """Top-1 and top-5 of logits, the last axis being the classes (vocabulary); `rms`: the RMS error."""
    flat_a, flat_b = board.reshape(-1, board.shape[-1]), eager.reshape(-1, eager.shape[-1])
    top_a, top_b = flat_a.argmax(axis=1), flat_b.argmax(axis=1)
    rows = np.arange(len(flat_b))
    margin = flat_b[rows, top_b] - flat_b[rows, top_a]
    # A flip between reference logits closer than the noise is a tie the noise decides, not a disagreement. The
    # noise is the RMS error: the max error is at least half of any flip's margin, so it would forgive them all.
    within = (top_a == top_b) | (margin <= 2 * rms)
    k = min(5, flat_b.shape[-1])
    best_a, best_b = _top_k(flat_a, k), _top_k(flat_b, k)
    return {
        "top1_agreement": float(np.mean(top_a == top_b)),
        "top1_within_noise": float(np.mean(within)),
        "top1_flips": int(np.count_nonzero(~within)),
        "top5_overlap": float(np.mean([len(set(x) & set(y)) / k for x, y in zip(best_a, best_b, strict=True)])),
    }


def compare_output(name: str, board: np.ndarray, eager: np.ndarray, kind: str | None = None) -> OutputCheck:
    """The figures of one output against the reference, unjudged (`ok` stays True; the judges decide).

    `kind` None: guessed from the reference's shape (lowering/outputs.py `kind_from_shape`).
    """
    kind = kind or kind_from_shape(eager.shape, str(eager.dtype))
    if board.shape != eager.shape:
        return OutputCheck(name, kind, tuple(board.shape), tuple(eager.shape))
    a, b = board.astype(np.float64), eager.astype(np.float64)
    shape = tuple(board.shape)
    if not a.size:
        return OutputCheck(name, kind, shape, max_abs_error=0.0, max_rel_error=0.0, sqnr_db=999.0)
    # Every comparison with NaN is false: non-finite board values must be caught before any threshold.
    finite = np.isfinite(b)
    all_finite = bool(finite.all())  # the usual case: no boolean-indexed copies of large outputs
    bad = int(np.count_nonzero(finite & ~np.isfinite(a)))
    scale = float(np.max(np.abs(b if all_finite else b[finite]))) if all_finite or finite.any() else 0.0
    if bad:
        return OutputCheck(name, kind, shape, reference_max_abs=scale, non_finite=bad)
    both = finite & np.isfinite(a)
    a_both, b_both = (a, b) if all_finite else (a[both], b[both])
    difference = a_both - b_both
    error = float(np.max(np.abs(difference))) if difference.size else 0.0
    relative = error / scale if scale > 0 else (0.0 if error == 0 else None)
    figures: dict[str, Any] = {}
    is_float = np.issubdtype(eager.dtype, np.floating)
    if kind == LOGITS and is_float and b.ndim >= 1 and b.shape[-1] > 1:
        rms = float(np.sqrt(np.mean((difference if all_finite else a - b) ** 2)))
        figures = _class_figures(a, b, rms)
    return OutputCheck(
        name,
        kind,
        shape,
        max_abs_error=error,
        max_rel_error=relative,
        reference_max_abs=scale,
        sqnr_db=_sqnr_db(a_both, b_both),
        **figures,
    )


class _Incomparable(Exception):
    """The outputs cannot be compared with the reference: unreadable (unchecked) or a different count (checked)."""

    def __init__(self, reason: str, *, checked: bool) -> None:
        super().__init__(reason)
        self.checked = checked


def _compare_files(outputs: Path, reference: Path, kinds: Sequence[str | None]) -> list[tuple[OutputCheck, bool]]:
    """Each output compared with its reference, and whether it is floating-point; _Incomparable when they cannot
    be."""
    try:
        got, want = read_tensors(outputs), read_tensors(reference)
    except TensorFileError as exc:
        raise _Incomparable(str(exc), checked=False) from None
    if len(got) != len(want):
        raise _Incomparable(f"{len(got)} outputs, reference has {len(want)}", checked=True)
    compared = []
    for position, (board, eager) in enumerate(zip(got, want, strict=True)):
        name = eager.name or board.name or f"output {position}"
        kind = kinds[position] if position < len(kinds) else None
        is_float = bool(np.issubdtype(eager.array.dtype, np.floating))
        compared.append((compare_output(name, board.array, eager.array, kind), is_float))
    return compared


def _fp32_problems(check: OutputCheck, is_float: bool) -> list[str]:
    """Why an fp32 program's output is not the eager model's, judged at the output's own scale."""
    name = check.name
    if check.reference_shape is not None:
        return [f"{name}: shape {list(check.shape or ())}, reference {list(check.reference_shape)}"]
    if check.non_finite:
        return [f"{name}: {check.non_finite} non-finite value(s) (NaN or Inf) where the reference is finite"]
    if not is_float:  # integer outputs (ids, masks) are exact or wrong
        if check.max_abs_error:
            return [f"{name}: differs from the reference (max abs error {check.max_abs_error:g})"]
        return []
    problems = []
    if check.sqnr_db is not None and check.sqnr_db < MIN_SQNR_DB:
        problems.append(f"{name}: SQNR {check.sqnr_db:.1f} dB < {MIN_SQNR_DB:g} dB")
    if check.max_rel_error is None or check.max_rel_error > OUTPUT_RTOL:
        shown = "inf" if check.max_rel_error is None else f"{check.max_rel_error:.3g}"
        problems.append(
            f"{name}: max abs error {check.max_abs_error:.3g} is {shown} of the reference's largest magnitude "
            f"{check.reference_max_abs:.3g} (limit {OUTPUT_RTOL:g})"
        )
    if check.top1_flips:
        problems.append(f"{name}: top-1 differs from the reference in {check.top1_flips} row(s)")
    return problems


def _worst(values: Sequence[float | None], pick: Any) -> float | None:
    present = [v for v in values if v is not None]
    return pick(present) if present else None


def check_outputs(
    outputs: Path, reference: Path, kinds: Sequence[str | None] = (), kind_note: str | None = None
) -> Correctness:
    """Board outputs vs eager reference outputs of an fp32 program, output by output: max abs and relative error,
    SQNR, and top-1 where the output is logits (`kinds` by position; the shape rule where it has none)."""
    thresholds = {"min_sqnr_db": MIN_SQNR_DB, "max_rel_error": OUTPUT_RTOL}
    try:
        compared = _compare_files(outputs, reference, kinds)
    except _Incomparable as exc:
        return Correctness(exc.checked, False, str(exc), kind_note=kind_note, thresholds=thresholds)
    checks, problems = [], []
    for check, is_float in compared:
        found = _fp32_problems(check, is_float)
        problems += found
        checks.append(dataclasses.replace(check, ok=not found, problems=tuple(found)))
    non_finite = sum(c.non_finite for c in checks)
    return Correctness(
        checked=True,
        ok=not problems,
        reason="; ".join(problems) or None,
        max_abs_error=None if non_finite else _worst([c.max_abs_error for c in checks], max),
        max_rel_error=None if non_finite else _worst([c.max_rel_error for c in checks], max),
        sqnr_db=_worst([c.sqnr_db for c in checks], min),
        non_finite=non_finite,
        top1_agreement=_worst([c.top1_agreement for c in checks], min),
        kind_note=kind_note,
        thresholds=thresholds,
        outputs=tuple(checks),
    )


def accuracy_figures(outputs: Path, reference: Path, kinds: Sequence[str | None] = ()) -> dict[str, Any] | str:
    """Per floating-point output: max abs error, SQNR (dB), and for logits top-1 agreement and top-5 overlap; at
    the top level the worst of each over the outputs. A reason string when the outputs cannot be compared."""
    try:
        compared = _compare_files(outputs, reference, kinds)
    except _Incomparable as exc:
        return str(exc)
    checks = []
    for check, is_float in compared:
        if check.reference_shape is not None:
            return f"output {check.name}: shape {list(check.shape or ())}, reference {list(check.reference_shape)}"
        if check.non_finite:
            return f"output {check.name} holds NaN or infinite values"
        if is_float and check.shape and math.prod(check.shape):
            checks.append(check)
    if not checks:
        return "no floating-point outputs to compare"
    return {
        "max_abs_error": _worst([c.max_abs_error for c in checks], max),
        "top1_agreement": _worst([c.top1_agreement for c in checks], min),
        "top1_within_noise": _worst([c.top1_within_noise for c in checks], min),
        "sqnr_db": _worst([c.sqnr_db for c in checks], min),
        "top5_overlap": _worst([c.top5_overlap for c in checks], min),
        "outputs": checks,
    }


def _gate_reasons(check: OutputCheck, thresholds: dict[str, float]) -> list[str]:
    """Why one output fails the accuracy gate: SQNR for every output, top-1 and top-5 for logits."""
    reasons = []
    if check.sqnr_db is not None and check.sqnr_db < thresholds["min_sqnr_db"]:
        reasons.append(f"{check.name}: SQNR {check.sqnr_db:.1f} dB < {thresholds['min_sqnr_db']:g} dB")
    within = check.top1_within_noise
    if within is not None and within < thresholds["min_top1_agreement"]:
        reasons.append(
            f"{check.name}: top-1 agreement {within:.2f} < {thresholds['min_top1_agreement']:g} "
            "(ties within noise forgiven)"
        )
    if check.top5_overlap is not None and check.top5_overlap < thresholds["min_top5_overlap"]:
        reasons.append(f"{check.name}: top-5 overlap {check.top5_overlap:.2f} < {thresholds['min_top5_overlap']:g}")
    return reasons


def weights_meaning(weights: str | None) -> tuple[bool, str | None]:
    """Whether accuracy figures mean anything with these weights, and the note saying so when they do not."""
    meaningful = weights in ("pretrained", "own")  # "own": a factory's module, weights as its maker gave them
    return meaningful, None if meaningful else f"weights {weights or 'unknown'}: accuracy figures are not meaningful"


def judge_accuracy(
    outputs: Path | None,
    reference: Path | None,
    scheme: str,
    thresholds: dict[str, float],
    weights: str | None,
    kinds: Sequence[str | None] = (),
) -> Accuracy:
    """The accuracy gate, output by output: pass when every output's SQNR, and every logits output's top-1
    agreement and top-5 overlap, reach their thresholds."""
    meaningful, note = weights_meaning(weights)
    if outputs is None or reference is None or not outputs.is_file() or not reference.is_file():
        return Accuracy(scheme, "unchecked", meaningful, thresholds=thresholds, note="no outputs or reference")
    figures = accuracy_figures(outputs, reference, kinds)
    if isinstance(figures, str):
        return Accuracy(scheme, "fail", meaningful, thresholds=thresholds, reasons=(figures,), note=note)
    checks, reasons = [], []
    for check in figures["outputs"]:
        found = _gate_reasons(check, thresholds)
        reasons += found
        checks.append(dataclasses.replace(check, ok=not found, problems=tuple(found)))
    return Accuracy(
        scheme,
        "fail" if reasons else "pass",
        meaningful,
        max_abs_error=figures["max_abs_error"],
        top1_agreement=figures["top1_agreement"],
        top1_within_noise=figures["top1_within_noise"],
        sqnr_db=figures["sqnr_db"],
        top5_overlap=figures["top5_overlap"],
        thresholds=dict(thresholds),
        reasons=tuple(reasons),
        note=note,
        outputs=tuple(checks),
    )


def judge_validity(
    manifest: dict[str, Any],
    latency: Latency,
    board: dict[str, Any],
    correctness: Correctness,
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
    if correctness.checked and not correctness.ok and not quantized:
        reasons.append(("invalid", f"output mismatch: {correctness.reason}"))
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
    verdict: ValidityStatus = "invalid" if "invalid" in levels else "degraded" if "degraded" in levels else "valid"
    return Validity(verdict, tuple(Reason(level, reason) for level, reason in reasons))
