"""The facts the advisor reads from a results folder: which run of the same model on the same board measures an
fp32 run's quantization saving. A run of any quantized scheme of the registry does (quantize.Scheme.peers)."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from orchestrator.advice.advisor import _rank, advise
from orchestrator.advice.detectors import _saving_from_ratios
from orchestrator.advice.facts import run_facts
from orchestrator.advice.findings import BoardRatios, shape_key
from orchestrator.commands.render_advice import advice_lines
from orchestrator.commands.render_deploy import model_advice_lines
from orchestrator.deploy.cells import CellOutcome
from orchestrator.lowering.artifacts import Artifact, ArtifactPaths
from orchestrator.lowering.quantize.schemes import FP32, QUANTIZED, SCHEMES
from orchestrator.lowering.sidecar import sidecar_from_data
from orchestrator.lowering.variants import QUANTIZED_ON, Variant
from orchestrator.results.ops_record import DelegateNodeTiming
from orchestrator.results.store import find_run
from tests.advice.advice_helpers import DATA, recorded

MODEL = "distilbert-tiny"


def _recorded_run(results: Path, backend: str, run_id: str) -> None:
    run = results / "local" / MODEL / backend / run_id
    (run / "analysis").mkdir(parents=True)
    (run / "result_manifest.json").write_text(json.dumps({"run_id": run_id}))
    for name in ("ops", "summary"):
        shutil.copy(DATA / MODEL / f"{name}.json", run / "analysis" / f"{name}.json")


def _facts_of_the_fp32_run(tmp_path: Path, *peers: Variant) -> tuple[Variant | None, bool]:
    results = tmp_path / "results"
    _recorded_run(results, "xnnpack", "20261201T000000Z-000abc")
    for number, peer in enumerate(peers, 1):
        _recorded_run(results, peer.name, f"20261201T00000{number}Z-000abc")
    fp32 = Variant(QUANTIZED_ON)
    artifact = Artifact(ArtifactPaths.for_model(MODEL, tmp_path / "artifacts"), fp32,
                        sidecar_from_data(recorded(MODEL)["sidecar"]))  # fmt: skip
    facts, _ = run_facts(find_run("20261201T000000Z", root=results), artifact, results_root=results)
    assert facts.sidecar is not None  # the artifact is the program the run ran: its peers are looked for
    return facts.quantized_peer_variant, facts.quantized_peer is not None


@pytest.mark.parametrize("scheme", [scheme.name for scheme in QUANTIZED])
def test_a_run_of_every_quantized_scheme_measures_the_saving(tmp_path: Path, scheme: str) -> None:
    peer = Variant(QUANTIZED_ON, SCHEMES[scheme])
    assert _facts_of_the_fp32_run(tmp_path, peer) == (peer, True)


def test_the_peers_are_taken_in_the_order_fp32_names_them(tmp_path: Path) -> None:
    peers = [Variant(QUANTIZED_ON, SCHEMES[name]) for name in FP32.peers]
    assert {variant.scheme for variant in peers} == set(QUANTIZED)
    assert _facts_of_the_fp32_run(tmp_path, *reversed(peers)) == (peers[0], True)


GEMM_SCALE = 5.0  # the advised run's FullyConnected made 75% of it, as on a full-size model (15% recorded)


def _copy_run(results: Path, recorded_as: str, model: str, backend: str, run_id: str, scale: float = 1.0) -> Path:
    run = results / "local" / model / backend / run_id
    (run / "analysis").mkdir(parents=True)
    (run / "result_manifest.json").write_text(json.dumps({"run_id": run_id}))
    shutil.copy(DATA / recorded_as / "summary.json", run / "analysis" / "summary.json")
    (run / "analysis" / "ops.json").write_text(json.dumps(_scaled_ops(recorded_as, scale)))
    return run


def _scaled_ops(recorded_as: str, scale: float) -> dict[str, Any]:
    ops = recorded(recorded_as)["ops"]
    for delegate in ops["delegates"]:
        for node in delegate["nodes"]:
            if node["type"] == "XNNFullyConnected":
                node["median_ms"] *= scale
                node["mean_ms"] *= scale
    return ops


def _gemm_sum(recorded_as: str, node_type: str, scale: float = 1.0) -> float:
    ops = _scaled_ops(recorded_as, scale)
    return sum(node["median_ms"] for d in ops["delegates"] for node in d["nodes"] if node["type"] == node_type)


def _advice_without_a_peer(tmp_path: Path) -> tuple[Any, Any]:
    """distilbert-tiny's fp32 run on a board that ran wav2vec2-tiny in fp32 and int8-dynamic, not distilbert-tiny."""
    results = tmp_path / "results"
    _copy_run(results, MODEL, MODEL, "xnnpack", "20261201T000000Z-000abc", scale=GEMM_SCALE)
    _copy_run(results, "wav2vec2-tiny", "wav2vec2-tiny", "xnnpack", "20261201T000001Z-000abc")
    _copy_run(results, "wav2vec2-tiny-int8-dynamic", "wav2vec2-tiny", "xnnpack-int8-dynamic", "20261201T000002Z-000abc")
    artifact = Artifact(ArtifactPaths.for_model(MODEL, tmp_path / "artifacts"), Variant(QUANTIZED_ON),
                        sidecar_from_data(recorded(MODEL)["sidecar"]))  # fmt: skip
    facts, _ = run_facts(find_run("20261201T000000Z", root=results), artifact, results_root=results)
    return facts, advise(facts)


