"""A finished task's process ends at once, without the interpreter's teardown.

Tearing down ~700 imported modules and collecting their objects takes 0.1-0.25 s after the last line a
`fab deploy-and-profile` prints (measured on the 2-core bench machine, bench/README.md): time the user waits for
nothing. Once a task has finished and said how the process ends, the exit hook runs etlab's own clean-ups
(`at_exit`), shuts logging down, flushes stdout and stderr and calls os._exit with that code. Hooks registered with
atexit after the first task started (temporary folders, thread pools) run before it, as atexit runs newest first.
A process that ends any other way (an exception no task caught, `fab --list`) tears down as usual.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import sys
from collections.abc import Callable

_cleanups: list[Callable[[], None]] = []
_exit_code: int | None = None
_armed = False


def at_exit(cleanup: Callable[[], None]) -> Callable[[], None]:
    """Run `cleanup` when the process ends, however it ends (a decorator, like atexit.register)."""
    _cleanups.append(cleanup)
    _ensure_hook()
    return cleanup


def task_started() -> None:
    """A task begins: until it says how it ends, the process tears down as usual."""
    global _exit_code
    _exit_code = None
    _ensure_hook()


def task_finished(code: int) -> None:
    """The task is over and the process should end with `code` (unless another task runs after it)."""
    global _exit_code
    _exit_code = int(code)


def _ensure_hook() -> None:
    global _armed
    if not _armed:
        atexit.register(_exit_now)
        _armed = True


def _exit_now() -> None:
    for cleanup in reversed(_cleanups):
        with contextlib.suppress(Exception):
            cleanup()
    if _exit_code is None or os.environ.get("ETLAB_FULL_TEARDOWN"):
        return
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):  # e.g. a closed pipe: the exit code still says how the task went
            stream.flush()
    os._exit(_exit_code)
