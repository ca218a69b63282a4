"""Lowering several variants at once: spawned workers and the main process share one queue of variants.

The workers start on the quantized variants as soon as the main process has loaded the model and written the
reference inputs and outputs (all a quantized variant needs: it is lowered from the eager model, which each worker
rebuilds), so they run while the main process exports. The main process lowers the variants that come from the
exported program itself, from the program in memory, and then takes whatever is still waiting. Workers take a
variant of the exported program only once the `.pt2` is saved. A variant starts only when the expected peaks of
everything running, the main process included, fit in the available memory: never swap.

Nothing here imports torch; the callables that lower come from lower.py.
"""

from __future__ import annotations

import contextlib
import dataclasses
import multiprocessing.context
import signal
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

from orchestrator import console
from orchestrator.lowering.sidecar import Sidecar
from orchestrator.lowering.spec import ModelSpec
from orchestrator.lowering.variants import Variant

_POLL_SECONDS = 0.2  # how often a blocked scheduler looks again (memory, or the .pt2 not saved yet)


def _leave_interrupts_to_the_parent() -> None:
    """In a worker: ignore Ctrl+C, which the terminal sends to every process of the job. The parent stops the
    workers (__exit__) and says so in one line, instead of each worker printing its KeyboardInterrupt traceback.
    Until now SIGINT was blocked (_QuietSpawnProcess): one that came meanwhile is dropped as it becomes ignored."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


class _QuietSpawnProcess(multiprocessing.context.SpawnProcess):
    """A spawned worker born with SIGINT blocked (a signal mask survives fork and exec), so a Ctrl+C while it
    starts, before its initializer ignores SIGINT, cannot print a traceback from its bootstrap either."""

    def start(self) -> None:
        previous = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})  # this thread only, while it spawns
        try:
            super().start()
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, previous)


class _QuietSpawnContext(multiprocessing.context.SpawnContext):
    Process = _QuietSpawnProcess


@dataclass(frozen=True)
class VariantTask:
    """One variant to lower, with everything a worker process needs (picklable)."""

    spec: ModelSpec
    variant: Variant
    weights: str  # resolved: pretrained or random
    weights_note: str
    parameters: int
    files: dict[str, dict[str, Any]]  # the shared files its sidecar vouches for (the .pt2 once it is saved)
    inputs: list[dict[str, Any]]
    outputs: list[dict[str, Any]]
    root: Path
    etrecord: bool
    key: str
    calibration: str | None
    peak_bytes: int  # what this variant is expected to need, for the memory check
    expected_seconds: float  # for the order: the longest variants start first
    rewrites: tuple[str, ...] = ()  # the rewrites (rewrites/) applied to the model, applied again on a reload
    generation: dict[str, Any] | None = None  # text-generation: the sidecar's `generation` record

    @property
    def needs_program(self) -> bool:
        """Lowered from the exported program (fp32), not from the eager model (quantized)."""
        return not self.variant.quantized


def with_program(task: VariantTask, record: dict[str, Any]) -> VariantTask:
    """`task` with the saved .pt2's file record among the files its sidecar vouches for, if it is lowered from it."""
    if not task.needs_program:
        return task  # quantized variants are lowered from the eager model: the .pt2 is not their source
    return dataclasses.replace(task, files={"exported_program": record, **task.files})


