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
from orchestrator.results.ops_record import OpsRecord
from orchestrator.results.summary import RunSummary

ADVICE_FILE = "advice.json"
FIX_KINDS = ("rewrite", "code", "option", "board")


@dataclass(frozen=True)
class Finding:
    id: str  # "F1": findings numbered by predicted saving, largest first
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
    def from_dict(cls, data: dict[str, Any]) -> Finding:
        """A finding as advice.json holds it; TypeError or ValueError when a field is not what it should be."""
        nodes = data["nodes"]
        if not isinstance(nodes, dict):
            raise TypeError("nodes is not a mapping")
        return cls(
            _text(data["id"]), _text(data["kind"]), _text(data["title"]),
            tuple(_text(op) for op in data["operators"]),
            {_text(graph): tuple(_text(node) for node in ids) for graph, ids in nodes.items()},
            _count(data["calls"]), _number(data["measured_ms"]), _number(data["share"]), _text(data["cause"]),
            _optional_number(data["saving_ms"]), _text(data["fix_kind"]), _text(data["fix"]),
            rewrite=None if data.get("rewrite") is None else _text(data["rewrite"]),
            saving_is_bound=data.get("saving_is_bound") is True, saving_note=_text(data.get("saving_note", "")),
            saving_mb=_optional_number(data.get("saving_mb")),
        )  # fmt: skip


def _text(value: Any) -> str:
    if not isinstance(value, str):
        raise TypeError(f"expected text, got {type(value).__name__}")
    return value


def _number(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValueError(f"expected a finite number, got {value!r}")
    return float(value)


def _optional_number(value: Any) -> float | None:
    return None if value is None else _number(value)


def _count(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"expected a count, got {value!r}")
    return value


@dataclass(frozen=True)
class RunFacts:
    """What the detectors read. `sidecar` and `spec` are None for a program etlab did not lower (`--pte`);
    `quantized_peer` is the same model's int8 run on the same board, when one was measured."""

    ops: OpsRecord
    summary: RunSummary
    sidecar: Sidecar | None = None
    spec: ModelSpec | None = None
    quantized_peer: OpsRecord | None = None
    quantized_peer_backend: str | None = None

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
        """Advice as advice.json holds it; TypeError, ValueError or KeyError when it is not."""
        if not isinstance(data, dict) or not isinstance(data["findings"], list):
            raise TypeError("not an advice document")
        return cls(
            _text(data["run_id"]),
            None if data.get("model") is None else _text(data["model"]),
            None if data.get("backend") is None else _text(data["backend"]),
            None if data.get("board") is None else _text(data["board"]),
            _number(data["method_ms"]),
            tuple(Finding.from_dict(item) for item in data["findings"]),
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
