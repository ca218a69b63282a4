"""What stays outside the XNNPACK delegates, read from real lowered tiny models (programs/outside.py): the plan's
kernel calls by operator, apart from the graph's bookkeeping nodes, and the constants stored twice (the tied
embedding of both tiny models: DistilBERT's vocab projector and GPT-2's LM head share the word embeddings)."""

from __future__ import annotations

import dataclasses
import random
from collections import Counter
from pathlib import Path

import pytest

from orchestrator.errors import AnalysisError
from orchestrator.lowering.export.delegation import BOOKKEEPING, bookkeeping_counts
from orchestrator.lowering.export.lower import LoweringResult
from orchestrator.lowering.variants import VARIANTS
from orchestrator.programs.outside import gathered_tables, read_outside_delegates
from orchestrator.programs.outside_record import StoredTensor
from orchestrator.programs.plan import program_bytes, read_program_plan
from tests.plugins.artifacts import TINY_MODELS

TINY_VOCAB, TINY_HIDDEN = 1000, 64  # both tiny configs (lowering/spec.py BUILTIN_SPECS)
FLOAT32 = 4


@pytest.mark.parametrize("name", TINY_MODELS)
@pytest.mark.parametrize("backend", ["portable", "xnnpack"])
def test_kernels_are_the_plans_kernel_calls_and_bookkeeping_the_rest(
    tiny_artifacts: dict[str, LoweringResult], name: str, backend: str
) -> None:
    lowered = tiny_artifacts[name].variants[VARIANTS[backend]]
    plan = read_program_plan(lowered.pte)
    planned = Counter(i.op for i in plan.instructions if i.kind == "KernelCall")
    outside = read_outside_delegates(lowered.pte)
    delegation = lowered.sidecar.delegation

    assert outside.kernels == dict(planned)
    assert outside.kernel_calls == delegation.instructions["KernelCall"] > 0
    bookkeeping = bookkeeping_counts(delegation.fallback_histogram)
    assert bookkeeping["memory_planning"] == delegation.fallback_histogram["memory.alloc"] > 0
    # every non-delegated graph node is either a kernel call in the plan or bookkeeping that emits none
    assert delegation.fallback_ops - sum(bookkeeping.values()) == outside.kernel_calls
    assert not any(op in BOOKKEEPING for op in outside.kernels)
    assert all(kind in {"KernelCall", "DelegateCall"} for kind in Counter(i.kind for i in plan.instructions))


@pytest.mark.parametrize("name", TINY_MODELS)
def test_the_xnnpack_program_stores_the_tied_embedding_twice(
    tiny_artifacts: dict[str, LoweringResult], name: str
) -> None:
    """The embedding gather runs outside the delegate, the tied LM head inside it: both keep the [vocab, hidden]."""
    outside = read_outside_delegates(tiny_artifacts[name].variants[VARIANTS["xnnpack"]].pte)
    embedding = TINY_VOCAB * TINY_HIDDEN * FLOAT32
    assert outside.stored_twice.tensors[0].shape == (TINY_VOCAB, TINY_HIDDEN)
    assert outside.stored_twice.tensors[0].bytes == embedding
    assert outside.stored_twice_bytes == sum(item.bytes for item in outside.stored_twice.tensors) >= embedding


@pytest.mark.parametrize("name", TINY_MODELS)
def test_a_portable_program_has_no_delegate_to_store_a_constant_twice(
    tiny_artifacts: dict[str, LoweringResult], name: str
) -> None:
    outside = read_outside_delegates(tiny_artifacts[name].variants[VARIANTS["portable"]].pte)
    assert outside.stored_twice.tensors == ()
    assert outside.stored_twice_bytes == 0


def test_the_sidecar_records_the_split_and_the_bytes_stored_twice(tiny_artifacts: dict[str, LoweringResult]) -> None:
    lowered = tiny_artifacts["gpt2-tiny"].variants[VARIANTS["xnnpack"]]
    recorded = lowered.sidecar.outside_delegates
    read = read_outside_delegates(lowered.pte)
    assert recorded is not None
    assert recorded.kernels == read.kernels
    assert recorded.kernel_calls == read.kernel_calls
    assert recorded.bookkeeping == bookkeeping_counts(lowered.sidecar.delegation.fallback_histogram)
    assert recorded.stored_twice_bytes == read.stored_twice_bytes > 0
    # One record, read from the .pte and recorded: equal but for what only the lowered graph knows.
    assert recorded == dataclasses.replace(read, bookkeeping=recorded.bookkeeping)
    assert recorded.stored_twice.tensors[0] == StoredTensor((TINY_VOCAB, TINY_HIDDEN), TINY_VOCAB * TINY_HIDDEN * 4)


def test_a_file_that_is_no_program_is_refused(tmp_path: Path) -> None:
    garbage = tmp_path / "model.pte"
    garbage.write_bytes(b"\0" * 64)
    with pytest.raises(AnalysisError, match="not an ExecuTorch program"):
        read_outside_delegates(garbage)


def test_a_program_damaged_inside_its_plan_is_refused_by_name_never_a_traceback(
    tiny_artifacts: dict[str, LoweringResult], tmp_path: Path
) -> None:
    """A .pte whose root still reads but whose chains, operators or values are garbage (a board's disk, a bad
    copy): every reader of its plan says the file is unreadable (AnalysisError, 65) or reads what it can."""
    source = tiny_artifacts["gpt2-tiny"].variants[VARIANTS["xnnpack"]].pte
    whole = source.read_bytes()
    flatbuffer_size = len(program_bytes(source)[0])
    damaged = tmp_path / "damaged.pte"
    draw = random.Random(55)
    refused = 0
    for _ in range(150):
        data = bytearray(whole)
        for offset in draw.sample(range(64, flatbuffer_size), 12):  # past the header and root tables
            data[offset] = draw.randrange(256)
        damaged.write_bytes(bytes(data))
        for read in (read_program_plan, gathered_tables, read_outside_delegates):
            try:
                read(damaged)
            except AnalysisError:
                refused += 1
    assert refused > 0  # the damage reached the plan: some readers refused it, by name
