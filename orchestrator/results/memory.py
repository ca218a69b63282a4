"""Memory: what a program plans (from the .pte) and what a run used (from timings.json), as data.

The program side reads the execution plan's `non_const_buffer_sizes` (the planned arenas; slot 0 is reserved), the
constant segment and delegate payloads, and, for each top-level instruction, the planned activation bytes live
while it runs: a planned tensor is live from the first instruction that names it to the last (method inputs from
the start, outputs to the end), and the bytes are the union of the live tensors' byte ranges per arena, so tensors
the planner made share memory are counted once. The run side is the runner's RSS at each phase.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from orchestrator.errors import AnalysisError
from orchestrator.results.etdump import _program_bytes
from orchestrator.results.summary import Memory

# Bytes per element of each ExecuTorch ScalarType (scalar_type.fbs).
ELEMENT_BYTES = {0: 1, 1: 1, 2: 2, 3: 4, 4: 8, 5: 2, 6: 4, 7: 8, 11: 1, 12: 1, 13: 1, 14: 4, 15: 2, 22: 2,
                 23: 1, 24: 1, 25: 1, 26: 1, 27: 2, 28: 4, 29: 8}  # fmt: skip
PHASES = ("start", "load", "method_init", "first_execution", "end")

MAX_ARENAS = 64  # a board's timings.json is untrusted: a method has a handful of planned arenas


@dataclass(frozen=True)
class ProgramMemory:
    """What the program itself says about memory, for one method."""

    method: str
    planned_arenas: list[int]
    constants_bytes: int  # constant segment and inline constant buffers
    delegate_data_bytes: int  # delegate payloads and named data (where XNNPACK keeps its weights)
    pte_bytes: int
    live_bytes: dict[tuple[int, int], int] = field(default_factory=dict)  # (chain, instruction) -> bytes

    @property
    def planned_bytes(self) -> int:
        return sum(self.planned_arenas)

    @property
    def peak_live_bytes(self) -> int:
        return max(self.live_bytes.values(), default=0)

    def node_values(self) -> dict[str, int]:
        """Live bytes by the PTE adapter's node id."""
        return {f"{self.method}_{chain}_{index}": value for (chain, index), value in sorted(self.live_bytes.items())}

    def to_sidecar(self) -> dict[str, Any]:
        return {
            "method": self.method,
            "planned_arenas": self.planned_arenas,
            "planned_bytes": self.planned_bytes,
            "constants_bytes": self.constants_bytes,
            "delegate_data_bytes": self.delegate_data_bytes,
            "pte_bytes": self.pte_bytes,
            "peak_live_bytes": self.peak_live_bytes,
            "live_bytes": self.node_values(),
        }


def _union_bytes(ranges: list[tuple[int, int]]) -> int:
    total, end = 0, -1
    for start, stop in sorted(ranges):
        if stop <= end:
            continue
        total += stop - max(start, end)
        end = stop
    return total


def read_program_memory(pte: Path, method: str = "forward") -> ProgramMemory:
    """The planned arenas, constant sizes and per-instruction live activation bytes of `method`."""
    from pte_adapter_model_explorer.executorch_flatbuffer import program_generated as pg

    pte = Path(pte)
    data, _ = _program_bytes(pte)
    try:
        program = pg.Program.GetRootAs(data, 0)
        plan = None
        for i in range(program.ExecutionPlanLength()):
            candidate = program.ExecutionPlan(i)
            name = candidate.Name()
            if (name.decode() if isinstance(name, bytes) else name) == method:
                plan = candidate
        if plan is None:
            raise AnalysisError(f"{pte}: no method {method!r}")
        arenas = [int(plan.NonConstBufferSizes(i)) for i in range(1, plan.NonConstBufferSizesLength())]
        constants = sum(program.ConstantBuffer(i).StorageLength() for i in range(program.ConstantBufferLength()))
        segment = program.ConstantSegment()
        if segment is not None and segment.OffsetsLength() and segment.SegmentIndex() < program.SegmentsLength():
            constants += int(program.Segments(segment.SegmentIndex()).Size())
        delegate_data = _delegate_bytes(pg, program, plan)
        live = _live_bytes(pg, plan)
    except AnalysisError:
        raise
    except Exception as exc:  # the generated reader raises struct/index errors on garbage
        raise AnalysisError(f"{pte}: unreadable program flatbuffer ({exc})") from None
    return ProgramMemory(method, arenas, constants, delegate_data, pte.stat().st_size, live)


def _delegate_bytes(pg: Any, program: Any, plan: Any) -> int:
    total = 0
    for i in range(plan.DelegatesLength()):
        processed = plan.Delegates(i).Processed()
        if processed is None:
            continue
        if processed.Location() == pg.DataLocation.INLINE:
            total += program.BackendDelegateData(processed.Index()).DataLength()
        elif processed.Index() < program.SegmentsLength():
            total += int(program.Segments(processed.Index()).Size())
    segments = {int(program.NamedData(i).SegmentIndex()) for i in range(program.NamedDataLength())}
    total += sum(int(program.Segments(s).Size()) for s in segments if s < program.SegmentsLength())
    return total


