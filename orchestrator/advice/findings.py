"""Findings: what the advisor says about one run, each a measured cause with a predicted saving and a fix.

A finding names the operators it is about (and their nodes, for Model Explorer), their measured time per run and
share of the method, the cause in one sentence, the saving predicted from those measured times, and the fix: a
rewrite etlab can apply (`--rewrites NAME`), a change in the user's code, an option, or a board condition.
Detectors (detectors.py, DETECTORS) find them; advisor.py runs them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from orchestrator.lowering.sidecar import Sidecar
from orchestrator.lowering.spec import ModelSpec
from orchestrator.lowering.variants import Variant
from orchestrator.results.ops_record import OpsRecord
from orchestrator.results.summary import RunSummary

ADVICE_FILE = "advice.json"
FIX_KINDS = ("rewrite", "code", "option", "board")


@dataclass(frozen=True, kw_only=True)  # built by keyword: fifteen fields, several of one type
class Finding:
    id: str = ""  # "F1": findings numbered by predicted saving, largest first (the advisor numbers them)
    kind: str  # the detector that found it (DETECTORS)
    title: str  # what, in a few words: "gelu_new's pow(x, 3) in portable kernels"
    operators: tuple[str, ...]  # the operators it is about: "aten::pow.Tensor_Scalar_out", "XNNFullyConnected"
    nodes: dict[str, tuple[str, ...]]  # Model Explorer graph id → node ids
    calls: int  # operator calls per run
    measured_ms: float  # their measured time per run (mean)
    share: float  # of the method's time, 0-1
    cause: str  # one sentence
    saving_ms: float | None  # predicted from the measured times; None: not predicted (see `saving_note`)
    fix_kind: str  # FIX_KINDS
    fix: str  # what to do
    rewrite: str | None = None  # the REWRITES name etlab can apply
    saving_is_bound: bool = False  # `saving_ms` is an upper bound (what the operators take), not a prediction
    saving_note: str = ""  # how the saving was predicted, or why it was not
    saving_mb: float | None = None  # a size finding: megabytes the program would shed

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "kind": self.kind,
            "title": self.title,
            "operators": list(self.operators),
            "nodes": {graph: list(nodes) for graph, nodes in self.nodes.items()},
            "calls": self.calls,
            "measured_ms": self.measured_ms,
            "share": self.share,
            "cause": self.cause,
            "saving_ms": self.saving_ms,
            "saving_is_bound": self.saving_is_bound,
            "saving_note": self.saving_note,
            "saving_mb": self.saving_mb,
            "fix_kind": self.fix_kind,
            "fix": self.fix,
            "rewrite": self.rewrite,
        }

    @classmethod
    def from_dict(cls, data: Any, where: str = "finding") -> Finding:
        """A finding as advice.json holds it; AdviceError naming the field (`where`.name) when one is not what the
        advisor writes (text, a count, a time >= 0)."""
        data = _mapping(data, where)

        def at(name: str) -> tuple[Any, str]:
            if name not in data:
                raise AdviceError(f"{where}.{name}", "is missing")
            return data[name], f"{where}.{name}"

        operators = _texts(*at("operators"))
        nodes = {graph: _texts(ids, f"{where}.nodes.{graph}") for graph, ids in _mapping(*at("nodes")).items()}
        return cls(
            id=_text(*at("id")),
            kind=_text(*at("kind")),
            title=_text(*at("title")),
            operators=operators,
            nodes=nodes,
            calls=_count(*at("calls")),
            measured_ms=_number(*at("measured_ms")),
            share=_number(*at("share")),
            cause=_text(*at("cause")),
            saving_ms=_optional_number(*at("saving_ms")),
            fix_kind=_text(*at("fix_kind")),
            fix=_text(*at("fix")),
            rewrite=None if data.get("rewrite") is None else _text(data["rewrite"], f"{where}.rewrite"),
            saving_is_bound=data.get("saving_is_bound") is True,
            saving_note=_text(data.get("saving_note", ""), f"{where}.saving_note"),
            saving_mb=_optional_number(data.get("saving_mb"), f"{where}.saving_mb"),
        )


class AdviceError(ValueError):
    """A field of advice.json that is not what the advisor writes: `field: problem` (load_advice names the file)."""

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(f"{field}: {problem}")


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else f"{text[:37]}..."


def _mapping(value: Any, field: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise AdviceError(field, f"must be a mapping, got {type(value).__name__}")
    return value


def _list(value: Any, field: str) -> list[Any]:
    if not isinstance(value, list):
        raise AdviceError(field, f"must be a list, got {type(value).__name__}")
    return value


def _texts(value: Any, field: str) -> tuple[str, ...]:
    return tuple(_text(item, f"{field}[{index}]") for index, item in enumerate(_list(value, field)))


def _text(value: Any, field: str) -> str:
    if not isinstance(value, str):
        raise AdviceError(field, f"expected text, got {_shown(value)}")
    return value


def _number(value: Any, field: str) -> float:
    """A time, a share or a size: a finite number >= 0 (the advisor never predicts a negative saving)."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
        raise AdviceError(field, f"expected a finite number >= 0, got {_shown(value)}")
    return float(value)


