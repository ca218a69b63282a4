"""The engine under deploy-and-profile and the nightly: cells (model × variant) run on one board.

Per board the cells run one after another, set up → push → run → pull → analyse; boards run in parallel. A failure is
recorded against its board, cell and stage, and never stops the other boards.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from rich.markup import escape
from rich.progress import Progress, TaskID

from orchestrator import console, prefetch
from orchestrator.boards import labgrid
from orchestrator.boards.inventory import Board
from orchestrator.console import format_seconds
from orchestrator.deploy.provision import quick_check, setup_board
from orchestrator.deploy.runs import RemoteRun, RunParams, profile, pull, push_artifact, push_numerics
from orchestrator.errors import (
    AnalysisError,
    BoardError,
    ExitCode,
    failure_code,
    first_line,
    full_reason,
)
from orchestrator.lowering.artifacts import Artifact
from orchestrator.lowering.export.numerics import NumericsProgram
from orchestrator.lowering.export.user_programs import reference_outputs_of
from orchestrator.lowering.variants import Variant
from orchestrator.results.store import new_run_id
from orchestrator.results.summary import RunSummary
from orchestrator.transport import BoardConnection, connect


@dataclass
class CellOutcome:
    """One model variant on one board."""

    board: str
    model: str
    variant: Variant
    ok: bool = False
    stage: str | None = None  # the stage that failed
    error: str | None = None
    run_id: str | None = None
    status: str | None = None  # the runner's status: ok | failed | timeout
    bundle: Path | None = None
    summary: RunSummary | None = None
    seconds: dict[str, float] = field(default_factory=dict)
    infrastructure: bool = False  # failed because the board or the link failed, not the model
    detail: str | None = None  # the whole reason (every line, hints included) when `error` is its first line
    exit_class: int = ExitCode.FAILED  # the exit code of the class of reason it failed for (see errors.py)

    @property
    def cell(self) -> tuple[str, str, str]:
        """Board, model and variant name: how the history and reports key a cell."""
        return (self.board, self.model, self.variant.name)

    @property
    def median_ms(self) -> float | None:
        return self.summary.latency.median_ms if self.summary else None

    @property
    def validity(self) -> str | None:
        return self.summary.validity.status if self.summary else None


def is_link_trouble(exc: BaseException | None) -> bool:
    """The board or the link failed (unreachable, lost link, transfer, no labgrid place): infrastructure, exit 69.

    A board that answered with malformed data (65) or cannot be set up (1) is not: it fails for its own reason."""
    if isinstance(exc, BoardError):
        return exc.exit_code == ExitCode.UNAVAILABLE
    return isinstance(exc, OSError | EOFError)


def exit_class(exc: BaseException) -> int:
    """The exit code of the class of reason a board or cell failed for: link trouble is 69 (a raw OSError too)."""
    return ExitCode.UNAVAILABLE if is_link_trouble(exc) else failure_code(exc)


class CellRows:
    """A board's cells in a live display (console.steps_progress): a row each, saying its step and time. Without a
    live display (stderr not a terminal), each finished cell is one line with its steps' times."""

    def __init__(self, board: str, cells: Sequence[CellOutcome], progress: Progress | None) -> None:
        self.progress = progress
        self.live = progress is not None and not progress.disable
        self.lines = progress is not None and progress.disable  # deploy's display, degraded to a line per cell
        self.rows = [
            progress.add_task(escape(f"[{board}] {cell.model}/{cell.variant}"), total=None, start=False, step="waiting")
            for cell in cells
        ] if progress is not None else []  # fmt: skip
        self.started: set[TaskID] = set()

    def step(self, index: int | None, name: str) -> None:
        """`index`'s row (every row: None) is at step `name`."""
        if self.progress is None:
            return
        for row in self.rows if index is None else [self.rows[index]]:
            if name != "waiting" and row not in self.started:
                self.started.add(row)
                self.progress.start_task(row)
            self.progress.update(row, step=name)

    def done(self, index: int, cell: CellOutcome) -> None:
        if self.progress is None:
            return
        row = self.rows[index]
        self.progress.stop_task(row)
        total = format_seconds(sum(cell.seconds.values()))
        steps = " · ".join(f"{name} {format_seconds(seconds)}" for name, seconds in cell.seconds.items())
        said = f"✓ {total} ({steps})" if cell.ok else f"✗ failed at {cell.stage}"
        self.progress.update(row, step=said)
        if self.lines:
            mark = "[green]✓[/]" if cell.ok else "[red]✗[/]"
            what = escape(f"[{cell.board}] {cell.model}/{cell.variant}")
            tail = f"{total} [dim]({escape(steps)})[/]" if cell.ok else escape(f"failed at {cell.stage}")
            console.info(f"{mark} {what} {tail}")


