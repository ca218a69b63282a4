"""Run the native runner in its own process group under a hard timeout.

On expiry (or when the agent itself is told to stop) the whole group gets SIGTERM, then SIGKILL after a grace
period, so nothing the runner spawned survives it.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Any, Callable, Sequence

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


class StartGate:
    """Holds the runner at `--start-fd` until a verdict: the runner loads and initialises the model while the agent
    verifies it, and executes nothing before the agent writes `g`. A refusal closes the pipe (the runner exits 10)
    and the runner's whole group is killed, in case it does not wait."""

    def __init__(self, decided: threading.Event, verdict: Callable[[], bool]) -> None:
        self.decided = decided  # set once verdict() can answer: True starts the runner, False refuses it
        self.verdict = verdict
        self.read_fd, self._write_fd = os.pipe()
        self._read_open = True
        self.refused = False
        self.opened_at: float | None = None  # time.monotonic() of the `g`: the runner executes from here

    @property
    def pending(self) -> bool:
        """The runner may still be waiting for the verdict."""
        return self._write_fd is not None

    def after_spawn(self) -> None:
        """The runner holds its own copy of the read end now; ours would keep the pipe open after it exits."""
        self._close_read()

    def poll(self) -> bool | None:
        """Write `g` (True) or refuse (False) once the verdict is in; None while waiting for it or once settled."""
        if self._write_fd is None or not self.decided.is_set():
            return None
        decision = bool(self.verdict())
        if decision:
            with contextlib.suppress(OSError):  # the runner is gone already (EPIPE): its exit code tells why
                os.write(self._write_fd, b"g")
                self.opened_at = time.monotonic()
        else:
            self.refused = True
        self.close()
        return decision

    def close(self) -> None:
        """EOF at the runner's end: a runner still waiting exits 10 without running anything."""
        self._close_read()
        if self._write_fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._write_fd)
            self._write_fd = None

    def _close_read(self) -> None:
        if self._read_open:
            self._read_open = False
            with contextlib.suppress(OSError):
                os.close(self.read_fd)


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


def _watch_exit(pid: int) -> threading.Event:
    """Set once the leader has exited (not reaped, as in _leader_exited), so the wait loop wakes at once instead of
    at its next poll."""
    exited = threading.Event()

    def watch() -> None:
        with contextlib.suppress(OSError):  # ChildProcessError: already reaped
            os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)
        exited.set()

    threading.Thread(target=watch, name="etlab-runner-exit", daemon=True).start()
    return exited


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
    gate: StartGate | None = None,
    while_held: Callable[[], None] | None = None,
) -> RunOutcome:
    """Run `argv` with stdout+stderr into `log_path`; kill its whole process group on timeout or on a stop signal.

    Pass an entered StopRequest to cover more than the run itself; otherwise one is installed for the run. With a
    `gate` (its read end is passed to the runner), the runner is released when the gate decides to, and its whole
    group is killed when the gate refuses it. The gate is closed when this returns. `while_held` runs once the runner
    has started and before the gate is looked at, so it finishes before the runner executes anything; if it raises,
    the runner's group is killed and the error propagates.
    """
    if stop is None:
        with StopRequest() as own_stop:
            return run_in_own_group(argv, log_path, timeout, grace, pass_fds, own_stop, gate, while_held)
    if gate is None:
        return _run_in_own_group(argv, log_path, timeout, grace, pass_fds, stop, None, None)
    try:
        return _run_in_own_group(argv, log_path, timeout, grace, (*pass_fds, gate.read_fd), stop, gate, while_held)
    finally:
        gate.close()


def _run_in_own_group(
    argv: Sequence[str],
    log_path: Path,
    timeout: float,
    grace: float,
    pass_fds: Sequence[int],
    stop: StopRequest,
    gate: StartGate | None,
    while_held: Callable[[], None] | None,
) -> RunOutcome:
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
        if gate is not None:
            gate.after_spawn()
        exited = _watch_exit(process.pid)
        try:
            if while_held is not None:
                while_held()
            deadline = started + timeout
            while not _leader_exited(process.pid):
                if gate is not None and gate.poll() is False:
                    log(f"refusing to start the runner: stopping process group {process.pid}")
                    _kill_group(process, grace)
                    break
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
                # Wake at once for what comes next: the verdict while the runner waits for it, else the exit.
                (gate.decided if gate is not None and gate.pending else exited).wait(POLL_SECONDS)
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


def pass_verdict(outcome: RunOutcome, wrote: bool, log_name: str) -> tuple[bool, str | None]:
    """A runner pass after the timing pass (counters, numerics): ok when it exited 0 in time and wrote its file;
    else why not, naming its log."""
    ok = outcome.exit_code == 0 and wrote and not outcome.timed_out
    if ok:
        return True, None
    if outcome.timed_out:
        return False, "timed out"
    return False, outcome.spawn_error or f"runner exited with code {outcome.exit_code}; see {log_name}"


def without_options(argv: list[str], options: set[str]) -> list[str]:
    """`argv` less each of `options` and the value after it (a later pass's command line from the timing pass's)."""
    kept: list[str] = []
    skip = False
    for word in argv:
        if skip:
            skip = False
        elif word in options:
            skip = True
        else:
            kept.append(word)
    return kept