def _optional_number(value: Any, field: str) -> float | None:
    return None if value is None else _number(value, field)


def _count(value: Any, field: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise AdviceError(field, f"expected a count (an integer >= 0), got {_shown(value)}")
    return value


@dataclass(frozen=True)
class RunFacts:
    """What the detectors read. `sidecar` and `spec` are None for a program etlab did not lower (`--pte`);
    `quantized_peer` is the same model's quantized run on the same board (of a scheme among the program's scheme's
    peers, quantize.Scheme.peers), when one was measured, and `quantized_peer_variant` the program it ran."""

    ops: OpsRecord
    summary: RunSummary
    sidecar: Sidecar | None = None
    spec: ModelSpec | None = None
    quantized_peer: OpsRecord | None = None
    quantized_peer_variant: Variant | None = None

    @property
    def applied_rewrites(self) -> tuple[str, ...]:
        return self.sidecar.applied_rewrites if self.sidecar is not None else ()


@dataclass(frozen=True)
class Advice:
    run_id: str
    model: str | None
    backend: str | None
    board: str | None
    method_ms: float
    findings: tuple[Finding, ...] = field(default_factory=tuple)

    @property
    def predicted_ms(self) -> float:
        """The predicted total: point predictions only (bounds and unpredicted findings excluded)."""
        return sum(f.saving_ms for f in self.findings if f.saving_ms is not None and not f.saving_is_bound)

    @property
    def rewrites(self) -> tuple[str, ...]:
        """The rewrites the findings propose, in the findings' order."""
        return tuple(dict.fromkeys(f.rewrite for f in self.findings if f.rewrite))

    def predicted_for(self, rewrite: str) -> float:
        return sum(f.saving_ms or 0.0 for f in self.findings if f.rewrite == rewrite)

    @classmethod
    def from_dict(cls, data: Any) -> Advice:
        """Advice as advice.json holds it; AdviceError (a ValueError) naming the field that is not what it should be."""
        data = _mapping(data, "the document")

        def optional_text(name: str) -> str | None:
            return None if data.get(name) is None else _text(data[name], name)

        return cls(
            _text(data.get("run_id"), "run_id"),
            optional_text("model"),
            optional_text("backend"),
            optional_text("board"),
            _number(data.get("method_ms"), "method_ms"),
            tuple(
                Finding.from_dict(item, f"findings[{index}]")
                for index, item in enumerate(_list(data.get("findings"), "findings"))
            ),
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "model": self.model,
            "backend": self.backend,
            "board": self.board,
            "method_ms": self.method_ms,
            "predicted_ms": self.predicted_ms,
            "predicted_share": self.predicted_ms / self.method_ms if self.method_ms else None,
            "findings": [finding.to_dict() for finding in self.findings],
        }
