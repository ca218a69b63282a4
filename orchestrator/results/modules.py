"""Where the time goes by module of the model: a profile's attributed rows (results/source_map.py) rolled up the
module tree (summary.json's `modules`, `fab analyze --by module[:DEPTH]`).

Each timed kernel call counts for its module. A delegate call's time goes to its XNNPACK nodes' modules as far as
its events were placed on nodes, and the rest of the call (the delegate's own overhead, events not placed) to the
deepest module holding all of its nodes. A module's `total_ms` holds its descendants', `self_ms` only its own rows';
each has its part inside delegates (`delegated_ms`, `self_delegated_ms`).

The figures are of the run's median execution: the executions are ordered by their time (timings.json's, the
run's median `fab analyze` shows, else ETDump's method time), and each row's time is its time in the middle one
(the mean of the middle two, for an even count). So the modules' times, the time on no module (`unattributed_ms`:
no map, a row with no source, or only the model itself) and the runtime around the instructions (`outside_ms`) add
up to the run's median (`median_ms`) at any depth, whatever the spread between executions.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from orchestrator.records import Count, Duration, Share
from orchestrator.results.profile import Profile


@dataclass(frozen=True)
class ModuleRow:
    """One module of the tree."""

    module: str  # "distilbert.transformer.layer.0.attention"
    depth: Count  # its number of components
    module_type: str | None
    total_ms: Duration  # in the median execution, its descendants included
    self_ms: Duration  # its own rows only
    delegated_ms: Duration  # of total_ms, inside delegates
    share: Share  # total_ms's share of the run's median (of the measured time in a summary.json from before)
    self_delegated_ms: Duration | None = None  # of self_ms, inside delegates (None: a summary.json from before)


@dataclass(frozen=True)
class ModuleTree:
    """summary.json's `modules`: every module that took time, in path order."""

    measured_ms: Duration  # the timed instructions' time in the median execution
    attributed_ms: Duration  # of which a module (other than the model itself) is known
    attributed_share: Share | None
    modules: tuple[ModuleRow, ...]
    # What the rows add up to, with the time on no module and the rest of the execution (None: from before).
    median_ms: Duration | None = None  # the run's median execution time
    unattributed_ms: Duration | None = None  # measured_ms - attributed_ms
    unattributed_delegated_ms: Duration | None = None  # of unattributed_ms, inside delegates
    # median_ms - measured_ms: the runtime between and around its instructions (negative only when timings.json's
    # clock says less than ETDump's instructions add up to)
    outside_ms: float | None = None
    executions: str | None = None  # which executions the figures are of, in words


@dataclass(frozen=True)
class _Piece:
    module: str | None
    module_type: str | None
    ms: np.ndarray  # per execution
    delegated: bool


def _per_execution(samples: np.ndarray, mean: float, executions: int) -> np.ndarray:
    """A row's time in each execution: its samples, or its mean where it did not run in every execution."""
    return np.asarray(samples, dtype=np.float64) if len(samples) == executions else np.full(executions, mean)


def _pieces(profile: Profile) -> Iterator[_Piece]:
    delegates = {d.node_id: d for d in profile.delegates}
    n = profile.executions
    for instruction in profile.instructions:
        if instruction.dist is None:
            continue
        times = _per_execution(instruction.samples_ms, instruction.dist.mean, n)
        delegate = delegates.get(instruction.node_id) if instruction.kind == "DelegateCall" else None
        if delegate is None:
            yield _Piece(instruction.source.module, instruction.source.module_type, times, delegated=False)
            continue
        placed = np.zeros(n)
        for node in delegate.nodes:
            if node.dist is not None:
                node_times = _per_execution(node.samples_ms, node.dist.mean, n)
                placed += node_times
                yield _Piece(node.source.module, node.source.module_type, node_times, delegated=True)
        rest = np.maximum(0.0, times - placed)
        yield _Piece(instruction.source.module, instruction.source.module_type, rest, delegated=True)


