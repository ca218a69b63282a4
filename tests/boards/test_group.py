"""Fan-out over real fake boards: one dead board is reported by name and never stops the others."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from orchestrator.boards.fanout import BoardOutcome, exit_code, fan_out, stage
from orchestrator.boards.inventory import Board
from orchestrator.commands.render_boards import summarize
from orchestrator.errors import ExitCode
from orchestrator.results.bundle import MANIFEST
from orchestrator.transport import connect
from orchestrator.transport.pull import pull_bundle
from orchestrator.transport.transfer import push_file
from tests.plugins.sshd import SshdBoard


def deploy(model: Path, results: Path):
    """push + run + pull, the shape of a real profiling job, with each step marked as a stage."""

    def work(board: Board) -> str:
        with stage("connect"):
            conn = connect(board)
        with conn:
            with stage("push"):
                pushed = push_file(conn, model)
            with stage("run"):
                bundle = f"{conn.workdir}/bundles/r1"
                script = (
                    'mkdir -p "$1" && sha256sum "$2" | cut -c1-64 > "$1/runner.log" && '
                    'printf \'{"schema": 1, "files": {"runner.log": {"sha256": "%s", "size": 65}}}\' '
                    '"$(sha256sum "$1/runner.log" | cut -c1-64)" > "$1/result_manifest.json"'
                )
                conn.run(["sh", "-c", script, "sh", bundle, pushed.remote_path])
            with stage("pull"):
                pulled = pull_bundle(conn, bundle, results / board.name / "r1")
        return (pulled / "runner.log").read_text().strip()

    return work


def test_one_dead_board_is_reported_and_the_others_succeed(
    sshd_boards, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fakes: list[SshdBoard] = sshd_boards(4, names=["pi-a", "pi b", "pi-dead", "pi 'd' $x"])
    fakes[2].stop()
    model = tmp_path / "model.pte"
    model.write_bytes(b"tiny model" * 100)
    outcomes = fan_out([f.board for f in fakes], deploy(model, tmp_path / "results"))

    assert [o.board.name for o in outcomes] == ["pi-a", "pi b", "pi-dead", "pi 'd' $x"]
    dead = outcomes[2]
    assert (dead.ok, dead.stage, dead.value) == (False, "connect", None)
    assert dead.error is not None and "'pi-dead'" in dead.error and "connection refused" in dead.error
    digest = hashlib.sha256(model.read_bytes()).hexdigest()
    for outcome in (outcomes[0], outcomes[1], outcomes[3]):
        assert outcome.ok and outcome.error is None and outcome.value == digest
        manifest = json.loads((tmp_path / "results" / outcome.board.name / "r1" / MANIFEST).read_text())
        assert list(manifest["files"]) == ["runner.log"]
    assert exit_code(outcomes) == ExitCode.UNAVAILABLE, "the only failure is an unreachable board"

    summarize(outcomes, title="deploy")
    table = capsys.readouterr().out
    assert "pi-dead" in table and "FAILED" in table and "connect" in table and "3 ok, 1 failed" in table


def test_stage_and_reason_of_a_failure_inside_a_stage() -> None:
    boards = [Board(name=f"b{i}", transport="local", workdir="/tmp") for i in range(3)]

    def work(board: Board) -> int:
        with stage("analyse"):
            if board.name == "b1":
                raise ValueError("bad numbers\nsecond line")
        return int(board.name[1:])

    outcomes = fan_out(boards, work, max_workers=2)
    assert [o.value for o in outcomes] == [0, None, 2]
    failed = outcomes[1]
    assert (failed.ok, failed.stage, failed.error) == (False, "analyse", "ValueError: bad numbers")
    assert isinstance(failed.exception, ValueError)
    assert failed.detail == "ValueError: bad numbers\nsecond line"
    assert exit_code(outcomes) == ExitCode.SOFTWARE, "the only failure is a bug"


def test_all_ok_exit_code_and_empty_fan_out() -> None:
    boards = [Board(name="a", transport="local", workdir="/tmp")]
    outcomes: list[BoardOutcome[str]] = fan_out(boards, lambda board: board.name)
    assert outcomes[0].ok and outcomes[0].value == "a" and outcomes[0].stage is None
    assert exit_code(outcomes) == ExitCode.OK
    assert fan_out([], lambda board: None) == []
