"""The real `fab` tasks at their edges: options refused before any work, exit codes by class of failure, whole
error reasons, and board-provided text shown as inert text."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from orchestrator.boards.fanout import exit_code, fan_out, stage
from orchestrator.boards.inventory import Board
from orchestrator.commands.render_boards import summarize
from orchestrator.errors import BundleError, ExitCode
from orchestrator.lowering.export.lower import LoweringResult
from orchestrator.paths import PROJECT_ROOT
from orchestrator.transport import connect
from tests.plugins.agent import AgentCli, agent_workdir, holding_lock
from tests.plugins.artifacts import ARTIFACT_CACHE
from tests.plugins.boards import write_inventory
from tests.plugins.sshd import SshdBoard


def fab(*args: str, tmp_path: Path, artifacts: Path | None = None) -> subprocess.CompletedProcess[str]:
    """A real `fab` task, with results (and optionally artifacts) under the test's own folder."""
    env = {
        **os.environ,
        "ETLAB_RESULTS": str(tmp_path / "results"),
        "ETLAB_ARTIFACTS": str(artifacts or ARTIFACT_CACHE),
        "ETLAB_WIDTH": "400",  # wide tables: no cell is wrapped, so a test can read it
    }
    return subprocess.run(
        [sys.executable, "-m", "fabric", *args], cwd=PROJECT_ROOT, env=env, capture_output=True, text=True, timeout=300
    )


@pytest.fixture
def dead_inventory(sshd_board: SshdBoard, tmp_path: Path) -> Path:
    """An inventory whose one board refuses connections: a task that reaches it exits 69, not 64."""
    sshd_board.stop()
    return write_inventory(tmp_path / "inventory.yaml", [sshd_board.board], groups={"default": [sshd_board.name]})


# ---------------------------------------------------------------- options are checked first


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (["run", "--model", "distilbert-tiny", "--iterations", "abc"], "--iterations"),
        (["run", "--model", "distilbert-tiny", "--iterations", "0"], "--iterations"),
        (["run", "--model", "distilbert-tiny", "--warmup", "-1"], "--warmup"),
        (["run", "--model", "distilbert-tiny", "--threads", "2.5"], "--threads"),
        (["run", "--model", "distilbert-tiny", "--max-seconds", "abc"], "--max-seconds"),
        (["run", "--model", "distilbert-tiny", "--max-seconds", "inf"], "--max-seconds"),
        (["run", "--model", "distilbert-tiny", "--max-seconds", "-5"], "--max-seconds"),
        (["run", "--model", "distilbert-tiny", "--timeout", "nan"], "--timeout"),
        (["run", "--model", "distilbert-tiny", "--timeout", "0"], "--timeout"),
        (["gc", "--keep", "abc"], "--keep"),
        (["gc", "--keep", "-1"], "--keep"),
        (["pull", "--run", "../x"], "--run"),
        (["deploy-and-profile", "--model", "distilbert-tiny", "--max-seconds", "nan", "--no-explore"], "--max-seconds"),
        (["deploy-and-profile", "--model", "distilbert-tiny", "--port", "70000", "--no-explore"], "--port"),
        (["deploy-and-profile", "--model", "distilbert-tiny", "--weights", "nosuch", "--no-explore"], "--weights"),
    ],
    ids=lambda value: " ".join(value) if isinstance(value, list) else value,
)
def test_bad_board_task_options_exit_64_before_any_board_is_reached(
    args: list[str], named: str, dead_inventory: Path, tmp_path: Path
) -> None:
    result = fab(*args, "--inventory", str(dead_inventory), tmp_path=tmp_path)
    assert result.returncode == ExitCode.USAGE, result.stdout + result.stderr
    assert f"error: {named} must be" in result.stderr, result.stderr
    assert "Traceback" not in result.stderr and "internal error" not in result.stderr
    assert not (tmp_path / "results").exists()


