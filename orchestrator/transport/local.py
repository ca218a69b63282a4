"""The workstation as a board: the same interface as SSH, run with subprocesses."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO

from orchestrator.transport.base import (
    BoardConnection,
    CommandResult,
    CommandTimeout,
    WriteStream,
    describe_command,
    env_argv,
)
from orchestrator.transport.pipes import Judge, subprocess_read_stream, subprocess_write_stream


class LocalConnection(BoardConnection):
    """The workstation as a board: the same interface, run with subprocesses."""

    shares_filesystem = True

    def _env(self, env: Mapping[str, str] | None) -> dict[str, str] | None:
        env_argv(env)  # validates names
        return {**os.environ, **env} if env else None

    def run(
        self,
        argv: Sequence[str],
        *,
        timeout: float | None = None,
        check: bool = True,
        env: Mapping[str, str] | None = None,
    ) -> CommandResult:
        timeout = timeout if timeout is not None else self.board.command_timeout
        started = time.monotonic()
        try:
            process = subprocess.Popen(
                list(argv),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                env=self._env(env),
                start_new_session=True,  # so a timeout stops the whole process group
            )
        except OSError as exc:
            result = CommandResult(tuple(argv), 127, "", f"{argv[0]}: {exc.strerror}", time.monotonic() - started)
        else:
            try:
                stdout, stderr = process.communicate(timeout=timeout)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
                process.communicate()
                raise CommandTimeout(
                    f"board {self.board.name!r}: `{describe_command(argv)}` did not finish within "
                    f"{timeout:g} s and was stopped"
                ) from None
            except BaseException:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
                process.wait()
                raise
            result = CommandResult(
                tuple(argv),
                process.returncode,
                stdout.decode("utf-8", errors="replace"),
                stderr.decode("utf-8", errors="replace"),
                time.monotonic() - started,
            )
        if check and not result.ok:
            raise self._failed(argv, result)
        return result

    def _judge(self, argv: Sequence[str]) -> Judge:
        return lambda result, check: self._failed(argv, result) if check and not result.ok else None

    def open_read_stream(
        self, argv: Sequence[str], *, bulk: bool = False
    ) -> contextlib.AbstractContextManager[IO[bytes]]:
        return subprocess_read_stream(argv, argv, self._judge(argv))

    def open_write_stream(
        self, argv: Sequence[str], *, check: bool = True, bulk: bool = False
    ) -> contextlib.AbstractContextManager[WriteStream]:
        return subprocess_write_stream(argv, argv, self._judge(argv), check=check)

    def _home_dir(self) -> str:
        return str(Path.home())
