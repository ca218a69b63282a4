"""One board's share of a night: its cells run, recorded as each finishes, and judged while the board is ours.

The same code runs a board in `fab nightly`'s own process (lab/nightly.py fans boards out to threads) and on a lab
worker (lab/worker_tasks.py), so a night split over hosts records and judges exactly as one host would.
"""

from __future__ import annotations

import functools
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from sqlalchemy.exc import IntegrityError, SQLAlchemyError

from orchestrator import console
from orchestrator.boards.inventory import Board
from orchestrator.deploy.abtest import ABProgram, interleave
from orchestrator.deploy.cells import CellJob, CellOutcome, run_cells_on_board
from orchestrator.deploy.limits import MAX_THREADS
from orchestrator.deploy.runs import RunParams
from orchestrator.errors import EtlabError, ExitCode, first_line
from orchestrator.fsutil import read_json
from orchestrator.lab import pending, service
from orchestrator.lab.history import History
from orchestrator.lab.history_url import problem
from orchestrator.lab.judging import confirm, judge, judge_memory
from orchestrator.lab.matrix import NightlyConfig
from orchestrator.lab.night_advice import advise_cell
from orchestrator.lab.night_report import CellVerdict, PlaceWait
from orchestrator.lab.run_record import RunRecord, host_name
from orchestrator.lowering import programs
from orchestrator.lowering.artifacts import Artifact, load_artifact
from orchestrator.lowering.export.numerics import NumericsUnavailable, make_numerics
from orchestrator.lowering.program import Program
from orchestrator.lowering.variants import Variant
from orchestrator.results.validity import number, number_list
from orchestrator.results.verdicts import Kind
from orchestrator.transport import connect


class PlannedCell(NamedTuple):
    """A cell of the night: a program, the variant it is lowered to, how it runs (on the board it is planned for)."""

    program: Program
    variant: Variant
    params: RunParams

    @property
    def model(self) -> str:
        """The program's name: the cell's model in the history."""
        return self.program.name


# ---------------------------------------------------------------- recording


def record_from_cell(
    cell: CellOutcome, night: str, versions: dict[str, str], threads: int | None, host: str | None = None
) -> RunRecord:
    summary = cell.summary
    warm = summary.latency.warm if summary else None
    status = "ok" if cell.ok else ("infra" if cell.infrastructure else "failed")
    latencies: list[float] = []
    ops: dict[str, tuple[str, float]] = {}
    environment: dict[str, str] = {}
    if cell.bundle:
        try:
            timings = read_json(cell.bundle / "timings.json")
        except (OSError, ValueError, RecursionError):
            timings = None
        if isinstance(timings, dict):  # the board's file: only its finite numbers are latencies
            latencies = number_list(timings.get("iterations_ms"))
            environment = {
                "runtime": str(timings.get("executorch_version") or ""),
                "runner": str(timings.get("runner_version") or ""),
            }
        try:
            info = read_json(cell.bundle / "board_info_before.json")
            environment["board_image"] = f"{info.get('os_release') or '?'}; kernel {info.get('kernel') or '?'}"
        except (OSError, ValueError, RecursionError, AttributeError):
            pass
        try:
            for row in read_json(cell.bundle / "analysis" / "ops.json").get("instructions", []):
                median = number(row.get("median_ms"))
                if median is not None:
                    ops[f"{row['chain']}:{row['instruction']}"] = (str(row.get("op") or row.get("kind")), median)
        except (OSError, ValueError, KeyError, AttributeError, TypeError):
            ops = {}
    return RunRecord(
        run_id=cell.run_id or f"{night}-unrun-{secrets.token_hex(4)}",
        night=night,
        board=cell.board,
        model=cell.model,
        backend=cell.variant.name,
        status=status,
        validity=summary.validity.status if summary else "invalid",
        reasons=[r.reason for r in summary.validity.reasons]
        if summary and summary.validity.reasons
        else ([cell.error] if cell.error else []),
        error=cell.error,
        stage=cell.stage if not cell.ok else None,
        versions=versions,
        pte_sha256=summary.model.sha256 if summary else None,
        threads=_threads(summary.latency.threads if summary else None) or threads,
        median_ms=warm.median_ms if warm else None,
        p90_ms=warm.p90_ms if warm else None,
        mean_ms=warm.mean_ms if warm else None,
        cv=warm.cv if warm else None,
        conditions=summary.board_conditions if summary else {},
        bundle_path=str(cell.bundle) if cell.bundle else None,
        latencies_ms=latencies,
        ops=ops,
        environment=environment,
        peak_rss_bytes=summary.memory.peak_rss_bytes if summary and summary.memory else None,
        planned_bytes=summary.memory.planned_bytes if summary and summary.memory else None,
        generation=summary.generation if summary else None,
        energy=summary.energy if summary else None,
        host=host,
    )


