"""Correctness output by output (results/validity.py): SQNR and relative error judge an fp32 program at any output
scale, top-1 and top-5 only where an output is logits, several outputs compared one by one and the bad one named;
the kinds from the sidecar (or from the shape, said so); the accuracy gate per output; a real tiny lowering run by
the native runner passes. Sidecars without kinds: tests/lowering/test_sidecar.py."""

from __future__ import annotations

import dataclasses
import subprocess
from pathlib import Path

import numpy as np
import pytest

from orchestrator.commands.render import render_outputs
from orchestrator.lowering.export.lower import LoweringResult
from orchestrator.lowering.outputs import LOGITS, VALUES, kind_from_shape, output_kind, output_records
from orchestrator.lowering.sidecar import OutputRecord, Sidecar
from orchestrator.lowering.variants import VARIANTS
from orchestrator.records import from_data, to_data
from orchestrator.results.summary import RunSummary, Validity
from orchestrator.results.summary_outputs import ACCURACY_DEFAULTS, Correctness
from orchestrator.results.validity import (
    MIN_SQNR_DB,
    OUTPUT_RTOL,
    check_outputs,
    judge_accuracy,
    output_kinds,
)
from orchestrator.tensorfile import NamedTensor, read_tensors, write_tensors
from tests.plugins.artifacts import lower_tiny


def _files(tmp_path: Path, board: dict[str, np.ndarray], eager: dict[str, np.ndarray]) -> tuple[Path, Path]:
    outputs, reference = tmp_path / "outputs.etlt", tmp_path / "reference.etlt"
    write_tensors(outputs, [NamedTensor(name, array) for name, array in board.items()])
    write_tensors(reference, [NamedTensor(name, array) for name, array in eager.items()])
    return outputs, reference


def _normal(scale: float, shape: tuple[int, ...] = (1, 10), seed: int = 23) -> np.ndarray:
    return (np.random.default_rng(seed).normal(size=shape) * scale).astype(np.float32)


def test_tiny_logits_with_tiny_absolute_errors_fail_by_sqnr(tmp_path: Path) -> None:
    """A random-weight image model's logits are ~1e-8: errors of 1e-9 are far under any absolute tolerance, and
    still 10% of the signal."""
    eager = _normal(1e-8)
    noisy = (eager + _normal(1.0, eager.shape, 1) * 1e-9).astype(np.float32)
    correctness = check_outputs(*_files(tmp_path, {"logits": noisy}, {"logits": eager}), [LOGITS])
    (check,) = correctness.outputs
    assert check.max_abs_error is not None and check.max_abs_error < 1e-8  # under the old 1e-4 absolute tolerance
    assert check.sqnr_db is not None and check.sqnr_db < MIN_SQNR_DB and not check.ok
    assert correctness.checked and correctness.ok is False
    assert "logits: SQNR" in (correctness.reason or "")

    # The same model with the noise of fp32 arithmetic (1e-7 of the signal) passes at this scale too.
    close = (eager * (1 + _normal(1.0, eager.shape, 1) * 1e-7)).astype(np.float32)
    correctness = check_outputs(*_files(tmp_path, {"logits": close}, {"logits": eager}), [LOGITS])
    (check,) = correctness.outputs
    assert correctness.ok, correctness.reason
    assert check.sqnr_db is not None and check.sqnr_db > 100 and check.top1_agreement == 1.0
    assert check.max_rel_error is not None and check.max_rel_error < OUTPUT_RTOL


def test_a_large_relative_error_fails_even_with_a_high_sqnr(tmp_path: Path) -> None:
    eager = _normal(1.0, (1, 10_000))
    board = eager.copy()
    board[0, 0] += 0.1 * float(np.abs(eager).max())  # one value off by 10% of the largest: SQNR stays above 40 dB
    (check,) = check_outputs(*_files(tmp_path, {"out": board}, {"out": eager}), [VALUES]).outputs
    assert check.sqnr_db is not None and check.sqnr_db > MIN_SQNR_DB
    assert not check.ok and any("largest magnitude" in problem for problem in check.problems)


def test_hidden_states_get_no_top_k(tmp_path: Path) -> None:
    """A [1, seq, hidden] output is no class scores: its argmax means nothing, however it moves."""
    eager = _normal(1.0, (1, 8, 64))
    board = (eager + _normal(1.0, eager.shape, 1).astype(np.float32) * 1e-6).astype(np.float32)
    correctness = check_outputs(*_files(tmp_path, {"last_hidden_state": board}, {"last_hidden_state": eager}))
    (check,) = correctness.outputs
    assert check.kind == VALUES  # no kind given: guessed from the shape (rank 3)
    assert check.top1_agreement is None and check.top5_overlap is None and check.top1_flips is None
    assert correctness.top1_agreement is None and correctness.ok and check.sqnr_db is not None
    # A recorded kind wins over the shape: a rank-2 feature vector recorded as values gets no top-k either.
    features = _normal(1.0, (1, 64))
    (check,) = check_outputs(*_files(tmp_path, {"pooled": features}, {"pooled": features}), [VALUES]).outputs
    assert check.kind == VALUES and check.top1_agreement is None


