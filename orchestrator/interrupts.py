"""Ctrl+C and SIGTERM: what runs on boards when etlab is interrupted is stopped, not left holding them.

A KeyboardInterrupt reaches only the main thread, while boards' commands run in fan-out threads. Work that can be
stopped from outside (a command on a board) registers a stopper with `stoppable()`; `interrupt()`, called where
the main thread catches the interrupt, runs every stopper and makes new stoppable work fail at once.
"""

from __future__ import annotations

import _thread
import atexit
import contextlib
import itertools
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any

from orchestrator.errors import EtlabError, ExitCode

_REDELIVER_SECONDS = 0.05  # a swallowed KeyboardInterrupt comes again this much later (no_lost_interrupts)
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


def caused_by_interrupt(exc: BaseException) -> bool:
    """Whether `exc` stands for an interrupt: a KeyboardInterrupt, or an error it caused (Python turns one raised
    in some places, e.g. a class body's __set_name__, into a RuntimeError whose cause it is)."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        if isinstance(current, KeyboardInterrupt | Interrupted):
            return True
        if type(current) in (RuntimeError, Exception) and "KeyboardInterrupt" in str(current):
            return True  # torch's C++ turned one into a RuntimeError by name, without its chain
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return False


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


@contextlib.contextmanager
def no_lost_interrupts() -> Iterator[None]:
    """Within the block, a KeyboardInterrupt that Python swallows (raised while a __del__ or a weakref callback
    runs, which only prints "Exception ignored ... KeyboardInterrupt" and goes on) is delivered again to the main
    thread, where it stops etlab: Ctrl+C in the middle of a lowering must neither print a traceback nor be lost."""
    previous = sys.unraisablehook
    lock = threading.Lock()
    timers: list[threading.Timer] = []
    closed = False

    def deliver() -> None:
        with lock:
            if not closed:
                _thread.interrupt_main()

    def hook(unraisable: Any) -> None:
        if isinstance(unraisable.exc_value, KeyboardInterrupt):
            # As if Ctrl+C came again, a moment later (raised here, it would be swallowed again). Should it land
            # in a finalizer once more, this hook sends it on again.
            timer = threading.Timer(_REDELIVER_SECONDS, deliver)
            timer.daemon = True
            with lock:
                timers.append(timer)
            timer.start()
            return
        previous(unraisable)

    sys.unraisablehook = hook
    try:
        yield
    finally:
        sys.unraisablehook = previous
        with lock:
            closed = True
            for timer in timers:
                timer.cancel()


def stay_quiet() -> None:
    """The process is ending on an interrupt (exit 130): a further SIGINT or SIGTERM (a second Ctrl+C, one that
    `no_lost_interrupts` delivers again late) is ignored while the boards are stopped; `deaf_until_exit` then keeps
    it so to the end."""
    if threading.current_thread() is threading.main_thread():
        for number in (signal.SIGINT, signal.SIGTERM):
            signal.signal(number, _ignore)


def deaf_until_exit() -> None:
    """The last step of an interrupted task: SIGINT and SIGTERM ignored by the kernel until the process is gone.
    The interpreter's finalization puts a Python-level handler back to the default, and a signal landing then ended
    the process by the signal itself (status -2, seen under load) instead of 130; SIG_IGN it leaves alone. Set only
    now: a child started while the boards were being stopped would inherit SIG_IGN."""
    if threading.current_thread() is threading.main_thread():
        for number in (signal.SIGINT, signal.SIGTERM):
            signal.signal(number, signal.SIG_IGN)
        if _fab_process():  # never a process that only called a task (a test run in pytest)
            atexit.register(_end_interrupted)


def _fab_process() -> bool:
    """Whether this process is `fab` itself (`python -m fabric`, or its console script)."""
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    return getattr(spec, "name", None) == "fabric.__main__" or os.path.basename(sys.argv[0]) == "fab"


def _end_interrupted() -> None:
    """Registered last, so it runs first at exit: an interrupted task ends with 130 whatever the rest of the
    shutdown does. When a KeyboardInterrupt reached the top level while the exit unwound, Python puts SIGINT's default
    action back and sends it to itself after finalizing (status -2, seen in CI once "interrupted" was printed), which
    SIG_IGN cannot stop. The workers and boards were stopped before: nothing is left for the skipped handlers."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(ExitCode.INTERRUPTED)


def _ignore(signum: int, frame: Any) -> None:
    pass  # a Python-level handler, not SIG_IGN: processes started meanwhile keep the default behaviour