@contextlib.contextmanager
def _stage(cell: CellOutcome, name: str, timer: console.StageTimer, rows: CellRows, index: int) -> Iterator[None]:
    cell.stage = name
    rows.step(index, name)
    label = f"{cell.model}/{cell.variant} {name}"
    with timer.stage(label):
        yield
    cell.seconds[name] = timer.durations[label]


def prefetch_analysis() -> None:
    """Import the analysis (numpy and the ETDump reader, about 0.1 s) in a thread while a board is set up, pushed
    to and loads the program, so a warm run does not wait for it afterwards. Before the runner's timed iterations
    start: the import is done long before (the board hashes the model first)."""
    prefetch.in_background("orchestrator.results.analysis")


def analyze_cell(cell: CellOutcome, artifact: Artifact, accuracy: dict[str, float] | None = None) -> None:
    # here, not at the top: imported by prefetch_analysis() while the board works (a concurrent import waits for it)
    from orchestrator.results.analysis import analyze_bundle

    assert cell.bundle is not None
    summary = analyze_bundle(
        cell.bundle,
        pte=artifact.pte,
        sidecar=artifact.sidecar,
        reference_outputs=reference_outputs_of(artifact),
        accuracy_thresholds=accuracy,
    )
    cell.summary = summary.run


def accuracy_failure(summary: RunSummary | None) -> str | None:
    """Why the accuracy gate fails the cell: only a failed verdict on meaningful (pretrained) figures does."""
    accuracy = summary.accuracy if summary else None
    if accuracy is None or accuracy.verdict != "fail":
        return None
    reason = "; ".join(accuracy.reasons) or "accuracy below thresholds"
    if not accuracy.meaningful:
        console.warn(f"{accuracy.scheme}: accuracy gate failed ({reason}), not enforced: {accuracy.note}")
        return None
    return f"accuracy gate failed ({accuracy.scheme} vs fp32 eager): {reason}"


@dataclass(frozen=True)
class CellJob:
    """One artifact to profile on a board, with its run parameters and the accuracy gate's thresholds."""

    artifact: Artifact
    params: RunParams
    accuracy: dict[str, float] | None = None
    numerics: NumericsProgram | None = None  # the artifact's numerics program, for a numerics pass


