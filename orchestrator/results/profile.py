"""The profile of one run: per runtime instruction and per XNNPACK node statistics (data only)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from orchestrator.results.stats import Distribution, distribution

# --------------------------------------------------------------------------------------------------------------
# Profile: what the ETDump says, independent of the rest of the bundle


@dataclass(frozen=True)
class Attribution:
    """What a row came from (results/source_map.py): its module (its sources' deepest common module, "" for the
    model itself), that module's class, the source line(s), `file:line in function`, and the exported `.pt2`'s nodes
    it was lowered from (their names: Model Explorer's node ids)."""

    module: str | None
    module_type: str | None
    source: str | None
    exported: tuple[str, ...] = ()


NO_SOURCE = Attribution(None, None, None)


@dataclass
class InstructionProfile:
    node_id: str
    chain: int
    index: int
    kind: str  # KernelCall, DelegateCall, ...
    op: str | None  # "aten::add.out" for kernels, the backend id for delegates
    label: str  # what the PTE adapter shows: "aten::add", "XnnpackBackend"
    samples_ms: np.ndarray
    dist: Distribution | None = None
    pct: float | None = None
    source: Attribution = NO_SOURCE

    def row(self) -> dict[str, Any]:
        d = self.dist
        return {
            "node_id": self.node_id,
            "chain": self.chain,
            "instruction": self.index,
            "kind": self.kind,
            "op": self.op,
            "samples": d.n if d else 0,
            "median_ms": d.median if d else None,
            "p10_ms": d.p10 if d else None,
            "p90_ms": d.p90 if d else None,
            "mean_ms": d.mean if d else None,
            "min_ms": d.min if d else None,
            "max_ms": d.max if d else None,
            "pct": self.pct,
            "module": self.source.module,
            "module_type": self.source.module_type,
            "source": self.source.source,
        }


@dataclass
class XnnNodeProfile:
    node: str  # node id inside the delegate graph ("0", "1", ...)
    type: str
    events: list[str]
    samples_ms: np.ndarray
    dist: Distribution | None
    pct: float | None
    source: Attribution = NO_SOURCE
    shape: tuple[int, ...] | None = None  # its output's dims, as serialized in the delegate


@dataclass
class DelegateProfile:
    node_id: str
    backend: str
    graph_id: str  # the PTE adapter's delegate graph id: "<pte file name>::<node_id>"
    call: Distribution | None  # the DELEGATE_CALL time
    event_names: list[str]  # one execution's runtime events, in order
    event_samples_ms: np.ndarray  # executions x events
    status: str  # "placed", "left out", "no events", "not inspectable"
    reason: str | None = None
    nodes: list[XnnNodeProfile] = field(default_factory=list)
    unplaced_events: list[str] = field(default_factory=list)
    fused_nodes: list[str] = field(default_factory=list)
    node_types: dict[str, str] = field(default_factory=dict)
    source: Attribution = NO_SOURCE
    node_sources: dict[str, Attribution] = field(default_factory=dict)  # every node's, fused ones included

    def event_mean_ms(self) -> float:
        return float(self.event_samples_ms.sum(axis=1).mean()) if self.event_samples_ms.size else 0.0

    def placed_mean_ms(self) -> float:
        return float(sum(node.dist.mean for node in self.nodes if node.dist))

    def report(self) -> DelegateReport:
        """What ops.json's `delegates` holds for this delegate (read back by ops_record.py)."""
        call_mean = self.call.mean if self.call else None
        return DelegateReport(
            node_id=self.node_id,
            backend=self.backend,
            graph_id=self.graph_id,
            status=self.status,
            reason=self.reason,
            call_mean_ms=call_mean,
            events_mean_ms=self.event_mean_ms(),
            placed_mean_ms=self.placed_mean_ms(),
            coverage=(self.placed_mean_ms() / call_mean) if call_mean else None,
            nodes=tuple(
                NodeReport(
                    n.node,
                    n.type,
                    tuple(n.events),
                    **dist_ms(n.dist),
                    pct=n.pct,
                    **_source(n.source),
                    shape=n.shape,
                    samples_ms=tuple(round(float(v), 6) for v in n.samples_ms),
                )
                for n in self.nodes
            ),
            fused_nodes=tuple(
                FusedNode(node, self.node_types.get(node), **_source(self.node_sources.get(node, NO_SOURCE)))
                for node in self.fused_nodes
            ),
            unplaced_events=tuple(self.unplaced_events),
            events=tuple(
                EventReport(name, **dist_ms(distribution(self.event_samples_ms[:, k])))
                for k, name in enumerate(self.event_names)
            ),
        )


@dataclass(frozen=True)
class NodeReport:
    """One XNNPACK node of a delegate, with the time of the events placed on it."""

    node: str
    type: str
    events: tuple[str, ...]
    samples: int
    median_ms: float | None
    p10_ms: float | None
    p90_ms: float | None
    mean_ms: float | None
    pct: float | None
    module: str | None = None
    module_type: str | None = None
    source: str | None = None
    shape: tuple[int, ...] | None = None  # the node's output dims
    samples_ms: tuple[float, ...] = ()  # per measured execution, as an instruction's (compare tests them)


@dataclass(frozen=True)
class FusedNode:
    """A node that emitted no event of its own (fused into its neighbour by XNNPACK), and what it came from."""

    node: str
    type: str | None
    module: str | None = None
    module_type: str | None = None
    source: str | None = None


@dataclass(frozen=True)
class EventReport:
    """One runtime event of a delegate's execution, over the executions."""

    name: str
    samples: int
    median_ms: float | None
    p10_ms: float | None
    p90_ms: float | None
    mean_ms: float | None


@dataclass(frozen=True)
class DelegateReport:
    """ops.json's record of one delegate call: where its time went (written with records.to_data)."""

    node_id: str
    backend: str
    graph_id: str
    status: str
    reason: str | None
    call_mean_ms: float | None
    events_mean_ms: float
    placed_mean_ms: float
    coverage: float | None
    nodes: tuple[NodeReport, ...]
    fused_nodes: tuple[FusedNode, ...]
    unplaced_events: tuple[str, ...]
    events: tuple[EventReport, ...]


@dataclass
class Profile:
    method: str
    pte_name: str | None
    executions: int
    ns_per_tick: float
    total: Distribution | None  # whole-method time per execution
    instructions: list[InstructionProfile]
    delegates: list[DelegateProfile]
    operator_types: list[dict[str, Any]]
    timing_agreement: float | None = None  # ETDump method time / timings.json time, after unit inference
    module_types: dict[str, str] = field(default_factory=dict)  # the model's modules' classes (its source map)
    exported_program: str | None = None  # the .pt2 file the rows' `exported` nodes are of (its source map)
    execution_ms: np.ndarray = field(default_factory=lambda: np.zeros(0))  # whole-method time of each execution

    def coverage(self) -> dict[str, Any]:
        """How much delegate time the XNN-node overlays account for."""
        call = sum(d.call.mean for d in self.delegates if d.call)
        placed = sum(d.placed_mean_ms() for d in self.delegates)
        events = sum(d.event_mean_ms() for d in self.delegates)
        return {
            "delegate_call_mean_ms": call,
            "delegate_events_mean_ms": events,
            "placed_mean_ms": placed,
            "placed_share": placed / call if call else None,
            "placed_share_of_events": placed / events if events else None,
            "delegates": len(self.delegates),
            "delegates_placed": sum(1 for d in self.delegates if d.status == "placed"),
            "left_out": [{"node_id": d.node_id, "reason": d.reason} for d in self.delegates if d.status != "placed"],
        }


def _source(source: Attribution) -> dict[str, Any]:
    return {"module": source.module, "module_type": source.module_type, "source": source.source}


def dist_ms(dist: Distribution | None) -> dict[str, Any]:
    if dist is None:
        return {"samples": 0, "median_ms": None, "p10_ms": None, "p90_ms": None, "mean_ms": None}
    return {"samples": dist.n, "median_ms": dist.median, "p10_ms": dist.p10, "p90_ms": dist.p90, "mean_ms": dist.mean}
