"""summary.json's checks of a program's outputs: each output against the eager model's (OutputCheck), the fp32
correctness check over them (Correctness) and a quantized program's accuracy gate (Accuracy, ACCURACY_DEFAULTS).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from orchestrator.results import summary_checks as check
from orchestrator.results.summary_checks import SummaryError


def _shape(value: Any, field: str) -> tuple[int, ...] | None:
    if value is None:
        return None
    return tuple(int(check.count(n, f"{field}[{index}]") or 0) for index, n in enumerate(check.listing(value, field)))


@dataclass(frozen=True)
class OutputCheck:
    """One output of the program against the same output of the eager model (results/validity.py).

    `kind` (lowering/outputs.py) decides what is compared: every output by its errors and SQNR, top-1 and top-5
    only for logits. `ok` is the verdict of the check it belongs to (fp32 correctness, or the accuracy gate).
    """

    name: str
    kind: str  # logits | values
    shape: tuple[int, ...] | None = None
    reference_shape: tuple[int, ...] | None = None  # written only when it differs from `shape`
    max_abs_error: float | None = None  # None with non-finite values (NaN/Inf have no error figure)
    max_rel_error: float | None = None  # max abs error over the reference's largest magnitude
    reference_max_abs: float | None = None
    sqnr_db: float | None = None  # 10·log10(Σref² / Σ(out-ref)²); ±999 for no noise / no signal
    non_finite: int = 0  # NaN or Inf where the reference is finite
    top1_agreement: float | None = None  # logits only, as every top-k figure
    top1_within_noise: float | None = None  # flips between reference logits closer than twice the RMS error forgiven
    top1_flips: int | None = None  # rows whose top-1 differs, not forgiven as a tie within the noise
    top5_overlap: float | None = None
    ok: bool = True
    problems: tuple[str, ...] = ()

    @classmethod
    def from_dict(cls, data: Any, where: str) -> OutputCheck:
        fields = check.mapping(data, where)

        def at(name: str) -> tuple[Any, str]:
            return fields.get(name), f"{where}.{name}"

        return cls(
            name=check.text(*at("name")) or "?",
            kind=check.text(*at("kind")) or "values",
            shape=_shape(*at("shape")),
            reference_shape=_shape(*at("reference_shape")),
            max_abs_error=check.number(*at("max_abs_error")),
            max_rel_error=check.number(*at("max_rel_error")),
            reference_max_abs=check.number(*at("reference_max_abs")),
            sqnr_db=check.number(*at("sqnr_db"), minimum=None),
            non_finite=check.count(*at("non_finite")) or 0,
            top1_agreement=check.share(*at("top1_agreement")),
            top1_within_noise=check.share(*at("top1_within_noise")),
            top1_flips=check.count(*at("top1_flips")),
            top5_overlap=check.share(*at("top5_overlap")),
            ok=check.flag(*at("ok")) is not False,
            problems=check.texts(*at("problems")),
        )

    def to_dict(self) -> dict[str, Any]:
        data = dict(vars(self))
        data["shape"] = list(self.shape) if self.shape is not None else None
        if self.reference_shape is None:
            del data["reference_shape"]
        else:
            data["reference_shape"] = list(self.reference_shape)
        data["problems"] = list(self.problems)
        return data


def _output_checks(value: Any, where: str) -> tuple[OutputCheck, ...]:
    return tuple(
        OutputCheck.from_dict(item, f"{where}[{index}]") for index, item in enumerate(check.listing(value, where))
    )


@dataclass(frozen=True)
class Correctness:
    """The board's outputs against the eager reference, output by output; the worst figures over the outputs."""

    checked: bool = False
    ok: bool | None = None
    reason: str | None = "no reference outputs given"
    max_abs_error: float | None = None
    max_rel_error: float | None = None
    sqnr_db: float | None = None  # the lowest over the outputs
    non_finite: int = 0
    top1_agreement: float | None = None  # the lowest over the logits outputs
    kind_note: str | None = None  # how the outputs' kinds were decided when the sidecar does not record them
    thresholds: dict[str, float] = field(default_factory=dict)
    outputs: tuple[OutputCheck, ...] = ()

    @classmethod
    def from_dict(cls, data: Any) -> Correctness:
        fields = check.mapping(data, "correctness")

        def at(name: str) -> tuple[Any, str]:
            return fields.get(name), f"correctness.{name}"

        return cls(
            checked=check.flag(*at("checked")) is True,
            ok=check.flag(*at("ok")),
            reason=check.text(*at("reason")),
            max_abs_error=check.number(*at("max_abs_error")),
            max_rel_error=check.number(*at("max_rel_error")),
            sqnr_db=check.number(*at("sqnr_db"), minimum=None),
            non_finite=check.count(*at("non_finite")) or 0,
            top1_agreement=check.share(*at("top1_agreement")),
            kind_note=check.text(*at("kind_note")),
            thresholds=check.numbers(*at("thresholds")),
            outputs=_output_checks(*at("outputs")),
        )

    def to_dict(self) -> dict[str, Any]:
        data = dict(vars(self))
        data["thresholds"] = dict(self.thresholds)
        data["outputs"] = [output.to_dict() for output in self.outputs]
        return data


ACCURACY_DEFAULTS = {"min_sqnr_db": 10.0, "min_top1_agreement": 0.9, "min_top5_overlap": 0.6}


@dataclass(frozen=True)
class Accuracy:
    """A quantized run's outputs against the fp32 eager reference, and the gate's verdict on them."""

    scheme: str
    verdict: str  # pass | fail | unchecked
    meaningful: bool  # False with random weights: the figures say little about real use
    max_abs_error: float | None = None
    top1_agreement: float | None = None  # exact argmax agreement
    top1_within_noise: float | None = None  # counting flips between reference logits closer than the noise as ties
    sqnr_db: float | None = None
    top5_overlap: float | None = None
    thresholds: dict[str, float] = field(default_factory=dict)
    reasons: tuple[str, ...] = ()
    note: str | None = None
    outputs: tuple[OutputCheck, ...] = ()  # output by output; the figures above are the worst over them

    @classmethod
    def from_dict(cls, data: Any) -> Accuracy | None:
        if data is None:
            return None
        fields = check.mapping(data, "accuracy")
        verdict = fields.get("verdict")
        if verdict not in ("pass", "fail", "unchecked"):
            raise SummaryError("accuracy.verdict", "must be pass, fail or unchecked")

        def at(name: str) -> tuple[Any, str]:
            return fields.get(name), f"accuracy.{name}"

        return cls(
            scheme=check.text(*at("scheme")) or "?",
            verdict=verdict,
            meaningful=check.flag(*at("meaningful")) is True,
            max_abs_error=check.number(*at("max_abs_error")),
            top1_agreement=check.share(*at("top1_agreement")),
            top1_within_noise=check.share(*at("top1_within_noise")),
            sqnr_db=check.number(*at("sqnr_db"), minimum=None),
            top5_overlap=check.share(*at("top5_overlap")),
            thresholds=check.numbers(*at("thresholds")),
            reasons=check.texts(*at("reasons")),
            note=check.text(*at("note")),
            outputs=_output_checks(*at("outputs")),
        )

    def to_dict(self) -> dict[str, Any]:
        data = dict(vars(self))
        data["reasons"] = list(self.reasons)
        data["outputs"] = [output.to_dict() for output in self.outputs]
        return data
