"""summary.json's checks of a program's outputs: each output against the eager model's (OutputCheck), the fp32
correctness check over them (Correctness) and a quantized program's accuracy gate (Accuracy, ACCURACY_DEFAULTS).

Records (orchestrator/records.py): the field types are the checks a reader makes (a share 0..1, a count an integer
>= 0, an SQNR any finite number), written by `to_data` and read back with summary.json (summary.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from orchestrator.records import Count, Duration, Share


@dataclass(frozen=True)
class OutputCheck:
    """One output of the program against the same output of the eager model (results/validity.py).

    `kind` (lowering/outputs.py) decides what is compared: every output by its errors and SQNR, top-1 and top-5
    only for logits. `ok` is the verdict of the check it belongs to (fp32 correctness, or the accuracy gate).
    """

    name: str = "?"
    kind: str = "values"  # logits | values
    shape: tuple[Count, ...] | None = None
    reference_shape: tuple[Count, ...] | None = None  # set only when it differs from `shape`
    max_abs_error: Duration | None = None  # None with non-finite values (NaN/Inf have no error figure)
    max_rel_error: Duration | None = None  # max abs error over the reference's largest magnitude
    reference_max_abs: Duration | None = None
    sqnr_db: float | None = None  # 10·log10(Σref² / Σ(out-ref)²); ±999 for no noise / no signal
    non_finite: Count = 0  # NaN or Inf where the reference is finite
    top1_agreement: Share | None = None  # logits only, as every top-k figure
    top1_within_noise: Share | None = None  # flips between reference logits closer than twice the RMS error forgiven
    top1_flips: Count | None = None  # rows whose top-1 differs, not forgiven as a tie within the noise
    top5_overlap: Share | None = None
    ok: bool = True
    problems: tuple[str, ...] = ()


@dataclass(frozen=True)
class Correctness:
    """The board's outputs against the eager reference, output by output; the worst figures over the outputs."""

    checked: bool = False
    ok: bool | None = None
    reason: str | None = "no reference outputs given"
    max_abs_error: Duration | None = None
    max_rel_error: Duration | None = None
    sqnr_db: float | None = None  # the lowest over the outputs
    non_finite: Count = 0
    top1_agreement: Share | None = None  # the lowest over the logits outputs
    kind_note: str | None = None  # how the outputs' kinds were decided when the sidecar does not record them
    thresholds: dict[str, float] = field(default_factory=dict)
    outputs: tuple[OutputCheck, ...] = ()


ACCURACY_DEFAULTS = {"min_sqnr_db": 10.0, "min_top1_agreement": 0.9, "min_top5_overlap": 0.6}


@dataclass(frozen=True)
class Accuracy:
    """A quantized run's outputs against the fp32 eager reference, and the gate's verdict on them."""

    scheme: str
    verdict: Literal["pass", "fail", "unchecked"]
    meaningful: bool  # False with random weights: the figures say little about real use
    max_abs_error: Duration | None = None
    top1_agreement: Share | None = None  # exact argmax agreement
    top1_within_noise: Share | None = None  # counting flips between reference logits closer than the noise as ties
    sqnr_db: float | None = None
    top5_overlap: Share | None = None
    thresholds: dict[str, float] = field(default_factory=dict)
    reasons: tuple[str, ...] = ()
    note: str | None = None
    outputs: tuple[OutputCheck, ...] = ()  # output by output; the figures above are the worst over them