def _middle(times: np.ndarray) -> tuple[list[int], str]:
    """The executions at the median of `times` (one, or the middle two of an even count), and which, in words."""
    order = np.argsort(times, kind="stable")
    n = len(order)
    middle = [int(order[n // 2])] if n % 2 else [int(order[n // 2 - 1]), int(order[n // 2])]
    said = " and ".join(str(index + 1) for index in sorted(middle))
    return middle, f"execution {said} of {n}, at the median"


def _ancestors(module: str) -> Iterator[str]:
    parts = module.split(".")
    for depth in range(1, len(parts) + 1):
        yield ".".join(parts[:depth])


def module_tree(profile: Profile, times_ms: Sequence[float] = ()) -> ModuleTree | None:
    """The profile's time by module in the run's median execution; None when no row of it has a module (a program
    without a source map). `times_ms`: each profiled execution's time as timings.json has it (ignored unless there
    is one per execution; ETDump's method times, else the instructions' sum, stand in)."""
    pieces = list(_pieces(profile))
    if not any(piece.module is not None for piece in pieces) or profile.executions <= 0:
        return None
    n = profile.executions
    timed = np.sum([piece.ms for piece in pieces], axis=0) if pieces else np.zeros(n)
    if len(times_ms) == n:
        times = np.asarray(times_ms, dtype=np.float64)
    elif len(profile.execution_ms) == n:
        times = np.asarray(profile.execution_ms, dtype=np.float64)
    else:
        times = timed
    middle, executions = _middle(times)
    median = float(np.mean(times[middle]))

    def at_median(piece: _Piece) -> float:
        return float(np.mean(piece.ms[middle]))

    measured = float(np.mean(timed[middle]))
    total: dict[str, float] = {}
    own: dict[str, float] = {}
    delegated: dict[str, float] = {}
    own_delegated: dict[str, float] = {}
    types: dict[str, str] = {}
    unattributed = unattributed_delegated = 0.0
    for piece in pieces:
        ms = at_median(piece)
        if not piece.module:
            unattributed += ms
            unattributed_delegated += ms if piece.delegated else 0.0
            continue
        own[piece.module] = own.get(piece.module, 0.0) + ms
        if piece.delegated:
            own_delegated[piece.module] = own_delegated.get(piece.module, 0.0) + ms
        if piece.module_type:
            types.setdefault(piece.module, piece.module_type)
        for module in _ancestors(piece.module):
            total[module] = total.get(module, 0.0) + ms
            if piece.delegated:
                delegated[module] = delegated.get(module, 0.0) + ms
    attributed = sum(own.values())
    rows = tuple(
        ModuleRow(
            module=module,
            depth=module.count(".") + 1,
            module_type=types.get(module) or profile.module_types.get(module),
            total_ms=total[module],
            self_ms=own.get(module, 0.0),
            delegated_ms=delegated.get(module, 0.0),
            share=min(1.0, total[module] / median) if median > 0 else 0.0,
            self_delegated_ms=own_delegated.get(module, 0.0),
        )
        for module in sorted(total)
    )
    share = min(1.0, attributed / measured) if measured else None
    return ModuleTree(
        measured_ms=measured, attributed_ms=attributed, attributed_share=share, modules=rows, median_ms=median,
        unattributed_ms=unattributed, unattributed_delegated_ms=unattributed_delegated,
        outside_ms=median - measured, executions=executions,
    )  # fmt: skip


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


def counts_total(row: ModuleRow, depth: int | None) -> bool:
    """Whether a rolled-up row shows its total (its subtree, at `depth`) or its self time (its own rows)."""
    return depth is not None and row.depth == depth


def shown_ms(row: ModuleRow, depth: int | None) -> float:
    return row.self_ms if depth is None else _time_at(row, depth)


def shown_delegated_ms(row: ModuleRow, depth: int | None) -> float | None:
    """The delegated part of shown_ms: None for a row of a summary.json from before self_delegated_ms."""
    return row.delegated_ms if counts_total(row, depth) else row.self_delegated_ms
