"""The compute probe's answers as board data (issue 55): the runner's timings of the fp32 and int8 GEMM programs,
turned into operations per second, and every malformed or absurd answer refused (65) or said, never a crash. The
real probe on the local board: tests/deploy/test_board_limits.py."""

from __future__ import annotations

import json

import pytest

from orchestrator.boards.limits import ComputePeak
from orchestrator.deploy.board_limits import GEMM, ITERATIONS, _rate
from orchestrator.errors import BoardDataError
from orchestrator.records import RecordError, from_data

M, K, N = GEMM


def _answer(iterations_ms: object, exit_code: object = 0) -> dict[str, object]:
    return {"exit_code": exit_code, "timings": json.dumps({"iterations_ms": iterations_ms, "runner_version": "x"}),
            "error": None}  # fmt: skip


def test_the_best_iteration_gives_the_rate() -> None:
    notes: list[str] = []
    times = [4.0] * (ITERATIONS - 1) + [2.0]
    assert _rate(_answer(times), "b", notes) == pytest.approx(2 * M * K * N / 0.002) and notes == []


@pytest.mark.parametrize(
    "answer",
    [
        _answer([1.0] * (ITERATIONS - 1)),  # one iteration short
        _answer([1.0] * (ITERATIONS - 1) + [-1.0]),
        _answer([1.0] * (ITERATIONS - 1) + [0]),
        _answer("fast"),
        _answer([1.0] * (ITERATIONS - 1) + ["1"]),
        {"exit_code": 0, "timings": "{not json", "error": None},
        {"exit_code": 0, "timings": json.dumps({"iterations_ms": [1e400] * ITERATIONS}), "error": None},
    ],
)
def test_malformed_timings_are_refused_with_65(answer: dict[str, object]) -> None:
    with pytest.raises(BoardDataError) as refused:
        _rate(answer, "pi-1: the fp32 GEMM probe", [])
    assert refused.value.exit_code == 65 and "pi-1: the fp32 GEMM probe" in str(refused.value)


def test_a_program_that_did_not_run_is_said_not_refused() -> None:
    notes: list[str] = []
    answer = {"exit_code": 7, "timings": None, "error": "etlab_runner: execution failed: XNNPACK init failed"}
    assert _rate(answer, "pi-1: the int8 GEMM probe", notes) is None
    assert notes == ["pi-1: the int8 GEMM probe did not run: etlab_runner: execution failed: XNNPACK init failed"]


def test_an_absurd_rate_is_refused_by_the_record() -> None:
    fast = _rate(_answer([1e-9] * ITERATIONS), "b", [])  # 2.7e20 ops/s
    peak = {"fp32_flops_per_s": fast, "int8_ops_per_s": None, "threads": 2, "gemm": list(GEMM),
            "runner_source_sha256": "a" * 64, "measured_at": "2026-12-06T00:00:00+00:00"}  # fmt: skip
    with pytest.raises(RecordError, match="fp32_flops_per_s"):
        from_data(peak, ComputePeak, where="pi-1: compute probe")
    assert from_data({**peak, "fp32_flops_per_s": 2e11}, ComputePeak, where="x").fp32_gflops == pytest.approx(200)
