"""A language model's prefill against the board's limits (results/roofline.py `prefill_roofline`), and the work of a
generation program's nodes at the rows an execution takes (results/op_roofline.py `SequenceRows`): counted on the
real lowered smollm2-gen-tiny (hidden 64, 2 layers, 4 query heads on 2 KV heads of 16, MLP 128, vocabulary 1000, no
biases, the head on the last row only) against figures worked out here from its config; a decode step's weights
with the embedding table a gather reads one row of; compute- against
memory-bound on limits far apart; a prompt longer than one call; no limits said. No timing is asserted. End to end
on the local board: tests/e2e/test_generation_e2e.py."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from orchestrator.boards.limits import ComputePeak, ReadBandwidth, compute_state_value, state_value
from orchestrator.commands.render_generation import prefill_text
from orchestrator.lowering.artifacts import load_artifact
from orchestrator.lowering.builtins import BUILTIN_SPECS
from orchestrator.lowering.export import lower as lowering
from orchestrator.lowering.sidecar import Sidecar
from orchestrator.lowering.variants import VARIANTS
from orchestrator.programs.outside import gathered_tables
from orchestrator.programs.plan import read_program_plan
from orchestrator.programs.xnn import read_xnn_graph
from orchestrator.results.op_roofline import FULLY_CONNECTED, SequenceRows, node_work
from orchestrator.results.roofline import prefill_roofline, prefill_work, prompt_calls, weights_bytes
from orchestrator.results.summary import Generation
from tests.plugins.artifacts import ARTIFACT_CACHE

MODEL = "smollm2-gen-tiny"
HIDDEN, KV, MLP, VOCAB, LAYERS, BOUND = 64, 32, 128, 1000, 2, 63  # KV: 2 heads of 16; BOUND: max_prompt_len
# Every Linear of a layer as (out, in): q, k, v, o, gate, up, down
LAYER_LINEARS = [(HIDDEN, HIDDEN), (KV, HIDDEN), (KV, HIDDEN), (HIDDEN, HIDDEN), (MLP, HIDDEN), (MLP, HIDDEN),
                 (HIDDEN, MLP)]  # fmt: skip


def ops_at(rows: int) -> int:
    """A prefill call of `rows` tokens: every layer's linears over the rows, the head over the last one."""
    return LAYERS * sum(2 * n * k * rows for n, k in LAYER_LINEARS) + 2 * VOCAB * HIDDEN


@pytest.fixture(scope="module")
def programs() -> dict[str, tuple[Path, Sidecar]]:
    """smollm2-gen-tiny's fp32 and 8da4w XNNPACK programs, lowered once into the shared test cache."""
    wanted = [VARIANTS["xnnpack"], VARIANTS["xnnpack-8da4w"]]
    lowering.lower(BUILTIN_SPECS[MODEL], variants=wanted, weights="random", root=ARTIFACT_CACHE)
    found = {}
    for variant in wanted:
        artifact = load_artifact(MODEL, variant, root=ARTIFACT_CACHE)
        found[variant.name] = (artifact.pte, artifact.sidecar)
    return found


def limits(bandwidth: float | None, fp32: float | None, int8: float | None) -> dict[str, Any]:
    """board_info_before.json with the limits given (bytes/s, flop/s, op/s; None: not measured)."""
    state: dict[str, Any] = {}
    if bandwidth is not None:
        state["limits"] = state_value(ReadBandwidth(
            bytes_per_s=bandwidth, median_bytes_per_s=bandwidth, threads=2, buffer_bytes=1 << 30, llc_bytes=1 << 20,
            runner_source_sha256="c" * 64, measured_at="2026-12-06T15:00:00+00:00"))  # fmt: skip
    if fp32 is not None:
        state["compute"] = compute_state_value(ComputePeak(
            fp32_flops_per_s=fp32, int8_ops_per_s=int8, threads=2, gemm=(128, 1024, 1024),
            runner_source_sha256="c" * 64, measured_at="2026-12-06T15:00:00+00:00"))  # fmt: skip
    return {"schema": 1, "state": state}


def generation(prompt_len: int = 8, ttft_ms: float = 2.0) -> Generation:
    return Generation(prompt_len=prompt_len, new_tokens=8, context=64, generations=3, ttft_ms=ttft_ms,
                      prefill_tokens_per_s=prompt_len / ttft_ms * 1e3 if ttft_ms else None,
                      decode_tokens_per_s=1000.0)  # fmt: skip


def test_a_linear_without_bias_is_counted_at_the_rows_an_execution_takes(
    programs: dict[str, tuple[Path, Sidecar]],
) -> None:
    pte, sidecar = programs["xnnpack"]
    assert sidecar.generation is not None and sidecar.generation.max_prompt_len == BOUND
    found = []
    for instruction in read_program_plan(pte).delegates():
        assert instruction.delegate is not None
        graph = read_xnn_graph(instruction.delegate, pte)
        for node in graph.nodes:
            if node.type == FULLY_CONNECTED:  # none has a bias: its unset id is no value the node reads
                found.append(tuple(node_work(node, graph.values, SequenceRows(BOUND, rows)) for rows in (1, 8)))
    assert len(found) == LAYERS * len(LAYER_LINEARS) + 1 and all(None not in works for works in found)
    # As serialized (at the bound) every layer's linear does 63 rows; a decode step does one, a prompt of 8 eight
    per_row = sorted(2 * n * k for n, k in LAYER_LINEARS * LAYERS)
    decode = sorted(one.ops for one, _ in found if one is not None)
    assert decode == sorted([*per_row, 2 * VOCAB * HIDDEN])
    prefill = sorted(eight.ops for _, eight in found if eight is not None)
    assert prefill == sorted([*(8 * ops for ops in per_row), 2 * VOCAB * HIDDEN])  # the head: the last row only
    # the weights are read whole at any rows; the activations scale with them
    for one, eight in found:
        assert one is not None and eight is not None
        assert one.weight_bytes == eight.weight_bytes and eight.bytes >= one.bytes


