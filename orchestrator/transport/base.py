"""How etlab talks to a board: one small interface, its errors and its streams.

Commands are argv lists, quoted with shlex.join on the way to the board's shell; environment variables travel
as an `env NAME=value ...` prefix, never as SSH env requests. Transports: `ssh.py` (Fabric/paramiko, with OpenSSH
for bulk streams) and `local.py` (the workstation as a board).
"""

from __future__ import annotations

import contextlib
import io
import posixpath
import re
import shlex
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import IO, TypeVar

from orchestrator import interrupts
from orchestrator.boards.inventory import Board
from orchestrator.errors import BoardDataError, BoardError, UsageError
from orchestrator.transport.stopper import new_token

_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")

# The most etlab keeps of one output stream (stdout or stderr) of one command. Answers are small (agent JSON,
# probes); a board sending more is stopped, so it cannot exhaust the workstation's memory.
OUTPUT_LIMIT = 4 << 20

quote = shlex.quote


class LinkError(BoardError):
    """The connection to a board could not be made or was lost. Transient: worth a retry."""


class AuthError(BoardError):
    """The board refused our credentials. Never retried."""


class CommandError(BoardError):
    """A command on the board exited non-zero."""

    def __init__(self, message: str, result: CommandResult, *, hint: str | None = None) -> None:
        super().__init__(message, hint=hint)
        self.result = result


class CommandTimeout(BoardError):
    """A command on the board ran longer than its timeout and was stopped."""


class OutputTooLarge(BoardDataError):
    """A command on the board sent more than OUTPUT_LIMIT bytes on one stream and was stopped: bad data (exit 65)."""

    def __init__(self, message: str, stream: str) -> None:
        super().__init__(message)
        self.stream = stream


def is_transient(exc: BaseException) -> bool:
    """Whether a failure is worth retrying: a lost or refused link, never auth or host key errors."""
    return isinstance(exc, LinkError)


@dataclass(frozen=True)
class CommandResult:
    argv: tuple[str, ...]
    exit_code: int
    stdout: str
    stderr: str
    duration: float
    overflow: str | None = None  # the stream ("stdout" or "stderr") that outgrew OUTPUT_LIMIT: the command was stopped

    @property
    def ok(self) -> bool:
        return self.exit_code == 0


def describe_command(argv: Sequence[str], limit: int = 160) -> str:
    text = shlex.join(argv)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def tail(text: str, lines: int = 5) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])


def env_argv(env: Mapping[str, str] | None) -> list[str]:
    if not env:
        return []
    for name in env:
        if not _ENV_NAME.fullmatch(name):
            raise UsageError(f"invalid environment variable name {name!r}")
    return ["env", *(f"{name}={value}" for name, value in env.items())]


class ReadStream(io.RawIOBase):
    """The stdout of a running command, readable as a binary file (e.g. a tar stream)."""

    def readable(self) -> bool:
        return True


class WriteStream:
    """The stdin of a running command. `result` is set once the command has exited."""

    result: CommandResult | None = None
    _stdout: Drain

    def write(self, data: bytes) -> int:
        raise NotImplementedError

    def first_line(self, timeout: float | None = None) -> str:
        """The first line the command printed (waiting for it), without its newline; "" if it printed none.

        Lets a command answer before it is fed, e.g. "have" / "send" before an upload.
        """
        return self._stdout.first_line(timeout)