def _threads(reported: int | None) -> int | None:
    """The threads a run reports, when a history can hold them (what the options allow); else the configured ones."""
    return reported if reported is not None and 1 <= reported <= MAX_THREADS else None


# ---------------------------------------------------------------- the night


def baseline_of(history: History, record: RunRecord, config: NightlyConfig) -> list[RunRecord]:
    return history.runs(
        cell=record.cell,
        before_night=record.night,
        versions=record.versions,
        valid_only=True,
        limit=config.baseline_nights,
    )


def retest(
    board: Board,
    verdict: CellVerdict,
    job: CellJob,
    config: NightlyConfig,
    find: Callable[[str | None], Path | None] = programs.find,
) -> CellVerdict:
    """The interleaved A/B re-test of a suspected cell on its board: baseline's program (A) vs tonight's (B)."""
    reference = verdict.reference
    try:
        kept = find(reference.pte_sha256 if reference else None)
    except (EtlabError, OSError) as exc:  # the lab's store refused or lost it: this cell's re-test, not the board
        return confirm(verdict, None, why_not=f"the baseline's program could not be fetched: {first_line(exc)}")
    if kept is None or reference is None or reference.pte_sha256 is None:
        return confirm(verdict, None, why_not="the baseline's program is not kept, so it cannot be re-run")
    artifact = job.artifact
    a = ABProgram("baseline", kept, reference.pte_sha256)
    b = ABProgram("tonight", artifact.pte, artifact.sha256)
    inputs = (artifact.paths.reference_inputs, artifact.sidecar.reference_inputs_sha256)
    console.info(
        console.escape(f"[{board.name}] {' / '.join(verdict.cell)} looks {verdict.suspect}: interleaved re-test")
    )
    try:
        with connect(board) as conn:
            result = interleave(
                conn, a, b, inputs, job.params, min_effect=config.min_effect, expect=verdict.suspect,
                rounds=config.retest_rounds, budget_seconds=config.retest_seconds,
            )  # fmt: skip
    except EtlabError as exc:
        return confirm(verdict, None, why_not=f"the re-test could not run: {first_line(exc)}")
    return confirm(verdict, result)


class Recorder:
    """Records the night's cells. A cell the history fails to record after it ran is kept pending (lab/pending.py),
    never lost: its bundle stays, the reports show it, and a later `fab nightly --record-pending` records it."""

    def __init__(self, history: History, reports_dir: Path, night: str) -> None:
        self.history, self.reports_dir, self.night = history, reports_dir, night
        self.pending: dict[tuple[str, str, str], RunRecord] = {}
        self.mine: dict[tuple[str, str, str], RunRecord] = {}  # what this run recorded or kept pending
        self._lock = threading.Lock()

    def recorded(self, cell: tuple[str, str, str]) -> bool:
        """Whether the history holds the cell for tonight (another run may have recorded it meanwhile)."""
        try:
            return cell in self.history.recorded_cells(self.night)
        except SQLAlchemyError:
            return False  # a history that cannot say: run the cell, its result is kept pending if need be

    def record(self, run: RunRecord) -> bool:
        """Record (or keep pending) `run`; False when another run of the night recorded the cell first."""
        label = " / ".join(run.cell)
        try:
            self.history.record(run)
        except IntegrityError:
            console.warn(
                f"{label}: recorded meanwhile by another run of night {self.night}; this run's measurement is not "
                f"recorded (its bundle stays: {run.bundle_path or 'none'})"
            )
            return False
        except SQLAlchemyError as exc:
            with self._lock:
                self.pending[run.cell] = run
            where = self._keep(run)
            console.warn(
                f"{label}: the history {self.history.where} did not record it ({problem(exc)}); kept pending in "
                f"{where}: `fab nightly --record-pending` (or the next nightly) records it"
            )
        with self._lock:
            self.mine[run.cell] = run
        return True

    def _keep(self, run: RunRecord) -> str:
        try:
            return str(pending.write(self.reports_dir, self.history.url, run))
        except OSError as exc:  # nowhere to keep it: the reports still show it, and its bundle stays
            console.error(f"{' / '.join(run.cell)}: could not keep the pending result ({exc}); its bundle stays: "
                          f"{run.bundle_path or 'none'}")  # fmt: skip
            return "nowhere"

    def set_verdict(self, run: RunRecord, verdict: CellVerdict) -> None:
        run.verdict, run.verdict_info = str(verdict.verdict), verdict.info()
        if run.cell in self.pending:
            self._keep(run)  # recorded later with its verdict
            return
        try:
            self.history.set_verdict(run.run_id, verdict.verdict, verdict.info())
        except SQLAlchemyError as exc:  # the next nightly judges the cell again (without a re-test)
            console.warn(f"{' / '.join(run.cell)}: its verdict was not stored: {problem(exc)}")

    def tonight(self) -> list[RunRecord]:
        """Every cell of the night: the history's, else what this run measured; and the pending ones."""
        try:
            records = self.history.runs(night=self.night)
        except SQLAlchemyError as exc:
            console.warn(f"the history {self.history.where} cannot be read ({problem(exc)}): the reports show "
                         "only what this run measured")  # fmt: skip
            records = list(self.mine.values())
        cells = {record.cell for record in records}
        return records + [record for cell, record in self.pending.items() if cell not in cells]

    def read(self, what: Callable[[], list[RunRecord]], fallback: list[RunRecord]) -> list[RunRecord]:
        try:
            return what()
        except SQLAlchemyError as exc:
            console.warn(f"the history {self.history.where} cannot be read: {problem(exc)}")
            return fallback


