"""Reading the ETDump a run wrote (the program's execution plan its events name: orchestrator/programs/plan.py).

ETDump events carry (chain_index, instruction_id), the same pair that locates an instruction in the .pte's
execution plan, so neither an ETRecord nor Inspector is needed to know which instruction an event timed.

The ETDump is read straight from its flatbuffer (schema: executorch/devtools/etdump/etdump_schema_flatcc.fbs)
with vectorised numpy gathers. ExecuTorch's own reader goes through `flatc` and JSON, which takes seconds on a
50-iteration GPT-2 dump; this one takes a fraction of that and never runs an external tool.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from orchestrator.errors import AnalysisError

ETDUMP_IDENTIFIER = b"ED00"

# Field slots (declaration order) of the ETDump tables used here.
_ETDUMP_VERSION, _ETDUMP_RUN_DATA = 0, 1
_RUN_NAME, _RUN_EVENTS = 0, 3
_EVENT_PROFILE, _EVENT_DEBUG = 0, 2
_PROFILE_NAME, _PROFILE_CHAIN, _PROFILE_INSTRUCTION = 0, 1, 2
_PROFILE_DELEGATE_STR, _PROFILE_START, _PROFILE_END = 4, 6, 7


@dataclass(frozen=True)
class RunBlock:
    """One ETDump run-data block ("Default" for load/init, "Execute" for each execution), profile events only."""

    name: str
    event_names: list[str]
    delegate_names: list[str | None]  # XNNPACK's per-operator events carry their name here
    chain: np.ndarray  # int64, -1 for method-level events
    instruction: np.ndarray  # int64
    start: np.ndarray  # int64 ticks
    end: np.ndarray  # int64 ticks
    debug_events: int = 0

    @property
    def durations(self) -> np.ndarray:
        return self.end - self.start

    def __len__(self) -> int:
        return len(self.event_names)


@dataclass(frozen=True)
class Etdump:
    version: int
    blocks: list[RunBlock]

    @property
    def execute_blocks(self) -> list[RunBlock]:
        return [block for block in self.blocks if block.name == "Execute"]

    def method_event_ticks(self, name: str) -> list[int]:
        """Durations of a method-level event such as "Method::init" or "Program::load_method", in block order."""
        found = []
        for block in self.blocks:
            for index, event_name in enumerate(block.event_names):
                if event_name == name and block.chain[index] == -1:
                    found.append(int(block.end[index] - block.start[index]))
        return found


class _Flatbuffer:
    """Little-endian flatbuffer field access, vectorised over many tables at once.

    Reads work at any alignment: a size-prefixed buffer written by one tool may be shifted relative to another's.
    """

    def __init__(self, data: bytes, where: str) -> None:
        self.data = data
        self.where = where
        self._views: dict[str, list[np.ndarray]] = {}

    def fail(self, what: str) -> AnalysisError:
        return AnalysisError(f"{self.where}: {what} (the file is corrupt or truncated)")

    def _read(self, positions: np.ndarray, dtype: str) -> np.ndarray:
        """Values of `dtype` ("<u2", "<i4", "<u4", "<i8") at byte `positions`, bounds-checked."""
        width = np.dtype(dtype).itemsize
        positions = np.asarray(positions, dtype=np.int64)
        if positions.size and (positions.min() < 0 or positions.max() + width > len(self.data)):
            raise self.fail("an offset points outside the file")
        views = self._views.get(dtype)
        if views is None:
            views = self._views[dtype] = [
                np.frombuffer(self.data, dtype=dtype, count=max(0, (len(self.data) - shift) // width), offset=shift)
                for shift in range(min(width, len(self.data)))
            ]
        shifts = positions % width
        if positions.size and not shifts.any():
            return views[0][positions // width].astype(np.int64)
        values = np.empty(positions.size, dtype=np.int64)
        for shift in np.flatnonzero(np.bincount(shifts, minlength=width)):  # np.unique would import numpy.ma
            mask = shifts == shift
            values[mask] = views[shift][(positions[mask] - shift) // width]
        return values

    def field_offsets(self, tables: np.ndarray, slot: int) -> np.ndarray:
        """Offset of field `slot` inside each table (0 when absent), via each table's vtable."""
        vtables = tables - self._read(tables, "<i4")
        vtable_sizes = self._read(vtables, "<u2")
        entries = vtables + 4 + 2 * slot
        present = entries + 2 <= vtables + vtable_sizes
        offsets = np.zeros(len(tables), dtype=np.int64)
        if present.any():
            offsets[present] = self._read(entries[present], "<u2")
        return offsets

    def deref(self, tables: np.ndarray, offsets: np.ndarray) -> np.ndarray:
        """Follow the uoffset stored in a field (tables, vectors, strings); -1 where the field is absent."""
        result = np.full(len(tables), -1, dtype=np.int64)
        present = offsets != 0
        where = tables[present] + offsets[present]
        result[present] = where + self._read(where, "<u4")
        return result

    def scalar(self, tables: np.ndarray, slot: int, dtype: str, default: int) -> np.ndarray:
        offsets = self.field_offsets(tables, slot)
        values = np.full(len(tables), default, dtype=np.int64)
        present = offsets != 0
        values[present] = self._read(tables[present] + offsets[present], dtype)
        return values

    def vector_of_tables(self, vector: int) -> np.ndarray:
        count = int(self._read(np.array([vector]), "<u4")[0])
        if vector + 4 + 4 * count > len(self.data):
            raise self.fail("a vector runs past the end of the file")
        elements = vector + 4 + 4 * np.arange(count, dtype=np.int64)
        return elements + self._read(elements, "<u4")

    def strings(self, positions: np.ndarray) -> list[str | None]:
        present = positions >= 0
        lengths = np.zeros(len(positions), dtype=np.int64)
        lengths[present] = self._read(positions[present], "<u4")
        if present.any() and int((positions[present] + 4 + lengths[present]).max()) > len(self.data):
            raise self.fail("a string runs past the end of the file")
        found: list[str | None] = []
        cache: dict[bytes, str] = {}
        data = self.data
        for pos, length in zip(positions.tolist(), lengths.tolist(), strict=True):
            if pos < 0:
                found.append(None)
                continue
            raw = data[pos + 4 : pos + 4 + length]
            text = cache.get(raw)
            if text is None:
                text = cache[raw] = raw.decode("utf-8", errors="replace")
            found.append(text)
        return found