class BoardConnection(ABC):
    """How etlab talks to one board. Use as a context manager; `close()` is idempotent."""

    board: Board
    # Whether the board's files are this machine's files (the local board): transfers then copy instead of
    # streaming through a command.
    shares_filesystem: bool = False

    def __init__(self, board: Board) -> None:
        self.board = board
        self._home: str | None = None

    def run(
        self,
        argv: Sequence[str],
        *,
        timeout: float | None = None,
        check: bool = True,
        env: Mapping[str, str] | None = None,
    ) -> CommandResult:
        """Run argv on the board (quoted, never concatenated). Raises CommandError on non-zero exit if `check`.

        A timeout or an interrupt stops the command and everything it started on the board (see stopping())."""
        token = new_token()
        with self.stopping(token):
            return self._run(argv, timeout=timeout, check=check, env=env, token=token)

    @abstractmethod
    def _run(
        self,
        argv: Sequence[str],
        *,
        timeout: float | None,
        check: bool,
        env: Mapping[str, str] | None,
        token: str,
    ) -> CommandResult:
        """run(), with `token` set as stopper.STOP_TOKEN_ENV in the environment of the command on the board."""

    @contextlib.contextmanager
    def stopping(self, token: str) -> Iterator[None]:
        """While a command carrying `token` runs: an interrupt (interrupts.py, from any thread) stops it on the
        board, and so does leaving the block by a timeout or a KeyboardInterrupt in this thread. The agent starts
        its runner in a session of its own, so closing the channel or killing a process group would miss it."""
        with interrupts.stoppable(lambda: self.stop_processes(token)):
            try:
                yield
            # What it started (a runner in its own session) stops too; and when this thread was interrupted.
            except (CommandTimeout, OutputTooLarge, KeyboardInterrupt, SystemExit):
                self.stop_processes(token)
                raise

    def stop_processes(self, token: str) -> None:  # noqa: B027 - a transport that cannot is left alone
        """SIGTERM every process on the board carrying `token`, SIGKILL those left after a grace period."""

    def run_shell(
        self,
        script: str,
        *,
        timeout: float | None = None,
        check: bool = True,
        env: Mapping[str, str] | None = None,
    ) -> CommandResult:
        """Run a POSIX sh script the caller built with `quote()` (pipelines, redirections)."""
        return self.run(["sh", "-c", script], timeout=timeout, check=check, env=env)

    def open_read_stream(
        self, argv: Sequence[str], *, bulk: bool = False
    ) -> contextlib.AbstractContextManager[IO[bytes]]:
        """Stream a command's stdout. Leaving the block waits for the command and raises if it failed.

        `bulk` asks for the bulk data path (see bulk_threshold()). An interrupt stops the command on the board,
        which ends the stream.
        """
        token = new_token()
        return _stopping_stream(self, token, lambda: self._open_read_stream(argv, bulk=bulk, token=token))

    def open_write_stream(
        self, argv: Sequence[str], *, check: bool = True, bulk: bool = False
    ) -> contextlib.AbstractContextManager[WriteStream]:
        """Feed a command's stdin. Leaving the block sends EOF, waits, and sets `stream.result`."""
        token = new_token()
        return _stopping_stream(self, token, lambda: self._open_write_stream(argv, check=check, bulk=bulk, token=token))

    @abstractmethod
    def _open_read_stream(
        self, argv: Sequence[str], *, bulk: bool, token: str
    ) -> contextlib.AbstractContextManager[IO[bytes]]:
        """open_read_stream(), with `token` set as stopper.STOP_TOKEN_ENV in the command's environment."""

    @abstractmethod
    def _open_write_stream(
        self, argv: Sequence[str], *, check: bool, bulk: bool, token: str
    ) -> contextlib.AbstractContextManager[WriteStream]:
        """open_write_stream(), with `token` set as stopper.STOP_TOKEN_ENV in the command's environment."""

    def bulk_threshold(self) -> int | None:
        """From how many bytes a transfer should ask for a bulk stream; None when bulk streams are no different."""
        return None

    @abstractmethod
    def _home_dir(self) -> str: ...

    def resolve_path(self, path: str) -> str:
        """An absolute path on the board: `~` and relative paths are taken from the board user's home."""
        if path.startswith("/"):
            return path
        if path.startswith("~") and not (path == "~" or path.startswith("~/")):
            raise UsageError(f"board {self.board.name!r}: only '~' and '~/...' are supported in paths, got {path!r}")
        if self._home is None:
            self._home = self._home_dir()
        rest = path[1:].lstrip("/") if path.startswith("~") else path
        return posixpath.join(self._home, rest) if rest else self._home

    @property
    def workdir(self) -> str:
        """The board's workdir as an absolute path."""
        return self.resolve_path(self.board.workdir)

    def close(self) -> None:  # noqa: B027 - optional hook
        pass

    def __enter__(self) -> BoardConnection:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def _failed(self, argv: Sequence[str], result: CommandResult) -> CommandError:
        detail = tail(result.stderr) or tail(result.stdout) or "(no output)"
        return CommandError(
            f"board {self.board.name!r}: `{describe_command(argv)}` exited {result.exit_code}: {detail}", result
        )

    def _too_much(self, argv: Sequence[str], stream: str) -> OutputTooLarge:
        return OutputTooLarge(
            f"board {self.board.name!r}: `{describe_command(argv)}` sent more than {OUTPUT_LIMIT >> 20} MiB on "
            f"{stream} and was stopped",
            stream,
        )

    def _judged(self, argv: Sequence[str], result: CommandResult, check: bool) -> BoardError | None:
        """The error a finished command stands for: too much output always, a non-zero exit if `check`."""
        if result.overflow:
            return self._too_much(argv, result.overflow)
        return self._failed(argv, result) if check and not result.ok else None


