"""setup-board measures the board's read bandwidth and its peak fp32 and int8 GEMM rates with its own runner (issue
55), keeps them in the board's state and `fab boards` shows them. A board whose probe fails says why and still runs
programs; one whose probe answers something absurd is refused (65) with the field named, the rest of its setup
kept, and it still runs programs. The two odd boards are the local board with its runner behind a wrapper that
answers `--probe-bandwidth` as such a board would (every other call goes to the real runner)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.boards.inventory import Board
from orchestrator.boards.limits import current_compute, limits_cell, recorded_bandwidth, recorded_compute
from orchestrator.deploy.board_limits import GEMM
from orchestrator.paths import PROJECT_ROOT
from tests.plugins.artifacts import ARTIFACT_CACHE
from tests.plugins.boards import provision_board, write_inventory

pytestmark = pytest.mark.slow

ABSURD = {
    "probe": "read_bandwidth", "threads": 2, "buffer_bytes": 268435456, "llc_bytes": 2097152, "rounds": 1,
    "round_seconds": [0.000001], "best_bytes_per_s": 2.7e14, "median_bytes_per_s": 2.7e14, "checksum": 1,
}  # fmt: skip


def _fab(tmp_path: Path, board: Board, *args: str) -> subprocess.CompletedProcess[str]:
    inventory = write_inventory(tmp_path / "inventory.yaml", [board])
    env = {**os.environ, "ETLAB_ARTIFACTS": str(ARTIFACT_CACHE), "ETLAB_RESULTS": str(tmp_path / "results"),
           "ETLAB_WIDTH": "400"}  # fmt: skip
    return subprocess.run(
        [sys.executable, "-m", "fabric", *args, "--board", board.name, "--inventory", str(inventory)],
        cwd=PROJECT_ROOT, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip


def _behind_a_wrapper(board: Board, tmp_path: Path, probe_answer: str) -> None:
    """The board's runner, as its state names it, behind a script that answers --probe-bandwidth itself; the
    bandwidth the state holds is forgotten, so setup-board measures it again."""
    state_path = Path(board.workdir) / "state.json"
    state = json.loads(state_path.read_text())
    wrapper = tmp_path / f"runner-{len(list(tmp_path.glob('runner-*')))}.sh"
    wrapper.write_text(
        f'#!/bin/sh\nif [ "$1" = --probe-bandwidth ]; then\n{probe_answer}\nfi\nexec {state["runner_path"]} "$@"\n'
    )
    wrapper.chmod(0o755)
    state["runner_path"] = str(wrapper)
    state.pop("limits", None)
    state_path.write_text(json.dumps(state))


def test_setup_board_measures_the_read_bandwidth_and_odd_probes_never_cost_the_board(
    tmp_path: Path, tiny_artifacts: object
) -> None:
    board = Board(name="odd", transport="local", workdir=str(tmp_path / "wd"), build="workstation")
    report = provision_board(board)  # the real probe, with the runner built for this board
    assert report.bandwidth is not None and 0 < report.bandwidth.gb_per_s < 1000
    state = json.loads((tmp_path / "wd" / "state.json").read_text())
    assert recorded_bandwidth(state, "state.json") == report.bandwidth
    # ... and its peak arithmetic rate: XNNPACK's fp32 and int8 GEMMs, each a lowered Linear the runner timed. The
    # int8 GEMM moves a quarter of the bytes and multiplies narrower numbers: never slower than 1/4 of the fp32 one.
    peak = report.compute
    assert peak is not None and peak.int8_ops_per_s is not None and peak.gemm == GEMM, report.limits_notes
    assert 0.01 < peak.fp32_gflops < 1e5 and peak.int8_ops_per_s > peak.fp32_flops_per_s / 4
    assert recorded_compute(state, "state.json") == peak and current_compute(state, peak.runner_source_sha256)
    listed = _fab(tmp_path, board, "boards")
    assert listed.returncode == 0 and f"{report.bandwidth.gb_per_s:.1f} GB/s" in listed.stdout, listed.stdout
    assert limits_cell(report.bandwidth, peak) in listed.stdout, listed.stdout

    # A board that cannot run the probe: said, the setup succeeds, programs run.
    _behind_a_wrapper(board, tmp_path, 'echo "etlab_runner: error: cannot allocate 268435456 bytes" >&2; exit 2')
    setup = _fab(tmp_path, board, "setup-board")
    said = " ".join((setup.stdout + setup.stderr).split())
    assert setup.returncode == 0, said
    assert "read bandwidth not measured: etlab_runner: error: cannot allocate 268435456 bytes" in said
    assert "read not measured" in _fab(tmp_path, board, "boards").stdout
    ran = _fab(tmp_path, board, "run", "--model", "distilbert-tiny", "--backend", "xnnpack", "--iterations", "2")
    assert ran.returncode == 0, ran.stdout + ran.stderr

    # A board whose probe answers 270 TB/s: refused naming the field (65); its state is kept, programs run.
    _behind_a_wrapper(board, tmp_path, f"echo '{json.dumps(ABSURD)}'; exit 0")
    setup = _fab(tmp_path, board, "setup-board")
    said = " ".join((setup.stdout + setup.stderr).split())
    assert setup.returncode == 65, said
    assert "odd: etlab_runner --probe-bandwidth" in said and "best_bytes_per_s" in said and "Traceback" not in said
    state = json.loads((tmp_path / "wd" / "state.json").read_text())
    assert "limits" not in state and state["runner_path"].endswith(".sh")
    ran = _fab(tmp_path, board, "run", "--model", "distilbert-tiny", "--backend", "xnnpack", "--iterations", "2")
    assert ran.returncode == 0, ran.stdout + ran.stderr