def test_a_prompt_longer_than_a_call_is_prefilled_in_chunks(programs: dict[str, tuple[Path, Sidecar]]) -> None:
    assert prompt_calls(8, BOUND) == [8] and prompt_calls(63, BOUND) == [63] and prompt_calls(100, BOUND) == [63, 37]
    assert prompt_calls(0, BOUND) == []
    pte, _ = programs["xnnpack"]
    assert sum(work.ops for work in prefill_work(pte, "forward", 8, BOUND)) == ops_at(8)
    assert sum(work.ops for work in prefill_work(pte, "forward", 100, BOUND)) == ops_at(63) + ops_at(37)


def test_compute_or_memory_bound_by_the_board_s_limits(programs: dict[str, tuple[Path, Sidecar]]) -> None:
    pte, sidecar = programs["xnnpack"]
    work = prefill_work(pte, "forward", 8, BOUND)
    moved = sum(w.bytes for w in work)
    # a slow peak and a fast memory: compute-bound; the least time is the ops at 1 GFLOP/s
    slow_peak = prefill_roofline(generation(), sidecar, pte, limits(1e12, 1e9, 1e9), "board", 2)
    assert slow_peak is not None and slow_peak.bound == "compute" and slow_peak.note is None
    assert (slow_peak.ops, slow_peak.int8_ops, slow_peak.calls) == (ops_at(8), 0, 1)
    assert slow_peak.compute_ms == pytest.approx(ops_at(8) / 1e9 * 1e3)
    assert slow_peak.share == pytest.approx(slow_peak.compute_ms / 2.0)  # type: ignore[operator]
    assert slow_peak.achieved_gops == pytest.approx(ops_at(8) / 2e-3 / 1e9)
    # a fast peak and a slow memory: memory-bound, the bytes at 1 MB/s
    slow_memory = prefill_roofline(generation(), sidecar, pte, limits(1e6, 1e15, 1e15), "board", 2)
    assert slow_memory is not None and slow_memory.bound == "memory"
    assert slow_memory.memory_ms == pytest.approx(moved / 1e6 * 1e3)
    assert slow_memory.share == pytest.approx(slow_memory.memory_ms / 2.0)  # type: ignore[operator]
    line = prefill_text(slow_memory, 2.0)
    assert f"{slow_memory.share:.0%} of bandwidth" in line and "1 call" in line, line


def test_four_bit_weights_take_the_int8_peak(programs: dict[str, tuple[Path, Sidecar]]) -> None:
    pte, sidecar = programs["xnnpack-8da4w"]
    found = prefill_roofline(generation(), sidecar, pte, limits(1e12, 1e9, 4e9), "board", 2)
    assert found is not None and found.bound == "compute"
    assert found.ops == ops_at(8)  # the same products as fp32, on int8 kernels
    assert 0 < found.int8_ops <= found.ops
    fp32_ops = found.ops - found.int8_ops
    assert found.compute_ms == pytest.approx((fp32_ops / 1e9 + found.int8_ops / 4e9) * 1e3)


def test_without_the_peak_the_work_is_kept_and_what_is_missing_said(
    programs: dict[str, tuple[Path, Sidecar]],
) -> None:
    pte, sidecar = programs["xnnpack"]
    for board in (limits(None, None, None), limits(10e9, None, None), None):
        found = prefill_roofline(generation(), sidecar, pte, board, "board", 2)
        assert found is not None and found.ops == ops_at(8)
        assert found.share is None and found.bound is None and found.compute_ms is None
        assert found.note is not None and "fab setup-board" in found.note
        assert "board not measured" in found.share_text
    # no program, no prefill time, no generation record: nothing to put against the roofline
    assert prefill_roofline(generation(), sidecar, None, None, "board", 2) is None
    assert prefill_roofline(generation(ttft_ms=0.0), sidecar, pte, None, "board", 2) is None
    plain = dataclasses.replace(sidecar, generation=None)
    assert prefill_roofline(generation(), plain, pte, None, "board", 2) is None


def test_a_table_only_a_gather_reads_counts_one_row_a_token(programs: dict[str, tuple[Path, Sidecar]]) -> None:
    # fp32: the tied table is held outside for the gather and inside for the head: already counted once (the head
    # reads it whole), never taken off twice
    pte, sidecar = programs["xnnpack"]
    (table,) = gathered_tables(pte)
    assert (table.shape, table.bytes, table.row_bytes) == ((VOCAB, HIDDEN), VOCAB * HIDDEN * 4, HIDDEN * 4)
    assert sidecar.outside_delegates is not None and sidecar.outside_delegates.stored_twice_bytes == table.bytes
    assert weights_bytes(sidecar, [table]) == weights_bytes(sidecar)
    # 8da4w: an 8-bit table and its per-row scales only the gather reads (the head has its own 4-bit copy): a token
    # reads one row of each
    pte, sidecar = programs["xnnpack-8da4w"]
    tables = gathered_tables(pte)
    assert [t.shape[0] for t in tables] == [VOCAB, VOCAB] and VOCAB * HIDDEN in [t.bytes for t in tables]
    assert sidecar.outside_delegates is not None and sidecar.outside_delegates.stored_twice_bytes == 0
    rows_only = sum(t.bytes - t.bytes // VOCAB for t in tables)
    assert weights_bytes(sidecar, tables) == weights_bytes(sidecar) - rows_only