_S = TypeVar("_S")


@contextlib.contextmanager
def _stopping_stream(
    conn: BoardConnection, token: str, opener: Callable[[], contextlib.AbstractContextManager[_S]]
) -> Iterator[_S]:
    """A stream whose command is stopped on an interrupt (from any thread); opened only once registered, so an
    interrupted etlab starts no new transfer."""
    with conn.stopping(token), opener() as stream:
        yield stream


class Drain(threading.Thread):
    """Reads one output stream of a channel to the end, so a chatty command never stalls on a full window.

    It keeps at most `limit` bytes: past them it sets `overflowed`, calls `on_overflow` (which stops the command)
    and reads no more; the caller then reports the command with OutputTooLarge.
    """

    def __init__(
        self,
        recv: Callable[[int], bytes],
        chunk: int = 1 << 31,
        errors: tuple[type[BaseException], ...] = (OSError, EOFError),
        *,
        stream: str = "stdout",
        on_overflow: Callable[[], object] | None = None,
        limit: int = OUTPUT_LIMIT,
    ) -> None:
        super().__init__(daemon=True)
        self.errors = errors
        self.recv = recv
        self.chunk = chunk
        self.stream = stream
        self.on_overflow = on_overflow
        self.limit = limit
        self.overflowed = False
        self.data = bytearray()
        self.last_activity = time.monotonic()
        self._changed = threading.Condition()
        self._ended = False

    def run(self) -> None:
        try:
            with contextlib.suppress(*self.errors):
                # Never asks for more than one byte past the limit, so memory stays bounded whatever the board sends.
                while chunk := self.recv(min(self.chunk, self.limit + 1 - len(self.data))):
                    with self._changed:
                        self.data += chunk
                        self.last_activity = time.monotonic()
                        self.overflowed = len(self.data) > self.limit
                        self._changed.notify_all()
                    if self.overflowed:
                        del self.data[self.limit :]
                        if self.on_overflow is not None:
                            self.on_overflow()
                        break
        finally:
            with self._changed:
                self._ended = True
                self._changed.notify_all()

    def first_line(self, timeout: float | None = None) -> str:
        with self._changed:
            self._changed.wait_for(lambda: b"\n" in self.data or self._ended, timeout)
            end = self.data.find(b"\n")
            return self.data[:end].decode("utf-8", errors="replace") if end >= 0 else ""

    def text(self) -> str:
        return self.data.decode("utf-8", errors="replace")


def overflow(drains: Sequence[Drain]) -> str | None:
    """The stream of the first drain that outgrew its limit (its command was stopped), or None."""
    return next((drain.stream for drain in drains if drain.overflowed), None)