class ParallelLowering:
    """Up to `workers` spawned workers plus the main process lowering `tasks`; a context manager.

    On any exception (Ctrl+C included) leaving the block, the workers are terminated at once: a variant whose
    worker did not finish has no sidecar and stays invalid, and every finished one keeps its valid sidecar.
    """

    def __init__(
        self,
        tasks: list[VariantTask],
        workers: int,
        *,
        worker: Callable[[VariantTask], Sidecar],
        main_peak: int,
        budget: int | None,
        timer: console.StageTimer,
    ) -> None:
        # Longest first: the last variant to start is then a short one, which shortens the critical path.
        self.pending = sorted(tasks, key=lambda task: -task.expected_seconds)
        self.workers = workers
        self.worker = worker
        self.main_reserved = main_peak  # the main process holds the model and lowers too
        self.budget = budget
        self.timer = timer
        self.done: dict[Variant, Sidecar] = {}
        self.total = len(tasks)
        self.program_record: dict[str, Any] | None = None  # the .pt2's file record, once saved
        self._lock = threading.Lock()
        self._running: dict[Future, VariantTask] = {}
        self._started: dict[Variant, float] = {}
        self._stopped = False
        self._error: BaseException | None = None
        self._pool: ProcessPoolExecutor | None = None
        self._feeder: threading.Thread | None = None
        self._began = time.perf_counter()

    def __enter__(self) -> ParallelLowering:
        self._began = time.perf_counter()
        names = ", ".join(task.variant.name for task in self.pending)
        name = self.pending[0].spec.name
        console.info(
            f"[cyan]▸[/] {console.escape(name)}: lowering {names} in this process and up to {self.workers} "
            f"worker process{'es' if self.workers > 1 else ''}"
        )
        # One process per variant: its peak RSS is its own, and memory goes back to the system when it ends.
        if sys.version_info >= (3, 11):
            self._pool = ProcessPoolExecutor(
                max_workers=self.workers,
                mp_context=_QuietSpawnContext(),
                max_tasks_per_child=1,
                initializer=_leave_interrupts_to_the_parent,
            )
        else:  # Python 3.10 has no max_tasks_per_child: a worker lowers the variants it is given, one after another
            self._pool = ProcessPoolExecutor(
                max_workers=self.workers,
                mp_context=_QuietSpawnContext(),
                initializer=_leave_interrupts_to_the_parent,
            )
        self._feeder = threading.Thread(target=self._feed, name="lowering-feeder", daemon=True)
        self._feeder.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, traceback: TracebackType | None
    ) -> None:
        with self._lock:
            self._stopped = True
            running = list(self._running)
        assert self._pool is not None
        if error is not None:
            # Ctrl+C or a failed variant: stop the workers now rather than let the pool's exit wait for them.
            for future in running:
                future.cancel()
            for process in list(getattr(self._pool, "_processes", {}).values()):  # the executor has no public kill
                with contextlib.suppress(OSError):
                    process.terminate()
        self._pool.shutdown(wait=True, cancel_futures=True)

    # ----------------------------------------------------------------------------------------------------------
    # The main process's side

    def program_saved(self, record: dict[str, Any]) -> None:
        """The `.pt2` is on disk: its record goes into the sidecars of the variants lowered from it."""
        with self._lock:
            self.program_record = record
            self.pending = [with_program(task, record) for task in self.pending]

    def run_main(self, lower_here: Callable[[VariantTask], Sidecar]) -> dict[Variant, Sidecar]:
        """Lower in this process what is left (the exported program's variants first), then wait for the workers."""
        while True:
            self._raise_worker_error()
            with self._lock:
                task = self._claim(main=True)
                if task is None and not self.pending:
                    break
            if task is None:
                time.sleep(_POLL_SECONDS)  # waiting for memory: a worker will finish
                continue
            started = self._announce(task, "this process")
            sidecar = lower_here(task)
            self._finished(task, sidecar, started)
        while self._feeder is not None and self._feeder.is_alive():
            self._feeder.join(timeout=_POLL_SECONDS)  # a timed join: Ctrl+C still reaches this thread
        self._raise_worker_error()
        self.timer.durations["lower variants (parallel)"] = time.perf_counter() - self._began
        return self.done

    def _raise_worker_error(self) -> None:
        if self._error is not None:
            raise self._error  # a failed variant fails the lowering; finished ones stay valid

    # ----------------------------------------------------------------------------------------------------------
    # Scheduling (under the lock)

    def _claim(self, *, main: bool) -> VariantTask | None:
        """The next variant this process (`main`) or a new worker may start now, removed from the queue."""
        if self._stopped:
            return None
        ready = [task for task in self.pending if not task.needs_program or self.program_record is not None]
        if main:
            # The exported program's variants first: this process holds the program in memory.
            ready.sort(key=lambda task: not task.needs_program)
        else:
            ready.sort(key=lambda task: task.needs_program)
        in_use = sum(t.peak_bytes for t in self._running.values())
        for task in ready:
            # This process keeps what it reserved (the model, the program) and grows to the largest variant it lowers.
            own = max(self.main_reserved, task.peak_bytes) if main else self.main_reserved
            if self.budget is None or in_use + own + (0 if main else task.peak_bytes) <= self.budget:
                return self._take(task, own if main else None)
        if not ready or not main or self._running:
            return None  # wait for a worker to finish (or for this process to take it) rather than swap
        task = ready[0]
        console.warn(
            f"{task.spec.name}: {task.variant} may need {task.peak_bytes / 1e9:.1f} GB, "
            f"{(self.budget or 0) / 1e9:.1f} GB is available; lowering it alone"
        )
        return self._take(task, max(self.main_reserved, task.peak_bytes))

    def _take(self, task: VariantTask, main_reserved: int | None) -> VariantTask:
        if main_reserved is not None:
            self.main_reserved = main_reserved
        self.pending.remove(task)
        return task

    def _announce(self, task: VariantTask, where: str) -> float:
        started = time.perf_counter()
        self._started[task.variant] = started
        console.detail(
            f"  [cyan]▸[/] {console.escape(task.spec.name)}: {task.variant} started in {where} "
            f"[dim](expects {task.peak_bytes / 1e9:.1f} GB)[/]"
        )
        return started

    def _finished(self, task: VariantTask, sidecar: Sidecar, started: float) -> None:
        seconds = time.perf_counter() - started
        with self._lock:
            self.done[task.variant] = sidecar
            count = len(self.done)
        self.timer.durations[f"{task.variant}: lower"] = seconds
        peak = sidecar.lowering.peak_rss_bytes
        console.info(
            f"  [green]✓[/] {console.escape(task.spec.name)}: {task.variant} done "
            f"[dim]{console.format_seconds(seconds)}, peak {peak / 1e9:.2f} GB[/] ({count}/{self.total})"
        )

    # ----------------------------------------------------------------------------------------------------------
    # The feeder thread: hands variants to workers as slots, memory and the .pt2 allow

    def _feed(self) -> None:
        try:
            while True:
                with self._lock:
                    while not self._stopped and len(self._running) < self.workers:
                        task = self._claim(main=False)
                        if task is None:
                            break
                        assert self._pool is not None
                        future = self._pool.submit(self.worker, task)
                        self._running[future] = task
                        self._announce(task, "a worker")
                    if self._stopped or (not self._running and not self.pending):
                        return
                    running = list(self._running)
                if not running:
                    time.sleep(_POLL_SECONDS)
                    continue
                finished, _ = wait(running, timeout=_POLL_SECONDS, return_when=FIRST_COMPLETED)
                for future in finished:
                    with self._lock:
                        task = self._running.pop(future)
                    self._finished(task, future.result(), self._started[task.variant])
        except BaseException as exc:  # a failed worker: the main thread raises it
            with self._lock:
                self._error = exc
                self._stopped = True
