"""One execution's timeline as a Chrome trace (analysis/trace.json), which Perfetto's UI and chrome://tracing open.

The trace is the JSON object form: `traceEvents` holds "M" metadata events naming the process and its thread and
"X" complete events (ts and dur in microseconds). Each kernel and delegate call of one measured execution is a
slice, in execution order, at the time ETDump recorded it (its OPERATOR_CALL or DELEGATE_CALL event: what ops.json
times); a delegate's XNNPACK events are child slices inside it. Where the backend's events carry no timestamps of
their own inside the call (only durations), they are laid out one after another from the call's start, clipped to
it, and their args say so (`layout`). A text-generation run shows the first timed generation's prefill and its
first decode step, each a top-level slice ("prefill", "decode step 1") holding its operators.

Every slice's args name the operator, its instruction, node id, module, module type and source line (the rows of
ops.json, results/source_map.py). The ETDump is the board's: an event that ends before it starts is refused
(AnalysisError, exit 65), never drawn; a timeline that breaks the format's rules (results/trace_rules.py: calls
across each other) is not written, and the analysis says why (the rest of it stands).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from orchestrator.errors import AnalysisError
from orchestrator.results.etdump import RunBlock
from orchestrator.results.generation import DECODE, PREFILL
from orchestrator.results.profile import NO_SOURCE, Attribution, DelegateProfile, InstructionProfile, Profile

TRACE_FILE = "trace.json"
PID = 1
TID = 1
NO_TIMESTAMPS = "the ETDump's events carry no timestamps (an older runner): no timeline (analysis/trace.json)"
BROKEN_RULES = (
    "no timeline (analysis/trace.json): the ETDump's events break {count} rule(s) of the trace format, first: {first}"
)
LAID_OUT = "consecutive from the call's start: ETDump gave this event's duration only"


@dataclass(frozen=True)
class Step:
    """One execution to draw: its name on the timeline ("iteration", "prefill", "decode step 1"), its ETDump block
    and the profile whose rows (operators, modules, delegates) and tick length describe it."""

    name: str
    block: RunBlock
    profile: Profile


def has_timestamps(block: RunBlock) -> bool:
    """Whether a block's events say when they ran (an older runner wrote zeros)."""
    return bool(len(block)) and bool((block.start != 0).any() or (block.end != 0).any())


def _source_args(source: Attribution) -> dict[str, Any]:
    return {"module": source.module, "module_type": source.module_type, "source": source.source}


def _slice(name: str, start_us: float, end_us: float, args: dict[str, Any], category: str) -> dict[str, Any]:
    # The start and the end rounded to the nanosecond, the duration their difference: a slice that ends where the
    # next begins does so exactly, so no rounding makes two siblings overlap (trace_rules.py).
    start, end = round(start_us, 3), round(max(end_us, start_us), 3)
    return {
        "name": name,
        "cat": category,
        "ph": "X",
        "ts": start,
        "dur": round(end - start, 3),
        "pid": PID,
        "tid": TID,
        "args": args,
    }


def _instruction_args(instruction: InstructionProfile) -> dict[str, Any]:
    return {
        "operator": instruction.op or instruction.label,
        "kind": instruction.kind,
        "chain": instruction.chain,
        "instruction": instruction.index,
        "node_id": instruction.node_id,
        **_source_args(instruction.source),
    }


def _node_of_events(delegate: DelegateProfile | None) -> dict[str, tuple[str, str, Attribution]]:
    """A delegate's event names -> (node, type, source) of the XNNPACK node they were placed on."""
    if delegate is None:
        return {}
    return {event: (node.node, node.type, node.source) for node in delegate.nodes for event in node.events}


def _check(block: RunBlock, k: int, where: str) -> None:
    if int(block.end[k]) < int(block.start[k]):
        raise AnalysisError(
            f"ETDump: {where}: event {block.event_names[k] or block.delegate_names[k]!r} ends before it starts "
            f"({int(block.start[k])} > {int(block.end[k])} ticks): no timeline can be drawn",
        )


def _step_events(step: Step, origin: int) -> list[dict[str, Any]]:
    """The step's slices: a top-level one spanning it, its calls, and each delegate's XNNPACK events inside."""
    block, profile = step.block, step.profile
    us_per_tick = profile.ns_per_tick / 1000.0

    def us(ticks: int) -> float:
        return (ticks - origin) * us_per_tick

    instructions = {(i.chain, i.index): i for i in profile.instructions}
    delegates = {d.node_id: d for d in profile.delegates}
    calls: list[tuple[int, int, InstructionProfile]] = []  # (start, end, row) ticks
    inner: dict[tuple[int, int], list[int]] = {}  # a delegate's own events, by its instruction
    method: tuple[int, int] | None = None
    for k, name in enumerate(block.event_names):
        chain, index = int(block.chain[k]), int(block.instruction[k])
        if chain < 0:
            if name == "Method::execute" and method is None:
                _check(block, k, step.name)
                method = (int(block.start[k]), int(block.end[k]))
            continue
        if block.delegate_names[k] is not None:
            inner.setdefault((chain, index), []).append(k)
        elif name in ("OPERATOR_CALL", "DELEGATE_CALL") and (chain, index) in instructions:
            _check(block, k, step.name)
            calls.append((int(block.start[k]), int(block.end[k]), instructions[(chain, index)]))
    calls.sort(key=lambda call: call[0])
    starts = [c[0] for c in calls] + ([method[0]] if method else [])
    ends = [c[1] for c in calls] + ([method[1]] if method else [])
    if not starts:
        return []
    top_start, top_end = min(starts), max(ends)
    events = [
        _slice(step.name, us(top_start), us(top_end),
               {"method": profile.method, "calls": len(calls), "program": profile.pte_name}, "step"),
    ]  # fmt: skip
    for start, end, row in calls:
        events.append(_slice(row.op or row.label, us(start), us(end), _instruction_args(row), row.kind))
        if row.kind == "DelegateCall":
            events += _delegate_events(block, inner.get((row.chain, row.index), []), (start, end),
                                       delegates.get(row.node_id), row, us)  # fmt: skip
    return events