@dataclass
class NightContext:
    """What a board's share of a night needs: the night, its matrix settings, the history it records into (through
    `recorder`), the programs' versions and lowering failures, and where its programs come from (`artifact`)."""

    night: str
    config: NightlyConfig
    history: History
    recorder: Recorder
    artifact: Callable[[str, Variant], Artifact]
    versions: dict[str, dict[str, str]] = field(default_factory=dict)
    lowering_errors: dict[str, str] = field(default_factory=dict)
    results_root: Path | None = None
    host: str = field(default_factory=host_name)
    skipped: list[tuple[str, str, str]] = field(default_factory=list)  # recorded meanwhile by another run
    places: dict[str, PlaceWait] = field(default_factory=dict)
    started: set[str] = field(default_factory=set)
    # Kept programs (tomorrow's baselines): where tonight's is also shared, and where a baseline's is found.
    share_program: Callable[[Path, str], None] | None = None
    find_program: Callable[[str | None], Path | None] = programs.find


def wanted_programs(plan: dict[Board, list[PlannedCell]]) -> dict[str, tuple[Program, list[Variant]]]:
    """Each program of the plan, once, with the variants its cells need: in matrix order."""
    wanted: dict[str, tuple[Program, dict[Variant, None]]] = {}
    for cells in plan.values():
        for cell in cells:
            wanted.setdefault(cell.model, (cell.program, {}))[1][cell.variant] = None
    return {model: (program, list(variants)) for model, (program, variants) in wanted.items()}


def local_artifacts(root: Path | None) -> Callable[[str, Variant], Artifact]:
    return lambda model, variant: load_artifact(model, variant, root)


