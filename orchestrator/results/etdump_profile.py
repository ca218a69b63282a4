"""ETDump -> Profile: per-instruction and per-XNN-node statistics of the measured executions.

Statistics cover the measured executions only: the runner writes one "Execute" block per execution, warmup
first, and timings.json says how many warmups there were. Each kernel instruction is timed by its
OPERATOR_CALL event (its `native_call_<op>` twin, nested inside, is not counted again); each delegate call by
its DELEGATE_CALL event. Shares (`pct`) are of medians: an instruction's (or XNN node's, or operator type's)
median over `share_base_ms`, the median whole-method time ("Method::execute"), or the sum of the instructions' medians
when that is larger (medians do not add up exactly), so the top-level shares never sum past 100%. The Results
table, the advisor and Model Explorer's `pct` overlay all read this one baseline: one slow iteration moves a mean,
never a median.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable
from typing import Any

import numpy as np

from orchestrator.errors import AnalysisError
from orchestrator.programs.plan import ProgramPlan
from orchestrator.programs.xnn import XNNPACK_BACKEND, XnnNode, read_xnn_nodes
from orchestrator.results.etdump import Etdump, RunBlock
from orchestrator.results.profile import DelegateProfile, InstructionProfile, Profile, XnnNodeProfile, dist_ms
from orchestrator.results.stats import Distribution, distribution
from orchestrator.results.xnn_match import MatchError, match_events, operator_type

NS_PER_TICK_CANDIDATES = (1.0, 1e3, 1e-3)  # ns, us and ps ticks; Linux runtimes tick in ns


def _instruction_key(chain: np.ndarray | int, index: np.ndarray | int) -> np.ndarray | int:
    return chain * 1_000_000 + index


def _method_totals(blocks: list[RunBlock]) -> np.ndarray:
    """Method::execute duration per block (ticks), NaN where a block lacks it."""
    totals = np.full(len(blocks), np.nan)
    for b, block in enumerate(blocks):
        for k, name in enumerate(block.event_names):
            if name == "Method::execute" and block.chain[k] == -1:
                totals[b] = float(block.end[k] - block.start[k])
                break
    return totals


def profile_etdump(
    etdump: Etdump,
    plan: ProgramPlan | None,
    *,
    method: str = "forward",
    skip_executions: int = 0,
    ns_per_tick: float = 1.0,
) -> Profile:
    """Per-instruction (and, for XNNPACK delegates, per-node) statistics over the Execute blocks after the first
    `skip_executions`. Instructions the plan lists but that never fired are kept, with no samples."""
    blocks = etdump.execute_blocks[skip_executions:]
    if not blocks:
        held = len(etdump.execute_blocks)
        raise AnalysisError(f"the ETDump holds {held} Execute block(s); none left after skipping {skip_executions}")
    ticks_per_ms = 1e6 / ns_per_tick  # dividing keeps round figures round (7000 ns -> 0.007 ms)
    instructions = _instruction_table(blocks, plan, method)
    columns = {_instruction_key(i.chain, i.index): c for c, i in enumerate(instructions)}
    times = np.zeros((len(blocks), len(instructions)))
    fired = np.zeros((len(blocks), len(instructions)), dtype=np.int64)
    sorted_keys = np.array(sorted(columns), dtype=np.int64)
    column_of_sorted = np.array([columns[k] for k in sorted_keys], dtype=np.int64)
    for b, block in enumerate(blocks):
        names = np.asarray(block.event_names, dtype=object)
        timed = ((names == "OPERATOR_CALL") | (names == "DELEGATE_CALL")) & (block.chain >= 0)
        keys = _instruction_key(block.chain[timed], block.instruction[timed])
        slots = np.searchsorted(sorted_keys, keys)
        slots = np.clip(slots, 0, len(sorted_keys) - 1)
        known = sorted_keys[slots] == keys
        cols = column_of_sorted[slots[known]]
        np.add.at(times[b], cols, block.durations[timed][known] / ticks_per_ms)
        np.add.at(fired[b], cols, 1)

    totals_ticks = _method_totals(blocks)
    totals = totals_ticks / ticks_per_ms
    if np.isnan(totals).any():  # no Method::execute event: fall back to the instructions' sum
        totals = np.where(np.isnan(totals), times.sum(axis=1), totals)
    total = distribution(totals)
    for c, instruction in enumerate(instructions):
        instruction.samples_ms = times[fired[:, c] > 0, c]
        instruction.dist = distribution(instruction.samples_ms)
    base = share_base_ms(total.median if total else None, (i.dist.median for i in instructions if i.dist))
    for instruction in instructions:
        instruction.pct = _pct(instruction.dist, base)

    pte_name = plan.pte.name if plan else None
    delegates = _delegate_profiles(blocks, plan, instructions, fired, method, ticks_per_ms, base, pte_name)
    return Profile(
        method=method,
        pte_name=pte_name,
        executions=len(blocks),
        ns_per_tick=ns_per_tick,
        total=total,
        instructions=instructions,
        delegates=delegates,
        operator_types=_operator_types(delegates, base, len(blocks)),
        execution_ms=totals,
    )


def share_base_ms(method_median: float | None, instruction_medians: Iterable[float]) -> float:
    """What a share (`pct`) is of: the method's median time, or the sum of its instructions' medians when that is
    larger (per-instruction medians need not add up to the method's), so shares sum to at most 100%."""
    return max(method_median or 0.0, sum(instruction_medians))


def _pct(dist: Distribution | None, base: float) -> float | None:
    """A median's share of `base`, in percent; None when not timed."""
    return dist.median / base * 100.0 if dist is not None and base else None


def _instruction_table(blocks: list[RunBlock], plan: ProgramPlan | None, method: str) -> list[InstructionProfile]:
    empty = np.zeros(0)
    if plan is not None:
        return [
            InstructionProfile(i.node_id(method), i.chain, i.index, i.kind, i.op or i.backend, i.label, empty)
            for i in plan.instructions
        ]
    # No .pte: learn the instructions from the events themselves.
    found: dict[tuple[int, int], InstructionProfile] = {}
    for block in blocks:
        for k, name in enumerate(block.event_names):
            chain, index = int(block.chain[k]), int(block.instruction[k])
            if chain < 0:
                continue
            node_id = f"{method}_{chain}_{index}"
            if name == "DELEGATE_CALL" and (chain, index) not in found:
                found[(chain, index)] = InstructionProfile(
                    node_id, chain, index, "DelegateCall", None, "delegate", empty
                )
            elif name.startswith("native_call_"):
                op = name[len("native_call_") :]  # the kernel's name, without the namespace only the program knows
                found[(chain, index)] = InstructionProfile(
                    node_id, chain, index, "KernelCall", op, op.split(".", 1)[0], empty
                )
            elif name == "OPERATOR_CALL" and (chain, index) not in found:
                found[(chain, index)] = InstructionProfile(node_id, chain, index, "KernelCall", None, "kernel", empty)
    return [found[key] for key in sorted(found)]


def _delegate_profiles(
    blocks: list[RunBlock],
    plan: ProgramPlan | None,
    instructions: list[InstructionProfile],
    fired: np.ndarray,
    method: str,
    ticks_per_ms: float,
    base: float,
    pte_name: str | None,
) -> list[DelegateProfile]:
    by_key = plan.by_key() if plan else {}
    # Per block, the delegate-internal events of each instruction, in order.
    sequences: list[dict[tuple[int, int], list[int]]] = []
    for block in blocks:
        groups: dict[tuple[int, int], list[int]] = defaultdict(list)
        for k, delegate_name in enumerate(block.delegate_names):
            if delegate_name is not None and block.chain[k] >= 0:
                groups[(int(block.chain[k]), int(block.instruction[k]))].append(k)
        sequences.append(groups)

    profiles = []
    for c, instruction in enumerate(instructions):
        if instruction.kind != "DelegateCall":
            continue
        key = (instruction.chain, instruction.index)
        backend = instruction.op or "delegate"
        profile = DelegateProfile(
            node_id=instruction.node_id,
            backend=backend,
            graph_id=f"{pte_name}::{instruction.node_id}" if pte_name else instruction.node_id,
            call=instruction.dist,
            event_names=[],
            event_samples_ms=np.zeros((0, 0)),
            status="no events",
        )
        profiles.append(profile)
        ran = [b for b in range(len(blocks)) if fired[b, c] > 0]
        if not ran:
            profile.reason = "the delegate never ran in the measured executions"
            continue
        if any(fired[b, c] > 1 for b in ran):
            profile.status, profile.reason = "left out", "the delegate ran more than once per execution"
            continue
        name_lists = [[blocks[b].delegate_names[k] for k in sequences[b].get(key, [])] for b in ran]
        if not name_lists[0]:
            profile.reason = "the backend reported no per-operator events"
            continue
        if any(names != name_lists[0] for names in name_lists[1:]):
            profile.status, profile.reason = "left out", "its operator events differ between executions"
            continue
        profile.event_names = [str(name) for name in name_lists[0]]
        profile.event_samples_ms = np.array(
            [blocks[b].durations[sequences[b][key]] / ticks_per_ms for b in ran], dtype=np.float64
        )
        plan_instruction = by_key.get(key)
        if plan is None or backend != XNNPACK_BACKEND or plan_instruction is None or plan_instruction.delegate is None:
            profile.status = "not inspectable"
            profile.reason = "no .pte given" if plan is None else f"no node matcher for backend {backend}"
            continue
        try:
            nodes = read_xnn_nodes(plan_instruction.delegate, plan.pte)
        except AnalysisError as exc:  # one unreadable payload costs that delegate's overlay, not the analysis
            profile.status, profile.reason = "left out", str(exc)
            continue
        _place_on_nodes(profile, nodes, base)
    return profiles


def _place_on_nodes(profile: DelegateProfile, nodes: list[XnnNode], base: float) -> None:
    profile.node_types = {str(node.index): node.type for node in nodes}
    try:
        placement = match_events(nodes, profile.event_names)
    except MatchError as exc:
        profile.status, profile.reason = "left out", str(exc)
        return
    profile.status = "placed"
    types = {node.index: node.type for node in nodes}
    shapes = {node.index: node.shape for node in nodes}
    for index in sorted(placement.node_events):
        positions = placement.node_events[index]
        samples = profile.event_samples_ms[:, positions].sum(axis=1)
        dist = distribution(samples)
        pct = _pct(dist, base)
        events = [profile.event_names[p] for p in positions]
        node = XnnNodeProfile(str(index), types[index], events, samples, dist, pct, shape=shapes[index])
        profile.nodes.append(node)
    profile.unplaced_events = [profile.event_names[p] for p in placement.unplaced_events]
    profile.fused_nodes = [str(index) for index in placement.fused_nodes]


def _operator_types(delegates: list[DelegateProfile], base: float, executions: int) -> list[dict[str, Any]]:
    """Delegate-internal time per XNNPACK operator type, summed per execution over every delegate call site."""
    per_type: dict[str, np.ndarray] = {}
    counts: dict[str, int] = defaultdict(int)
    for delegate in delegates:
        if delegate.event_samples_ms.shape[0] != executions:
            continue  # a delegate that skipped some executions cannot be summed per execution
        for k, name in enumerate(delegate.event_names):
            kind = operator_type(name)
            per_type[kind] = per_type.get(kind, np.zeros(executions)) + delegate.event_samples_ms[:, k]
            counts[kind] += 1
    rows = []
    for kind, samples in per_type.items():
        dist = distribution(samples)
        rows.append({"type": kind, "count": counts[kind], **dist_ms(dist), "pct": _pct(dist, base)})
    rows.sort(key=lambda row: -(row["median_ms"] or 0.0))
    return rows


def inferred_ns_per_tick(etdump_ticks: np.ndarray, timings_ms: list[float]) -> tuple[float, float | None]:
    """The tick length (ns) that makes ETDump's Method::execute agree with timings.json, and the remaining ratio."""
    ticks = etdump_ticks[np.isfinite(etdump_ticks)]
    if ticks.size == 0 or float(np.median(ticks)) <= 0 or not timings_ms or float(np.median(timings_ms)) <= 0:
        return 1.0, None
    measured_ns = float(np.median(timings_ms)) * 1e6
    best = min(NS_PER_TICK_CANDIDATES, key=lambda ns: abs(math.log(float(np.median(ticks)) * ns / measured_ns)))
    return best, float(np.median(ticks)) * best / measured_ns