def test_without_its_own_int8_run_the_boards_ratios_predict_the_saving(tmp_path: Path) -> None:
    facts, advice = _advice_without_a_peer(tmp_path)
    assert facts.quantized_peer is None and facts.board_ratios is not None
    assert facts.board_ratios.scheme == Variant(QUANTIZED_ON, SCHEMES["int8-dynamic"])
    ratio = _gemm_sum("wav2vec2-tiny-int8-dynamic", "XNNFullyConnected") / _gemm_sum(
        "wav2vec2-tiny", "XNNFullyConnected"
    )
    assert facts.board_ratios.ratios["XNNFullyConnected"] == pytest.approx(ratio)
    assert facts.board_ratios.by_shape == {}  # these recorded profiles predate the node shapes: by type alone
    (finding,) = [f for f in advice.findings if f.kind == "quantize"]
    fully_connected = _gemm_sum(MODEL, "XNNFullyConnected", GEMM_SCALE)
    assert finding.saving_ms == pytest.approx(max(0.0, fully_connected * (1 - ratio)), abs=1e-6)
    assert "wav2vec2-tiny" in finding.saving_note and "--quantize int8-dynamic" in finding.fix


def test_a_nodes_ratio_is_its_sizes_else_its_types_else_the_mean() -> None:
    board = BoardRatios(Variant(QUANTIZED_ON, SCHEMES["int8-dynamic"]), {"XNNFullyConnected": 0.5, "XNNConv2d": 0.9},
                        (), {"XNNFullyConnected@2^13": 1.2})  # fmt: skip
    assert shape_key("XNNFullyConnected", (1, 128, 64)) == "XNNFullyConnected@2^13"
    assert shape_key("XNNFullyConnected", None) is None and shape_key("XNNFullyConnected", ()) is None
    assert board.ratio("XNNFullyConnected", (1, 128, 64)) == 1.2  # a small GEMM: int8 slower at that size
    assert board.ratio("XNNFullyConnected", (1, 128, 3072)) == 0.5
    assert board.ratio("XNNDepthwiseConv2d", (1, 8, 8, 32)) == pytest.approx(0.7)


