"""Commands run as local subprocesses with streamed stdin/stdout: the local board, and OpenSSH's `ssh` client."""

from __future__ import annotations

import contextlib
import fcntl
import functools
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import IO

from orchestrator.errors import BoardError, UsageError
from orchestrator.transport.base import CommandResult, Drain, WriteStream, overflow

_PIPE_SIZE = 1 << 20  # larger pipes: fewer wake-ups per MiB between etlab and its subprocesses
_F_SETPIPE_SZ = getattr(fcntl, "F_SETPIPE_SZ", 1031)


@functools.cache
def openssh_client() -> str | None:
    """The path of OpenSSH's `ssh` client, if installed."""
    return shutil.which("ssh")


def openssh_path(path: Path) -> str:
    """A path as an ssh option value: `%` escaped (ssh expands %-tokens), quoted if it has blanks."""
    text = str(Path(path).absolute()).replace("%", "%%")
    if '"' in text:
        raise UsageError(f"{path}: OpenSSH cannot be given a path with a double quote in it")
    return f'"{text}"' if any(c.isspace() for c in text) else text


# Judges a command run as a subprocess once it ended (or stopped early): the error to raise, or None.
# `check` is False when the caller looks at a non-zero exit itself.
Judge = Callable[[CommandResult, bool], "BoardError | None"]


def _exited_with_error(process: subprocess.Popen[bytes], wait: float = 2.0) -> bool:
    try:
        return process.wait(timeout=wait) != 0
    except subprocess.TimeoutExpired:
        return False


def _spawn(argv: Sequence[str], *, stdin: bool) -> subprocess.Popen[bytes]:
    # Unbuffered: a buffered reader turns read(1 MiB) into many small reads plus copies (measured 1.5x slower).
    process = subprocess.Popen(
        list(argv),
        stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        bufsize=0,
    )
    for pipe in (process.stdin, process.stdout):
        if pipe is not None:
            with contextlib.suppress(OSError):  # beyond /proc/sys/fs/pipe-max-size: keep the default
                fcntl.fcntl(pipe.fileno(), _F_SETPIPE_SZ, _PIPE_SIZE)
    return process


def _stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.kill()
        process.wait()
    for pipe in (process.stdin, process.stdout, process.stderr):
        if pipe is not None:
            with contextlib.suppress(OSError):
                pipe.close()


@contextlib.contextmanager
def subprocess_read_stream(argv: Sequence[str], process_argv: Sequence[str], judge: Judge) -> Iterator[IO[bytes]]:
    """Stream the stdout of `process_argv` (which runs `argv`, the command named in messages)."""
    started = time.monotonic()
    process = _spawn(process_argv, stdin=False)
    assert process.stdout is not None and process.stderr is not None
    stderr = Drain(process.stderr.read, 1 << 16, stream="stderr", on_overflow=process.kill)
    stderr.start()
    try:
        try:
            yield process.stdout
        except Exception as exc:
            # If the command failed, that is the story; if it is still writing, the reader's error is.
            if _exited_with_error(process):
                stderr.join()
                early = CommandResult(tuple(argv), process.returncode, "", stderr.text(), 0.0, overflow([stderr]))
                error = judge(early, True)
                if error is not None:
                    raise error from exc
            raise
        while process.stdout.read(_PIPE_SIZE):  # the reader may stop before EOF (e.g. at tar's end blocks)
            pass
        process.wait()
        stderr.join()
        duration = time.monotonic() - started
        error = judge(
            CommandResult(tuple(argv), process.returncode, "", stderr.text(), duration, overflow([stderr])), True
        )
        if error is not None:
            raise error
    finally:
        _stop(process)


class _PipeWriter(WriteStream):
    def __init__(self, process: subprocess.Popen[bytes], stdout: Drain) -> None:
        self.process = process
        self._stdout = stdout

    def write(self, data: bytes) -> int:
        assert self.process.stdin is not None
        view = memoryview(data)
        try:
            while view:
                view = view[self.process.stdin.write(view) or 0 :]
        except BrokenPipeError as exc:
            raise BoardError(f"the receiving command stopped early: {exc}") from exc
        return len(data)


@contextlib.contextmanager
def subprocess_write_stream(
    argv: Sequence[str], process_argv: Sequence[str], judge: Judge, *, check: bool
) -> Iterator[WriteStream]:
    """Feed the stdin of `process_argv` (which runs `argv`, the command named in messages)."""
    started = time.monotonic()
    process = _spawn(process_argv, stdin=True)
    assert process.stdin is not None and process.stdout is not None and process.stderr is not None
    drains = [
        Drain(process.stdout.read, 1 << 16, stream="stdout", on_overflow=process.kill),
        Drain(process.stderr.read, 1 << 16, stream="stderr", on_overflow=process.kill),
    ]
    for drain in drains:
        drain.start()
    writer = _PipeWriter(process, drains[0])
    try:
        try:
            yield writer
        except BoardError as exc:
            if _exited_with_error(process):  # the command quit early: its stderr says why
                for drain in drains:
                    drain.join()
                early = CommandResult(
                    tuple(argv), process.returncode, drains[0].text(), drains[1].text(), 0.0, overflow(drains)
                )
                error = judge(early, True)
                if error is not None:
                    raise error from exc
            raise
        finally:
            with contextlib.suppress(BrokenPipeError):
                process.stdin.close()
        process.wait()
        for drain in drains:
            drain.join()
        writer.result = CommandResult(
            tuple(argv),
            process.returncode,
            drains[0].text(),
            drains[1].text(),
            time.monotonic() - started,
            overflow(drains),
        )
        error = judge(writer.result, check)
        if error is not None:
            raise error
    finally:
        _stop(process)
