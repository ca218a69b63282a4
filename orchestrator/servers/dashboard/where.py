"""Where in the model a run's time goes, for the dashboard's pages: the top operators with the XNNPACK nodes inside
the delegates (ops.json's rows, each with its module and source line), the module tree of summary.json's `modules`
for the run page's chart (the compare page's modules: results/compare_modules.py).
"""

from __future__ import annotations

from orchestrator.results.modules import ModuleTree
from orchestrator.results.ops_record import DELEGATE_CALL, DelegateTiming, OpsRecord
from orchestrator.servers.dashboard.records import DelegateGroup, ModuleTime, OperatorRow, OperatorType

TOP_OPERATORS = 12
NO_MODULES = (
    "No time by module: this run was analysed without a source map (a program lowered before maps, or brought "
    "along without one); lowering it again and `fab analyze` gives one."
)


def operator_rows(
    ops: OpsRecord, limit: int = TOP_OPERATORS
) -> tuple[list[OperatorRow], list[DelegateGroup], list[OperatorType]]:
    """The slowest rows, kernel calls and the XNNPACK nodes inside delegate calls ranked together by time; a delegate
    call whose events were placed on nodes is a group (its total) rather than a row, one without stays a row. And
    every row summed by operator type (TensorBoard's op-type view: "aten::where ×4 = 49 %"). Ranked and shared by
    medians, of the run's median (ops.json's `pct`), as every other view of the run is."""
    total = ops.method_median_ms or 1.0
    rows: list[OperatorRow] = []
    groups: list[DelegateGroup] = []
    delegates = {delegate.node_id: delegate for delegate in ops.delegates}
    for i in ops.instructions:
        delegate = delegates.get(i.node_id) if i.kind == DELEGATE_CALL else None
        nodes = [node for node in delegate.nodes if node.ms > 0] if delegate is not None else []
        if nodes:
            placed = sum(node.ms for node in nodes)
            groups.append(DelegateGroup(node_id=i.node_id, op=i.op or i.kind, median_ms=i.median_ms, placed_ms=placed,
                                        nodes=len(nodes), share=i.median_ms / total * 100))  # fmt: skip
            rows += [
                OperatorRow(node_id=f"{i.node_id}/{node.node}", kind="XNNPACK node", op=node.type,
                            mean_ms=node.mean_ms, median_ms=node.median_ms, share=node.ms / total * 100,
                            module=node.module, source=node.source, inside=i.node_id,
                            shape="×".join(map(str, node.shape)) if node.shape else None,
                            roofline=_roofline(ops, delegate, node.node))
                for node in nodes
            ]  # fmt: skip
        elif i.median_ms > 0:
            rows.append(
                OperatorRow(node_id=i.node_id, kind=i.kind, op=i.op or i.kind, mean_ms=i.mean_ms,
                            median_ms=i.median_ms, share=i.median_ms / total * 100, module=i.module, source=i.source)
            )  # fmt: skip
    rows.sort(key=lambda row: -(row.median_ms or 0.0))
    groups.sort(key=lambda group: -group.share)
    return rows[:limit], groups, operator_types(rows, total)[:limit]


def _roofline(ops: OpsRecord, delegate: DelegateTiming | None, node: str) -> str | None:
    """The node against the board's limits (results/op_roofline.py), as the column says it; None: not measured."""
    row = ops.node_roofline(delegate.graph_id, node) if delegate is not None else None
    return (row.label or None) if row is not None else None


def operator_types(rows: list[OperatorRow], total: float) -> list[OperatorType]:
    """Rows summed by operator (a kernel's `aten::addmm`, an XNNPACK node's `XNNFullyConnected`), costliest first."""
    by_type: dict[tuple[str, str], list[OperatorRow]] = {}
    for row in rows:
        by_type.setdefault((row.op, "XNNPACK node" if row.inside else row.kind), []).append(row)
    types = [
        OperatorType(op=op, kind=kind, count=len(members), mean_ms=sum(r.mean_ms for r in members),
                     median_ms=sum(r.median_ms or 0.0 for r in members),
                     share=sum(r.median_ms or 0.0 for r in members) / total * 100)
        for (op, kind), members in by_type.items()
    ]  # fmt: skip
    return sorted(types, key=lambda t: -t.share)


def module_times(tree: ModuleTree) -> list[ModuleTime]:
    """Every module of the tree, slowest (descendants included) first: the chart's elements and the table's rows."""
    known = {row.module for row in tree.modules}
    times = []
    for row in tree.modules:
        parent = row.module.rsplit(".", 1)[0] if "." in row.module else ""
        times.append(
            ModuleTime(
                module=row.module,
                parent=parent if parent in known else "",
                name=row.module.rsplit(".", 1)[-1],
                module_type=row.module_type,
                total_ms=row.total_ms,
                self_ms=row.self_ms,
                share=row.share * 100,
            )
        )
    return sorted(times, key=lambda time: (-time.total_ms, time.module))
