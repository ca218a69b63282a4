"""A program's execution plan, read from its .pte: every instruction, its operator, and where delegate payloads live.

Lowering reads it to check what it built (lowering/quantize/xnn_types.py), analysis to name what ETDump events
timed. Read with the PTE adapter's generated flatbuffer classes, so neither ExecuTorch nor torch is imported.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from orchestrator.errors import AnalysisError

PROGRAM_IDENTIFIER = b"ET12"


@dataclass(frozen=True)
class DelegateData:
    """Where a delegate's processed payload lives: inline bytes, or a byte range of the .pte file."""

    inline: bytes | None = None
    file_offset: int = 0
    size: int = 0

    def read(self, pte: Path, limit: int | None = None) -> bytes:
        if self.inline is not None:
            return self.inline[:limit] if limit is not None else self.inline
        length = self.size if limit is None else min(self.size, limit)
        with open(pte, "rb") as handle:
            handle.seek(self.file_offset)
            return handle.read(length)

    def read_range(self, pte: Path, offset: int, length: int) -> bytes:
        if offset < 0 or length < 0 or offset + length > (len(self.inline) if self.inline is not None else self.size):
            raise AnalysisError(f"{pte.name}: a delegate payload range lies outside the payload")
        if self.inline is not None:
            return self.inline[offset : offset + length]
        with open(pte, "rb") as handle:
            handle.seek(self.file_offset + offset)
            return handle.read(length)


@dataclass(frozen=True)
class PlanInstruction:
    chain: int
    index: int
    kind: str  # KernelCall, DelegateCall, MoveCall, JumpFalseCall, FreeCall
    op: str | None = None  # "aten::add.out" for a KernelCall
    backend: str | None = None  # "XnnpackBackend" for a DelegateCall
    delegate: DelegateData | None = field(default=None, compare=False, repr=False)
    args: tuple[int, ...] = field(default=(), compare=False, repr=False)  # a KernelCall's value indices

    def node_id(self, method: str) -> str:
        """The PTE adapter's node id for this instruction (and the key ETDump events carry)."""
        return f"{method}_{self.chain}_{self.index}"

    @property
    def label(self) -> str:
        """aten::add for kernels (the adapter's node label), the backend id for delegates."""
        if self.op:
            return self.op.split(".", 1)[0]
        return self.backend or self.kind


@dataclass(frozen=True)
class ProgramPlan:
    pte: Path
    method: str
    instructions: list[PlanInstruction]

    def by_key(self) -> dict[tuple[int, int], PlanInstruction]:
        return {(i.chain, i.index): i for i in self.instructions}

    def delegates(self) -> Iterator[PlanInstruction]:
        return (i for i in self.instructions if i.kind == "DelegateCall")


def program_bytes(pte: Path) -> tuple[bytes, int]:
    """The Program flatbuffer (without the segments that follow it) and the segment base offset."""
    try:
        with open(pte, "rb") as handle:
            head = handle.read(64)
            if len(head) < 8 or head[4:8] != PROGRAM_IDENTIFIER:
                raise AnalysisError(f"{pte}: not an ExecuTorch program (identifier {head[4:8]!r})")
            program_size, segment_base = -1, 0  # no extended header: the whole file is the program
            if head[8:12] == b"eh00" and len(head) >= 32:
                program_size, segment_base = struct.unpack_from("<QQ", head, 16)
            handle.seek(0)
            data = handle.read(program_size)
    except OSError as exc:
        raise AnalysisError(f"cannot read program {pte}: {exc.strerror or exc}") from None
    if program_size >= 0 and len(data) < program_size:
        raise AnalysisError(f"{pte}: truncated program ({len(data)} bytes, its header says {program_size})")
    return data, segment_base


def read_program_plan(pte: Path, method: str = "forward") -> ProgramPlan:
    """Every instruction of `method`'s execution plan, with operator names and delegate payload locations."""
    from pte_adapter_model_explorer.executorch_flatbuffer import program_generated as pg

    pte = Path(pte)
    data, segment_base = program_bytes(pte)
    try:
        program = pg.Program.GetRootAs(data, 0)
        plans = {
            program.ExecutionPlan(i).Name(): program.ExecutionPlan(i) for i in range(program.ExecutionPlanLength())
        }
    except Exception as exc:  # the generated reader raises struct/index errors on garbage
        raise AnalysisError(f"{pte}: unreadable program flatbuffer ({exc})") from None
    plan_names = {(k.decode() if isinstance(k, bytes) else str(k)): v for k, v in plans.items()}
    if method not in plan_names:
        raise AnalysisError(f"{pte}: no method {method!r} (methods: {', '.join(sorted(plan_names)) or 'none'})")
    plan = plan_names[method]
    kinds = {value: name for name, value in vars(pg.InstructionArguments).items() if not name.startswith("_")}

    def text(value: bytes | str | None) -> str | None:
        return value.decode() if isinstance(value, bytes) else value

    instructions: list[PlanInstruction] = []
    try:  # a flatbuffer whose root reads may still hold garbage in its chains: named, never a traceback
        for chain_index in range(plan.ChainsLength()):
            chain = plan.Chains(chain_index)
            for index in range(chain.InstructionsLength()):
                instruction = chain.Instructions(index)
                kind = kinds.get(instruction.InstrArgsType(), f"type{instruction.InstrArgsType()}")
                table = instruction.InstrArgs()
                op = backend = None
                delegate = None
                args: tuple[int, ...] = ()
                if kind == "KernelCall" and table is not None:
                    call = pg.KernelCall()
                    call.Init(table.Bytes, table.Pos)
                    operator = plan.Operators(call.OpIndex())
                    name, overload = text(operator.Name()) or "?", text(operator.Overload())
                    op = f"{name}.{overload}" if overload else name
                    args = tuple(int(call.Args(j)) for j in range(call.ArgsLength()))
                elif kind == "DelegateCall" and table is not None:
                    call = pg.DelegateCall()
                    call.Init(table.Bytes, table.Pos)
                    entry = plan.Delegates(call.DelegateIndex())
                    backend = text(entry.Id())
                    delegate = _delegate_data(pg, program, entry.Processed(), segment_base, pte)
                instructions.append(PlanInstruction(chain_index, index, kind, op, backend, delegate, args))
    except AnalysisError:
        raise
    except Exception as exc:
        raise AnalysisError(f"{pte}: unreadable program flatbuffer ({exc})") from None
    return ProgramPlan(pte=pte, method=method, instructions=instructions)


def _delegate_data(pg, program, reference, segment_base: int, pte: Path) -> DelegateData | None:
    if reference is None:
        return None
    if reference.Location() == pg.DataLocation.INLINE:
        inline = program.BackendDelegateData(reference.Index())
        return DelegateData(inline=inline.DataAsNumpy().tobytes() if inline.DataLength() else b"")
    if reference.Index() >= program.SegmentsLength():
        raise AnalysisError(f"{pte}: a delegate names segment {reference.Index()}, which does not exist")
    segment = program.Segments(reference.Index())
    return DelegateData(file_offset=segment_base + segment.Offset(), size=segment.Size())
