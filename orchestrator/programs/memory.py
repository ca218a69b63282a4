"""Memory a program plans, read from its .pte (or recorded in its sidecar), as data.

It reads the execution plan's `non_const_buffer_sizes` (the planned arenas; slot 0 is reserved), the constant
segment and delegate payloads, and, for each top-level instruction, the planned activation bytes live while it
runs: a planned tensor is live from the first instruction that names it to the last (method inputs from the start,
outputs to the end), and the bytes are the union of the live tensors' byte ranges per arena, so tensors the planner
made share memory are counted once. Lowering records it in the sidecar; analysis compares a run's RSS with it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from orchestrator.errors import AnalysisError
from orchestrator.programs.plan import program_bytes

# Bytes per element of each ExecuTorch ScalarType (scalar_type.fbs).
ELEMENT_BYTES = {0: 1, 1: 1, 2: 2, 3: 4, 4: 8, 5: 2, 6: 4, 7: 8, 11: 1, 12: 1, 13: 1, 14: 4, 15: 2, 22: 2,
                 23: 1, 24: 1, 25: 1, 26: 1, 27: 2, 28: 4, 29: 8}  # fmt: skip


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
    data, _ = program_bytes(pte)
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


def program_memory_from_sidecar(sidecar: dict[str, Any] | None) -> ProgramMemory | None:
    """The lowering's record of the plan (the sidecar's `memory`), when no .pte is at hand."""
    memory = (sidecar or {}).get("memory") if isinstance(sidecar, dict) else None
    if not isinstance(memory, dict) or not isinstance(memory.get("planned_arenas"), list | tuple):
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
