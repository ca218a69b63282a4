"""A run's per-operator profile as typed records: what `analysis/ops.json` holds, read back (or taken from the
document an analysis is about to write), for whatever reasons about operators after the analysis (the advisor, the
terminal's top operators). Only the fields readers use; every value checked, since a results folder can be edited.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from orchestrator.errors import AnalysisError
from orchestrator.results.documents import ANALYSIS_DIR, read_analysis_file

OPS_FILE = "ops.json"
KERNEL_CALL, DELEGATE_CALL = "KernelCall", "DelegateCall"


@dataclass(frozen=True)
class InstructionTiming:
    """One top-level instruction: a kernel call or a delegate call (node id as in Model Explorer's graph)."""

    node_id: str
    index: int  # position in the method's chain, in execution order
    kind: str
    op: str | None  # "aten::pow.Tensor_Scalar_out"; the backend id for a delegate call
    mean_ms: float  # per execution; 0 when it was not timed
    median_ms: float

    @property
    def operator(self) -> str:
        """The operator without its overload: "aten::pow" for "aten::pow.Tensor_Scalar_out"."""
        return (self.op or self.kind).split(".", 1)[0]


@dataclass(frozen=True)
class DelegateNodeTiming:
    node: str  # node id inside the delegate's graph
    type: str  # "XNNFullyConnected", ...
    mean_ms: float


@dataclass(frozen=True)
class DelegateTiming:
    node_id: str  # the delegate call's top-level node
    graph_id: str  # Model Explorer's graph id of the delegate: "<pte file>::<node id>"
    placed: bool  # its events were placed on its nodes
    nodes: tuple[DelegateNodeTiming, ...]


@dataclass(frozen=True)
class OpsRecord:
    run_id: str
    method: str
    method_mean_ms: float  # the whole method, per execution
    instructions: tuple[InstructionTiming, ...]
    delegates: tuple[DelegateTiming, ...]

    def kernel_calls(self) -> Iterator[InstructionTiming]:
        return (i for i in self.instructions if i.kind == KERNEL_CALL)

    def delegate_calls(self) -> Iterator[InstructionTiming]:
        return (i for i in self.instructions if i.kind == DELEGATE_CALL)

    @property
    def delegated_ms(self) -> float:
        return sum(i.mean_ms for i in self.delegate_calls())

    @classmethod
    def from_dict(cls, data: Any, where: str = OPS_FILE) -> OpsRecord:
        """The record in an ops document, or an AnalysisError naming `where` and what is wrong."""
        try:
            return cls._from_dict(data)
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise AnalysisError(f"{where} is not a usable ops document ({type(exc).__name__}: {exc})") from None

    @classmethod
    def _from_dict(cls, data: dict[str, Any]) -> OpsRecord:
        instructions = tuple(
            InstructionTiming(
                _text(row["node_id"]),
                int(row["instruction"]),
                _text(row["kind"]),
                None if row.get("op") is None else _text(row["op"]),
                _ms(row.get("mean_ms")),
                _ms(row.get("median_ms")),
            )
            for row in data["instructions"]
        )
        delegates = tuple(
            DelegateTiming(
                _text(row["node_id"]),
                _text(row["graph_id"]),
                row.get("status") == "placed",
                tuple(
                    DelegateNodeTiming(_text(node["node"]), _text(node["type"]), _ms(node.get("mean_ms")))
                    for node in row.get("nodes") or ()
                ),
            )
            for row in data["delegates"]
        )
        method = data.get("method_ms") or {}
        total = _ms(method.get("mean")) or sum(i.mean_ms for i in instructions)
        return cls(_text(data["run_id"]), _text(data["method"]), total, instructions, delegates)


def _text(value: Any) -> str:
    if not isinstance(value, str):
        raise TypeError(f"expected text, got {type(value).__name__}")
    return value


def _ms(value: Any) -> float:
    """A time in ms: a finite non-negative number, 0 when absent (not timed)."""
    if value is None:
        return 0.0
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise ValueError(f"not a time in ms: {value!r}")
    return float(value)


def load_ops(bundle_dir: Path) -> OpsRecord:
    """A bundle's `analysis/ops.json`, or an AnalysisError saying why there is none to read."""
    path = Path(bundle_dir) / ANALYSIS_DIR / OPS_FILE
    if not path.is_file():
        raise AnalysisError(f"{bundle_dir} has no per-operator profile ({ANALYSIS_DIR}/{OPS_FILE}): run with ETDump")
    return OpsRecord.from_dict(read_analysis_file(bundle_dir, OPS_FILE), str(path))
