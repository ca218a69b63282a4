"""The workstation as a board: the same interface as SSH, run with subprocesses."""

from __future__ import annotations

import contextlib
import io
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO

from orchestrator.boards.inventory import Board
from orchestrator.transport.base import (
    BoardConnection,
    CommandResult,
    CommandTimeout,
    Drain,
    WriteStream,
    describe_command,
    env_argv,
    overflow,
)
from orchestrator.transport.pipes import Judge, subprocess_read_stream, subprocess_write_stream
from orchestrator.transport.stopper import STOP_TOKEN_ENV
from orchestrator.transport.stopper import stop as stop_marked


def _local(argv: Sequence[str]) -> list[str]:
    """On the workstation, a board's `python3` (also after `env NAME=value ...`) is the interpreter etlab runs on:
    found once, not looked up on PATH at every start (where a pyenv shim alone costs 0.1 s)."""
    argv = list(argv)
    program = 0
    if argv and argv[0] == "env":
        program = 1
        while program < len(argv) and "=" in argv[program] and not argv[program].startswith("-"):
            program += 1
    if program < len(argv) and argv[program] == "python3":
        argv[program] = sys.executable
    return argv


def _marked(token: str, argv: Sequence[str]) -> list[str]:
    """argv run with its stop token in its environment, for stop_processes()."""
    return [*env_argv({STOP_TOKEN_ENV: token}), *_local(argv)]


class LocalConnection(BoardConnection):
    """The workstation as a board: the same interface, run with subprocesses."""

    shares_filesystem = True

    def _env(self, env: Mapping[str, str] | None) -> dict[str, str] | None:
        env_argv(env)  # validates names
        return {**os.environ, **env} if env else None

    def _run(
        self,
        argv: Sequence[str],
        *,
        timeout: float | None,
        check: bool,
        env: Mapping[str, str] | None,
        token: str,
    ) -> CommandResult:
        timeout = timeout if timeout is not None else self.board.command_timeout
        started = time.monotonic()
        try:
            process = subprocess.Popen(
                _local(argv),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                env=self._env({**(env or {}), STOP_TOKEN_ENV: token}),
                start_new_session=True,  # so a timeout stops the whole process group
            )
        except OSError as exc:
            result = CommandResult(tuple(argv), 127, "", f"{argv[0]}: {exc.strerror}", time.monotonic() - started)
        else:
            # PIPE with the default buffering: buffered readers, whose read1 returns what is there
            assert isinstance(process.stdout, io.BufferedReader) and isinstance(process.stderr, io.BufferedReader)

            def stop() -> None:  # too much output: the whole process group goes, and what left it
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
                stop_marked(token)  # e.g. a runner in a session of its own, which holds the pipes open

            # Not communicate(): it keeps all the output, however much the command prints.
            drains = [
                Drain(process.stdout.read1, 1 << 16, stream="stdout", on_overflow=stop),
                Drain(process.stderr.read1, 1 << 16, stream="stderr", on_overflow=stop),
            ]
            for drain in drains:
                drain.start()
            try:
                # The output ends when the last process holding it does. Waiting for it first wakes at the exit,
                # where Popen.wait(timeout) polls (every 50 ms after a while: that much later for a long command).
                for drain in drains:
                    drain.join(None if timeout is None else max(0.0, started + timeout - time.monotonic()))
                if any(drain.is_alive() for drain in drains):
                    raise subprocess.TimeoutExpired(list(argv), timeout or 0.0)
                process.wait(timeout=None if timeout is None else max(0.0, started + timeout - time.monotonic()))
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
                process.wait()
                raise CommandTimeout(
                    f"board {self.board.name!r}: `{describe_command(argv)}` did not finish within "
                    f"{timeout:g} s and was stopped"
                ) from None
            except BaseException:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
                process.wait()
                raise
            for pipe in (process.stdout, process.stderr):
                pipe.close()
            duration = time.monotonic() - started
            result = CommandResult(
                tuple(argv), process.returncode, drains[0].text(), drains[1].text(), duration, overflow(drains)
            )
        error = self._judged(argv, result, check)
        if error is not None:
            raise error
        return result

    def stop_processes(self, token: str) -> None:
        stop_marked(token)  # in-process: the board's processes are this machine's

    def _judge(self, argv: Sequence[str]) -> Judge:
        return lambda result, check: self._judged(argv, result, check)

    def _open_read_stream(
        self, argv: Sequence[str], *, bulk: bool, token: str
    ) -> contextlib.AbstractContextManager[IO[bytes]]:
        return subprocess_read_stream(argv, _marked(token, argv), self._judge(argv))

    def _open_write_stream(
        self, argv: Sequence[str], *, check: bool, bulk: bool, token: str
    ) -> contextlib.AbstractContextManager[WriteStream]:
        return subprocess_write_stream(argv, _marked(token, argv), self._judge(argv), check=check)

    def _home_dir(self) -> str:
        return str(Path.home())


def open_local(board: Board, *, known_hosts: Path | None = None) -> LocalConnection:
    """The opener of transport `local` (boards/transports.py): the workstation needs no connecting; no host keys."""
    del known_hosts
    return LocalConnection(board)
