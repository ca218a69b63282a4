"""Every Fully Connected, convolution and batch matmul against the board's two limits (results/op_roofline.py): the
operations and bytes of real lowered nodes against figures worked out here from the models' shapes (distilbert-tiny:
sequence 128, dim 64, FFN 128, 2 heads, vocabulary 1000; mobilenet-v2-tiny: a 3x32x32 image, width 0.25), fp32 and
quantized (int8 and 4-bit weights); memory- against compute-bound on limits far apart; both limits, one, none and a
malformed record; and a real analysis: ops.json's rows, summary.json's top few, the `roofline_pct` overlay on the
delegate graphs the PTE adapter draws. No timing is asserted. The dashboard's column:
tests/servers/test_dashboard_roofline.py; the advisor's findings: tests/advice/test_roofline_advice.py."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from orchestrator.boards.limits import ComputePeak, ReadBandwidth, compute_state_value, state_value
from orchestrator.commands.render import render_top_ops
from orchestrator.lowering.artifacts import load_artifact
from orchestrator.lowering.quantize.schemes import SCHEMES
from orchestrator.lowering.variants import VARIANTS
from orchestrator.programs.plan import read_program_plan
from orchestrator.programs.xnn import read_xnn_graph
from orchestrator.records import RecordError
from orchestrator.results.op_roofline import (
    ROOFLINE_TYPES,
    SUMMARY_ROWS,
    BoardLimits,
    NodeWork,
    board_limits,
    bundle_limits,
    node_roofline,
    node_work,
)
from orchestrator.results.ops_record import load_ops
from orchestrator.results.overlays import ROOFLINE_PCT, overlay_path
from tests.plugins.analysis import BundleCopy, adapter_graphs, analyze, edit_json
from tests.plugins.artifacts import ARTIFACT_CACHE, lower_tiny
from tests.plugins.quantized import lower_quantized

SEQ, DIM, FFN, HEADS, VOCAB, LAYERS = 128, 64, 128, 2, 1000, 2  # distilbert-tiny (lowering/builtins.py)
F32 = 4


def bandwidth(bytes_per_s: float, threads: int = 2, llc_bytes: int = 1 << 20) -> ReadBandwidth:
    return ReadBandwidth(bytes_per_s=bytes_per_s, median_bytes_per_s=bytes_per_s, threads=threads,
                         buffer_bytes=1 << 30, llc_bytes=llc_bytes, runner_source_sha256="c" * 64,
                         measured_at="2026-12-06T15:00:00+00:00")  # fmt: skip


def peak(fp32: float, int8: float | None, threads: int = 2) -> ComputePeak:
    return ComputePeak(fp32_flops_per_s=fp32, int8_ops_per_s=int8, threads=threads, gemm=(64, 512, 512),
                       runner_source_sha256="c" * 64, measured_at="2026-12-06T15:00:00+00:00")  # fmt: skip


def state(read: ReadBandwidth | None = None, compute: ComputePeak | None = None) -> dict[str, Any]:
    found = {
        "limits": state_value(read) if read else None,
        "compute": compute_state_value(compute) if compute else None,
    }
    return {key: value for key, value in found.items() if value is not None}


def fp32_program(name: str) -> Path:
    """The model's fp32 XNNPACK program, lowered once into the shared test cache (tests/plugins/artifacts.py)."""
    return lower_tiny(name).paths.pte(VARIANTS["xnnpack"])


def works(pte: Path, node_type: str) -> list[NodeWork]:
    """node_work of every node of `node_type` in the program's XNNPACK delegates, in program order."""
    found = []
    for instruction in read_program_plan(pte).delegates():
        assert instruction.delegate is not None
        graph = read_xnn_graph(instruction.delegate, pte)
        found += [node_work(node, graph.values) for node in graph.nodes if node.type == node_type]
    assert all(work is not None for work in found)
    return [work for work in found if work is not None]


def fc(k: int, n: int, weight_bytes: float) -> tuple[int, int]:
    """(ops, bytes) of a Linear(k, n) on the SEQ rows: input and output fp32, the weights as given, an fp32 bias."""
    return 2 * SEQ * k * n, int(F32 * SEQ * k + weight_bytes + F32 * n + F32 * SEQ * n)


