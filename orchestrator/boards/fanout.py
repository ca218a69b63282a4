"""Fan-out: run one function per board in threads; a board that fails is recorded and never stops the others."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from orchestrator import interrupts
from orchestrator.boards import labgrid
from orchestrator.boards.inventory import Board
from orchestrator.errors import ExitCode, combined_exit_code, failure_code, first_line, full_reason

_T = TypeVar("_T")


@dataclass(frozen=True)
class BoardOutcome(Generic[_T]):
    board: Board
    ok: bool
    value: _T | None
    error: str | None  # one line for the summary table; `exception` has the whole story
    stage: str | None  # the stage the board was in when it failed, if known
    duration: float
    exception: BaseException | None = None

    @property
    def detail(self) -> str | None:
        """The whole reason (every line, hints included), for the details under the summary table."""
        return None if self.exception is None else full_reason(self.exception)


_STAGE_ATTRIBUTE = "_etlab_stage"


@contextlib.contextmanager
def stage(name: str) -> Iterator[None]:
    """Mark a stage of one board's work (e.g. "push"): an error raised inside is reported with it."""
    try:
        yield
    except Exception as exc:
        if getattr(exc, _STAGE_ATTRIBUTE, None) is None:  # the innermost stage names the failure
            with contextlib.suppress(AttributeError):
                setattr(exc, _STAGE_ATTRIBUTE, name)
        raise


def _run_one(board: Board, fn: Callable[[Board], _T], hold: bool) -> BoardOutcome[_T]:
    started = time.monotonic()
    try:
        if hold and board.labgrid is not None:
            # A labgrid place is reserved and locked for the board's whole job, and released however it ends.
            with labgrid.held(board) as resolved:
                board = resolved
                value = fn(resolved)
        else:
            value = fn(board)
    except Exception as exc:
        failed_stage = getattr(exc, _STAGE_ATTRIBUTE, None)
        if failed_stage is None and isinstance(exc, labgrid.LabgridError):
            failed_stage = "labgrid"
        return BoardOutcome(board, False, None, first_line(exc), failed_stage, time.monotonic() - started, exc)
    return BoardOutcome(board, True, value, None, None, time.monotonic() - started)


def fan_out(
    boards: Sequence[Board], fn: Callable[[Board], _T], *, max_workers: int | None = None, hold: bool = True
) -> list[BoardOutcome[_T]]:
    """Run `fn(board)` for every board in parallel threads; outcomes come back in the order of `boards`.
    With `hold`, a board that is a labgrid place runs while its place is reserved and locked (boards/labgrid.py);
    `fn` gets the board resolved through the place's NetworkService."""
    if not boards:
        return []
    workers = max_workers or min(len(boards), 32)
    places = hold and any(board.labgrid is not None for board in boards)
    pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="etlab-board")
    interrupted = False
    try:
        # SIGTERM (a cancelled CI job) stops like Ctrl+C when labgrid places are held, so they are released (every
        # fab task does so anyway: commands/handling.py; this is for other callers).
        with interrupts.sigterm_interrupts() if places else contextlib.nullcontext():
            futures = [pool.submit(_run_one, board, fn, hold) for board in boards]
            return [future.result() for future in futures]
    except BaseException:
        labgrid.interrupt()  # boards waiting for a labgrid place give up; held places are released as jobs end
        pool.shutdown(wait=False, cancel_futures=True)  # e.g. Ctrl-C: start no more boards
        # Stop what the boards run for us (agents, runners: board locks are freed) and start nothing new, so the
        # boards' threads end within seconds instead of at their commands' timeouts.
        interrupted = True
        interrupts.interrupt()
        raise
    finally:
        pool.shutdown(wait=True)
        if interrupted:  # the boards' threads have ended: new work is this process's caller's to decide
            interrupts.reset()


def exit_code(outcomes: Sequence[BoardOutcome[Any]]) -> int:
    """0 when every board succeeded; when every failed board failed for the same class of reason (unreachable,
    bad data, ...), that class's exit code; ExitCode.FAILED for a mix."""
    return combined_exit_code(
        ExitCode.FAILED if o.exception is None else failure_code(o.exception) for o in outcomes if not o.ok
    )
