"""What a program keeps outside its XNNPACK delegates: the kernels it calls, and constants it stores twice.

Kernels are the plan's KernelCall instructions, by operator: each runs a portable (or optimized) kernel at run
time. Memory planning (`memory.alloc`), tuple access (`getitem`) and views (`memory.view`) are nodes of the
lowered graph that emit no instruction, so they are not here (lowering/delegation.py counts them apart).

A constant is stored twice when the same bytes sit in the program's constant segment (used by a kernel outside the
delegates, e.g. an embedding gather) and in an XNNPACK delegate's constant data (e.g. the tied LM head): a tied
embedding lowered into a delegate costs its size again in the .pte and in memory. Compared by content (sha256), so
two tensors that merely hold the same values (a LayerNorm's ones at random initialisation) count too: the bytes are
stored twice all the same. Read without torch or ExecuTorch.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from orchestrator.errors import AnalysisError
from orchestrator.programs.memory import ELEMENT_BYTES
from orchestrator.programs.outside_record import OutsideDelegates, StoredTensor, StoredTwice
from orchestrator.programs.plan import DelegateData, program_bytes, read_program_plan
from orchestrator.programs.xnn import XNNPACK_BACKEND, xnn_graph_buffer

_NO_OFFSET = 2**64 - 1  # ConstantDataOffset.offset when the constant lives in the program's named data


def read_outside_delegates(pte: Path, method: str = "forward") -> OutsideDelegates:
    """The kernel calls of `method` by operator and the constants stored both outside and inside its delegates (no
    bookkeeping: the .pte holds none of those nodes)."""
    pte = Path(pte)
    plan = read_program_plan(pte, method)
    kernels = Counter(instruction.op or "?" for instruction in plan.instructions if instruction.kind == "KernelCall")
    payloads = [i.delegate for i in plan.delegates() if i.backend == XNNPACK_BACKEND and i.delegate is not None]
    outside = _outside_constants(pte, method)
    sizes = {nbytes for _, nbytes, _ in outside}
    inside = _inside_constant_hashes(pte, payloads, sizes) if outside else set()
    twice = sorted(
        (StoredTensor(tuple(shape), nbytes) for shape, nbytes, digest in outside if digest() in inside),
        key=lambda item: -item.bytes,
    )
    return OutsideDelegates(
        kernel_calls=sum(kernels.values()),
        kernels=dict(kernels.most_common()),
        bookkeeping={},
        stored_twice=StoredTwice(sum(item.bytes for item in twice), tuple(twice)),
    )


Constant = tuple[tuple[int, ...], int, Callable[[], str]]  # shape, bytes, a function giving the sha256 of its data


def _outside_constants(pte: Path, method: str) -> list[Constant]:
    """Every constant tensor the plan's values use, each stored buffer once."""
    return list(_constants(pte, method)[0].values())


def _constants(pte: Path, method: str) -> tuple[dict[int, Constant], dict[int, int]]:
    """The constant tensors the plan's values use by their data buffer (those of 0 bytes left out), and each
    constant value's buffer."""
    from pte_adapter_model_explorer.executorch_flatbuffer import program_generated as pg

    data, segment_base = program_bytes(pte)
    found: dict[int, Constant] = {}
    buffers: dict[int, int] = {}
    try:
        program = pg.Program.GetRootAs(data, 0)
        plan = next(
            (
                program.ExecutionPlan(i)
                for i in range(program.ExecutionPlanLength())
                if _text(program.ExecutionPlan(i).Name()) == method
            ),
            None,
        )
        if plan is None:
            raise AnalysisError(f"{pte}: no method {method!r}")
        segment = program.ConstantSegment()
        segment_start = None
        if segment is not None and segment.OffsetsLength() and segment.SegmentIndex() < program.SegmentsLength():
            segment_start = segment_base + int(program.Segments(segment.SegmentIndex()).Offset())
        for index in range(plan.ValuesLength()):
            value = plan.Values(index)
            if value.ValType() != pg.KernelTypes.Tensor:
                continue
            tensor = pg.Tensor()
            tensor.Init(value.Val().Bytes, value.Val().Pos)
            buffer = int(tensor.DataBufferIdx())
            if tensor.AllocationInfo() is not None or buffer == 0:
                continue  # planned activations and inputs
            buffers[index] = buffer
            if buffer in found:
                continue
            shape = tuple(int(tensor.Sizes(d)) for d in range(tensor.SizesLength()))
            nbytes = ELEMENT_BYTES.get(int(tensor.ScalarType()), 1)
            for size in shape:
                nbytes *= max(0, size)
            if program.ConstantBufferLength() > buffer:  # older programs: constants inline in the flatbuffer
                inline = program.ConstantBuffer(buffer).StorageAsNumpy().tobytes()[:nbytes]
                found[buffer] = (shape, nbytes, _digest_of(inline))
            elif segment_start is not None and buffer < segment.OffsetsLength():
                start = segment_start + int(segment.Offsets(buffer))
                found[buffer] = (shape, nbytes, _file_digest(pte, start, nbytes))
    except AnalysisError:
        raise
    except Exception as exc:  # the generated reader raises struct/index errors on garbage
        raise AnalysisError(f"{pte}: unreadable program flatbuffer ({exc})") from None
    return {buffer: item for buffer, item in found.items() if item[1] > 0}, buffers