def _tensor_ranges(pg: Any, plan: Any) -> dict[int, tuple[int, int, int]]:
    """value index -> (arena, offset, nbytes) for every memory-planned tensor."""
    planned: dict[int, tuple[int, int, int]] = {}
    for index in range(plan.ValuesLength()):
        value = plan.Values(index)
        if value.ValType() != pg.KernelTypes.Tensor:
            continue
        tensor = pg.Tensor()
        table = value.Val()
        tensor.Init(table.Bytes, table.Pos)
        allocation = tensor.AllocationInfo()
        if allocation is None:
            continue
        elements = 1
        for d in range(tensor.SizesLength()):
            elements *= max(0, int(tensor.Sizes(d)))
        nbytes = elements * ELEMENT_BYTES.get(int(tensor.ScalarType()), 1)
        offset = (int(allocation.MemoryOffsetHigh()) << 32) | int(allocation.MemoryOffsetLow())
        planned[index] = (int(allocation.MemoryId()), offset, nbytes)
    return planned


def _instruction_values(pg: Any, plan: Any, instruction: Any) -> list[int]:
    kind = instruction.InstrArgsType()
    table = instruction.InstrArgs()
    if table is None:
        return []
    if kind == pg.InstructionArguments.KernelCall:
        call = pg.KernelCall()
    elif kind == pg.InstructionArguments.DelegateCall:
        call = pg.DelegateCall()
    elif kind == pg.InstructionArguments.MoveCall:
        move = pg.MoveCall()
        move.Init(table.Bytes, table.Pos)
        return [int(move.MoveFrom()), int(move.MoveTo())]
    elif kind == pg.InstructionArguments.FreeCall:
        free = pg.FreeCall()
        free.Init(table.Bytes, table.Pos)
        return [int(free.ValueIndex())]
    else:
        return []
    call.Init(table.Bytes, table.Pos)
    return [int(call.Args(j)) for j in range(call.ArgsLength())]


def _expand(pg: Any, plan: Any, indices: list[int]) -> list[int]:
    """A tensor list stands for its items."""
    found = []
    for index in indices:
        if not 0 <= index < plan.ValuesLength():
            continue
        value = plan.Values(index)
        if value.ValType() in (pg.KernelTypes.TensorList, pg.KernelTypes.OptionalTensorList):
            items = pg.TensorList() if value.ValType() == pg.KernelTypes.TensorList else pg.OptionalTensorList()
            table = value.Val()
            items.Init(table.Bytes, table.Pos)
            found += [int(items.Items(j)) for j in range(items.ItemsLength()) if int(items.Items(j)) >= 0]
        found.append(index)
    return found


def _live_bytes(pg: Any, plan: Any) -> dict[tuple[int, int], int]:
    planned = _tensor_ranges(pg, plan)
    order: list[tuple[int, int]] = []
    first: dict[int, int] = {}
    last: dict[int, int] = {}
    for c in range(plan.ChainsLength()):
        chain = plan.Chains(c)
        for i in range(chain.InstructionsLength()):
            step = len(order)
            order.append((c, i))
            for value in _expand(pg, plan, _instruction_values(pg, plan, chain.Instructions(i))):
                if value in planned:
                    first.setdefault(value, step)
                    last[value] = step
    end = len(order) - 1
    for index in _expand(pg, plan, [int(plan.Inputs(j)) for j in range(plan.InputsLength())]):
        if index in planned:
            first[index] = 0
            last.setdefault(index, 0)
    for index in _expand(pg, plan, [int(plan.Outputs(j)) for j in range(plan.OutputsLength())]):
        if index in planned:
            first.setdefault(index, end)
            last[index] = end
    live: dict[tuple[int, int], int] = {}
    for step, key in enumerate(order):
        by_arena: dict[int, list[tuple[int, int]]] = {}
        for value, (arena, offset, nbytes) in planned.items():
            if value in first and first[value] <= step <= last[value] and nbytes:
                by_arena.setdefault(arena, []).append((offset, offset + nbytes))
        live[key] = sum(_union_bytes(ranges) for ranges in by_arena.values())
    return live


def _phase_int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def run_memory(timings: dict[str, Any]) -> dict[str, Any] | None:
    """The runner's memory record in timings.json, checked: {"peak_reset", "phases": {phase: {...}}}, or None."""
    memory = timings.get("memory") if isinstance(timings, dict) else None
    if not isinstance(memory, dict) or not isinstance(memory.get("phases"), list):
        return None
    phases: dict[str, dict[str, int | None]] = {}
    for entry in memory["phases"]:
        if isinstance(entry, dict) and entry.get("phase") in PHASES:
            phases[str(entry["phase"])] = {
                key: _phase_int(entry.get(key)) for key in ("peak_rss_bytes", "rss_bytes", "maxrss_bytes")
            }
    return {"peak_reset": memory.get("peak_reset") is True, "phases": phases}