def run_board(ctx: NightContext, board: Board, planned: list[PlannedCell]) -> list[CellOutcome]:
    """The board's cells: run, each recorded as it finishes (a degraded one re-measured first), then judged while the
    board is ours (a suspected cell re-tested at once, interleaved with its baseline's program)."""
    ctx.started.add(board.name)
    if board.labgrid is not None:
        lg = board.labgrid
        ctx.places[board.name] = PlaceWait(str(lg.place), lg.coordinator, lg.waited)
    jobs: dict[tuple[str, Variant], CellJob] = {}
    failed, threads = [], {}
    health = service.NightHealth(ctx.history, board.name)
    out = health.out_of_service()
    if out is not None:
        console.warn(f"{board.name}: {out.describe()}: its cells are skipped; {service.bring_back_hint(board.name)}")
    for planned_cell in planned:
        model, variant, params = planned_cell.model, planned_cell.variant, planned_cell.params
        threads[(model, variant)] = params.threads or board.threads
        if out is not None:  # infrastructure, never a regression: the night says so and judges nothing here
            failed.append(CellOutcome(board.name, model, variant, stage="out of service", error=out.describe(),
                                      infrastructure=True, exit_class=ExitCode.UNAVAILABLE))  # fmt: skip
        elif model in ctx.lowering_errors:
            failed.append(CellOutcome(board.name, model, variant, stage="lower", error=ctx.lowering_errors[model]))
        else:
            try:
                artifact = ctx.artifact(model, variant)
                numerics = None
                try:
                    numerics = make_numerics(artifact) if params.numerics else None  # `numerics:` in the matrix
                except NumericsUnavailable as exc:  # the pass is skipped, not the cell
                    console.warn(f"[{board.name}] {exc}: no numerics pass for it")
                jobs[(model, variant)] = CellJob(artifact, params, ctx.config.accuracy, numerics)
            except EtlabError as exc:  # e.g. the lab's store refused it, or a program numerics cannot measure
                failed.append(CellOutcome(board.name, model, variant, stage="lower", error=first_line(exc)))
    remeasured: dict[tuple[str, str, str], dict[str, Any]] = {}
    held: list[CellOutcome] = []
    runs: dict[tuple[str, str, str], RunRecord] = {}  # the cells this run recorded (or kept pending)

    def record(cell: CellOutcome) -> None:
        run = record_from_cell(
            cell, ctx.night, ctx.versions.get(cell.model, {}), threads[(cell.model, cell.variant)], ctx.host
        )
        if cell.ok and (cell.model, cell.variant) in jobs:
            artifact = jobs[(cell.model, cell.variant)].artifact
            try:
                # Tonight's program: tomorrow's baseline.
                programs.keep(artifact.pte, artifact.sha256, programs.holder_id(ctx.history.url))
                if ctx.share_program is not None:  # a lab: another host may judge tomorrow's cell
                    ctx.share_program(artifact.pte, artifact.sha256)
            except (EtlabError, OSError) as exc:
                console.warn(f"{board.name}: {cell.model}/{cell.variant}: program not kept: {exc}")
            advise_cell(cell, artifact, ctx.results_root)  # its findings in its bundle: the reports and pages show them
        if ctx.recorder.record(run):
            runs[run.cell] = run

    def record_or_hold(cell: CellOutcome) -> None:
        # A degraded run is re-measured after the other cells, before it is recorded (a kill re-runs it).
        if cell.ok and cell.validity == "degraded":
            held.append(cell)
        else:
            record(cell)

    def recorded_meanwhile(job: CellJob) -> bool:
        # Checked just before the cell runs: another run of the night may have recorded it since the plan.
        cell = (board.name, job.artifact.model, job.artifact.variant.name)
        if ctx.recorder.recorded(cell):
            console.info(console.escape(f"  [{board.name}] {' / '.join(cell)}: recorded meanwhile: skipped"))
            ctx.skipped.append(cell)
            return True
        return False

    for cell in failed:
        record(cell)
    if out is not None:
        return failed
    cells = run_cells_on_board(
        board, list(jobs.values()), on_cell=record_or_hold, results_root=ctx.results_root, skip=recorded_meanwhile,
        gate=health.gate,
    )  # fmt: skip
    health.after(cells)
    # One cool-down for the board, shared by all its degraded cells (not one per cell), then each is re-measured.
    reasons_of = {c.cell: [r.reason for r in c.summary.validity.reasons] if c.summary else [] for c in held}
    if held:
        degraded = "; ".join(f"{c.model}/{c.variant} ({', '.join(reasons_of[c.cell])})" for c in held)
        console.warn(
            f"{board.name}: {len(held)} degraded cell(s): {degraded}: one {ctx.config.cooldown_seconds:g} s "
            f"cool-down shared by {len(held)} cell(s), then each is re-measured"
        )
        time.sleep(ctx.config.cooldown_seconds)
    for first in held:
        (again,) = run_cells_on_board(
            board, [jobs[(first.model, first.variant)]], setup=False, results_root=ctx.results_root
        )
        final = again if again.ok or not again.infrastructure else first
        remeasured[first.cell] = {
            "first_run": first.run_id, "first_reasons": reasons_of[first.cell],
            "cooldown_seconds": ctx.config.cooldown_seconds, "cooldown_shared_by": len(held),
            "second_run": again.run_id, "second_validity": again.validity if again.ok else again.error,
        }  # fmt: skip
        record(final)
        cells = [final if c is first else c for c in cells]

    # Judge this board's cells now, while the board is ours: a suspected cell is re-tested at once.
    for cell in cells:
        run = runs.get(cell.cell)
        if run is None:
            continue  # recorded by another run of the night: judged with the night
        baseline = ctx.recorder.read(functools.partial(baseline_of, ctx.history, run, ctx.config), [])
        verdict = judge(run, baseline, ctx.config.min_effect, min_nights=ctx.config.min_baseline_nights)
        verdict.remeasured = remeasured.get(cell.cell)
        if verdict.suspect:
            verdict = retest(board, verdict, jobs[(cell.model, cell.variant)], ctx.config, ctx.find_program)
            if run.validity == "degraded" and verdict.verdict == Kind.UNCONFIRMED:
                verdict.verdict = Kind.INCONCLUSIVE  # degraded twice and the re-test settled nothing
        verdict = judge_memory(verdict, baseline, ctx.config.min_effect)
        ctx.recorder.set_verdict(run, verdict)
    return failed + cells
