"""A board cannot exhaust the workstation's memory: every command output read from a board (agent JSON, probes,
stdout and stderr of commands and streams) is capped at OUTPUT_LIMIT. Past it the command is stopped and that
board alone fails with bad data (exit 65), on real sshd boards, the local board and through the real `fab run`."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from orchestrator.boards.inventory import Board
from orchestrator.errors import BoardDataError, ExitCode
from orchestrator.lowering.export.lower import LoweringResult
from orchestrator.paths import PROJECT_ROOT
from orchestrator.transport import OUTPUT_LIMIT, BoardConnection, OutputTooLarge, connect
from tests.commands.test_exit_codes import fake_provisioned
from tests.plugins.artifacts import ARTIFACT_CACHE
from tests.plugins.boards import write_inventory
from tests.plugins.sshd import SshdBoard


def flood(stream: str, pid_file: Path | None = None, pause: float = 0.01) -> list[str]:
    """A command that prints to `stream` forever. The pause bounds what a transport without a cap piles up before
    the test's command timeout (about 6 MB/s), so the test fails on such a transport without exhausting memory."""
    # /proc/self is the pid this machine's /proc knows, also for an sshd board in its own pid namespace.
    record = f"open({str(pid_file)!r}, 'w').write(os.readlink('/proc/self'))\n" if pid_file else ""
    script = (
        f"import os, sys, time\n{record}"
        f"while True:\n    sys.{stream}.buffer.write(b'x' * 65536)\n    sys.{stream}.flush()\n    time.sleep({pause})\n"
    )
    return ["python3", "-c", script]


def gone(pid: int, within: float = 30.0) -> bool:
    """Whether process `pid` has ended (a zombie counts as ended), waiting up to `within` seconds for it."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (FileNotFoundError, ProcessLookupError):
            return True
        if state in ("Z", "X"):
            return True
        time.sleep(0.1)
    return False


# Without a cap a stream test waits for output that never ends, piling it up: fail it well before the session timeout.
UNBOUNDED_WITHOUT_A_CAP = pytest.mark.timeout(120)


@pytest.fixture
def local_board(tmp_path: Path) -> Board:
    return Board(name="local", transport="local", workdir=str(tmp_path / "wd"))


@UNBOUNDED_WITHOUT_A_CAP
@pytest.mark.parametrize("stream", ["stdout", "stderr"])
def test_the_local_board_stops_a_command_that_prints_endlessly(local_board: Board, tmp_path: Path, stream: str) -> None:
    # The flood runs under a shell that also started a background process: the whole process group is stopped.
    background = tmp_path / "background.pid"
    with connect(local_board) as conn:
        with pytest.raises(OutputTooLarge) as caught:
            conn.run(
                ["sh", "-c", 'sleep 1000 & echo $! > "$0"; exec "$@"', str(background), *flood(stream)], timeout=60
            )
        assert isinstance(caught.value, BoardDataError) and caught.value.exit_code == ExitCode.DATA
        message = str(caught.value)
        assert "board 'local'" in message and "python3 -c" in message, message
        assert f"more than {OUTPUT_LIMIT >> 20} MiB on {stream}" in message, message
        assert gone(int(background.read_text())), "the command's process group was not stopped"
        assert conn.run(["echo", "still usable"]).stdout == "still usable\n"


@UNBOUNDED_WITHOUT_A_CAP
def test_a_flood_stops_what_the_command_started_in_a_session_of_its_own(local_board: Board, tmp_path: Path) -> None:
    """The agent starts its runner with a session of its own: a flooding agent's runner must stop too."""
    escaped = tmp_path / "escaped.pid"
    script = 'setsid sh -c \'echo $$ > "$0"; exec sleep 1000\' "$0" & exec "$@"'
    with connect(local_board) as conn, pytest.raises(OutputTooLarge):
        conn.run(["sh", "-c", script, str(escaped), *flood("stdout")], timeout=60)
    assert gone(int(escaped.read_text())), "a process the flooding command started in its own session still runs"


def test_output_up_to_the_limit_is_kept_whole(local_board: Board) -> None:
    with connect(local_board) as conn:
        result = conn.run_shell(f"head -c {OUTPUT_LIMIT} /dev/zero | tr '\\0' a; head -c {OUTPUT_LIMIT} /dev/zero >&2")
        assert len(result.stdout) == OUTPUT_LIMIT and len(result.stderr) == OUTPUT_LIMIT


@UNBOUNDED_WITHOUT_A_CAP
@pytest.mark.parametrize("stream", ["stdout", "stderr"])
def test_an_ssh_board_stops_a_command_that_prints_endlessly(sshd_board: SshdBoard, tmp_path: Path, stream: str) -> None:
    pid_file = sshd_board.home / "flood.pid"
    with connect(sshd_board.board) as conn:
        with pytest.raises(OutputTooLarge) as caught:
            conn.run(flood(stream, pid_file), timeout=60)
        message = str(caught.value)
        assert caught.value.exit_code == ExitCode.DATA
        assert sshd_board.name in message and "python3 -c" in message and f"on {stream}" in message, message
        assert gone(int(pid_file.read_text())), "the board's command still runs after its channel was closed"
        assert conn.run(["echo", "still usable"]).stdout == "still usable\n"


@pytest.fixture(params=["ssh channel", "ssh bulk (OpenSSH)", "local"])
def stream_board(request: pytest.FixtureRequest, local_board: Board) -> Iterator[tuple[BoardConnection, bool]]:
    if request.param == "local":
        with connect(local_board) as conn:
            yield conn, False
        return
    fake: SshdBoard = request.getfixturevalue("sshd_board")
    with connect(fake.board) as conn:
        yield conn, request.param.startswith("ssh bulk")