def program_memory_from_sidecar(sidecar: dict[str, Any] | None) -> ProgramMemory | None:
    """The lowering's record of the plan (the sidecar's `memory`), when no .pte is at hand."""
    memory = (sidecar or {}).get("memory") if isinstance(sidecar, dict) else None
    if not isinstance(memory, dict) or not isinstance(memory.get("planned_arenas"), list):
        return None
    method = str(memory.get("method") or "forward")
    live: dict[tuple[int, int], int] = {}
    for node, value in (memory.get("live_bytes") or {}).items():
        parts = str(node).rsplit("_", 2)
        if len(parts) == 3 and parts[1].isdigit() and parts[2].isdigit() and isinstance(value, int):
            live[(int(parts[1]), int(parts[2]))] = value
    return ProgramMemory(
        method=method,
        planned_arenas=[int(a) for a in memory["planned_arenas"] if isinstance(a, int)],
        constants_bytes=int(memory.get("constants_bytes") or 0),
        delegate_data_bytes=int(memory.get("delegate_data_bytes") or 0),
        pte_bytes=int(memory.get("pte_bytes") or 0),
        live_bytes=live,
    )


def _byte_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2**63


def _byte_counts(value: Any) -> bool:
    return isinstance(value, list) and len(value) <= MAX_ARENAS and all(_byte_count(a) for a in value)


# What the runner reports of the program (timings.json `program_memory`), checked against the program's own plan:
# key -> (what it must be, its check, the note when it differs). Absent or null (an older runner, an unreadable
# program) is unknown; anything else is unknown and noted.
_RUNNER_FIGURES: dict[str, tuple[str, Callable[[Any], bool], str]] = {
    "planned_arenas": (
        "a list of byte counts",
        _byte_counts,
        "the runner planned arenas of {} bytes, the program's plan says {}",
    ),
    "constants_bytes": ("a byte count", _byte_count, "the runner read {} bytes of constant data, the program says {}"),
}


def _runner_figures(runner_program: Any, program: ProgramMemory | None, notes: list[str]) -> dict[str, Any]:
    """The runner's figures of the program, validated, each compared with the program's; notes appended."""
    figures = {}
    for key, (kind, valid, mismatch) in _RUNNER_FIGURES.items():
        value = runner_program.get(key) if isinstance(runner_program, dict) else None
        if value is not None and not valid(value):
            notes.append(f"the runner's {key} is not {kind}: {str(value)[:60]!r}")
            value = None
        if value is not None and program is not None and value != getattr(program, key):
            notes.append(mismatch.format(value, getattr(program, key)))
        figures[key] = value
    return figures


def memory_summary(timings: dict[str, Any], program: ProgramMemory | None) -> tuple[Memory | None, list[str]]:
    """summary.json's `memory` section from the runner's phases and the program's plan; plus notes on mismatches."""
    run = run_memory(timings)
    notes: list[str] = []
    runner_program = timings.get("program_memory") if isinstance(timings, dict) else None
    figures = _runner_figures(runner_program, program, notes)
    runner_arenas, runner_constants = figures["planned_arenas"], figures["constants_bytes"]
    if run is None and program is None:
        return None, notes
    phases = run["phases"] if run else {}
    peaks = [p["peak_rss_bytes"] for p in phases.values() if p.get("peak_rss_bytes") is not None]
    maxrss = [p["maxrss_bytes"] for p in phases.values() if p.get("maxrss_bytes") is not None]
    peak = max(peaks + maxrss) if peaks or maxrss else None
    baseline = (phases.get("start") or {}).get("rss_bytes")
    arenas = program.planned_arenas if program else list(runner_arenas or [])
    planned = sum(arenas) if arenas or program else None
    constants = program.constants_bytes if program else runner_constants
    other = None
    if peak is not None and baseline is not None and planned is not None and constants is not None:
        other = max(0, peak - baseline - planned - constants)
    pte_bytes = program.pte_bytes if program else None
    if pte_bytes is None and isinstance(runner_program, dict) and _byte_count(runner_program.get("pte_bytes")):
        pte_bytes = runner_program["pte_bytes"]
    memory = Memory(
        peak_rss_bytes=peak,
        phases=phases,
        peak_reset=bool(run and run["peak_reset"]),
        baseline_rss_bytes=baseline,
        planned_arenas=tuple(arenas),
        planned_bytes=planned,
        constants_bytes=constants,
        delegate_data_bytes=program.delegate_data_bytes if program else None,
        pte_bytes=pte_bytes,
        peak_live_bytes=program.peak_live_bytes if program and program.live_bytes else None,
        other_bytes=other,
    )
    return memory, notes
