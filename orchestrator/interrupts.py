"""Ctrl+C and SIGTERM: what runs on boards when etlab is interrupted is stopped, not left holding them.

A KeyboardInterrupt reaches only the main thread, while boards' commands run in fan-out threads. Work that can be
stopped from outside (a command on a board) registers a stopper with `stoppable()`; `interrupt()`, called where
the main thread catches the interrupt, runs every stopper and makes new stoppable work fail at once.
"""

from __future__ import annotations

import contextlib
import itertools
import signal
import threading
from collections.abc import Callable, Iterator
from typing import Any

from orchestrator.errors import EtlabError, ExitCode

# How long interrupt() waits for the stoppers (each is bounded by its own grace period; this only caps a hung one).
STOP_WAIT_SECONDS = 10.0


class Interrupted(EtlabError):
    """Work refused or stopped because etlab was interrupted."""

    exit_code = ExitCode.INTERRUPTED


_lock = threading.Lock()
_stoppers: dict[int, Callable[[], None]] = {}
_ids = itertools.count()
_interrupted = threading.Event()


def check() -> None:
    """Raise Interrupted when etlab is being interrupted: start nothing new on a board."""
    if _interrupted.is_set():
        raise Interrupted("interrupted")


@contextlib.contextmanager
def stoppable(stop: Callable[[], None]) -> Iterator[None]:
    """Within the block, an interrupt calls `stop()` (from the interrupting thread); `stop` must not block long."""
    check()
    key = next(_ids)
    with _lock:
        _stoppers[key] = stop
    try:
        yield
    finally:
        with _lock:
            _stoppers.pop(key, None)


def interrupt() -> None:
    """Stop all registered work, in parallel, and refuse new stoppable work until reset()."""
    _interrupted.set()
    with _lock:
        stoppers = list(_stoppers.values())
    threads = [threading.Thread(target=_quietly, args=(stop,), daemon=True) for stop in stoppers]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(STOP_WAIT_SECONDS)


def _quietly(stop: Callable[[], None]) -> None:
    with contextlib.suppress(Exception):  # best effort: a board that cannot be reached is not stopped either way
        stop()


def reset() -> None:
    _interrupted.clear()


@contextlib.contextmanager
def sigterm_interrupts() -> Iterator[None]:
    """Within the block, SIGTERM raises KeyboardInterrupt in the main thread, as Ctrl+C does (a cancelled CI job
    or `kill` then stops boards and releases locks and places instead of dying on the spot)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def raise_interrupt(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, raise_interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
