"""Where the time goes by module of the model: a profile's attributed rows (results/source_map.py) rolled up the
module tree (summary.json's `modules`, `fab analyze --by module[:DEPTH]`).

Each timed kernel call counts for its module. A delegate call's time goes to its XNNPACK nodes' modules as far as
its events were placed on nodes, and the rest of the call (the delegate's own overhead, events not placed) to the
deepest module holding all of its nodes. A module's `total_ms` holds its descendants', `self_ms` only its own rows'.
Time without a module (no map, a row with no source, or only the model itself) is `unattributed`.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from orchestrator.records import Count, Duration, Share
from orchestrator.results.profile import Profile


@dataclass(frozen=True)
class ModuleRow:
    """One module of the tree."""

    module: str  # "distilbert.transformer.layer.0.attention"
    depth: Count  # its number of components
    module_type: str | None
    total_ms: Duration  # per execution, its descendants included
    self_ms: Duration
    delegated_ms: Duration  # of total_ms, inside delegates
    share: Share  # of the measured time


@dataclass(frozen=True)
class ModuleTree:
    """summary.json's `modules`: every module that took time, in path order."""

    measured_ms: Duration  # the timed instructions' time per execution
    attributed_ms: Duration  # of which a module (other than the model itself) is known
    attributed_share: Share | None
    modules: tuple[ModuleRow, ...]


@dataclass(frozen=True)
class _Piece:
    module: str | None
    module_type: str | None
    ms: float
    delegated: bool


def _pieces(profile: Profile) -> Iterator[_Piece]:
    delegates = {d.node_id: d for d in profile.delegates}
    for instruction in profile.instructions:
        if instruction.dist is None:
            continue
        mean = instruction.dist.mean
        delegate = delegates.get(instruction.node_id) if instruction.kind == "DelegateCall" else None
        if delegate is None:
            yield _Piece(instruction.source.module, instruction.source.module_type, mean, delegated=False)
            continue
        placed = 0.0
        for node in delegate.nodes:
            if node.dist is not None:
                placed += node.dist.mean
                yield _Piece(node.source.module, node.source.module_type, node.dist.mean, delegated=True)
        rest = max(0.0, mean - placed)
        yield _Piece(instruction.source.module, instruction.source.module_type, rest, delegated=True)


def _ancestors(module: str) -> Iterator[str]:
    parts = module.split(".")
    for depth in range(1, len(parts) + 1):
        yield ".".join(parts[:depth])


def module_tree(profile: Profile) -> ModuleTree | None:
    """The profile's time by module; None when no row of it has a module (a program without a source map)."""
    pieces = list(_pieces(profile))
    if not any(piece.module is not None for piece in pieces):
        return None
    measured = sum(piece.ms for piece in pieces)
    total: dict[str, float] = {}
    own: dict[str, float] = {}
    delegated: dict[str, float] = {}
    types: dict[str, str] = {}
    for piece in pieces:
        if not piece.module:
            continue
        own[piece.module] = own.get(piece.module, 0.0) + piece.ms
        if piece.module_type:
            types.setdefault(piece.module, piece.module_type)
        for module in _ancestors(piece.module):
            total[module] = total.get(module, 0.0) + piece.ms
            if piece.delegated:
                delegated[module] = delegated.get(module, 0.0) + piece.ms
    attributed = sum(own.values())
    rows = tuple(
        ModuleRow(
            module=module,
            depth=module.count(".") + 1,
            module_type=types.get(module) or profile.module_types.get(module),
            total_ms=total[module],
            self_ms=own.get(module, 0.0),
            delegated_ms=delegated.get(module, 0.0),
            share=min(1.0, total[module] / measured) if measured else 0.0,
        )
        for module in sorted(total)
    )
    share = min(1.0, attributed / measured) if measured else None
    return ModuleTree(measured_ms=measured, attributed_ms=attributed, attributed_share=share, modules=rows)


def rolled_up(tree: ModuleTree, depth: int | None) -> list[ModuleRow]:
    """The modules at `depth` (and shallower ones' own time, where it is not in a child), slowest first; all the
    modules that took time themselves when `depth` is None."""
    if depth is None:
        rows = [row for row in tree.modules if row.self_ms > 0]
        return sorted(rows, key=lambda row: (-row.self_ms, row.module))
    rows = [row for row in tree.modules if row.depth == depth or (row.depth < depth and row.self_ms > 0)]
    return sorted(rows, key=lambda row: (-_time_at(row, depth), row.module))


def _time_at(row: ModuleRow, depth: int) -> float:
    """A row's time at a depth: the whole subtree at `depth`, its own rows above it."""
    return row.total_ms if row.depth == depth else row.self_ms


def shown_ms(row: ModuleRow, depth: int | None) -> float:
    return row.self_ms if depth is None else _time_at(row, depth)