def _delegate_events(
    block: RunBlock,
    positions: list[int],
    call: tuple[int, int],
    delegate: DelegateProfile | None,
    row: InstructionProfile,
    us: Callable[[int], float],
) -> list[dict[str, Any]]:
    """A delegate call's own events, nested inside it: at their times when they lie inside the call, else laid out
    one after another from its start (durations only), clipped to its end."""
    nodes = _node_of_events(delegate)
    inside = [k for k in positions if call[0] <= int(block.start[k]) <= int(block.end[k]) <= call[1]]
    timed = bool(inside)
    if timed:  # a call made more than once per execution keeps the events inside it
        positions = inside
    cursor = call[0]
    events = []
    for k in positions:
        name = str(block.delegate_names[k])
        duration = max(0, int(block.end[k]) - int(block.start[k]))
        if timed:
            start, end = int(block.start[k]), int(block.end[k])
        else:
            start = min(cursor, call[1])
            end = min(start + duration, call[1])
            cursor = end
        node, node_type, source = nodes.get(name, (None, None, NO_SOURCE))
        args: dict[str, Any] = {
            "operator": node_type or name,
            "event": name,
            "delegate": row.op or row.label,
            "instruction": row.index,
            "node_id": row.node_id,
            "xnn_node": node,
            **_source_args(source if node is not None else NO_SOURCE),
        }
        if not timed:
            args["layout"] = LAID_OUT
        events.append(_slice(name, us(start), us(end), args, "DelegateNode"))
    return events


def trace_document(steps: Sequence[Step], *, run_id: str, model: str | None) -> dict[str, Any] | None:
    """The Chrome trace of `steps` (one execution, or a generation's prefill and a decode step), times from the first
    step's earliest event; None when the ETDump holds no timestamps. AnalysisError for an event that ends before it
    starts."""
    steps = [step for step in steps if len(step.block)]
    if not steps or not all(has_timestamps(step.block) for step in steps):
        return None
    origin = min(_runtime_start(step.block) for step in steps)
    events: list[dict[str, Any]] = [
        {"name": "process_name", "ph": "M", "pid": PID, "tid": TID,
         "args": {"name": f"etlab run {run_id}" + (f" ({model})" if model else "")}},
        {"name": "thread_name", "ph": "M", "pid": PID, "tid": TID,
         "args": {"name": "runner: Method::execute (ETDump)"}},
    ]  # fmt: skip
    for step in steps:
        events += _step_events(step, origin)
    document = {
        "traceEvents": events,
        "displayTimeUnit": "ms",
        "otherData": {"run_id": run_id, "model": model, "steps": [step.name for step in steps],
                      "clock": "ETDump ticks from the first event, in microseconds"},
    }  # fmt: skip
    return document


def _runtime_start(block: RunBlock) -> int:
    """The earliest start among the runtime's own events (a backend's may carry durations only)."""
    own = [int(start) for start, delegate in zip(block.start, block.delegate_names, strict=True) if delegate is None]
    return min(own) if own else int(block.start.min())


def iteration_steps(execute: list[RunBlock], profile: Profile) -> list[Step]:
    """The first measured execution of an ordinary run (`profile` covers the last `profile.executions` blocks)."""
    if profile.executions <= 0 or profile.executions > len(execute):
        return []
    return [Step("iteration 1", execute[len(execute) - profile.executions], profile)]


def generation_steps(
    blocks: dict[str, list[RunBlock]], phases: dict[str, Profile], prefill_chunks: int = 1
) -> list[Step]:
    """The first timed generation's prefill (each of its `prefill_chunks` executions, "prefill chunk 2/3", when a long
    prompt went in chunks) and its first decode step."""
    steps = []
    if blocks.get(PREFILL) and PREFILL in phases:
        chunks = blocks[PREFILL][: max(1, prefill_chunks)]
        for number, block in enumerate(chunks, 1):
            name = PREFILL if len(chunks) == 1 else f"{PREFILL} chunk {number}/{len(chunks)}"
            steps.append(Step(name, block, phases[PREFILL]))
    if blocks.get(DECODE) and DECODE in phases:
        steps.append(Step(f"{DECODE} step 1", blocks[DECODE][0], phases[DECODE]))
    return steps