def run_cells_on_board(
    board: Board,
    jobs: Sequence[CellJob],
    *,
    setup: bool = True,
    analyze: bool = True,
    progress: Progress | None = None,
    on_cell: Callable[[CellOutcome], None] | None = None,
    results_root: Path | None = None,
    skip: Callable[[CellJob], bool] | None = None,
    gate: Callable[[BoardConnection], None] | None = None,
) -> list[CellOutcome]:
    """setup → (push → run → pull → analyze) per artifact, one board. Never raises for board trouble.
    `skip` is asked just before each cell runs: a cell it skips is neither run, reported nor returned. `gate` runs
    after the setup, before any cell (the nightly's health job): what it raises fails every cell at stage "health"."""
    cells = [CellOutcome(board.name, job.artifact.model, job.artifact.variant) for job in jobs]
    if analyze:
        prefetch_analysis()
    rows = CellRows(board.name, cells, progress)
    timer = console.StageTimer(prefix=f"[{board.name}] ", shown=not rows.live)
    board_stage: str | None = "connect"
    started: set[int] = set()
    reported: set[int] = set()
    skipped: set[int] = set()

    def report(index: int) -> None:
        reported.add(index)
        rows.done(index, cells[index])
        if on_cell:
            on_cell(cells[index])

    try:
        rows.step(None, "connect")
        with connect(board) as conn:
            if setup:
                board_stage = "setup"
                rows.step(None, "setup")
                _setup_if_needed(conn, timer)
            if gate is not None:
                board_stage = "health"
                rows.step(None, "health")
                with timer.stage("health job"):
                    gate(conn)
            board_stage = None
            rows.step(None, "waiting")
            for index, (cell, job) in enumerate(zip(cells, jobs, strict=True)):
                labgrid.check_held(board)  # a lost labgrid coordinator fails the board now, not after every cell
                if skip is not None and skip(job):
                    skipped.add(index)
                    rows.step(index, "skipped")
                    continue
                started.add(index)
                _run_cell(conn, cell, job, timer, analyze, progress, results_root, rows, index)
                report(index)
    except Exception as exc:
        # Board trouble (unreachable, setup failed, link lost): every unfinished cell fails with it.
        reason, detail = first_line(exc), full_reason(exc)
        # Only link trouble is infrastructure (the nightly retries it); a malformed or unfit board keeps its class.
        code, infrastructure = exit_class(exc), is_link_trouble(exc)
        for index, cell in enumerate(cells):
            if index in reported or index in skipped:
                continue
            if board_stage:
                cell.stage = board_stage
            elif index not in started:
                cell.stage, cell.error = "not started", f"{board.name} failed earlier: {reason}"
            if cell.error is None:
                cell.error, cell.detail = reason, detail
            cell.exit_class, cell.infrastructure = code, infrastructure
            report(index)
    return [cell for index, cell in enumerate(cells) if index not in skipped]


def _setup_if_needed(conn: BoardConnection, timer: console.StageTimer) -> None:
    with timer.stage("setup"):
        report = quick_check(conn) or setup_board(conn)
    if report.up_to_date:
        console.detail(
            escape(f"  [{conn.board.name}] board already provisioned (executorch {report.executorch_version})")
        )


def _run_cell(
    conn: BoardConnection,
    cell: CellOutcome,
    job: CellJob,
    timer: console.StageTimer,
    analyze: bool,
    progress: Progress | None,
    results_root: Path | None,
    rows: CellRows,
    index: int,
) -> None:
    artifact, params = job.artifact, job.params
    try:
        with _stage(cell, "push", timer, rows, index):
            pushed = push_artifact(conn, artifact, progress)
            numerics = push_numerics(conn, job.numerics, progress) if job.numerics is not None else None
        cell.run_id = new_run_id()
        with _stage(cell, "run", timer, rows, index):
            remote: RemoteRun = profile(conn, artifact, pushed, params, cell.run_id, numerics)
        cell.status = remote.status
        with _stage(cell, "pull", timer, rows, index):
            cell.bundle = pull(conn, remote, artifact, results_root)
        if analyze:
            with _stage(cell, "analyze", timer, rows, index):
                analyze_cell(cell, artifact, job.accuracy)
        if remote.status != "ok":
            cell.stage, cell.error = "run", f"runner {remote.status}: {remote.error or 'see runner.log'}"
            return
        failed_gate = accuracy_failure(cell.summary)
        if failed_gate:
            cell.stage, cell.error = "accuracy", failed_gate
            return
        cell.ok, cell.stage = True, None
    except AnalysisError as exc:
        cell.error = f"{first_line(exc)} (raw bundle kept at {cell.bundle})"
        cell.detail, cell.exit_class = f"{full_reason(exc)}\n(raw bundle kept at {cell.bundle})", exc.exit_code
    except BoardError:
        raise  # the board or link is gone: the remaining cells cannot run either
    except Exception as exc:
        cell.error, cell.detail, cell.exit_class = first_line(exc), full_reason(exc), exit_class(exc)
        if is_link_trouble(exc):
            cell.infrastructure = True
            raise
