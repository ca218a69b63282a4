"""Run the native runner in its own process group under a hard timeout.

On expiry (or when the agent itself is told to stop) the whole group gets SIGTERM, then SIGKILL after a grace
period, so nothing the runner spawned survives it.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any, Sequence

from .files import log, utc_now

POLL_SECONDS = 0.05
STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP, signal.SIGINT)


class RunOutcome:
    def __init__(self) -> None:
        self.exit_code: int | None = None  # negative: killed by that signal (subprocess convention)
        self.timed_out = False
        self.interrupted_by: str | None = None  # the signal that told the agent to stop
        self.spawn_error: str | None = None  # the runner could not be started at all
        self.started_at = ""
        self.ended_at = ""
        self.duration_s = 0.0

    def as_dict(self) -> dict[str, Any]:
        return {
            "exit_code": self.exit_code,
            "timed_out": self.timed_out,
            "interrupted_by": self.interrupted_by,
            "spawn_error": self.spawn_error,
            "started_at": self.started_at,
            "ended_at": self.ended_at,
            "duration_s": round(self.duration_s, 6),
        }


class StopRequest:
    """Turns SIGTERM/SIGHUP/SIGINT into a flag the wait loop checks (e.g. the ssh session died), so the agent
    stops its runner and still finishes the bundle instead of dying half-way."""

    def __init__(self) -> None:
        self.signal_name: str | None = None
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> StopRequest:
        for number in STOP_SIGNALS:
            self._previous[number] = signal.signal(number, self._handle)
        return self

    def _handle(self, number: int, _frame: Any) -> None:
        self.signal_name = signal.Signals(number).name

    def __exit__(self, *_exc: object) -> None:
        for number, handler in self._previous.items():
            signal.signal(number, handler)


def _group_exists(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _signal_group(pgid: int, number: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, number)


def _leader_exited(pid: int) -> bool:
    """True once the leader has exited, without reaping it: its pid (= the group id) stays ours until we wait."""
    try:
        info = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:
        return True
    return info is not None


def _kill_group(process: subprocess.Popen, grace: float) -> None:
    pgid = process.pid
    _signal_group(pgid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        # The leader is not reaped yet, so while it is a zombie the group id cannot be reused.
        if _leader_exited(process.pid) and not _others_alive(pgid):
            break
        time.sleep(POLL_SECONDS)
    _signal_group(pgid, signal.SIGKILL)


def _others_alive(pgid: int) -> bool:
    """Whether live processes other than the leader remain in the group."""
    try:
        names = os.listdir("/proc")
    except OSError:
        return _group_exists(pgid)
    for name in names:
        if not name.isdigit() or int(name) == pgid:
            continue
        try:
            with open(f"/proc/{name}/stat", encoding="utf-8", errors="replace") as handle:
                fields = handle.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        # fields: state ppid pgrp ...; zombies hold no resources and cannot be killed further.
        if len(fields) > 2 and int(fields[2]) == pgid and fields[0] != "Z":
            return True
    return False


def run_in_own_group(
    argv: Sequence[str],
    log_path: Path,
    timeout: float,
    grace: float,
    pass_fds: Sequence[int] = (),
    stop: StopRequest | None = None,
) -> RunOutcome:
    """Run `argv` with stdout+stderr into `log_path`; kill its whole process group on timeout or on a stop signal.

    Pass an entered StopRequest to cover more than the run itself; otherwise one is installed for the run.
    """
    if stop is None:
        with StopRequest() as own_stop:
            return run_in_own_group(argv, log_path, timeout, grace, pass_fds, own_stop)
    outcome = RunOutcome()
    with open(str(log_path), "wb") as log_file:
        outcome.started_at = utc_now()
        started = time.monotonic()
        if stop.signal_name:  # told to stop before the runner even started
            outcome.interrupted_by = stop.signal_name
            outcome.ended_at = outcome.started_at
            return outcome
        try:
            process = subprocess.Popen(
                list(argv),
                stdin=subprocess.DEVNULL,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                pass_fds=tuple(pass_fds),
            )
        except OSError as exc:  # e.g. a runner built for another architecture: "Exec format error"
            outcome.spawn_error = f"cannot start the runner {argv[0]}: {exc.strerror or exc}"
            log_file.write(f"etlab-agent: {outcome.spawn_error}\n".encode())
            outcome.ended_at = utc_now()
            return outcome
        try:
            deadline = started + timeout
            while not _leader_exited(process.pid):
                if stop.signal_name:
                    outcome.interrupted_by = stop.signal_name
                    log(f"{stop.signal_name} received: stopping the runner (process group {process.pid})")
                    _kill_group(process, grace)
                    break
                if time.monotonic() >= deadline:
                    outcome.timed_out = True
                    log(f"runner exceeded its {timeout:g} s timeout: killing process group {process.pid}")
                    _kill_group(process, grace)
                    break
                time.sleep(POLL_SECONDS)
            # Anything the runner left behind in its group goes with it.
            _signal_group(process.pid, signal.SIGKILL)
        finally:
            if process.poll() is None and not _leader_exited(process.pid):
                _signal_group(process.pid, signal.SIGKILL)
            outcome.exit_code = process.wait()
        outcome.duration_s = time.monotonic() - started
        outcome.ended_at = utc_now()
        log_file.flush()
        os.fsync(log_file.fileno())
    return outcome


def run_probe(argv: Sequence[str], timeout: float) -> tuple[int, bytes, bytes] | None:
    """Run a short command (vcgencmd, `runner --version`) in its own process group; (exit, stdout, stderr) or None.

    On timeout the whole group is killed, so a hung probe leaves nothing behind.
    """
    try:
        process = subprocess.Popen(
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
    except OSError:
        return None
    try:
        stdout, stderr = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _signal_group(process.pid, signal.SIGKILL)
        process.communicate()
        return None
    finally:
        if process.poll() is None:
            _signal_group(process.pid, signal.SIGKILL)
            process.wait()
    return process.returncode, stdout, stderr