def test_an_unpredicted_finding_keeps_its_share_in_the_one_line_advice(tmp_path: Path) -> None:
    facts, _ = _advice_without_a_peer(tmp_path)
    advice = advise(dataclasses.replace(facts, board_ratios=None))
    (finding,) = [f for f in advice.findings if f.kind == "quantize"]
    assert finding.saving_ms is None and finding.share > 0
    # the scheme `fab advise --try` measures: the one its fix names
    assert (
        finding.quantize
        and f"--quantize {finding.quantize} " in finding.fix
        and "fab advise --try" in finding.saving_note
    )
    padded = dataclasses.replace(advice, findings=(*[advice.findings[0]] * 3, finding))  # ranked last, below 3 others
    line = next(line for line in advice_lines(padded) if "--quantize" in line)
    assert f"not predicted ({finding.share:.0%} of the run)" in line
    # the deploy's advice per model, as README command 1 prints it: not folded into "more" either
    others = [dataclasses.replace(advice.findings[0], title=f"other {k}", saving_ms=1.0) for k in range(3)]
    cell = CellOutcome("local", MODEL, Variant(QUANTIZED_ON), ok=True, run_id=advice.run_id)
    said = model_advice_lines(MODEL, [(cell, dataclasses.replace(advice, findings=(*others, finding)))])
    assert any(f"not predicted ({finding.share:.0%} of the run)" in line and "--quantize" in line for line in said)
    assert "more" not in said[0], said


def test_an_unpredicted_finding_ranks_by_the_share_it_holds(tmp_path: Path) -> None:
    """The fp32 matmuls of a run on a board never measured in int8: no prediction, most of the run. They rank above
    a predicted saving worth less, and the one-line advice shows every finding worth a few percent of the run."""
    facts, _ = _advice_without_a_peer(tmp_path)
    advice = advise(dataclasses.replace(facts, board_ratios=None))
    (quantize,) = [f for f in advice.findings if f.kind == "quantize"]
    assert quantize.saving_ms is None and quantize.share > 0.2, quantize
    small = [
        dataclasses.replace(quantize, kind="lowering", title=f"small {k}", saving_ms=0.05 * quantize.measured_ms,
                            share=0.05 * quantize.share, measured_ms=0.05 * quantize.measured_ms, keep_float=())
        for k in range(4)
    ]  # fmt: skip
    ranked = sorted([*small, quantize], key=_rank)
    assert ranked[0] is quantize, [f.title for f in ranked]
    # each small one is worth well over 3% of the run here: all five shown, none folded into "more"
    method_ms = quantize.measured_ms / quantize.share
    assert all(f.saving_ms / method_ms > 0.03 for f in small)  # type: ignore[operator]
    numbered = dataclasses.replace(advice, method_ms=method_ms, findings=tuple(ranked))
    lines = advice_lines(numbered)
    assert len(lines) == 6 and "more" not in lines[-1], lines
    assert f"({quantize.share:.0%} of the run)" in lines[0]
    # a finding worth under a few percent past the top three is folded
    tiny = dataclasses.replace(small[0], title="tiny", saving_ms=0.001 * quantize.measured_ms)
    folded = advice_lines(dataclasses.replace(numbered, findings=(*ranked, tiny)))
    assert "1 more" in folded[-1] and not any("tiny" in line for line in folded)


def test_a_saving_from_the_boards_ratios_takes_each_nodes_size_where_it_was_measured() -> None:
    scheme = Variant(QUANTIZED_ON, SCHEMES["int8-dynamic"])
    board = BoardRatios(scheme, {"XNNFullyConnected": 0.5}, ("m (a against b)",), {"XNNFullyConnected@2^13": 1.2})
    small = DelegateNodeTiming("1", "XNNFullyConnected", median_ms=1.0, shape=(1, 128, 64))
    large = DelegateNodeTiming("2", "XNNFullyConnected", median_ms=4.0, shape=(1, 128, 3072))
    saving, note = _saving_from_ratios(board, [small, large])
    assert saving == pytest.approx((1.0 - 1.2) + 4.0 * (1 - 0.5))  # the small GEMM costs, the large one saves
    assert "1 of 2 nodes at the ratio of their own size" in note
