"""`fab nightly`: the lab's matrix every night, recorded, compared with its baseline, reported.

Cells (board × model × backend) are recorded as soon as they finish, one transaction each, so a killed
nightly re-run the same night skips what is already recorded and loses nothing. One nightly runs a night of a
history at a time (lab/nightlock.py), and each cell is checked against the history just before it runs. The history
is checked before the first cell; a cell it still fails to record is kept pending (lab/pending.py), never lost.

Verdicts (results/verdicts.py) survive a noisy board:
- the same program and versions as the baseline: a shift is board drift (a warning), never a regression;
- a changed program that looks slower or faster is re-tested at once, interleaved with the baseline's program on
  the same board (deploy/abtest.py); only a confirmed shift is a regression, else it is "unconfirmed";
- a degraded run is re-measured once after a cool-down (one per board, shared by its degraded cells); still
  degraded, it is "inconclusive" (unless a changed program's shift is then settled by the interleaved re-test,
  which does not depend on tonight's run).

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
from pathlib import Path

from sqlalchemy.exc import SQLAlchemyError

from orchestrator import console
from orchestrator.boards import labgrid
from orchestrator.boards.fanout import fan_out
from orchestrator.boards.inventory import Board, Inventory
from orchestrator.deploy.cells import CellOutcome, is_link_trouble
from orchestrator.errors import EtlabError, ExitCode, UsageError, failure_code, first_line
from orchestrator.lab import pending
from orchestrator.lab.board_night import (
    NightContext,
    PlannedCell,
    Recorder,
    baseline_of,
    local_artifacts,
    record_from_cell,
    run_board,
    wanted_programs,
)
from orchestrator.lab.history import History
from orchestrator.lab.history_url import default_url, describe_url, reach
from orchestrator.lab.judging import confirm, judge, judge_memory
from orchestrator.lab.lab_settings import LabSettings
from orchestrator.lab.matrix import NightlyConfig, load_config
from orchestrator.lab.night_report import CellVerdict, NightReport, PlaceWait
from orchestrator.lab.nightlock import night_lock
from orchestrator.lab.report import write_reports
from orchestrator.lab.reports_folder import claim_folder
from orchestrator.lab.run_record import RunRecord
from orchestrator.lowering import programs
from orchestrator.lowering.export import lower as lowering
from orchestrator.results.verdicts import exit_code


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
    lab: LabSettings | None = None,
) -> NightReport:
    """The night, under its lock (another nightly of the same night and history: NightBusy, or wait with `wait`),
    on a history checked before the first cell (corrupt: HistoryError; locked by another writer: waited for)."""
    config = load_config(inventory)
    night = night or dt.date.today().isoformat()
    url = history_url or config.history_url or default_url()
    reports = reports_dir or config.reports_dir
    expanded = _expand_boards(config)
    if lab is not None and url.startswith("sqlite"):
        raise UsageError(
            f"a lab's night is recorded by every host that runs a cell: its history must be a server every host "
            f"reaches, not {describe_url(url)}",
            hint="`history: postgresql://...` in the nightly section",
        )
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
                artifacts_root=artifacts_root, results_root=results_root, carried=carried, lab=lab,
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
    lab: LabSettings | None = None,
) -> NightReport:
    """The night's cells (on the lab's workers with `lab`), after the earlier nights' pending results were recorded
    (`carried`). Kept programs no baseline needs are dropped, unless results of any night are still pending: the
    history does not list their programs yet."""
    recorder = Recorder(history, reports, night)
    recorded = history.recorded_cells(night)
    # A program is one value (its spec and rewrites): the matrix's check refuses two programs under one name.
    plan: dict[Board, list[PlannedCell]] = {}
    skipped: list[tuple[str, str, str]] = []
    for entry in config.entries:
        for board in [place for selected in entry.boards for place in expanded[selected]]:
            for program in entry.programs():
                for variant in entry.variants:
                    if (board.name, program.name, variant.name) in recorded:
                        skipped.append((board.name, program.name, variant.name))
                    else:
                        plan.setdefault(board, []).append(PlannedCell(program, variant, entry.params))
    if skipped:
        console.info(f"{len(skipped)} cell(s) already recorded for {night}: skipped")

    lost = None
    if lab is None:
        ran, places = _run_here(config, night, history, recorder, plan, skipped,
                                artifacts_root=artifacts_root, results_root=results_root)  # fmt: skip
    else:
        from orchestrator.lab.lab_night import run_on_lab  # Dask: imported only for a lab's night

        on_lab = run_on_lab(lab, config, night, history.url, recorder, plan)
        ran, places, lost = on_lab.infrastructure_ok, {}, on_lab.lost

    # Tonight's verdicts cover every cell recorded tonight, including those from an earlier, killed run.
    verdicts = []
    trends: dict[tuple[str, str, str], list[RunRecord]] = {}
    for record in recorder.tonight():
        if record.verdict:
            verdict = CellVerdict.stored(record)
        else:  # recorded by a run killed before it judged the cell: judged now, without a re-test
            baseline = recorder.read(functools.partial(baseline_of, history, record, config), [])
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
    infrastructure_ok = ran and not recorder.pending
    code = exit_code((v.verdict for v in verdicts), infrastructure_ok=infrastructure_ok)
    if code == ExitCode.OK and carried.left_behind:
        code = ExitCode.TEMPFAIL  # tonight is good, but earlier results still wait to be recorded: say so
    report = NightReport(night, verdicts, trends, code, skipped, places=places,
                         pending=sorted(recorder.pending), pending_dir=pending.folder(reports, night),
                         left_behind=carried.left_behind, lost=lost,
                         advised=[pair for entry in config.entries for pair in entry.advised_pairs()])  # fmt: skip
    report.outputs = write_reports(report, reports)
    return report


def _keep_baselines_only(history: History, config: NightlyConfig) -> None:
    """Drop kept programs that no cell of this history uses as a baseline any more (tonight's included)."""
    wanted = history.baseline_programs(config.baseline_nights)
    for sha in programs.prune(wanted, programs.holder_id(history.url)):
        console.info(f"dropped kept program {sha[:12]}: no longer a baseline")


def _run_here(
    config: NightlyConfig,
    night: str,
    history: History,
    recorder: Recorder,
    plan: dict[Board, list[PlannedCell]],
    skipped: list[tuple[str, str, str]],
    *,
    artifacts_root: Path | None,
    results_root: Path | None,
) -> tuple[bool, dict[str, PlaceWait]]:
    """The night in this process: each model lowered here first, once (cached across nights when nothing changed),
    then every board in a thread of its own. Whether every board's share ran, and the labgrid places' waits."""
    lowering_errors: dict[str, str] = {}
    versions: dict[str, dict[str, str]] = {}
    for model, (program, variants) in wanted_programs(plan).items():
        try:
            result = lowering.lower(
                program.spec, variants=variants, weights=config.weights, root=artifacts_root, rewrites=program.rewrites
            )
            versions[model] = dict(next(iter(result.variants.values())).sidecar.versions)
        except EtlabError as exc:
            lowering_errors[model] = first_line(exc)

    # fan_out hands each job the board resolved through its labgrid place: the same board by name
    cells_of = {board.name: cells for board, cells in plan.items()}
    ctx = NightContext(night, config, history, recorder, local_artifacts(artifacts_root), versions, lowering_errors,
                       results_root, skipped=skipped)  # fmt: skip
    places, started = ctx.places, ctx.started

    outcomes = fan_out(list(plan), lambda board: run_board(ctx, board, cells_of[board.name]))
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
            for model, variant, params in ((c.model, c.variant, c.params) for c in cells_of[outcome.board.name]):
                cell = CellOutcome(outcome.board.name, model, variant, stage=outcome.stage or "?",
                                   error=outcome.error, detail=outcome.detail,
                                   infrastructure=is_link_trouble(failure), exit_class=exit_class)  # fmt: skip
                threads = params.threads or outcome.board.threads
                recorder.record(record_from_cell(cell, night, versions.get(model, {}), threads))

    return all(o.ok for o in outcomes), places
