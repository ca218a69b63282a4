"""Fuzzing the ETDump reader (results/etdump.py): random bytes, mutations of a real ETDump and crafted amplifying
files end in an AnalysisError, never another exception, a hang or exhausted memory.

Settings and mutations: tests/plugins/fuzz.py.
"""

from __future__ import annotations

import re
import struct

import flatbuffers
import pytest
from hypothesis import event, example, given
from hypothesis import strategies as st

from orchestrator.errors import AnalysisError
from orchestrator.lowering.variants import VARIANTS
from orchestrator.results.etdump import Etdump, parse_etdump
from orchestrator.tensorfile import read_tensors
from tests.plugins.fuzz import FUZZ, FUZZ_TIMEOUT, mutate, mutations

pytestmark = FUZZ_TIMEOUT


def crafted_etdump(runs: int, events: int) -> bytes:
    """A size-prefixed ETDump whose `runs` run-data entries all share one run with `events` events, all the same
    event: a small file that describes runs * events events."""
    builder = flatbuffers.Builder(1024)
    name = builder.CreateString("OPERATOR_CALL")
    builder.StartObject(8)  # ProfileEvent
    builder.PrependUOffsetTRelativeSlot(0, name, 0)
    builder.PrependInt32Slot(1, 0, 0)
    builder.PrependInt32Slot(2, 1, -1)
    builder.PrependInt64Slot(6, 10, 0)
    builder.PrependInt64Slot(7, 25, 0)
    profile = builder.EndObject()
    builder.StartObject(3)  # Event
    builder.PrependUOffsetTRelativeSlot(0, profile, 0)
    event = builder.EndObject()
    builder.StartVector(4, events, 4)
    for _ in range(events):
        builder.PrependUOffsetTRelative(event)
    event_vector = builder.EndVector()
    run_name = builder.CreateString("Execute")
    builder.StartObject(4)  # RunData
    builder.PrependUOffsetTRelativeSlot(0, run_name, 0)
    builder.PrependUOffsetTRelativeSlot(3, event_vector, 0)
    run = builder.EndObject()
    builder.StartVector(4, runs, 4)
    for _ in range(runs):
        builder.PrependUOffsetTRelative(run)
    run_vector = builder.EndVector()
    builder.StartObject(2)  # ETDump
    builder.PrependUint32Slot(0, 0, 0)
    builder.PrependUOffsetTRelativeSlot(1, run_vector, 0)
    root = builder.EndObject()
    builder.FinishSizePrefixed(root, file_identifier=b"ED00")
    return bytes(builder.Output())


# 3000 runs sharing one 3000-event run: 9 million events from a 24 KB file (a hang, or memory exhausted, as the
# counts grow); an honest ETDump has at most one 4-byte vector entry per event.
AMPLIFIED_ETDUMP = crafted_etdump(3000, 3000)


@pytest.fixture(scope="module")
def etdump_seed(tiny_artifacts: dict, tmp_path_factory: pytest.TempPathFactory) -> bytes:
    """A real ETDump: the tiny DistilBERT (XNNPACK, so delegate events too) run once by ExecuTorch's runtime."""
    import torch
    from executorch.runtime import Runtime

    result = tiny_artifacts["distilbert-tiny"]
    inputs = [torch.from_numpy(tensor.array) for tensor in read_tensors(result.paths.reference_inputs)]
    folder = tmp_path_factory.mktemp("etdump")
    program = Runtime.get().load_program(result.paths.pte(VARIANTS["xnnpack"]), enable_etdump=True, debug_buffer_size=0)
    program.load_method("forward").execute(inputs)
    program.write_etdump_result_to_file(str(folder / "etdump.etdp"), str(folder / "debug.bin"))
    data = (folder / "etdump.etdp").read_bytes()
    parsed = parse_etdump(data)
    assert [block.name for block in parsed.blocks] == ["Default", "Execute"]
    assert any(name is not None for name in parsed.blocks[1].delegate_names)
    return data


def check_etdump(data: bytes) -> None:
    """parse_etdump gives a consistent Etdump or AnalysisError, nothing else."""
    try:
        etdump = parse_etdump(data)
    except AnalysisError as exc:
        event(f"etdump: refused ({re.sub(r'[0-9]+', 'N', str(exc).split(': ', 1)[1])[:30]})")
        return
    event("etdump: parsed")
    assert isinstance(etdump, Etdump)
    # every event has its own 4-byte entry in a vector: a file cannot describe more events than that
    assert sum(len(block) for block in etdump.blocks) * 4 <= len(data)
    for block in etdump.blocks:
        columns = (block.chain, block.instruction, block.start, block.end)
        assert all(len(column) == len(block) for column in columns)
        assert len(block.delegate_names) == len(block)
        assert block.debug_events >= 0
        block.durations  # noqa: B018 - computing it must not fail either


@FUZZ
@given(data=st.binary(max_size=512))
@example(data=AMPLIFIED_ETDUMP)
def test_etdump_from_random_bytes(data: bytes) -> None:
    check_etdump(data)
    check_etdump(struct.pack("<I", len(data) + 4) + b"\0\0\0\0ED00" + data)  # past the identifier check
    check_etdump(b"\x08\0\0\0ED00" + data)


@FUZZ
@given(operations=mutations, form=st.sampled_from(["prefixed", "plain", "prefix fixed"]))
def test_etdump_mutated(etdump_seed: bytes, operations: list[tuple], form: str) -> None:
    data = mutate(etdump_seed[4:] if form == "plain" else etdump_seed, operations)
    if form == "prefix fixed" and len(data) >= 4:  # past the size check, into the structure
        data = struct.pack("<I", len(data) - 4) + data[4:]
    check_etdump(data)


def test_the_etdump_regressions_give_clear_errors() -> None:
    honest = parse_etdump(crafted_etdump(2, 3))  # the crafting is sound: small counts parse
    assert [len(block) for block in honest.blocks] == [3, 3]
    with pytest.raises(AnalysisError, match="more events than"):
        parse_etdump(AMPLIFIED_ETDUMP)