def test_several_outputs_are_compared_one_by_one_and_the_bad_one_named(tmp_path: Path) -> None:
    logits, hidden, ids = _normal(3.0, (2, 100)), _normal(1.0, (2, 4, 16)), np.arange(6, dtype=np.int64).reshape(2, 3)
    wrong_hidden = hidden.copy()
    wrong_hidden[1] = wrong_hidden[1][::-1]  # the second sequence's states reversed
    board = {"logits": logits.copy(), "hidden": wrong_hidden, "ids": ids.copy()}
    eager = {"logits": logits, "hidden": hidden, "ids": ids}
    correctness = check_outputs(*_files(tmp_path, board, eager), [LOGITS, VALUES, VALUES])
    assert [(c.name, c.kind, c.ok) for c in correctness.outputs] == [
        ("logits", LOGITS, True), ("hidden", VALUES, False), ("ids", VALUES, True)
    ]  # fmt: skip
    assert correctness.ok is False and (correctness.reason or "").startswith("hidden: SQNR")
    assert "logits" not in (correctness.reason or "") and "ids" not in (correctness.reason or "")
    logits_check = correctness.outputs[0]
    assert logits_check.top1_agreement == 1.0 and logits_check.top5_overlap == 1.0
    assert logits_check.sqnr_db == 999.0  # identical: no noise
    # The worst figures over the outputs are the hidden states'.
    assert correctness.sqnr_db == correctness.outputs[1].sqnr_db
    # An integer output is exact or wrong.
    board["ids"] = ids + 1
    board["hidden"] = hidden
    correctness = check_outputs(*_files(tmp_path, board, eager), [LOGITS, VALUES, VALUES])
    assert [c.ok for c in correctness.outputs] == [True, True, False] and "ids: differs" in (correctness.reason or "")
    # What summary.json stores reads back the same.
    assert from_data(to_data(correctness), Correctness, where="summary.json") == correctness