@pytest.mark.parametrize("port", ["abc", "70000", "0", "-1"])
def test_bad_explore_port_exits_64(port: str, tmp_path: Path) -> None:
    result = fab("explore", "--port", port, "--no-browser", tmp_path=tmp_path)
    assert result.returncode == ExitCode.USAGE, result.stdout + result.stderr
    assert "error: --port must be a whole number from 1 to 65535" in result.stderr
    assert "Traceback" not in result.stderr


def test_bad_weights_leave_the_cached_artifacts_valid(
    tiny_artifacts: dict[str, LoweringResult], tmp_path: Path
) -> None:
    artifacts = tmp_path / "artifacts"
    shutil.copytree(ARTIFACT_CACHE / "distilbert-tiny", artifacts / "distilbert-tiny")
    before = {path.name: path.read_bytes() for path in (artifacts / "distilbert-tiny").iterdir()}
    assert "distilbert-tiny_xnnpack.json" in before

    refused = fab("lower", "--model", "distilbert-tiny", "--weights", "nosuch", tmp_path=tmp_path, artifacts=artifacts)
    assert refused.returncode == ExitCode.USAGE, refused.stdout + refused.stderr
    assert "--weights must be one of auto, pretrained, random" in refused.stderr
    assert {path.name: path.read_bytes() for path in (artifacts / "distilbert-tiny").iterdir()} == before
    # The cache is still valid: the same lowering with good options is a hit.
    cached = fab("lower", "--model", "distilbert-tiny", "--weights", "random", tmp_path=tmp_path, artifacts=artifacts)
    assert cached.returncode == 0 and "using cached artifacts" in cached.stderr, cached.stderr


@pytest.mark.parametrize(
    ("option", "value"),
    [("--timeout", "nan"), ("--timeout", "inf"), ("--max-seconds", "nan"), ("--lock-timeout", "nan"),
     ("--kill-grace", "inf")],
)  # fmt: skip
def test_the_agent_refuses_non_finite_budgets(agent: AgentCli, tmp_path: Path, option: str, value: str) -> None:
    model = tmp_path / "model.pte"
    model.write_bytes(b"not run")
    result = agent.run("profile", "--model", model, "--run-id", "r1", option, value)
    assert result.returncode == 2, result.stdout + result.stderr
    assert option in result.document["error"] and "not a finite number" in result.document["error"]
    assert not agent.bundle("r1").exists()


def test_the_agent_refuses_a_negative_gc_keep(agent: AgentCli) -> None:
    result = agent.run("gc", "--keep", "-1")
    assert result.returncode == 2 and "--keep" in result.document["error"], result.stdout + result.stderr


# ---------------------------------------------------------------- a run id that matches nothing


def test_pull_of_a_run_id_that_matches_nothing_is_an_error(tmp_path: Path) -> None:
    workdir = agent_workdir(tmp_path / "wd")
    (workdir / "bundles" / "20261130T021530Z-abc123").mkdir()
    board = Board(name="agent-only", transport="local", workdir=str(workdir))
    inventory = write_inventory(tmp_path / "inventory.yaml", [board], groups={"default": ["agent-only"]})

    result = fab("pull", "--run", "20991231T000000Z-ffffff", "--inventory", str(inventory), tmp_path=tmp_path)
    assert result.returncode == ExitCode.USAGE, result.stdout + result.stderr
    assert "no run '20991231T000000Z-ffffff' on the selected boards (agent-only)" in result.stderr
    assert "nothing new to pull" not in result.stdout
    assert not list((tmp_path / "results").glob("**/result_manifest.json"))


# ---------------------------------------------------------------- exit codes and whole reasons


def test_changed_host_key_and_dead_board_exit_69_with_the_whole_reason(sshd_boards: Any, tmp_path: Path) -> None:
    changed, dead = sshd_boards(2, names=["pi-rekeyed", "pi-dead"])
    inventory = write_inventory(
        tmp_path / "inventory.yaml", [changed.board, dead.board], groups={"default": ["pi-rekeyed", "pi-dead"]}
    )
    first = fab("boards", "--inventory", str(inventory), tmp_path=tmp_path)  # pins both host keys
    assert first.returncode == 0, first.stdout + first.stderr

    changed.regenerate_host_key()
    dead.stop()
    result = fab("boards", "--inventory", str(inventory), tmp_path=tmp_path)
    assert result.returncode == ExitCode.UNAVAILABLE, result.stdout + result.stderr
    # The table keeps one line per board; the details under it keep every line of the reason.
    assert result.stdout.count("SHA256:") == 2, result.stdout
    assert "ssh-keygen -R " in result.stdout and str(changed.board.known_hosts) in result.stdout.replace("\n", "")
    assert "pi-dead" in result.stdout and "connection refused" in result.stdout