def distilbert_fcs(weight_bytes: Any) -> Counter[tuple[int, int]]:
    """Every Linear of distilbert-tiny: q, k, v, out, lin1, lin2 per layer; vocab_transform and the projector."""
    shapes = [(DIM, DIM)] * 4 * LAYERS + [(DIM, FFN), (FFN, DIM)] * LAYERS + [(DIM, DIM), (DIM, VOCAB)]
    return Counter(fc(k, n, weight_bytes(k, n)) for k, n in shapes)


def test_fully_connected_and_batch_matmul_work_of_fp32_distilbert() -> None:
    pte = fp32_program("distilbert-tiny")
    found = Counter((w.ops, w.bytes) for w in works(pte, "XNNFullyConnected"))
    assert found == distilbert_fcs(lambda k, n: F32 * k * n)
    assert {w.kernel for w in works(pte, "XNNFullyConnected")} == {"fp32"}
    head = DIM // HEADS  # scores: [2, 128, 32] x [2, 32, 128]; context: [2, 128, 128] x [2, 128, 32]
    scores = (2 * HEADS * SEQ * SEQ * head, F32 * (2 * HEADS * SEQ * head + HEADS * SEQ * SEQ))
    context = (2 * HEADS * SEQ * head * SEQ, F32 * (HEADS * SEQ * SEQ + 2 * HEADS * SEQ * head))
    found = Counter((w.ops, w.bytes) for w in works(pte, "XNNBatchMatrixMultiply"))
    assert found == Counter([scores, context] * LAYERS)


