"""Errors the agent reports as JSON; each carries the exit code the workstation acts on."""

from __future__ import annotations

from typing import Any


class ExitCode:
    OK = 0
    FAILED = 1  # the operation failed (e.g. the runner failed; its bundle is still written)
    USAGE = 2  # bad command line or input
    LOCK_TIMEOUT = 3  # the board lock stayed busy for --lock-timeout seconds
    NOT_PROVISIONED = 4  # no state.json / runner: provision the board first


class AgentError(Exception):
    """A failure with a message meant for the user; `details` are merged into the JSON answer."""

    exit_code = ExitCode.FAILED

    def __init__(self, message: str, **details: Any) -> None:
        super().__init__(message)
        self.details = details


class BadInput(AgentError):
    exit_code = ExitCode.USAGE


class LockTimeout(AgentError):
    exit_code = ExitCode.LOCK_TIMEOUT


class NotProvisioned(AgentError):
    exit_code = ExitCode.NOT_PROVISIONED