def test_fan_out_exit_code_is_the_class_of_its_failures(
    sshd_boards: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fakes: list[SshdBoard] = sshd_boards(3, names=["pi-ok", "pi-dead", "pi-bad-bundle"])
    fakes[1].stop()
    bad_files = ["timings.json", "etdump.etdp"]

    def work(board: Board) -> str:
        with stage("connect"), connect(board) as conn, stage("verify"):
            conn.run(["true"])
            if board.name == "pi-bad-bundle":
                raise BundleError(
                    "bundle r1 failed verification:\n" + "\n".join(f"  {n}: sha256 mismatch" for n in bad_files)
                )
            return hashlib.sha256(board.name.encode()).hexdigest()

    everyone = fan_out([f.board for f in fakes], work)
    assert [o.ok for o in everyone] == [True, False, False]
    assert exit_code(everyone) == ExitCode.FAILED, "unreachable and bad data: mixed classes exit 1"
    assert exit_code(everyone[:2]) == ExitCode.UNAVAILABLE
    assert exit_code([everyone[0], everyone[2]]) == ExitCode.DATA

    summarize(everyone, title="verify")
    out = capsys.readouterr().out
    for name in bad_files:
        assert f"{name}: sha256 mismatch" in out, out


# ---------------------------------------------------------------- board text is inert


@pytest.fixture
def held_lock(tmp_path: Path) -> Iterator[Path]:
    """A board workdir with the agent whose lock is held, by a holder whose text carries escape sequences."""
    workdir = agent_workdir(tmp_path / "wd")
    (workdir / "state.json").write_text(json.dumps({"executorch_version": "1.5.1"}))
    holder = {
        "purpose": "profile",
        "run_id": "r1\x1b]0;owned\x07\x1b[2J\x1b[31m[bold red]EVIL[/bold red]",
        "user": "mallory\r[link=http://example.invalid]x[/link]",
        "hostname": "\x9b31mpi",
        "pid": os.getpid(),
    }
    with holding_lock(workdir, holder):
        yield workdir


def test_boards_shows_a_hostile_lock_holder_as_inert_text(held_lock: Path, tmp_path: Path) -> None:
    board = Board(name="local-held", transport="local", workdir=str(held_lock))
    inventory = write_inventory(tmp_path / "inventory.yaml", [board], groups={"default": ["local-held"]})
    result = fab("boards", "--inventory", str(inventory), tmp_path=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    shown = result.stdout + result.stderr
    for control in ("\x1b", "\x07", "\x9b", "\r"):
        assert control not in shown, repr(shown)
    assert "\\x1b[31m[bold red]EVIL[/bold red]" in result.stdout, result.stdout  # shown, not obeyed
    assert "\\x1b]0;owned\\x07" in result.stdout and "\\x9b31mpi" in result.stdout
    assert "[link=http://example.invalid]x[/link]" in result.stdout


def test_an_internal_error_is_logged_for_the_suite(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The suite-wide check that no `fab` exits 70 (tests/plugins/internal_errors.py) rests on this log."""
    from invoke.exceptions import Exit

    from orchestrator.commands.handling import handle_errors

    log = tmp_path / "exit70.jsonl"
    monkeypatch.setenv("ETLAB_INTERNAL_ERROR_LOG", str(log))

    @handle_errors
    def buggy_task() -> int:
        raise TypeError("a bug")

    @handle_errors
    def user_mistake() -> int:
        from orchestrator.errors import UsageError

        raise UsageError("--iterations must be a whole number")

    with pytest.raises(Exit) as caught:
        user_mistake()
    assert caught.value.code == 64 and not log.exists(), "a user's mistake is not a bug"
    with pytest.raises(Exit) as caught:
        buggy_task()
    assert caught.value.code == 70
    (entry,) = [json.loads(line) for line in log.read_text().splitlines()]
    assert entry["task"] == "buggy_task" and "TypeError: a bug" in entry["detail"]


INNER_SUITE = """
import json, os

def test_a_fab_that_exited_70():  # what handle_errors appends for one
    with open(os.environ["ETLAB_INTERNAL_ERROR_LOG"], "a") as log:
        log.write(json.dumps({"task": "buggy_task", "argv": ["fab", "buggy"], "detail": "TypeError: a bug"}) + "\\n")

def test_something_else():
    pass
"""


def test_an_exit_70_on_a_parallel_worker_fails_the_session(tmp_path: Path) -> None:
    """The suite runs on pytest-xdist workers: an exit 70 logged on any of them fails the whole run, as it does
    without workers (tests/plugins/internal_errors.py)."""
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    (tmp_path / "test_inner.py").write_text(INNER_SUITE)
    outer = ("PYTEST_XDIST_WORKER", "PYTEST_XDIST_WORKER_COUNT", "ETLAB_INTERNAL_ERROR_LOG", "PYTEST_ADDOPTS")
    env = {key: value for key, value in os.environ.items() if key not in outer}  # this session's, not the inner one's
    env["PYTHONPATH"] = str(PROJECT_ROOT)
    for workers in ("2", "0"):
        inner = subprocess.run(
            [sys.executable, "-m", "pytest", "-n", workers, "-p", "tests.plugins.internal_errors",
             "-p", "no:cacheprovider", "-p", "no:labgrid", "test_inner.py"],
            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        assert inner.returncode == pytest.ExitCode.TESTS_FAILED, (workers, inner.stdout, inner.stderr)
        assert "fab exited 70 (internal error) 1 time(s)" in inner.stdout and "buggy_task: fab buggy" in inner.stdout


def test_the_interleave_minimum_is_the_sign_tests() -> None:
    """One minimum: `--interleave` refuses below abtest.MIN_ROUNDS, accepts it, and its help says so."""
    import tasks
    from orchestrator.commands import options
    from orchestrator.deploy.abtest import MIN_ROUNDS
    from orchestrator.errors import UsageError

    assert options.ab_rounds(MIN_ROUNDS) == MIN_ROUNDS and options.ab_rounds(0) == 0
    with pytest.raises(UsageError, match=rf"--interleave must be a number of rounds from {MIN_ROUNDS} "):
        options.ab_rounds(MIN_ROUNDS - 1)
    assert f"(>= {MIN_ROUNDS})" in tasks.compare.help["interleave"]


def test_the_execution_a_timeline_draws_is_median_first_or_a_count() -> None:
    """`fab analyze --execution`: median (the default), first or N from 1; anything else exit 64, the option named."""
    from orchestrator.commands import options
    from orchestrator.errors import UsageError

    assert [options.execution(v) for v in ("median", " First ", "7", 3)] == ["median", "first", 7, 3]
    for wrong in ("0", "-1", "last", "1.5", True):
        with pytest.raises(UsageError, match="--execution must be median, first or a whole number from 1"):
            options.execution(wrong)


def test_the_command_layer_names_the_options_the_library_does_not() -> None:
    from orchestrator.commands import options
    from orchestrator.commands.program_options import model_spec
    from orchestrator.counters import parse_counters
    from orchestrator.errors import SpecError, UsageError
    from orchestrator.lowering.builtins import resolve_spec

    with pytest.raises(UsageError, match=r"^give exactly one of --model NAME or --spec FILE$"):
        model_spec(None, None)
    with pytest.raises(SpecError) as spec_error:
        resolve_spec(None, None)
    with pytest.raises(UsageError, match=r"^--counters: unknown counter 'bogus'"):
        options.counters("bogus")
    with pytest.raises(UsageError) as counter_error:
        parse_counters("bogus")
    assert "--" not in str(spec_error.value) + str(counter_error.value)
