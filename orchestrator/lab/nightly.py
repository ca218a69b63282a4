"""`fab nightly`: the lab's matrix every night, recorded, compared with its baseline, reported.

Cells (board × model × backend) are recorded as soon as they finish, one transaction each, so a killed
nightly re-run the same night skips what is already recorded and loses nothing. One nightly runs a night of a
history at a time (lab/nightlock.py), and each cell is checked against the history just before it runs. The history
is checked before the first cell; a cell it still fails to record is kept pending (lab/pending.py), never lost.

Verdicts (results/verdicts.py) survive a noisy board:
- the same program and versions as the baseline: a shift is board drift (a warning), never a regression;
- a changed program that looks slower or faster is re-tested at once, interleaved with the baseline's program on
  the same board (deploy/abtest.py); only a confirmed shift is a regression, else it is "unconfirmed";
- a degraded run is re-measured once after a cool-down; still degraded, it is "inconclusive" (unless a changed
  program's shift is then settled by the interleaved re-test, which does not depend on tonight's run).

Exit codes: 0 all good (warnings included), 1 a confirmed regression (or a model that fails on a healthy board),
2 an infrastructure failure (a board unreachable or lost, or a cell kept pending; takes precedence, since the night
is incomplete), 75 a night otherwise good that left an earlier night's pending result unrecorded (a malformed file,
kept and named). Before anything runs: 64 a reports folder that holds another history's reports, 65 a corrupt
history, 75 a history server that cannot be reached, the night held by another nightly (without --wait) or the
history locked by another writer for longer than `history_wait_seconds`.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import functools
import secrets
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sqlalchemy.exc import IntegrityError, SQLAlchemyError

from orchestrator import console
from orchestrator.boards import labgrid
from orchestrator.boards.fanout import fan_out
from orchestrator.boards.inventory import Board, Inventory
from orchestrator.deploy.abtest import Program, interleave
from orchestrator.deploy.cells import CellJob, CellOutcome, is_link_trouble, run_cells_on_board
from orchestrator.deploy.limits import MAX_THREADS
from orchestrator.deploy.runs import RunParams
from orchestrator.errors import EtlabError, ExitCode, failure_code, first_line
from orchestrator.fsutil import read_json
from orchestrator.lab import pending
from orchestrator.lab.history import History
from orchestrator.lab.history_url import default_url, describe_url, problem, reach
from orchestrator.lab.judging import confirm, judge, judge_memory
from orchestrator.lab.matrix import NightlyConfig, load_config
from orchestrator.lab.night_advice import advise_cell
from orchestrator.lab.night_report import CellVerdict, NightReport, PlaceWait
from orchestrator.lab.nightlock import night_lock
from orchestrator.lab.report import write_reports
from orchestrator.lab.reports_folder import claim_folder
from orchestrator.lab.run_record import RunRecord
from orchestrator.lowering import programs
from orchestrator.lowering.artifacts import load_artifact
from orchestrator.lowering.export import lower as lowering
from orchestrator.lowering.rewrites.registry import NO_REWRITES, RewriteRequest
from orchestrator.lowering.spec import ModelSpec
from orchestrator.lowering.variants import Variant
from orchestrator.results.validity import number, number_list
from orchestrator.results.verdicts import Kind, exit_code
from orchestrator.transport import connect

# ---------------------------------------------------------------- recording


def record_from_cell(cell: CellOutcome, night: str, versions: dict[str, str], threads: int | None) -> RunRecord:
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
    )


def _threads(reported: int | None) -> int | None:
    """The threads a run reports, when a history can hold them (what the options allow); else the configured ones."""
    return reported if reported is not None and 1 <= reported <= MAX_THREADS else None


# ---------------------------------------------------------------- the night


def _baseline(history: History, record: RunRecord, config: NightlyConfig) -> list[RunRecord]:
    return history.runs(
        cell=record.cell,
        before_night=record.night,
        versions=record.versions,
        valid_only=True,
        limit=config.baseline_nights,
    )


def _retest(board: Board, verdict: CellVerdict, job: CellJob, config: NightlyConfig) -> CellVerdict:
    """The interleaved A/B re-test of a suspected cell on its board: baseline's program (A) vs tonight's (B)."""
    reference = verdict.reference
    kept = programs.find(reference.pte_sha256 if reference else None)
    if kept is None or reference is None or reference.pte_sha256 is None:
        return confirm(verdict, None, why_not="the baseline's program is not kept, so it cannot be re-run")
    artifact = job.artifact
    a = Program("baseline", kept, reference.pte_sha256)
    b = Program("tonight", artifact.pte, artifact.sha256)
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


class _Recorder:
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


def _expand_boards(config: NightlyConfig) -> dict[Board, tuple[Board, ...]]:
    """The boards each board of the matrix stands for: a labgrid tag selector its places, any other board itself."""
    expanded: dict[Board, tuple[Board, ...]] = {}
    for entry in config.entries:
        for board in entry.boards:
            if board not in expanded:
                expanded[board] = tuple(labgrid.expand([board]))
    return expanded


def run_nightly(
    inventory: Inventory,
    *,
    night: str | None = None,
    history_url: str | None = None,
    reports_dir: Path | None = None,
    artifacts_root: Path | None = None,
    results_root: Path | None = None,
    wait: bool = False,
) -> NightReport:
    """The night, under its lock (another nightly of the same night and history: NightBusy, or wait with `wait`),
    on a history checked before the first cell (corrupt: HistoryError; locked by another writer: waited for)."""
    config = load_config(inventory)
    night = night or dt.date.today().isoformat()
    url = history_url or config.history_url or default_url()
    reports = reports_dir or config.reports_dir
    expanded = _expand_boards(config)
    reach(url)  # a server that does not answer: 75 naming it, before its lock is asked for
    with night_lock(url, night, describe_url(url), wait=wait):
        history = History(url, busy_seconds=config.history_wait_seconds, check=True)
        try:
            history.wait_writable(config.history_wait_seconds)
            claim_folder(reports, url)  # by a history that works; another history's reports are never overwritten
            carried = pending.record_pending(history, reports, held_night=night)
            for why in carried.left:
                console.warn(why)
            return _run_night(
                config, night, history, reports, expanded,
                artifacts_root=artifacts_root, results_root=results_root, carried=carried,
            )  # fmt: skip
        finally:
            history.close()


def record_pending_results(
    inventory: Inventory, *, history_url: str | None = None, reports_dir: Path | None = None
) -> int:
    """`fab nightly --record-pending`: record the results earlier nightlies kept pending. Exit 0 when none is left,
    75 when some still wait (the history still fails, or their night is being run)."""
    config = load_config(inventory)
    url = history_url or config.history_url or default_url()
    reach(url)
    history = History(url, busy_seconds=config.history_wait_seconds, check=True)
    try:
        history.wait_writable(config.history_wait_seconds)
        outcome = pending.record_pending(history, reports_dir or config.reports_dir)
    finally:
        history.close()
    console.info(f"{outcome.recorded} pending result(s) recorded in the history {console.escape(history.where)}")
    for why in outcome.left:
        console.warn(why)
    return ExitCode.TEMPFAIL if outcome.left else ExitCode.OK


def _run_night(
    config: NightlyConfig,
    night: str,
    history: History,
    reports: Path,
    expanded: dict[Board, tuple[Board, ...]],
    *,
    artifacts_root: Path | None,
    results_root: Path | None,
    carried: pending.Outcome,
) -> NightReport:
    """The night's cells, after the earlier nights' pending results were recorded (`carried`). Kept programs no
    baseline needs are dropped, unless results of any night are still pending: the history does not list their
    programs yet."""
    recorder = _Recorder(history, reports, night)
    recorded = history.recorded_cells(night)
    specs: dict[str, ModelSpec] = {}
    # Per program (a rewritten one under its own name): its rewrites; the matrix's check refuses two for one name.
    rewrites_of: dict[str, RewriteRequest] = {}
    plan: dict[Board, list[tuple[str, Variant, RunParams]]] = {}
    skipped: list[tuple[str, str, str]] = []
    for entry in config.entries:
        for board in [place for selected in entry.boards for place in expanded[selected]]:
            for spec, request in entry.programs():
                specs[spec.name] = spec
                rewrites_of[spec.name] = request
                for variant in entry.variants:
                    if (board.name, spec.name, variant.name) in recorded:
                        skipped.append((board.name, spec.name, variant.name))
                    else:
                        plan.setdefault(board, []).append((spec.name, variant, entry.params))
    if skipped:
        console.info(f"{len(skipped)} cell(s) already recorded for {night}: skipped")

    # Lower on the workstation first, once per model (cached across nights when nothing changed).
    wanted: dict[str, dict[Variant, None]] = {}  # ordered sets, in matrix order
    for cells in plan.values():
        for model, variant, _ in cells:
            wanted.setdefault(model, {})[variant] = None
    lowering_errors: dict[str, str] = {}
    versions: dict[str, dict[str, str]] = {}
    for model, variants in wanted.items():
        try:
            result = lowering.lower(
                specs[model],
                variants=list(variants),
                weights=config.weights,
                root=artifacts_root,
                rewrites=rewrites_of.get(model, NO_REWRITES),
            )
            versions[model] = dict(next(iter(result.variants.values())).sidecar.versions)
        except EtlabError as exc:
            lowering_errors[model] = first_line(exc)

    # fan_out hands each job the board resolved through its labgrid place: the same board by name
    cells_of = {board.name: cells for board, cells in plan.items()}
    places: dict[str, PlaceWait] = {}
    started: set[str] = set()

    def on_board(board: Board) -> list[CellOutcome]:
        started.add(board.name)
        if board.labgrid is not None:
            lg = board.labgrid
            places[board.name] = PlaceWait(str(lg.place), lg.coordinator, lg.waited)
        jobs: dict[tuple[str, Variant], CellJob] = {}
        failed, threads = [], {}
        for model, variant, params in cells_of[board.name]:
            threads[(model, variant)] = params.threads or board.threads
            if model in lowering_errors:
                failed.append(CellOutcome(board.name, model, variant, stage="lower", error=lowering_errors[model]))
            else:
                jobs[(model, variant)] = CellJob(load_artifact(model, variant, artifacts_root), params, config.accuracy)
        remeasured: dict[tuple[str, str, str], dict[str, Any]] = {}
        held: list[CellOutcome] = []
        runs: dict[tuple[str, str, str], RunRecord] = {}  # the cells this run recorded (or kept pending)

        def record(cell: CellOutcome) -> None:
            run = record_from_cell(cell, night, versions.get(cell.model, {}), threads[(cell.model, cell.variant)])
            if cell.ok and (cell.model, cell.variant) in jobs:
                artifact = jobs[(cell.model, cell.variant)].artifact
                try:
                    # Tonight's program: tomorrow's baseline.
                    programs.keep(artifact.pte, artifact.sha256, programs.holder_id(history.url))
                except (EtlabError, OSError) as exc:
                    console.warn(f"{board.name}: {cell.model}/{cell.variant}: program not kept: {exc}")
                advise_cell(cell, artifact, results_root)  # its findings in its bundle: the reports and pages show them
            if recorder.record(run):
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
            if recorder.recorded(cell):
                console.info(console.escape(f"  [{board.name}] {' / '.join(cell)}: recorded meanwhile: skipped"))
                skipped.append(cell)
                return True
            return False

        for cell in failed:
            record(cell)
        cells = run_cells_on_board(
            board, list(jobs.values()), on_cell=record_or_hold, results_root=results_root, skip=recorded_meanwhile
        )
        for first in held:
            reasons = [r.reason for r in first.summary.validity.reasons] if first.summary else []
            console.warn(
                f"{board.name}: {first.model}/{first.variant} is degraded ({'; '.join(reasons)}): "
                f"re-measuring after a {config.cooldown_seconds:g} s cool-down"
            )
            time.sleep(config.cooldown_seconds)
            (again,) = run_cells_on_board(
                board, [jobs[(first.model, first.variant)]], setup=False, results_root=results_root
            )
            final = again if again.ok or not again.infrastructure else first
            remeasured[first.cell] = {
                "first_run": first.run_id, "first_reasons": reasons, "cooldown_seconds": config.cooldown_seconds,
                "second_run": again.run_id, "second_validity": again.validity if again.ok else again.error,
            }  # fmt: skip
            record(final)
            cells = [final if c is first else c for c in cells]

        # Judge this board's cells now, while the board is ours: a suspected cell is re-tested at once.
        for cell in cells:
            run = runs.get(cell.cell)
            if run is None:
                continue  # recorded by another run of the night: judged with the night
            baseline = recorder.read(functools.partial(_baseline, history, run, config), [])
            verdict = judge(run, baseline, config.min_effect, min_nights=config.min_baseline_nights)
            verdict.remeasured = remeasured.get(cell.cell)
            if verdict.suspect:
                verdict = _retest(board, verdict, jobs[(cell.model, cell.variant)], config)
                if run.validity == "degraded" and verdict.verdict == Kind.UNCONFIRMED:
                    verdict.verdict = Kind.INCONCLUSIVE  # degraded twice and the re-test settled nothing
            verdict = judge_memory(verdict, baseline, config.min_effect)
            recorder.set_verdict(run, verdict)
        return failed + cells

    outcomes = fan_out(list(plan), on_board)
    for outcome in outcomes:
        if not outcome.ok:  # a bug, or the board's labgrid place: still visible, and a reason to alarm
            console.error(f"{outcome.board.name}: {outcome.error}")
            lg = outcome.board.labgrid
            if lg is not None:
                places.setdefault(outcome.board.name, PlaceWait(str(lg.place), lg.coordinator, None, outcome.error))
        if not outcome.ok and outcome.board.name not in started:
            # Never started (no labgrid place, e.g. --lg-wait ran out): its cells are recorded as failed.
            failure = outcome.exception
            exit_class = ExitCode.SOFTWARE if failure is None else failure_code(failure)
            for model, variant, params in cells_of[outcome.board.name]:
                cell = CellOutcome(outcome.board.name, model, variant, stage=outcome.stage or "?",
                                   error=outcome.error, detail=outcome.detail,
                                   infrastructure=is_link_trouble(failure), exit_class=exit_class)  # fmt: skip
                threads = params.threads or outcome.board.threads
                recorder.record(record_from_cell(cell, night, versions.get(model, {}), threads))

    # Tonight's verdicts cover every cell recorded tonight, including those from an earlier, killed run.
    verdicts = []
    trends: dict[tuple[str, str, str], list[RunRecord]] = {}
    for record in recorder.tonight():
        if record.verdict:
            verdict = CellVerdict.stored(record)
        else:  # recorded by a run killed before it judged the cell: judged now, without a re-test
            baseline = recorder.read(functools.partial(_baseline, history, record, config), [])
            verdict = judge(record, baseline, config.min_effect, min_nights=config.min_baseline_nights)
            if verdict.suspect:
                verdict = confirm(verdict, None, why_not="the night was resumed after the cell ran")
            verdict = judge_memory(verdict, baseline, config.min_effect)
            recorder.set_verdict(record, verdict)
        verdicts.append(verdict)
        earlier = recorder.read(functools.partial(history.runs, cell=record.cell, limit=60), [])
        if record.cell in recorder.pending:  # not in the history yet: tonight's point comes from the pending copy
            earlier = [record, *(r for r in earlier if r.night != night)]
        trends[record.cell] = list(reversed(earlier))
    verdicts.sort(key=lambda v: v.cell)
    if recorder.pending:
        # Tonight's programs are kept for tomorrow's baseline, but the history does not list them yet: keep them all.
        console.warn(
            f"{len(recorder.pending)} cell(s) measured but not recorded in the history {history.where}: kept pending "
            f"in {pending.folder(reports, night)}; `fab nightly --record-pending` records them"
        )
    elif not carried.left:
        with contextlib.suppress(SQLAlchemyError):
            _keep_baselines_only(history, config)
    infrastructure_ok = all(o.ok for o in outcomes) and not recorder.pending
    code = exit_code((v.verdict for v in verdicts), infrastructure_ok=infrastructure_ok)
    if code == ExitCode.OK and carried.left_behind:
        code = ExitCode.TEMPFAIL  # tonight is good, but earlier results still wait to be recorded: say so
    report = NightReport(night, verdicts, trends, code, skipped, places=places,
                         pending=sorted(recorder.pending), pending_dir=pending.folder(reports, night),
                         left_behind=carried.left_behind,
                         advised=[pair for entry in config.entries for pair in entry.advised_pairs()])  # fmt: skip
    report.outputs = write_reports(report, reports)
    return report


def _keep_baselines_only(history: History, config: NightlyConfig) -> None:
    """Drop kept programs that no cell of this history uses as a baseline any more (tonight's included)."""
    wanted = history.baseline_programs(config.baseline_nights)
    for sha in programs.prune(wanted, programs.holder_id(history.url)):
        console.info(f"dropped kept program {sha[:12]}: no longer a baseline")