@pytest.mark.parametrize("scheme", ["int8-dynamic", "8da4w"])
@pytest.mark.slow  # lowers the quantized variants once into the shared cache (tests/plugins/quantized.py)
def test_quantized_weights_count_their_width_and_scales_and_take_the_int8_peak(scheme: str) -> None:
    lower_quantized("distilbert-tiny")
    pte = load_artifact("distilbert-tiny", VARIANTS[f"xnnpack-{scheme}"], ARTIFACT_CACHE).pte
    group = SCHEMES[scheme].group_size

    def weights(k: int, n: int) -> float:
        if group is None:  # 8-bit, per output channel: one fp32 scale a row
            return k * n + F32 * n
        return k * n / 2 + 2 * (k * n // group)  # 4-bit, in groups of `group` input features: one bf16 scale each

    # the input is read as fp32 (its dynamic quantization is fused into the operator)
    found = works(pte, "XNNFullyConnected")
    assert Counter((w.ops, w.bytes) for w in found) == distilbert_fcs(weights)
    assert {w.kernel for w in found} == {"int8"}


@pytest.mark.slow  # lowers mobilenet-v2-tiny once into the shared cache
def test_convolution_work_of_mobilenet() -> None:
    pte = fp32_program("mobilenet-v2-tiny")
    first = next(read_program_plan(pte).delegates())
    assert first.delegate is not None
    graph = read_xnn_graph(first.delegate, pte)
    convolutions = [n for n in graph.nodes if n.type in ("XNNConv2d", "XNNDepthwiseConv2d")][:3]
    # features[0]: Conv2d(3, 8, 3, stride 2) on 3x32x32 -> 8x16x16; features[1]: depthwise 3x3 on 8 channels, then
    # a pointwise Conv2d(8, 8, 1); every batch norm folded in as a bias of 8
    out = 16 * 16 * 8
    expected = [
        (2 * out * 3 * 3 * 3, F32 * (3 * 32 * 32 + 8 * 3 * 3 * 3 + 8 + out)),
        (2 * out * 3 * 3, F32 * (out + 8 * 3 * 3 + 8 + out)),
        (2 * out * 8, F32 * (out + 8 * 8 + 8 + out)),
    ]
    assert [n.type for n in convolutions] == ["XNNConv2d", "XNNDepthwiseConv2d", "XNNConv2d"]
    found = [node_work(n, graph.values) for n in convolutions]
    assert [(w.ops, w.bytes) for w in found if w is not None] == expected


def test_memory_or_compute_bound_by_the_ridge_point() -> None:
    work = NodeWork(ops=2_000_000, bytes=100_000, weight_bytes=80_000, kernel="fp32")  # 20 ops per byte
    slow_memory = board_limits(state(bandwidth(1e6), peak(1e14, None)), "state")  # ridge 1e8 ops/byte
    row = node_roofline("g", "0", "XNNFullyConnected", work, 1.0, slow_memory)
    assert row is not None and row.bound == "memory" and row.label.startswith("memory-bound ")
    assert row.achieved_gb_per_s == pytest.approx(0.1) and row.achieved_gops == pytest.approx(2.0)
    assert row.roofline_pct == pytest.approx(row.bandwidth_pct) == pytest.approx(0.1e9 / 1e6 * 100)
    slow_compute = board_limits(state(bandwidth(1e12), peak(1.0, 1.0)), "state")  # ridge 1e-12 ops/byte
    row = node_roofline("g", "0", "XNNFullyConnected", work, 1.0, slow_compute)
    assert row is not None and row.bound == "compute" and row.roofline_pct == pytest.approx(row.peak_pct)
    assert row.said.startswith("compute-bound at ") and row.said.endswith("% of the fp32 peak")
    int8 = NodeWork(ops=2_000_000, bytes=100_000, weight_bytes=80_000, kernel="int8")
    row = node_roofline("g", "0", "XNNFullyConnected", int8, 1.0, board_limits(state(None, peak(1e9, 4e9)), "s"))
    assert row is not None and row.peak_pct == pytest.approx(2e9 / 4e9 * 100), "an int8 node against the int8 peak"
    assert node_roofline("g", "0", "XNNFullyConnected", work, 0.0, slow_memory) is None, "not timed"


def test_no_limit_one_limit_and_a_malformed_record() -> None:
    work = NodeWork(ops=2_000_000, bytes=100_000, weight_bytes=80_000, kernel="int8")
    limits, note = bundle_limits({"state": {}}, "board_info_before.json", 2)
    assert limits == BoardLimits() and note is not None and "read bandwidth and peak arithmetic rate" in note
    row = node_roofline("g", "0", "XNNFullyConnected", work, 1.0, limits)
    assert row is not None and row.ops == work.ops and row.achieved_gb_per_s == pytest.approx(0.1)
    assert (row.bandwidth_pct, row.peak_pct, row.bound, row.roofline_pct, row.label) == (None, None, None, None, "")
    assert limits.text == "bandwidth not measured, fp32 peak not measured, int8 peak not measured"
    # the bandwidth alone (every board until setup-board measures the peak): its share, and no bound
    limits, note = bundle_limits({"state": state(bandwidth(1e9))}, "board_info_before.json", 2)
    assert note is not None and "peak arithmetic rate is not measured" in note
    row = node_roofline("g", "0", "XNNFullyConnected", work, 1.0, limits)
    assert row is not None and row.bound is None and row.roofline_pct is None and row.label == "10% of bandwidth"
    # both, but no int8 peak: an int8 node has no bound, an fp32 one has
    limits, note = bundle_limits({"state": state(bandwidth(1e9), peak(1e10, None, threads=4))}, "b", 2)
    assert note == "the limits were measured at 2, 4 thread(s), the run used 2"
    assert (row := node_roofline("g", "0", "t", work, 1.0, limits)) is not None and row.bound is None
    fp32 = NodeWork(ops=2_000_000, bytes=100_000, weight_bytes=80_000, kernel="fp32")
    assert (row := node_roofline("g", "0", "t", fp32, 1.0, limits)) is not None and row.bound is not None
    # malformed: refused (65) by the reader; said by the analysis, which goes on with the other limit
    sound = state(bandwidth(1e9), peak(1e10, 3e10))
    for key, broken in (("compute", "{"), ("compute", json.dumps({"fp32_flops_per_s": 0})), ("limits", 7)):
        with pytest.raises(RecordError) as refused:
            board_limits({**sound, key: broken}, "board_info_before.json")
        assert refused.value.exit_code == 65 and key in str(refused.value)
        limits, note = bundle_limits({"state": {**sound, key: broken}}, "board_info_before.json", 2)
        assert note is not None and "is refused (board_info_before.json" in note
        kept, lost = (limits.bandwidth_gb_per_s, limits.fp32_gflops)[:: 1 if key == "compute" else -1]
        assert kept is not None and lost is None


def plant_limits(case: Any, board_state: dict[str, Any]) -> None:
    path = case.path / "board_info_before.json"
    edit_json(path, state={**(json.loads(path.read_text()).get("state") or {}), **board_state})


@pytest.mark.slow  # runs a real tiny model (session fixture)
def test_the_analysis_writes_the_rows_the_summary_and_the_overlay_on_real_nodes(
    bundle_copy: BundleCopy, capsys: pytest.CaptureFixture[str]
) -> None:
    case = bundle_copy("distilbert_xnnpack")  # run at 1 thread, as the limits were measured
    plant_limits(case, state(bandwidth(20e9, threads=1), peak(40e9, 120e9, threads=1)))
    summary = analyze(case)
    ops = load_ops(case.path)
    assert ops.roofline is not None and ops.roofline.note is None
    types = {(d.graph_id, n.node): n.type for d in ops.delegates for n in d.nodes}
    rows = ops.roofline.rows
    timed = {key for key, kind in types.items() if kind in ROOFLINE_TYPES}
    assert {(row.graph, row.node) for row in rows} == timed and len(rows) == 14 + 2 * LAYERS
    assert all(row.bound is not None and row.roofline_pct is not None for row in rows)
    assert ops.roofline.memory_bound + ops.roofline.compute_bound == ops.roofline.nodes == len(rows)
    assert [row.median_ms for row in rows] == sorted((row.median_ms for row in rows), reverse=True)
    top = summary.run.operator_roofline
    assert top is not None and top.rows == rows[:SUMMARY_ROWS] and top.nodes == len(rows)
    graphs = adapter_graphs(case.model.pte)
    overlay = json.loads(overlay_path(case.path, ROOFLINE_PCT).read_text())
    assert overlay and all(graph in graphs and set(data["results"]) <= graphs[graph] for graph, data in overlay.items())
    painted = {
        (graph, node): value["value"] for graph, data in overlay.items() for node, value in data["results"].items()
    }
    assert painted == {(r.graph, r.node): pytest.approx(r.roofline_pct, rel=1e-3) for r in rows}
    index = json.loads((case.path / "model_explorer" / "overlays.json").read_text())
    assert index["metrics"][ROOFLINE_PCT] == f"me_overlay_{ROOFLINE_PCT}.json"
    assert index["roofline_pct"]["limits"] == "20.0 GB/s, fp32 40.0 GFLOP/s, int8 120.0 GOP/s"
    render_top_ops(summary)  # `fab analyze`: one line, the costliest memory-bound node (else the costliest)
    printed = capsys.readouterr()
    assert top.line is not None and f"roofline: {top.line}" in (printed.out + printed.err).splitlines()


@pytest.mark.slow
def test_an_analysis_without_both_limits_paints_nothing_and_says_why(bundle_copy: BundleCopy) -> None:
    case = bundle_copy("distilbert_xnnpack")
    plant_limits(case, {"limits": state_value(bandwidth(20e9)), "compute": "{"})
    summary = analyze(case)
    found = summary.run.operator_roofline
    assert found is not None and found.note is not None and "peak arithmetic rate is refused" in found.note
    assert found.limits.fp32_gflops is None and found.limits.bandwidth_gb_per_s == pytest.approx(20.0)
    assert all(row.bound is None and row.label.endswith("% of bandwidth") for row in found.rows)
    assert not overlay_path(case.path, ROOFLINE_PCT).exists()
    index = json.loads((case.path / "model_explorer" / "overlays.json").read_text())
    assert index["roofline_pct"]["file"] is None and "refused" in index["roofline_pct"]["note"]
    assert found.line is not None and "of bandwidth; 18 nodes, no bound" in found.line
    plant_limits(case, {"limits": None, "compute": None})  # none: the work and the rates, no share, never 0
    found = analyze(case).run.operator_roofline
    assert found is not None and found.limits == BoardLimits() and found.note is not None
    assert all(row.label == "" and row.ops > 0 and row.bandwidth_pct is None for row in found.rows)
    assert not overlay_path(case.path, ROOFLINE_PCT).exists()
