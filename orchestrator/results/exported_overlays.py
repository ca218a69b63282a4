"""A run's cost on the exported program: the measured operators painted on the `.pt2` graph Model Explorer's PyTorch
adapter draws (one graph, id "graph"; node ids are the FX nodes' names; layers nest as the model's modules do),
through the source map's `exported` names (lowering/export/source_map.py: each instruction's and XNNPACK node's
`from_node` roots).

Lowering splits and fuses. One `.pt2` node can become several measured rows (`linear` -> permute, addmm, view), and
several `.pt2` nodes one row (`linear` and `gelu` in one XNNPACK node). The rows and the nodes they came from form
groups (a row joins its nodes, a node its rows); every node of a group shows the group's sum, and the
`exported_lowering` overlay says in words what lowering made of it, so a fused node's shared cost is never read as
its own. A node with no row (a view lowering removed, a constant) gets no value.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the types only: overlays.py is imported where numpy is not
    from orchestrator.results.profile import Profile
    from orchestrator.results.stats import Distribution

EXPORTED_GRAPH = "graph"  # the PyTorch adapter's one graph per .pt2
EXPORTED_PREFIX = "exported_"  # me_overlay_exported_<metric>.json paint the .pt2
LOWERING = "lowering"  # me_overlay_exported_lowering.json: what lowering made of each split or fused node


@dataclass(frozen=True)
class MeasuredRow:
    """One measured operator (a kernel call, an XNNPACK node, or a delegate call whose nodes could not be placed)."""

    label: str  # "aten::addmm", "XNNFullyConnected", "XnnpackBackend (whole call)"
    median_ms: float | None
    mean_ms: float | None
    pct: float | None
    exported: tuple[str, ...]

    def value(self, metric: str) -> float | None:
        return {"median_ms": self.median_ms, "mean_ms": self.mean_ms, "pct": self.pct}[metric]


@dataclass(frozen=True)
class ExportedGroup:
    """`.pt2` nodes and the measured rows lowering made of them, linked both ways."""

    nodes: tuple[str, ...]
    rows: tuple[MeasuredRow, ...]

    def total(self, metric: str) -> float | None:
        values = [value for value in (row.value(metric) for row in self.rows) if value is not None]
        return sum(values) if values else None

    def note(self, node: str) -> str | None:
        """What lowering made of `node`, in words; None when it is one operator of its own."""
        made = _labels(row.label for row in self.rows)
        if len(self.nodes) > 1:
            others = [other for other in self.nodes if other != node]
            shown = ", ".join(others[:6]) + (f" and {len(others) - 6} more" if len(others) > 6 else "")
            return f"fused with {shown} into {made}: the cost of all {len(self.nodes)} nodes, shown on each"
        if len(self.rows) > 1:
            return f"split into {len(self.rows)} operators ({made}): their cost summed"
        return None


def _labels(labels: Iterable[str]) -> str:
    counted = Counter(labels)
    return ", ".join(label if n == 1 else f"{label} ×{n}" for label, n in counted.items())


def _row(label: str, dist: Distribution | None, pct: float | None, exported: tuple[str, ...]) -> MeasuredRow:
    return MeasuredRow(label, dist.median if dist else None, dist.mean if dist else None, pct, exported)


def measured_rows(profile: Profile) -> list[MeasuredRow]:
    """The profile's measured operators that came from `.pt2` nodes: kernel calls, placed XNNPACK nodes, and the
    whole call of a delegate whose events could not be placed on its nodes."""
    delegates = {delegate.node_id: delegate for delegate in profile.delegates}
    rows = []
    for instruction in profile.instructions:
        if instruction.kind == "KernelCall" and instruction.source.exported:
            rows.append(_row(instruction.label, instruction.dist, instruction.pct, instruction.source.exported))
        elif instruction.kind == "DelegateCall":
            delegate = delegates.get(instruction.node_id)
            if delegate is not None and delegate.status == "placed":
                rows += [_row(n.type, n.dist, n.pct, n.source.exported) for n in delegate.nodes if n.source.exported]
            elif instruction.source.exported:
                label = f"{instruction.label} (whole call)"
                rows.append(_row(label, instruction.dist, instruction.pct, instruction.source.exported))
    return rows


def exported_groups(profile: Profile) -> list[ExportedGroup]:
    """The profile's rows grouped with the `.pt2` nodes they came from (connected components, in order of first use)."""
    rows = measured_rows(profile)
    parent: dict[str, str] = {}

    def find(node: str) -> str:
        parent.setdefault(node, node)
        while parent[node] != node:
            parent[node] = parent[parent[node]]
            node = parent[node]
        return node

    for row in rows:
        first = find(row.exported[0])
        for other in row.exported[1:]:
            parent[find(other)] = first
    members: dict[str, list[str]] = {}
    for node in parent:
        members.setdefault(find(node), []).append(node)
    grouped: dict[str, list[MeasuredRow]] = {}
    for row in rows:
        grouped.setdefault(find(row.exported[0]), []).append(row)
    return [ExportedGroup(tuple(members[root]), tuple(found)) for root, found in grouped.items()]


def exported_values(groups: list[ExportedGroup], metric: str) -> dict[str, float]:
    """`.pt2` node name -> its group's total of `metric`."""
    values = {}
    for group in groups:
        total = group.total(metric)
        if total is not None:
            values.update(dict.fromkeys(group.nodes, total))
    return values


def lowering_notes(profile: Profile, groups: list[ExportedGroup]) -> dict[str, str]:
    """`.pt2` node name -> what lowering made of it, for the nodes it split or fused: into other nodes of the `.pt2`
    (a group), or inside XNNPACK into a neighbouring node (an XNN node with no time of its own)."""
    notes = {}
    for group in groups:
        for node in group.nodes:
            note = group.note(node)
            if note is not None:
                notes[node] = note
    for delegate in profile.delegates:
        if delegate.status != "placed":
            continue
        for fused in delegate.fused_nodes:
            kind = delegate.node_types.get(fused, "an XNNPACK node")
            for node in delegate.node_sources[fused].exported if fused in delegate.node_sources else ():
                notes.setdefault(node, f"{kind} fused by XNNPACK into a neighbouring node: its time is counted there")
    return notes