def parse_etdump(data: bytes, where: str = "ETDump") -> Etdump:
    """Parse an ETDump flatbuffer (size-prefixed as the runtime writes it, or plain). Raises AnalysisError."""
    if len(data) >= 12 and data[8:12] == ETDUMP_IDENTIFIER:
        (declared,) = struct.unpack_from("<I", data, 0)
        if declared + 4 > len(data):
            raise AnalysisError(
                f"{where}: truncated: its size prefix says {declared + 4} bytes, the file has {len(data)}"
            )
        root_at = 4
    elif len(data) >= 8 and data[4:8] == ETDUMP_IDENTIFIER:
        root_at = 0
    else:
        raise AnalysisError(f"{where}: not an ETDump (no {ETDUMP_IDENTIFIER.decode()} identifier; {len(data)} bytes)")
    buffer = _Flatbuffer(data, where)
    try:
        root = np.array([root_at + struct.unpack_from("<I", data, root_at)[0]], dtype=np.int64)
        version = int(buffer.scalar(root, _ETDUMP_VERSION, "<u4", 0)[0])
        run_vector = int(buffer.deref(root, buffer.field_offsets(root, _ETDUMP_RUN_DATA))[0])
        runs = buffer.vector_of_tables(run_vector) if run_vector >= 0 else np.zeros(0, dtype=np.int64)
        run_names = buffer.strings(buffer.deref(runs, buffer.field_offsets(runs, _RUN_NAME)))
        event_vectors = buffer.deref(runs, buffer.field_offsets(runs, _RUN_EVENTS))
        # Each event takes a 4-byte entry of its block's own vector: more than that means blocks share vectors,
        # and a file of kilobytes could describe billions of events.
        if int(buffer._read(event_vectors[event_vectors >= 0], "<u4").sum()) * 4 > len(data):
            raise buffer.fail("its run blocks list more events than the file can hold")
        blocks = [
            _parse_block(buffer, name or "", int(vector)) for name, vector in zip(run_names, event_vectors, strict=True)
        ]
    except (IndexError, ValueError, OverflowError, struct.error) as exc:
        raise buffer.fail(f"unreadable structure ({exc})") from None
    return Etdump(version=version, blocks=blocks)


def _parse_block(buffer: _Flatbuffer, name: str, vector: int) -> RunBlock:
    empty = np.zeros(0, dtype=np.int64)
    if vector < 0:
        return RunBlock(name, [], [], empty, empty, empty, empty)
    events = buffer.vector_of_tables(vector)
    profile = buffer.deref(events, buffer.field_offsets(events, _EVENT_PROFILE))
    debug_count = int(np.count_nonzero(buffer.field_offsets(events, _EVENT_DEBUG)))
    profile = profile[profile >= 0]
    names = buffer.strings(buffer.deref(profile, buffer.field_offsets(profile, _PROFILE_NAME)))
    delegate = buffer.strings(buffer.deref(profile, buffer.field_offsets(profile, _PROFILE_DELEGATE_STR)))
    return RunBlock(
        name=name,
        event_names=[n or "" for n in names],
        delegate_names=delegate,
        chain=buffer.scalar(profile, _PROFILE_CHAIN, "<i4", 0),
        instruction=buffer.scalar(profile, _PROFILE_INSTRUCTION, "<i4", -1),
        start=buffer.scalar(profile, _PROFILE_START, "<i8", 0),
        end=buffer.scalar(profile, _PROFILE_END, "<i8", 0),
        debug_events=debug_count,
    )


def read_etdump(path: Path) -> Etdump:
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise AnalysisError(f"cannot read ETDump {path}: {exc.strerror or exc}") from None
    return parse_etdump(data, where=f"ETDump {path}")