GATHERS = frozenset({
    "aten::embedding.out", "quantized_decomposed::embedding_byte.out", "quantized_decomposed::embedding_byte.dtype_out",
    "quantized_decomposed::embedding_4bit.out", "quantized_decomposed::embedding_4bit.dtype_out",
    "quantized_decomposed::embedding_2bit.out",
})  # fmt: skip


@dataclass(frozen=True)
class GatheredTable:
    """A constant an embedding gather outside the delegates reads a row of per token (its table and the table's
    per-row scales): stored whole, read one row a token."""

    shape: tuple[int, ...]
    bytes: int

    @property
    def row_bytes(self) -> int:
        return self.bytes // max(self.shape[0], 1) if self.shape else self.bytes


def gathered_tables(pte: Path, method: str = "forward") -> list[GatheredTable]:
    """The constants only embedding gathers read (their table and the scales beside it), each once: a token reads
    one row of each. A constant another kernel reads too is not one."""
    plan = read_program_plan(pte, method)
    constants, buffers = _constants(pte, method)
    gathered: set[int] = set()
    others: set[int] = set()
    for instruction in plan.instructions:
        if instruction.kind != "KernelCall":
            continue
        read = {buffers[arg] for arg in instruction.args if arg in buffers}
        (gathered if instruction.op in GATHERS else others).update(read)
    tables = []
    for buffer in sorted(gathered - others):
        if buffer in constants:
            shape, nbytes, _ = constants[buffer]
            tables.append(GatheredTable(shape, nbytes))
    return tables


def _inside_constant_hashes(pte: Path, payloads: list[DelegateData], sizes: set[int]) -> set[str]:
    """sha256 of every XNNPACK constant whose size some outside constant has (nothing else can match)."""
    from pte_adapter_model_explorer.executorch_flatbuffer import program_generated as pg
    from pte_adapter_model_explorer.executorch_flatbuffer import xnnpack_generated as xg

    data, segment_base = program_bytes(pte)
    hashes: set[str] = set()
    try:
        program = pg.Program.GetRootAs(data, 0)
        named = {}
        for i in range(program.NamedDataLength()):
            entry = program.NamedData(i)
            if entry.SegmentIndex() < program.SegmentsLength():
                segment = program.Segments(entry.SegmentIndex())
                named[_text(entry.Key())] = segment_base + int(segment.Offset())
        seen: set[str] = set()
        for payload in payloads:
            graph = xg.XNNGraph.GetRootAs(xnn_graph_buffer(payload, pte), 0)
            head = payload.read(pte, limit=32)
            constants_base = int.from_bytes(head[18:22], "little") if head[4:8] == b"XH00" else 0
            for j in range(graph.ConstantDataLength()):
                entry = graph.ConstantData(j)
                size, key = int(entry.Size()), _text(entry.NamedKey())
                if size not in sizes:
                    continue
                if key:
                    if key in named and key not in seen:
                        seen.add(key)
                        hashes.add(_file_digest(pte, named[key], size)())
                elif int(entry.Offset()) != _NO_OFFSET:
                    blob = payload.read_range(pte, constants_base + int(entry.Offset()), size)
                    hashes.add(_digest_of(blob)())
    except AnalysisError:
        raise
    except Exception as exc:
        raise AnalysisError(f"{pte.name}: unreadable XNNPACK constants ({exc})") from None
    return hashes


def _text(value: bytes | str | None) -> str:
    return value.decode() if isinstance(value, bytes) else (value or "")


def _digest_of(blob: bytes) -> Callable[[], str]:
    return lambda: hashlib.sha256(blob).hexdigest()


def _file_digest(pte: Path, start: int, length: int) -> Callable[[], str]:
    """The sha256 of a byte range of the file, read only when asked (an unmatched size never needs it)."""

    def digest() -> str:
        hasher = hashlib.sha256()
        with open(pte, "rb") as handle:
            handle.seek(start)
            remaining = length
            while remaining > 0:
                chunk = handle.read(min(remaining, 1 << 20))
                if not chunk:
                    raise AnalysisError(f"{pte}: a constant lies past the end of the file")
                hasher.update(chunk)
                remaining -= len(chunk)
        return hasher.hexdigest()

    return digest
