"""A run's per-operator profile as typed records: what `analysis/ops.json` holds, read back (or taken from the
document an analysis is about to write), for whatever reasons about operators after the analysis (the advisor,
compare, the dashboard). Only the fields readers use, under the names the file gives them (orchestrator/records.py:
the field types are the checks, the field named when wrong), since a results folder can be edited.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import msgspec

from orchestrator.errors import AnalysisError
from orchestrator.records import Count, Duration, RecordError, from_data
from orchestrator.results.documents import ANALYSIS_DIR, read_analysis_file
from orchestrator.results.op_roofline import NodeRoofline, OperatorRooflines

OPS_FILE = "ops.json"
KERNEL_CALL, DELEGATE_CALL = "KernelCall", "DelegateCall"


@dataclass(frozen=True)
class InstructionTiming:
    """One top-level instruction: a kernel call or a delegate call (node id as in Model Explorer's graph)."""

    node_id: str
    instruction: Count  # position in the method's chain, in execution order
    kind: str
    op: str | None = None  # "aten::pow.Tensor_Scalar_out"; the backend id for a delegate call
    mean_ms: Duration = 0.0  # per execution; 0 when it was not timed
    median_ms: Duration = 0.0
    samples: Count = 0  # timed executions; 0: not timed
    samples_ms: tuple[Duration, ...] = ()  # each timed execution's time (compare tests them)
    module: str | None = None  # the model's module it came from (the program's source map); None: unknown
    module_type: str | None = None
    source: str | None = None  # "modeling_distilbert.py:182 in forward"

    @property
    def index(self) -> int:
        return self.instruction

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
    mean_ms: Duration = 0.0
    median_ms: Duration | None = None  # None: not timed
    module: str | None = None
    module_type: str | None = None
    source: str | None = None
    shape: Annotated[tuple[Count, ...], msgspec.Meta(max_length=16)] | None = None  # its output's dims
    samples_ms: tuple[Duration, ...] = ()  # each timed execution's time (compare tests them); older files: none

    @property
    def ms(self) -> float:
        """Its median, 0 when it was not timed: what shares and savings add up."""
        return self.median_ms or 0.0


@dataclass(frozen=True)
class DelegateTiming:
    node_id: str  # the delegate call's top-level node
    graph_id: str  # Model Explorer's graph id of the delegate: "<pte file>::<node id>"
    status: str | None = None  # "placed": its events were placed on its nodes
    nodes: tuple[DelegateNodeTiming, ...] = ()

    @property
    def placed(self) -> bool:
        return self.status == "placed"


@dataclass(frozen=True)
class MethodTime:
    mean: Duration | None = None  # the whole method, per execution
    median: Duration | None = None


class OpsError(RecordError, AnalysisError):
    """An ops document field that is not what an analysis writes: the file, the field and what is wrong (exit 65)."""


@dataclass(frozen=True)
class OpsRecord:
    run_id: str
    method: str
    instructions: tuple[InstructionTiming, ...]
    delegates: tuple[DelegateTiming, ...]
    method_ms: MethodTime | None = None
    roofline: OperatorRooflines | None = None  # FC, convolutions, batch matmuls against the board's limits

    def node_roofline(self, graph: str, node: str) -> NodeRoofline | None:
        """A delegate node's figures against the board's limits; None: not a FC/conv/bmm, or not timed."""
        return self.roofline.find(graph, node) if self.roofline is not None else None

    def kernel_calls(self) -> Iterator[InstructionTiming]:
        return (i for i in self.instructions if i.kind == KERNEL_CALL)

    def delegate_calls(self) -> Iterator[InstructionTiming]:
        return (i for i in self.instructions if i.kind == DELEGATE_CALL)

    @property
    def method_mean_ms(self) -> float:
        """The whole method per execution; without the method's own time, the sum of its instructions'."""
        mean = self.method_ms.mean if self.method_ms is not None else None
        return mean or sum(i.mean_ms for i in self.instructions)

    @property
    def method_median_ms(self) -> float:
        """What every share of this run is of (etdump_profile.share_base_ms): the method's median time, or the sum
        of its instructions' medians when that is larger; so a `pct` in ops.json is 100 * median / this."""
        median = self.method_ms.median if self.method_ms is not None else None
        return max(median or 0.0, sum(i.median_ms for i in self.instructions))

    def share(self, ms: float) -> float:
        """`ms` (a sum of medians) as a share of the run's median, 0-1."""
        base = self.method_median_ms
        return ms / base if base else 0.0

    @property
    def delegated_ms(self) -> float:
        """The delegate calls' means, summed."""
        return sum(i.mean_ms for i in self.delegate_calls())

    @property
    def delegated_median_ms(self) -> float:
        """The delegate calls' medians, summed (a part of `method_median_ms`)."""
        return sum(i.median_ms for i in self.delegate_calls())

    def where(self, nodes: Mapping[str, Sequence[str]], limit: int = 4) -> tuple[str, ...]:
        """Where in the model the given nodes (graph id -> node ids, as a finding names them) came from, one line
        per operator and source line, the most time first: "aten::where ×2 at modeling_x.py:182 in forward
        (encoder.layer.0.attention)". Empty when the run has no source map."""
        found: dict[tuple[str, str], list[Any]] = {}  # (operator, source) -> [calls, ms, modules]
        rows: list[tuple[str, str | None, str | None, float]] = []
        for node_id in nodes.get(self.method, ()):
            rows += [(i.operator, i.source, i.module, i.median_ms) for i in self.instructions if i.node_id == node_id]
        for delegate in self.delegates:
            wanted = set(nodes.get(delegate.graph_id, ()))
            rows += [(n.type, n.source, n.module, n.ms) for n in delegate.nodes if n.node in wanted]
        for operator, source, module, ms in rows:
            if source is None and module is None:
                continue
            entry = found.setdefault((operator, source or "?"), [0, 0.0, []])
            entry[0], entry[1] = entry[0] + 1, entry[1] + ms
            if module and module not in entry[2]:
                entry[2].append(module)
        ranked = sorted(found.items(), key=lambda item: -item[1][1])
        lines = []
        for (operator, source), (calls, _, modules) in ranked[:limit]:
            more = f" +{len(modules) - 1} more" if len(modules) > 1 else ""
            inside = f" ({modules[0]}{more})" if modules else ""
            lines.append(f"{operator} ×{calls} at {source}{inside}")
        return tuple(lines)


def read_ops(data: Any, where: str = OPS_FILE) -> OpsRecord:
    """The record in an ops document, or an OpsError (an AnalysisError) naming `where`, the field and what is wrong:
    every field a reader uses is checked (text, times >= 0, counts), never taken on trust."""
    try:
        return from_data(_timed_or_zero(data), OpsRecord, where=where)
    except RecordError as exc:
        raise OpsError(exc.where, exc.field, exc.problem) from None


def _timed_or_zero(data: Any) -> Any:
    """Null times (not timed) as 0, as readers add them up: an instruction's mean and median, a delegate node's
    mean. Anything else is left for the field types to check."""
    if not isinstance(data, dict):
        return data
    data = dict(data)
    if "instructions" in data:
        data["instructions"] = _zeroed(data["instructions"], ("mean_ms", "median_ms"))
    delegates = data.get("delegates")
    if isinstance(delegates, list):
        data["delegates"] = [
            {**row, "nodes": _zeroed(row.get("nodes"), ("mean_ms",))} if isinstance(row, dict) else row
            for row in delegates
        ]
    return data


def _zeroed(rows: Any, keys: tuple[str, ...]) -> Any:
    if not isinstance(rows, list):
        return rows
    return [{**row, **{key: 0.0 for key in keys if key in row and row[key] is None}} if isinstance(row, dict) else row
            for row in rows]  # fmt: skip


def load_ops(bundle_dir: Path) -> OpsRecord:
    """A bundle's `analysis/ops.json`, or an AnalysisError saying why there is none to read."""
    path = Path(bundle_dir) / ANALYSIS_DIR / OPS_FILE
    if not path.is_file():
        raise AnalysisError(f"{bundle_dir} has no per-operator profile ({ANALYSIS_DIR}/{OPS_FILE}): run with ETDump")
    return read_ops(read_analysis_file(bundle_dir, OPS_FILE), str(path))