def test_the_terminal_shows_one_row_per_output(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    logits, hidden = _normal(1.0, (1, 100)), _normal(1.0, (1, 4, 8))
    files = _files(tmp_path, {"scores": logits, "states": hidden + 1}, {"scores": logits, "states": hidden})
    correctness = check_outputs(*files, [LOGITS, VALUES], "a note on the kinds")
    render_outputs(RunSummary(run_id="run", validity=Validity("invalid"), correctness=correctness))
    rows = [line for line in capsys.readouterr().out.splitlines() if "scores" in line or "states" in line]
    assert len(rows) == 2, rows
    assert "1×100" in rows[0] and "100%" in rows[0] and rows[0].rstrip(" │").endswith("ok")
    assert "1×4×8" in rows[1] and "FAIL" in rows[1] and "%" not in rows[1]


def test_a_clear_top1_flip_in_logits_fails(tmp_path: Path) -> None:
    eager = _normal(1.0, (1, 50))
    eager[0, :2] = [10.0, 5.0]
    board = eager.copy()
    board[0, :2] = [5.0, 10.0]
    (check,) = check_outputs(*_files(tmp_path, {"o": board}, {"o": eager})).outputs  # [1, 50] float: logits
    assert check.kind == LOGITS and check.top1_agreement == 0.0 and check.top1_flips == 1
    assert any("top-1 differs" in problem for problem in check.problems)


def test_unreadable_or_missing_outputs(tmp_path: Path) -> None:
    outputs, reference = _files(tmp_path, {"a": _normal(1.0)}, {"a": _normal(1.0), "b": _normal(1.0)})
    counted = check_outputs(outputs, reference)
    assert counted.checked and counted.ok is False and counted.reason == "1 outputs, reference has 2"
    (tmp_path / "garbage.etlt").write_bytes(b"not a tensor file")
    unreadable = check_outputs(tmp_path / "garbage.etlt", reference)
    assert not unreadable.checked and unreadable.ok is False and unreadable.reason
    shaped = check_outputs(*_files(tmp_path, {"a": _normal(1.0, (1, 5))}, {"a": _normal(1.0, (1, 6))}))
    assert shaped.ok is False and "shape [1, 5], reference [1, 6]" in (shaped.reason or "")


def test_the_accuracy_gate_judges_each_output(tmp_path: Path) -> None:
    logits, hidden = _normal(5.0, (1, 100)), _normal(1.0, (1, 8, 32))
    quantized_logits = (logits + _normal(1.0, logits.shape, 1) * 0.05).astype(np.float32)  # ~40 dB
    noisy_hidden = (hidden + _normal(1.0, hidden.shape, 2)).astype(np.float32)  # 0 dB
    files = _files(tmp_path, {"logits": quantized_logits, "hidden": noisy_hidden}, {"logits": logits, "hidden": hidden})
    accuracy = judge_accuracy(*files, "int8-dynamic", dict(ACCURACY_DEFAULTS), "pretrained", [LOGITS, VALUES])
    assert accuracy.verdict == "fail" and accuracy.reasons == (
        f"hidden: SQNR {accuracy.outputs[1].sqnr_db:.1f} dB < {ACCURACY_DEFAULTS['min_sqnr_db']:g} dB",
    )
    good, bad = accuracy.outputs
    assert good.ok and good.top5_overlap is not None and good.top1_agreement is not None
    assert not bad.ok and bad.top1_agreement is None and bad.top5_overlap is None  # values: SQNR only
    assert accuracy.sqnr_db == bad.sqnr_db and accuracy.top5_overlap == good.top5_overlap
    assert from_data(to_data(accuracy), type(accuracy), where="summary.json") == accuracy


def test_output_kinds_come_from_the_task() -> None:
    assert output_kind("fill-mask") == output_kind("image-classification") == LOGITS
    assert output_kind("feature-extraction") == output_kind("speech-encoder") == VALUES
    assert output_kind(None) is None and output_kind("something-new") is None
    assert kind_from_shape([1, 1000], "float32") == LOGITS
    assert kind_from_shape([1, 8, 64], "float32") == kind_from_shape([1, 1], "float32") == VALUES
    assert kind_from_shape([1, 10], "int64") == VALUES
    described = [{"name": "out", "shape": [1, 3, 16], "dtype": "float32"}]
    assert output_records("causal-lm", described)[0]["kind"] == LOGITS  # the task says, not the shape
    assert output_records(None, described)[0]["kind"] == VALUES  # a program without a task: the shape


@pytest.mark.slow  # a real lowering (cached across sessions)
def test_output_kinds_of_old_sidecars_are_said_to_be_guessed(tiny_artifacts: dict[str, LoweringResult]) -> None:
    sidecar = tiny_artifacts["gpt2-tiny"].variants[VARIANTS["xnnpack"]].sidecar
    assert output_kinds(sidecar) == ([LOGITS], None)
    # no kind, as in a sidecar from before kinds were recorded
    old_outputs = tuple(OutputRecord(name=o.name, shape=o.shape, dtype=o.dtype) for o in sidecar.outputs)  # type: ignore[call-arg]
    assert [(o.kind, o.kind_recorded) for o in old_outputs] == [(VALUES, False)]  # guessed: [1, 128, 1000]
    old = dataclasses.replace(sidecar, outputs=old_outputs)
    assert output_kinds(old) == ([LOGITS], "the sidecar records no output kinds: logits from its task")
    unknown_task = dataclasses.replace(old, task="something-new")
    kinds, note = output_kinds(unknown_task)
    assert kinds == [VALUES] and note is not None and "guessed" in note
    kinds, note = output_kinds(None)
    assert kinds == [] and note is not None and "no sidecar" in note


def _run_on_the_runner(runner: Path, result: LoweringResult, tmp_path: Path) -> tuple[Sidecar, Path]:
    variant = VARIANTS["xnnpack"]
    outputs = tmp_path / f"{result.spec.name}_outputs.etlt"
    subprocess.run(
        [runner, "--model", result.paths.pte(variant), "--inputs", result.paths.reference_inputs,
          "--warmup", "0", "--iterations", "1", "--outputs", outputs],
        check=True, capture_output=True, timeout=120,
    )  # fmt: skip
    return result.variants[variant].sidecar, outputs


@pytest.mark.slow  # lowers (cached) and runs real programs
@pytest.mark.parametrize("name", ["distilbert-tiny", "mobilenet-v2-tiny"])
def test_a_real_tiny_xnnpack_program_passes(runner_binary: Path, tmp_path: Path, name: str) -> None:
    """fp32 XNNPACK against eager, at each model's own scale: the random-weight MobileNet's logits are ~1e-7."""
    result = lower_tiny(name)
    sidecar, outputs = _run_on_the_runner(runner_binary, result, tmp_path)
    assert [output.kind for output in sidecar.outputs] == [LOGITS] and all(o.kind_recorded for o in sidecar.outputs)
    reference = result.paths.reference_outputs
    correctness = check_outputs(outputs, reference, *output_kinds(sidecar))
    (check,) = correctness.outputs
    assert correctness.ok, correctness.reason
    assert check.sqnr_db is not None and check.sqnr_db >= MIN_SQNR_DB and check.top1_agreement == 1.0
    # The same outputs scaled by 1.5 are wrong, however small the model's outputs are.
    (board,) = read_tensors(outputs)
    write_tensors(outputs, [NamedTensor(board.name, board.array * np.float32(1.5))])
    wrong = check_outputs(outputs, reference, *output_kinds(sidecar))
    assert wrong.ok is False and wrong.outputs[0].sqnr_db is not None and wrong.outputs[0].sqnr_db < 10
