"""Ctrl+C and SIGTERM stop the board too: `fab run` interrupted while the runner runs exits 130 with one line, and
the board's agent and runner are gone and its lock free, on the local board and on a real sshd board; a parallel
lowering interrupted prints no worker's traceback. Everything runs for real: `fab`, the agent, OpenSSH."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import click
import pytest

from orchestrator import interrupts
from orchestrator.boards.inventory import Board
from orchestrator.boards.workdir import BoardWorkdir
from orchestrator.errors import ExitCode
from orchestrator.lowering.export.lower import LoweringResult
from orchestrator.paths import PROJECT_ROOT
from orchestrator.transport import connect
from orchestrator.versions import executorch_version
from tests.plugins.agent import AGENT_DIR, AgentCli, process_gone, wait_for
from tests.plugins.artifacts import ARTIFACT_CACHE
from tests.plugins.boards import write_inventory
from tests.plugins.processes import reaped
from tests.plugins.sshd import SshdBoard

# Generous: the property is "within seconds"; a loaded CI machine must not make it flaky.
EXIT_TIMEOUT = 30.0


def marked(marker: str) -> list[int]:
    """Live processes (zombies excluded) whose command line holds `marker`."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == os.getpid():
            continue
        try:
            cmdline = Path(f"/proc/{name}/cmdline").read_bytes()
            state = Path(f"/proc/{name}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if marker.encode() in cmdline and state not in ("Z", "X"):
            found.append(int(name))
    return found


def kill_marked(marker: str) -> None:
    for pid in marked(marker):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def stubborn_board(workdir: Path, marker: str, started: Path) -> None:
    """A provisioned workdir with the real agent and a runner that ignores SIGTERM and leaves a child (which
    ignores it too) in its own session: only a SIGKILL stops them. Every process of the run has `marker` in its
    command line (the workdir's name, the child's argument)."""
    shutil.copytree(AGENT_DIR, workdir / "board" / "agent", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(Path(click.__file__).parent, workdir / "pylib" / "click", ignore=shutil.ignore_patterns("*.pyc"))
    runner = Path(BoardWorkdir(str(workdir)).runner(executorch_version())) / "etlab_runner"
    runner.parent.mkdir(parents=True)
    version = json.dumps({"executorch_version": executorch_version(), "runner_version": "stubborn"})
    runner.write_text(
        "#!/bin/sh\n"
        f"if [ \"$1\" = --version ]; then echo '{version}'; exit 0; fi\n"
        "trap '' TERM\n"  # ignored signals stay ignored in the child too
        f"python3 -c 'import time; time.sleep(600)' {marker} &\n"
        f"echo $$ > {started}\n"
        "wait\n"
    )
    runner.chmod(0o755)
    state = {"executorch_version": executorch_version(), "runner_path": str(runner), "runner_build": "board"}
    (workdir / "state.json").write_text(json.dumps(state))


def start_fab(*args: str, results: Path) -> subprocess.Popen[str]:
    env = {**os.environ, "ETLAB_ARTIFACTS": str(ARTIFACT_CACHE), "ETLAB_RESULTS": str(results)}
    return subprocess.Popen(
        [sys.executable, "-m", "fabric", *args],
        cwd=PROJECT_ROOT,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own group: a signal to it is ours to send, as a terminal's would be
    )


def interrupt_run(board: Board, workdir: Path, marker: str, signum: int, tmp_path: Path) -> None:
    """`fab run` on `board` until its runner runs, then `signum` to fab: 130, one line, nothing left, lock free."""
    started = tmp_path / "runner-started"
    stubborn_board(workdir, marker, started)
    inventory = write_inventory(tmp_path / "inventory.yaml", [board])
    try:
        fab = start_fab("run", "--model", "distilbert-tiny", "--backend", "xnnpack", "--board", board.name,
                        "--inventory", str(inventory), "--iterations", "2", results=tmp_path / "results")  # fmt: skip
        with reaped(fab):
            wait_for(lambda: started.exists() or fab.poll() is not None, timeout=300, what="the runner to start")
            assert fab.poll() is None, "".join(fab.communicate())
            # The agent, the runner and its child (the board lock is held by the first two).
            wait_for(lambda: len(marked(marker)) >= 3, what="the agent, the runner and its child")
            assert AgentCli(workdir).run("lock-status").document["held"] is True
            fab.send_signal(signum)
            stdout, stderr = fab.communicate(timeout=EXIT_TIMEOUT)  # the "within seconds", generously

        output = stdout + stderr
        assert fab.returncode == ExitCode.INTERRUPTED, output
        assert "Traceback" not in output, output
        assert "interrupted" in stderr, output
        wait_for(lambda: not marked(marker), timeout=10, what="the board's processes to be gone")
        assert AgentCli(workdir).run("lock-status").document == {"held": False, "holder": None}
    finally:
        kill_marked(marker)  # on a failure, nothing of this test keeps running


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_an_interrupted_run_stops_the_local_board(
    tiny_artifacts: dict[str, LoweringResult], tmp_path: Path, signum: int
) -> None:
    marker = f"etlab-interrupt-{uuid.uuid4().hex}"
    workdir = tmp_path / f"wd-{marker}"
    board = Board(name="local", transport="local", workdir=str(workdir))
    interrupt_run(board, workdir, marker, signum, tmp_path)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_an_interrupted_run_stops_an_ssh_board(
    sshd_boards: Callable[..., list[SshdBoard]],
    tiny_artifacts: dict[str, LoweringResult],
    tmp_path: Path,
    signum: int,
) -> None:
    marker = f"etlab-interrupt-{uuid.uuid4().hex}"
    (fake,) = sshd_boards(1, workdir=f"~/wd-{marker}")
    interrupt_run(fake.board, fake.workdir_path, marker, signum, tmp_path)


@pytest.mark.parametrize("transport", ["local", "ssh"])
def test_an_interrupt_stops_commands_and_streams_of_other_threads(
    request: pytest.FixtureRequest, tmp_path: Path, transport: str
) -> None:
    """What fan-out threads run when the main thread is interrupted: a command and a stream end within seconds,
    with everything they started on the board, and nothing new starts."""
    marker = f"etlab-interrupt-{uuid.uuid4().hex}"
    if transport == "ssh":
        board = request.getfixturevalue("sshd_boards")(1)[0].board
    else:
        board = Board(name="local", transport="local", workdir=str(tmp_path / "wd"))
    sleeper = ["python3", "-c", "import time; time.sleep(600)", marker]
    ended: list[str] = []

    def command() -> None:
        conn.run(sleeper, timeout=600, check=False)
        ended.append("command")

    def stream() -> None:
        with contextlib.suppress(Exception), conn.open_read_stream([*sleeper, "stream"]) as reader:
            reader.read()
        ended.append("stream")

    try:
        with connect(board) as conn:
            threads = [threading.Thread(target=command), threading.Thread(target=stream)]
            for thread in threads:
                thread.start()
            wait_for(lambda: len(marked(marker)) >= 2, what="the command and the stream to run")
            interrupts.interrupt()
            for thread in threads:
                thread.join(EXIT_TIMEOUT)
            assert sorted(ended) == ["command", "stream"]
            wait_for(lambda: not marked(marker), timeout=10, what="their processes to be gone")
            with pytest.raises(interrupts.Interrupted):
                conn.run(["true"])
    finally:
        interrupts.reset()
        kill_marked(marker)


def test_an_interrupt_swallowed_by_a_finalizer_is_delivered_again(capfd: pytest.CaptureFixture[str]) -> None:
    """Ctrl+C landing while a __del__ runs is only printed by Python ("Exception ignored ... KeyboardInterrupt",
    a traceback) and lost; within no_lost_interrupts() it stops the main thread as any Ctrl+C does."""

    class Finalized:
        def __del__(self) -> None:
            raise KeyboardInterrupt  # as the SIGINT handler does when the signal lands here

    with pytest.raises(KeyboardInterrupt), interrupts.no_lost_interrupts():
        Finalized()  # finalized at once: the interrupt is swallowed, then delivered again
        for _ in range(100):
            time.sleep(0.01)
    assert "Traceback" not in capfd.readouterr().err


def _spawn_workers(parent: int) -> list[int]:
    """The multiprocessing workers among `parent`'s children."""
    workers = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            stat = Path(f"/proc/{name}/stat").read_text()
            cmdline = Path(f"/proc/{name}/cmdline").read_bytes()
        except OSError:
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == parent and b"spawn_main" in cmdline:
            workers.append(int(name))
    return workers


def _ignores_sigint(pid: int) -> bool:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    ignored = next(int(line.split()[1], 16) for line in status.splitlines() if line.startswith("SigIgn:"))
    return bool(ignored & (1 << (signal.SIGINT - 1)))


@pytest.mark.slow
@pytest.mark.parametrize("settled", [False, True], ids=["as a worker starts", "while the workers lower"])
def test_ctrl_c_during_a_parallel_lowering_prints_one_line_and_no_traceback(tmp_path: Path, settled: bool) -> None:
    env = {**os.environ, "ETLAB_ARTIFACTS": str(tmp_path / "artifacts")}
    fab = subprocess.Popen(
        [sys.executable, "-m", "fabric", "lower", "--model", "distilbert-tiny", "--weights", "random",
         "--backend", "portable,xnnpack", "--quantize", "int8-dynamic,int8-static,8da4w", "--jobs", "3"],
        cwd=PROJECT_ROOT, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True, start_new_session=True,
    )  # fmt: skip
    with reaped(fab):
        workers = wait_for(lambda: _spawn_workers(fab.pid), timeout=300, what="lowering workers")
        if settled:  # both workers past their start (they ignore Ctrl+C: without that, Ctrl+C still comes, later)
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                workers = _spawn_workers(fab.pid)
                if len(workers) == 2 and all(_ignores_sigint(pid) for pid in workers):
                    break
                time.sleep(0.1)
            time.sleep(2)
        assert fab.poll() is None, "the lowering ended before it could be interrupted"
        os.killpg(fab.pid, signal.SIGINT)  # Ctrl+C: the terminal signals every process of the job
        stdout, stderr = fab.communicate(timeout=120)

    output = stdout + stderr
    assert fab.returncode == ExitCode.INTERRUPTED, output
    assert "Traceback" not in output and "KeyboardInterrupt" not in output, output
    assert "interrupted" in stderr, output
    wait_for(lambda: all(process_gone(pid) for pid in workers), timeout=10, what="the workers to be gone")


LATE_SIGNALS = """
import os, signal, subprocess, sys
from invoke.exceptions import Exit
from orchestrator.commands.handling import handle_errors

@handle_errors
def task() -> int:
    raise KeyboardInterrupt  # Ctrl+C in the middle of the task

try:
    task()
except Exit as stopped:
    # More Ctrl+C, every 5 ms until the process is gone: while the exit unwinds and while the interpreter finalizes
    # (a second Ctrl+C, a late re-delivery).
    loop = f"while kill -INT {os.getpid()} 2>/dev/null; do sleep 0.005; done"  # ends once this process is reaped
    subprocess.Popen(["sh", "-c", loop], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    os.kill(os.getpid(), signal.SIGTERM)
    sys.exit(stopped.code)
"""


@pytest.mark.parametrize("round_", range(3))
def test_signals_after_the_interrupted_line_still_end_in_130(round_: int) -> None:
    """Measured under load: a lowering interrupted by Ctrl+C said "interrupted", then ended by SIGINT itself (status
    -2, no exit code) because a late one landed after the handlers were restored or the interpreter reset them."""
    done = subprocess.run(
        [sys.executable, "-c", LATE_SIGNALS], cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == ExitCode.INTERRUPTED, (done.returncode, done.stderr)
    assert done.stderr.count("interrupted") == 1 and "Traceback" not in done.stderr, done.stderr
