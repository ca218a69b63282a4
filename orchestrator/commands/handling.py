"""A task's body run as users expect of etlab: an EtlabError becomes one clear message and its exit code, Ctrl+C and
SIGTERM stop what runs on boards and exit 130, anything else is an internal error (70) logged for the test suite.
Light on purpose: tasks.py imports it at every `fab` start."""

from __future__ import annotations

import functools
import json
import os
import sys
import traceback
from collections.abc import Callable
from typing import Any, NoReturn, TypeVar

from invoke.exceptions import Exit

from orchestrator import console, exiting, interrupts
from orchestrator.errors import EtlabError, ExitCode
from orchestrator.lowering.spec import UntrustedFactory
from orchestrator.lowering.weights import PretrainedUnavailable

F = TypeVar("F", bound=Callable[..., Any])


def _interrupted() -> NoReturn:
    said = False
    while True:
        try:
            # From here until the process ends, a further Ctrl+C or SIGTERM (a second one, or one that
            # no_lost_interrupts delivers again late) is ignored: exit 130 in one line, never a traceback, never
            # the signal's own status (-2) because one landed while the exit unwound.
            interrupts.stay_quiet()
            interrupts.interrupt()  # whatever is still running on a board for us stops too
            if not said:
                said = True
                console.error("interrupted")
            break
        except KeyboardInterrupt:
            continue  # one came before the signals were quieted
    interrupts.deaf_until_exit()
    raise Exit(code=ExitCode.INTERRUPTED) from None


def handle_errors(func: F) -> F:
    """Run a task body: EtlabError → one clear message and its exit code; an int result is the exit code."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        exiting.task_started()
        console.quiet_third_party()
        interrupts.reset()
        try:
            # SIGTERM (a cancelled CI job, `kill`) stops like Ctrl+C: boards are stopped, locks and places released.
            with interrupts.sigterm_interrupts(), interrupts.no_lost_interrupts(), console.warnings_once():
                code = func(*args, **kwargs)
        except EtlabError as exc:
            console.error(str(_naming_options(exc)))
            raise Exit(code=exc.exit_code) from None
        except KeyboardInterrupt:
            _interrupted()
        except Exit:
            raise
        except Exception as exc:
            if interrupts.caused_by_interrupt(exc):  # e.g. Python wraps one raised in __set_name__ in a RuntimeError
                _interrupted()
            if os.environ.get("ETLAB_DEBUG"):
                raise
            console.error("internal error (set ETLAB_DEBUG=1 for the full traceback):")
            console.plain(traceback.format_exc(limit=-3).rstrip())  # inert: the message may quote a board
            _log_internal_error(func.__name__, traceback.format_exc())
            raise Exit(code=ExitCode.SOFTWARE) from None
        if isinstance(code, int) and code != 0:
            if code == ExitCode.SOFTWARE:
                _log_internal_error(func.__name__, "a board's job ended in an internal error")
            raise Exit(code=code)
        return None

    return wrapper  # type: ignore[return-value]


def _naming_options(exc: EtlabError) -> EtlabError:
    """A library error with the option that mends it, which the library does not name."""
    if isinstance(exc, PretrainedUnavailable):
        exc.hint = "use --weights random to build the architecture from its config"
    elif isinstance(exc, UntrustedFactory):
        exc.hint = "pass --trust-code on the command line if you trust the factory's code"
    return exc


def _log_internal_error(task: str, detail: str) -> None:
    """Exit 70 is etlab's own bug: the test suite collects every one (ETLAB_INTERNAL_ERROR_LOG) and fails on any."""
    path = os.environ.get("ETLAB_INTERNAL_ERROR_LOG")
    if path:
        with open(path, "a", encoding="utf-8") as log:
            log.write(json.dumps({"task": task, "argv": sys.argv, "detail": detail[-4000:]}) + "\n")
