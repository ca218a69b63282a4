"""A run's per-operator profile as typed records: what `analysis/ops.json` holds, read back (or taken from the
document an analysis is about to write), for whatever reasons about operators after the analysis (the advisor,
compare, the dashboard). Only the fields readers use; every value checked (its field named when wrong), since a
results folder can be edited.
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
    samples: int = 0  # timed executions; 0: not timed
    samples_ms: tuple[float, ...] = ()  # each timed execution's time (compare tests them)

    @property
    def operator(self) -> str:
        """The operator without its overload: "aten::pow" for "aten::pow.Tensor_Scalar_out"."""
        return (self.op or self.kind).split(".", 1)[0]

    @property
    def timed_median_ms(self) -> float | None:
        """The median of a timed instruction, None when it was not timed."""
        return self.median_ms if self.samples else None


@dataclass(frozen=True)
class DelegateNodeTiming:
    node: str  # node id inside the delegate's graph
    type: str  # "XNNFullyConnected", ...
    mean_ms: float
    median_ms: float | None = None  # None: not timed


@dataclass(frozen=True)
class DelegateTiming:
    node_id: str  # the delegate call's top-level node
    graph_id: str  # Model Explorer's graph id of the delegate: "<pte file>::<node id>"
    placed: bool  # its events were placed on its nodes
    nodes: tuple[DelegateNodeTiming, ...]


class OpsError(AnalysisError):
    """An ops document field that is not what an analysis writes: the file, the field and what is wrong."""


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
        """The record in an ops document, or an OpsError (an AnalysisError) naming `where`, the field and what is
        wrong: every field a reader uses is checked (text, times >= 0, counts), never taken on trust."""
        try:
            return cls._from_dict(_mapping(data, "the document"))
        except _Invalid as exc:
            field, problem = exc.args
            raise OpsError(f"{where}: {field}: {problem}") from None

    @classmethod
    def _from_dict(cls, data: dict[str, Any]) -> OpsRecord:
        for required in ("instructions", "delegates"):
            if not isinstance(data.get(required), list):
                raise _Invalid(required, "must be a list")
        instructions = tuple(
            _instruction(_mapping(row, f"instructions[{index}]"), f"instructions[{index}]")
            for index, row in enumerate(data["instructions"])
        )
        delegates = tuple(
            _delegate(_mapping(row, f"delegates[{index}]"), f"delegates[{index}]")
            for index, row in enumerate(data["delegates"])
        )
        method = _mapping(data.get("method_ms") or {}, "method_ms")
        total = _ms(method.get("mean"), "method_ms.mean") or sum(i.mean_ms for i in instructions)
        return cls(_text(data.get("run_id"), "run_id"), _text(data.get("method"), "method"), total, instructions,
                   delegates)  # fmt: skip


class _Invalid(Exception):
    """(field, problem): raised below, named with its file by OpsRecord.from_dict."""


def _instruction(row: dict[str, Any], where: str) -> InstructionTiming:
    samples = _count(row.get("samples", 0), f"{where}.samples")
    times = _list(row.get("samples_ms"), f"{where}.samples_ms")
    return InstructionTiming(
        _text(row.get("node_id"), f"{where}.node_id"),
        _count(row.get("instruction"), f"{where}.instruction"),
        _text(row.get("kind"), f"{where}.kind"),
        None if row.get("op") is None else _text(row["op"], f"{where}.op"),
        _ms(row.get("mean_ms"), f"{where}.mean_ms"),
        _ms(row.get("median_ms"), f"{where}.median_ms"),
        samples,
        tuple(_ms(value, f"{where}.samples_ms[{i}]") for i, value in enumerate(times)),
    )


def _delegate(row: dict[str, Any], where: str) -> DelegateTiming:
    nodes = []
    for index, item in enumerate(_list(row.get("nodes"), f"{where}.nodes")):
        node, at = _mapping(item, f"{where}.nodes[{index}]"), f"{where}.nodes[{index}]"
        median = node.get("median_ms")
        nodes.append(
            DelegateNodeTiming(
                _text(node.get("node"), f"{at}.node"),
                _text(node.get("type"), f"{at}.type"),
                _ms(node.get("mean_ms"), f"{at}.mean_ms"),
                None if median is None else _ms(median, f"{at}.median_ms"),
            )
        )
    return DelegateTiming(
        _text(row.get("node_id"), f"{where}.node_id"),
        _text(row.get("graph_id"), f"{where}.graph_id"),
        row.get("status") == "placed",
        tuple(nodes),
    )


def _mapping(value: Any, field: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise _Invalid(field, f"must be a mapping, got {type(value).__name__}")
    return value


def _list(value: Any, field: str) -> list[Any]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise _Invalid(field, f"must be a list, got {type(value).__name__}")
    return value


def _text(value: Any, field: str) -> str:
    if not isinstance(value, str):
        raise _Invalid(field, f"expected text, got {_shown(value)}")
    return value


def _count(value: Any, field: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise _Invalid(field, f"expected a count (an integer >= 0), got {_shown(value)}")
    return value


def _ms(value: Any, field: str) -> float:
    """A time in ms: a finite non-negative number, 0 when absent (not timed)."""
    if value is None:
        return 0.0
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise _Invalid(field, f"expected a time in ms (a number >= 0), got {_shown(value)}")
    return float(value)


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else f"{text[:37]}..."


def load_ops(bundle_dir: Path) -> OpsRecord:
    """A bundle's `analysis/ops.json`, or an AnalysisError saying why there is none to read."""
    path = Path(bundle_dir) / ANALYSIS_DIR / OPS_FILE
    if not path.is_file():
        raise AnalysisError(f"{bundle_dir} has no per-operator profile ({ANALYSIS_DIR}/{OPS_FILE}): run with ETDump")
    return OpsRecord.from_dict(read_analysis_file(bundle_dir, OPS_FILE), str(path))
