"""One execution's timeline as a Chrome trace (analysis/trace.json), which Perfetto's UI and chrome://tracing open.

The trace is the JSON object form: `traceEvents` holds "M" metadata events naming the process and its thread and
"X" complete events (ts and dur in microseconds). Each kernel and delegate call of one measured execution is a
slice, in execution order, at the time ETDump recorded it (its OPERATOR_CALL or DELEGATE_CALL event: what ops.json
times); a delegate's XNNPACK events are child slices inside it. Where the backend's events carry no timestamps of
their own inside the call (only durations), they are laid out one after another from the call's start, clipped to
it, and their args say so (`layout`). The execution drawn is a typical one: the measured iteration nearest the
median ("iteration 7 of 20 (nearest the median, 3.410 ms; median 3.400 ms)", its name on the timeline and in
`otherData.steps`), or the first, or the Nth, when asked (`Execution`). A text-generation run shows the prefill
nearest the median prefill and the decode step nearest the median step, each a top-level slice holding its operators.

Every slice's args name the operator, its instruction, node id, module, module type and source line (the rows of
ops.json, results/source_map.py). The ETDump is the board's: an event that ends before it starts is refused
(AnalysisError, exit 65), never drawn; a timeline that breaks the format's rules (results/trace_rules.py: calls
across each other) is not written, and the analysis says why (the rest of it stands).
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Final, Literal

from orchestrator.errors import AnalysisError, UsageError
from orchestrator.results.etdump import RunBlock
from orchestrator.results.generation import DECODE, PREFILL, GenerationRun
from orchestrator.results.profile import NO_SOURCE, Attribution, DelegateProfile, InstructionProfile, Profile

TRACE_FILE = "trace.json"
PID = 1
TID = 1
NO_TIMESTAMPS = "the ETDump's events carry no timestamps (an older runner): no timeline (analysis/trace.json)"
BROKEN_RULES = (
    "no timeline (analysis/trace.json): the ETDump's events break {count} rule(s) of the trace format, first: {first}"
)
LAID_OUT = "consecutive from the call's start: ETDump gave this event's duration only"
MEDIAN: Final = "median"
FIRST: Final = "first"
Execution = Literal["median", "first"] | int  # which execution to draw: N counts from 1


@dataclass(frozen=True)
class Step:
    """One execution to draw: its name on the timeline ("iteration 7 of 20", "prefill", "decode step 12 of 31"), its
    ETDump block, the profile whose rows (operators, modules, delegates) and tick length describe it, which of that
    profile's executions it is (its samples' index) and why it was chosen, in words."""

    name: str
    block: RunBlock
    profile: Profile
    sample: int = 0
    why: str = ""

    @property
    def title(self) -> str:
        """The name the timeline shows: "iteration 7 of 20 (nearest the median, 3.410 ms; median 3.400 ms)"."""
        return f"{self.name} ({self.why})" if self.why else self.name


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
        _slice(step.title, us(top_start), us(top_end),
               {"method": profile.method, "calls": len(calls), "program": profile.pte_name, "execution": step.name,
                "chosen": step.why, "sample": step.sample}, "step"),  # sample: its index in ops.json's samples_ms
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
        "otherData": {"run_id": run_id, "model": model, "steps": [step.title for step in steps],
                      "clock": "ETDump ticks from the first event, in microseconds"},
    }  # fmt: skip
    return document


def _runtime_start(block: RunBlock) -> int:
    """The earliest start among the runtime's own events (a backend's may carry durations only)."""
    own = [int(start) for start, delegate in zip(block.start, block.delegate_names, strict=True) if delegate is None]
    return min(own) if own else int(block.start.min())


def _ms(value: float) -> str:
    return f"{value:.1f}" if value >= 100 else f"{value:.2f}" if value >= 10 else f"{value:.3f}"


def chosen(times_ms: Sequence[float], execution: Execution, what: str) -> tuple[int, str]:
    """Which of the executions `times_ms` to draw (its index) and why, in words: the one nearest their median (the
    first of two as near), the first, or the Nth (1-based; UsageError past the last)."""
    median = statistics.median(times_ms)
    if execution == MEDIAN:
        index, said = min(range(len(times_ms)), key=lambda i: (abs(times_ms[i] - median), i)), "nearest the median"
    elif execution == FIRST:
        index, said = 0, "the first"
    elif isinstance(execution, int) and 1 <= execution <= len(times_ms):
        index, said = execution - 1, "as asked"
    else:
        raise UsageError(f"there is no {what} {execution}: the run timed {len(times_ms)} (1 to {len(times_ms)})")
    return index, f"{said}, {_ms(times_ms[index])} ms; median {_ms(median)} ms"


def method_times_ms(blocks: Sequence[RunBlock], ns_per_tick: float) -> list[float]:
    """Each block's Method::execute time (0 where it has none): the ETDump's word when timings.json has none."""
    times = []
    for block in blocks:
        ticks = next((int(block.end[k]) - int(block.start[k]) for k, name in enumerate(block.event_names)
                      if name == "Method::execute" and int(block.chain[k]) < 0), 0)  # fmt: skip
        times.append(ticks * ns_per_tick / 1e6)
    return times


def iteration_steps(
    execute: list[RunBlock], profile: Profile, times_ms: Sequence[float] = (), execution: Execution = MEDIAN
) -> list[Step]:
    """One measured execution of an ordinary run (`profile` covers the last `profile.executions` blocks, timed
    `times_ms` as timings.json has them, else as the ETDump does): by default the one nearest the median."""
    count = profile.executions
    if count <= 0 or count > len(execute):
        return []
    blocks = execute[len(execute) - count :]
    times = list(times_ms) if len(times_ms) == count else method_times_ms(blocks, profile.ns_per_tick)
    index, why = chosen(times, execution, "iteration")
    return [Step(f"iteration {index + 1} of {count}", blocks[index], profile, index, why)]


def generation_steps(
    blocks: dict[str, list[RunBlock]],
    phases: dict[str, Profile],
    runs: Sequence[GenerationRun],
    execution: Execution = MEDIAN,
) -> list[Step]:
    """A text generation's prefill (each of its executions, "prefill chunk 2/3", when a long prompt went in chunks)
    and one decode step, of the timed generations `runs`: by default the prefill nearest the median prefill and the
    step nearest the median step; "first": the first generation's prefill and its first step; N: decode step N
    (counted over the timed generations) and its generation's prefill."""
    steps: list[Step] = []
    decode = blocks.get(DECODE) if DECODE in phases else None
    step_times = [ms for run in runs for ms in run.decode_ms]
    owner = [g for g, run in enumerate(runs) for _ in run.decode_ms]  # each step's generation
    step = None
    if decode and len(decode) == len(step_times):
        index, why = chosen(step_times, execution, "decode step")
        first_of_its = owner.index(owner[index])
        said = f"generation {owner[index] + 1}'s step {index - first_of_its + 1}; " if len(runs) > 1 else ""
        step = Step(f"{DECODE} step {index + 1} of {len(step_times)}", decode[index], phases[DECODE], index,
                    said + why)  # fmt: skip
    prefill = blocks.get(PREFILL) if PREFILL in phases else None
    chunks = [len(run.prefill_chunks) for run in runs]
    if prefill and len(prefill) == sum(chunks):
        if step is not None and isinstance(execution, int):  # the asked step's own prompt
            which, why = owner[step.sample], f"the prompt of {step.name}"
        else:
            which, why = chosen([run.prefill_ms for run in runs], execution, "generation")
        start = sum(chunks[:which])
        of = f" of generation {which + 1} of {len(runs)}" if len(runs) > 1 else ""
        for number in range(chunks[which]):
            name = PREFILL if chunks[which] == 1 else f"{PREFILL} chunk {number + 1}/{chunks[which]}"
            steps.append(Step(name + of, prefill[start + number], phases[PREFILL], start + number, why))
    return steps + ([step] if step is not None else [])
