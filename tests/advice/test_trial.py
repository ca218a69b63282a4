"""The trial behind `fab advise --try` (advice/trial.py): the original and its rewritten variants lowered side by
side, the variant's outputs checked against the original's (the head-at-position projection), the interleaved A/B
on the local board, and a variant whose outputs differ refused. No timing is asserted: only that both programs ran.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from orchestrator.advice.findings import QUANTIZE
from orchestrator.advice.trial import (
    OutputsCheck,
    ParetoPoint,
    TrialRefused,
    TrialReport,
    VariantTrial,
    _logits_rows,
    change_sets,
    check_outputs,
    pareto_front,
    try_change,
)
from orchestrator.boards.inventory import Board
from orchestrator.deploy.abtest import Interleaved
from orchestrator.deploy.runs import RunParams
from orchestrator.errors import ExitCode
from orchestrator.lowering.artifacts import ArtifactPaths
from orchestrator.lowering.builtins import BUILTIN_SPECS
from orchestrator.lowering.program import ProgramChoice
from orchestrator.lowering.rewrites.registry import RewriteRequest
from orchestrator.lowering.sources.huggingface import HuggingFaceOptions
from orchestrator.lowering.variants import VARIANTS
from orchestrator.records import to_data
from orchestrator.tensorfile import NamedTensor, read_tensors, write_tensors
from tests.plugins.artifacts import ARTIFACT_CACHE

ALL_THREE = ("tanh-gelu", "eager-attention", "head-at-position")


def test_head_at_position_rows() -> None:
    logits = np.arange(2 * 4 * 3, dtype=np.float32).reshape(2, 4, 3)
    ids = np.array([[5, 103, 7, 103], [103, 1, 2, 3]], dtype=np.int64)
    mask = np.array([[1, 1, 1, 0], [1, 1, 1, 1]], dtype=np.int64)
    inputs = [NamedTensor("input_ids", ids), NamedTensor("attention_mask", mask)]
    fill_mask, causal = BUILTIN_SPECS["distilbert-tiny"], BUILTIN_SPECS["gpt2-tiny"]
    assert fill_mask.options_of(HuggingFaceOptions).mask_token_id == 103
    # fill-mask: each row's first [MASK] (positions 1 and 0); causal-lm: the last real token (positions 2 and 3).
    np.testing.assert_array_equal(_logits_rows(logits, inputs, fill_mask), logits[[0, 1], [1, 0]])
    np.testing.assert_array_equal(_logits_rows(logits, inputs, causal), logits[[0, 1], [2, 3]])

    rows = logits[[0, 1], [2, 3]]
    good = check_outputs(causal, ("head-at-position",), inputs, [NamedTensor("output_0", logits)],
                         [NamedTensor("output_0", rows.copy())])  # fmt: skip
    assert good.ok and good.sqnr_db == 999.0 and good.max_abs_error == 0.0
    # The row of another position is another function: refused by SQNR and error.
    wrong = check_outputs(causal, ("head-at-position",), inputs, [NamedTensor("output_0", logits)],
                          [NamedTensor("output_0", logits[[0, 1], [0, 0]])])  # fmt: skip
    assert not wrong.ok and any("SQNR" in problem for problem in wrong.problems)
    # Without head-at-position a [B, V] output where [B, S, V] was expected is a shape mismatch.
    shape = check_outputs(causal, (), inputs, [NamedTensor("output_0", logits)], [NamedTensor("output_0", rows)])
    assert shape.problems == ("output_0: shape [2, 3], expected [2, 4, 3]",)


def rewrites_of(*names: str) -> ProgramChoice:
    return ProgramChoice(rewrites=RewriteRequest(names=names))


def test_change_sets() -> None:
    assert change_sets(rewrites_of(*ALL_THREE), each=False) == [rewrites_of(*ALL_THREE)]
    assert change_sets(rewrites_of(*ALL_THREE), each=True) == [rewrites_of(*ALL_THREE),
                                                               *[rewrites_of(name) for name in ALL_THREE]]  # fmt: skip
    assert change_sets(rewrites_of("tanh-gelu"), each=True) == [rewrites_of("tanh-gelu")]
    # together, a superseded rewrite is left out (bmm-attention makes eager-attention's change); alone, both run
    both = rewrites_of("eager-attention", "bmm-attention")
    assert change_sets(both, each=False) == [rewrites_of("bmm-attention")]
    assert change_sets(both, each=True) == [rewrites_of("bmm-attention"), rewrites_of("eager-attention")]
    # one kind of change: an attention and a rewrite together, and with `each` each alone
    mixed = ProgramChoice(attention="etlab", rewrites=RewriteRequest(names=("tanh-gelu",)))
    assert change_sets(mixed, each=False) == [mixed]
    assert change_sets(mixed, each=True) == [mixed, rewrites_of("tanh-gelu"), ProgramChoice(attention="etlab")]


@pytest.mark.slow
def test_try_rewrites_on_the_local_board(local_board: Board, tmp_path: Path) -> None:
    spec, xnnpack = BUILTIN_SPECS["gpt2-tiny"], VARIANTS["xnnpack"]
    predicted = {"tanh-gelu": 1.5, "eager-attention": 0.5, "head-at-position": 2.0}
    quick: dict[str, Any] = {"rounds": 5, "budget_seconds": 0.0, "iterations_per_run": 5}
    int8 = VARIANTS["xnnpack-int8-dynamic"]  # the quantize finding's program, measured beside the rewrites
    report = try_change(spec, xnnpack, rewrites_of(*ALL_THREE), local_board, RunParams(warmup=1),
                        predicted_ms={**predicted, QUANTIZE: 1.0}, weights="random", root=ARTIFACT_CACHE, jobs=1,
                        quantize_to=int8, **quick)  # fmt: skip
    assert report.model == "gpt2-tiny" and report.board == "local" and len(report.variants) == 2
    trial, quantized = report.variants
    # the quantized program: A/B'd against the original like a rewrite, its accuracy its outputs on the board
    assert quantized.variant == int8 and quantized.change == "--quantize int8-dynamic" and not quantized.rewrites
    assert quantized.predicted_ms == 1.0 and quantized.retest.rounds == 5 and quantized.retest.median_b_ms
    assert report.original_sqnr_db is not None and quantized.sqnr_db is not None
    assert quantized.sqnr_db < report.original_sqnr_db  # int8 loses some; fp32 on the board is fp32 rounding
    assert {(point.name, point.variant) for point in report.points()} >= {("gpt2-tiny", int8), ("gpt2-tiny", xnnpack)}
    assert trial.name == "gpt2-tiny.tanh-gelu.eager-attention.head-at-position"
    assert trial.rewrites == ALL_THREE and trial.predicted_ms == pytest.approx(4.0)
    # Both programs lived side by side and both ran: five rounds of five iterations each.
    assert (ARTIFACT_CACHE / "gpt2-tiny").is_dir() and (ARTIFACT_CACHE / trial.name).is_dir()
    assert len(trial.retest.a_ms) == len(trial.retest.b_ms) == 25 and trial.retest.error is None
    assert trial.retest.rounds == 5 and len(trial.retest.round_ratios) == 5
    assert trial.outputs.ok and trial.outputs.sqnr_db > 40.0 and trial.outputs.max_abs_error < 1e-3
    assert trial.measured_ms is not None and trial.measured_percent is not None and trial.ratio is not None
    assert trial.retest.median_a_ms is not None and trial.retest.median_b_ms is not None
    assert trial.measured_ms == pytest.approx(trial.retest.median_a_ms - trial.retest.median_b_ms)
    assert report.original_ms == trial.retest.median_a_ms and trial.why  # a decision, whichever way it went

    # A reference the variant does not match (the original's logits shuffled along the vocabulary) is refused before
    # anything runs on the board.
    (original,) = read_tensors(ArtifactPaths.for_model("gpt2-tiny", ARTIFACT_CACHE).reference_outputs)
    shuffled = np.random.default_rng(0).permutation(original.array, axis=-1)
    wrong = tmp_path / "wrong.etlt"
    write_tensors(wrong, [NamedTensor(original.name, np.ascontiguousarray(shuffled))])
    with pytest.raises(TrialRefused, match=rf"{trial.name} does not compute what gpt2-tiny computes: "
                                           r"output_0: SQNR") as refused:  # fmt: skip
        try_change(spec, xnnpack, rewrites_of(*ALL_THREE), local_board, RunParams(warmup=1), weights="random",
                     root=ARTIFACT_CACHE, jobs=1, reference=wrong, **quick)  # fmt: skip
    assert refused.value.exit_code == ExitCode.DATA == 65


def test_the_trial_file_keeps_its_layout() -> None:
    """advice_trial.json as `to_data` writes a TrialReport's outcome: the keys and figures the report had before."""
    retest = Interleaved(rounds=5, iterations_per_run=10, seconds=12.34567, a_ms=[10.0, 12.0], b_ms=[8.0, 9.0],
                         round_ratios=[0.8, 0.75], change="faster", confirmed=True, reason="5 of 5 rounds")  # fmt: skip
    trial = VariantTrial("distilbert-tiny.eager-attention", ("eager-attention",), 1.5,
                         OutputsCheck(60.0, 1e-4, 1e-3), retest, profiled_ms=20.0)  # fmt: skip
    report = TrialReport("distilbert-tiny", "local", VARIANTS["xnnpack"], 11.0, [trial])
    data = json.loads(json.dumps(to_data(report.outcome)))
    # the keys it had before, in their order; the accuracy figures after them
    assert list(data) == ["model", "board", "backend", "original_ms", "variants", "original_sqnr_db", "pareto_front"]
    assert data["backend"] == "xnnpack" and data["pareto_front"] == []  # no SQNR measured: no point to place
    (written,) = data["variants"]
    assert list(written) == [
        "name", "rewrites", "predicted_ms", "profiled_ms", "predicted_share", "predicted_at_retest_ms", "measured_ms",
        "measured_percent", "prediction_error", "ratio", "confirmed", "why", "outputs", "retest", "attention",
        "keep_float", "backend", "sqnr_db",
    ]  # fmt: skip
    assert written["rewrites"] == ["eager-attention"] and written["measured_ms"] == pytest.approx(2.5)
    assert written["attention"] is None  # a rewrite, not the attention switch
    assert written["outputs"] == {"sqnr_db": 60.0, "max_abs_error": 1e-4, "max_rel_error": 1e-3}
    assert written["retest"] == {
        "rounds": 5, "iterations_per_run": 10, "seconds": 12.346, "budget_seconds": None, "median_a_ms": 11.0,
        "median_b_ms": 8.5, "ratio": pytest.approx(8.5 / 11), "round_ratios": [0.8, 0.75], "change": "faster",
        "confirmed": True, "reason": "5 of 5 rounds", "error": None,
    }  # fmt: skip


def test_the_front_keeps_the_points_no_other_beats_on_both_speed_and_accuracy() -> None:
    def point(name: str, ms: float, db: float) -> ParetoPoint:
        return ParetoPoint(name, VARIANTS["xnnpack"], ms, db, None)

    fp32, int8, kept, worse = (
        point("fp32", 10.0, 120.0),
        point("int8", 6.0, 5.0),
        point("kept", 7.0, 40.0),
        point("worse", 8.0, 30.0),
    )
    front = pareto_front([fp32, int8, kept, worse])
    assert [p.name for p in front] == ["int8", "kept", "fp32"]  # fastest first; "worse" is slower and less accurate
    assert worse.dominated_by(kept) and not kept.dominated_by(worse) and not fp32.dominated_by(int8)
    twin = point("twin", 6.0, 5.0)
    assert not twin.dominated_by(int8)  # equal on both: neither beats the other