@UNBOUNDED_WITHOUT_A_CAP
def test_a_read_stream_stops_a_command_that_floods_stderr(stream_board: tuple[BoardConnection, bool]) -> None:
    conn, bulk = stream_board
    argv = ["sh", "-c", 'echo data; exec "$@"', "sh", *flood("stderr")]
    with pytest.raises(OutputTooLarge, match=r"more than \d+ MiB on stderr"):  # noqa: SIM117
        with conn.open_read_stream(argv, bulk=bulk) as reader:
            while reader.read(1 << 16):
                pass
    assert conn.run(["echo", "still usable"]).stdout == "still usable\n"


@UNBOUNDED_WITHOUT_A_CAP
def test_a_write_stream_stops_a_command_that_floods_stdout(stream_board: tuple[BoardConnection, bool]) -> None:
    conn, bulk = stream_board
    argv = ["sh", "-c", 'exec "$@"', "sh", *flood("stdout")]
    with pytest.raises(OutputTooLarge, match=r"more than \d+ MiB on stdout"):  # noqa: SIM117
        with conn.open_write_stream(argv, bulk=bulk) as stream:
            for _ in range(6000):  # never read: a write blocks on a full pipe until the flood gets the command stopped
                stream.write(b"y" * 4096)


# ---------------------------------------------------------------- through the real `fab run`, two boards

FLOOD_AGENT = """import sys
# Test-only: a broken or hostile board's agent answers every command with output that never ends.
while True:
    sys.{stream}.write("x" * 65536)
"""

GOOD_AGENT = """import json, sys
# Test-only: an agent whose `profile` answers as the real one does, without running anything.
args = sys.argv[1:]
workdir, run_id = args[args.index("--workdir") + 1], args[args.index("--run-id") + 1]
print(json.dumps({"run_id": run_id, "status": "ok", "bundle": f"{workdir}/bundles/{run_id}"}))
"""

RSS_LIMIT_KIB = 1 << 20  # 1 GiB: far above etlab's own footprint, far below what a flood piles up in seconds


@dataclass(frozen=True)
class Watched:
    returncode: int
    output: str
    peak_rss_kib: int
    stopped: str | None  # why the watcher killed the process, if it did


def rss_kib(pid: int, field: str = "VmRSS") -> int:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return 0
    line = next((line for line in status.splitlines() if line.startswith(f"{field}:")), f"{field}: 0 kB")
    return int(line.split()[1])


def watched_fab(*args: str, results: Path, timeout: float = 120.0) -> Watched:
    """`fab *args` in a subprocess, killed if it outgrows RSS_LIMIT_KIB or `timeout` (so a transport without a cap
    fails the test instead of the machine); its peak RSS, VmHWM sampled while it runs. Not wait4's ru_maxrss: Linux
    keeps the pre-exec high-water mark, a copy of this test process's own size (about 1 GB late in a full run)."""
    env = {**os.environ, "ETLAB_ARTIFACTS": str(ARTIFACT_CACHE), "ETLAB_RESULTS": str(results)}
    with tempfile.TemporaryFile() as out:
        process = subprocess.Popen([sys.executable, "-m", "fabric", *args], cwd=PROJECT_ROOT, env=env, stdout=out,
                                   stderr=subprocess.STDOUT)  # fmt: skip
        deadline = time.monotonic() + timeout
        stopped = None
        peak = 0
        while True:
            peak = max(peak, rss_kib(process.pid, "VmHWM"))  # before wait4: a reaped pid has no /proc entry
            pid, status, _ = os.wait4(process.pid, os.WNOHANG)
            if pid:
                break
            if stopped is None and rss_kib(process.pid) > RSS_LIMIT_KIB:
                stopped = f"its RSS passed {RSS_LIMIT_KIB >> 10} MiB"
            elif stopped is None and time.monotonic() > deadline:
                stopped = f"it ran longer than {timeout:g} s"
            if stopped is not None:
                os.kill(process.pid, signal.SIGKILL)
            time.sleep(0.1)
        process.returncode = os.waitstatus_to_exitcode(status)  # reaped here: Popen must not wait for it again
        out.seek(0)
        return Watched(process.returncode, out.read().decode(errors="replace"), peak, stopped)


@pytest.mark.parametrize("stream", ["stdout", "stderr"])
def test_fab_run_fails_a_flooding_board_alone_with_bounded_memory(
    sshd_boards: Callable[..., list[SshdBoard]],
    tiny_artifacts: dict[str, LoweringResult],
    tmp_path: Path,
    stream: str,
) -> None:
    flooding, good = sshd_boards(2)
    fake_provisioned(flooding, FLOOD_AGENT.format(stream=stream))
    fake_provisioned(good, GOOD_AGENT)
    inventory = write_inventory(tmp_path / "inventory.yaml", [flooding.board, good.board])

    run = watched_fab("run", "--model", "distilbert-tiny", "--board", f"{flooding.name},{good.name}",
                      "--inventory", str(inventory), "--iterations", "2", results=tmp_path / "results")  # fmt: skip

    assert run.stopped is None, f"fab was killed: {run.stopped}\n{run.output}"
    assert 0 < run.peak_rss_kib < RSS_LIMIT_KIB, run.output
    assert run.returncode == ExitCode.DATA, run.output  # the flooding board's bad data; the good board succeeded
    reason = f"{flooding.name}: agent profile sent malformed output: more than {OUTPUT_LIMIT >> 20} MiB on {stream}"
    assert reason in run.output and f"│ {flooding.name} │ FAILED" in run.output, run.output
    good_rows = [
        [cell.strip() for cell in line.split("│")] for line in run.output.splitlines() if f"│ {good.name} │" in line
    ]
    assert good_rows and all("ok" in cells for cells in good_rows), run.output  # its run row and its summary row
