"""Errors users see. Each carries the process exit code it maps to, so exit codes mean something."""

from __future__ import annotations

from collections.abc import Iterable


class ExitCode:
    OK = 0
    FAILED = 1  # the job ran and something failed (a board, a regression)
    INFRA = 2  # infrastructure failure (nightly)
    USAGE = 64  # bad command line or input file (sysexits EX_USAGE)
    DATA = 65  # bad data: corrupt bundle, ETDump, spec (EX_DATAERR)
    UNAVAILABLE = 69  # board unreachable (EX_UNAVAILABLE)
    TEMPFAIL = 75  # busy, try again later: another nightly holds the night, the history stays locked (EX_TEMPFAIL)
    SOFTWARE = 70  # internal error (EX_SOFTWARE)
    INTERRUPTED = 130


class EtlabError(Exception):
    """An error with a message meant for the user: no traceback is shown for these."""

    exit_code: int = ExitCode.FAILED

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        super().__init__(message)
        self.hint = hint

    def __str__(self) -> str:
        base = super().__str__()
        return f"{base}\n  hint: {self.hint}" if self.hint else base


class UsageError(EtlabError):
    exit_code = ExitCode.USAGE


class SpecError(UsageError):
    """A model spec (built-in name or user file) is unknown or malformed."""


class InventoryError(UsageError):
    """inventory.yaml is malformed; the message names the file, line and field."""


class ArtifactError(EtlabError):
    """Lowered artifacts are missing or stale."""

    exit_code = ExitCode.DATA


class BoardError(EtlabError):
    """A board failed: unreachable, provisioning failed, or a command on it failed."""

    exit_code = ExitCode.UNAVAILABLE


class BoardSetupError(BoardError):
    """The board lacks what etlab needs (a compiler, glibc, disk space): it answered, but cannot be set up."""

    exit_code = ExitCode.FAILED


class BoardDataError(BoardError):
    """A board answered, but with something malformed (agent output, facts): bad data, not an unreachable board."""

    exit_code = ExitCode.DATA


class HostKeyError(BoardError):
    """A board presented a host key that differs from the pinned one."""


class TransferError(BoardError):
    """A push or pull failed or could not be verified."""


class BundleError(EtlabError):
    """A result bundle is incomplete, corrupt or hostile."""

    exit_code = ExitCode.DATA


class AnalysisError(EtlabError):
    """Analysis of a bundle failed; the raw bundle is kept."""

    exit_code = ExitCode.DATA


def failure_code(exc: BaseException) -> int:
    """The exit code of the class of reason `exc` stands for; anything not meant for users is a bug."""
    return exc.exit_code if isinstance(exc, EtlabError) else ExitCode.SOFTWARE


def combined_exit_code(failures: Iterable[int]) -> int:
    """Fan-out rule: no failure is 0; failures all of one class exit with that class's code; mixed ones exit 1."""
    codes = set(failures)
    if not codes:
        return ExitCode.OK
    return codes.pop() if len(codes) == 1 else ExitCode.FAILED


def full_reason(exc: BaseException) -> str:
    """Every line of an error, hint included; anything not meant for users also names its type."""
    text = str(exc).strip()
    if isinstance(exc, EtlabError) and text:
        return text
    return f"{type(exc).__name__}: {text}".rstrip(": ")


def first_line(exc: BaseException) -> str:
    """An error's first line for tables and logs; errors not meant for users (bugs) also show their type."""
    text = str(exc).strip()
    line = text.splitlines()[0] if text else ""
    if isinstance(exc, EtlabError) and line:
        return line
    return f"{type(exc).__name__}: {line}" if line else type(exc).__name__
