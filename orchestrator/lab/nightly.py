"""`fab nightly`: the lab's matrix every night, recorded, compared with its baseline, reported.

Cells (board × model × backend) are recorded as soon as they finish, one transaction each, so a killed
nightly re-run the same night skips what is already recorded and loses nothing.

Verdicts (results/verdicts.py) survive a noisy board:
- the same program and versions as the baseline: a shift is board drift (a warning), never a regression;
- a changed program that looks slower or faster is re-tested at once, interleaved with the baseline's program on
  the same board (deploy/abtest.py); only a confirmed shift is a regression, else it is "unconfirmed";
- a degraded run is re-measured once after a cool-down; still degraded, it is "inconclusive" (unless a changed
  program's shift is then settled by the interleaved re-test, which does not depend on tonight's run).

Exit codes: 0 all good (warnings included), 1 a confirmed regression (or a model that fails on a healthy board),
2 an infrastructure failure (a board unreachable or lost; takes precedence, since the night is incomplete).
"""

from __future__ import annotations

import datetime as dt
import secrets
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from orchestrator import console
from orchestrator.boards import labgrid
from orchestrator.boards.fanout import fan_out
from orchestrator.boards.inventory import Board, Inventory
from orchestrator.deploy.abtest import Interleaved, Program, interleave
from orchestrator.deploy.cells import CellJob, CellOutcome, is_link_trouble, run_cells_on_board
from orchestrator.deploy.runs import RunParams
from orchestrator.errors import EtlabError, ExitCode, failure_code, first_line
from orchestrator.lab.history import History, RunRecord
from orchestrator.lab.matrix import MIN_BASELINE_NIGHTS, NightlyConfig, load_config
from orchestrator.lab.report import CellVerdict, NightReport, PlaceWait, write_reports
from orchestrator.lowering import programs
from orchestrator.lowering.spec import ModelSpec
from orchestrator.results.stats import compare_samples
from orchestrator.results.validity import number_list
from orchestrator.results.verdicts import Kind, exit_code

OP_MIN_SHARE = 0.005  # an operator must move at least 0.5% of the total to be named


# ---------------------------------------------------------------- recording


def record_from_cell(cell: CellOutcome, night: str, versions: dict[str, str], threads: int | None) -> RunRecord:
    summary = cell.summary
    warm = summary.latency.warm if summary else None
    status = "ok" if cell.ok else ("infra" if cell.infrastructure else "failed")
    latencies: list[float] = []
    ops: dict[str, tuple[str, float]] = {}
    environment: dict[str, str] = {}
    if cell.bundle:
        from orchestrator.fsutil import read_json

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
                if row.get("median_ms") is not None:
                    ops[f"{row['chain']}:{row['instruction']}"] = (
                        str(row.get("op") or row.get("kind")),
                        row["median_ms"],
                    )
        except (OSError, ValueError, KeyError):
            ops = {}
    return RunRecord(
        run_id=cell.run_id or f"{night}-unrun-{secrets.token_hex(4)}",
        night=night,
        board=cell.board,
        model=cell.model,
        backend=cell.backend,
        status=status,
        validity=summary.validity.status if summary else "invalid",
        reasons=[r.reason for r in summary.validity.reasons]
        if summary and summary.validity.reasons
        else ([cell.error] if cell.error else []),
        error=cell.error,
        stage=cell.stage if not cell.ok else None,
        versions=versions,
        pte_sha256=summary.model.sha256 if summary else None,
        threads=(summary.latency.threads if summary else None) or threads,
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
    )


# ---------------------------------------------------------------- verdicts


def same_program(a: RunRecord, b: RunRecord) -> bool:
    """The same .pte and versions (workstation, runtime, runner, board image) on both sides.

    An environment field missing on one side (a history row from an older etlab) is not a difference.
    """
    if not a.pte_sha256 or a.pte_sha256 != b.pte_sha256 or a.versions != b.versions:
        return False
    shared = a.environment.keys() & b.environment.keys()
    return all(a.environment[key] == b.environment[key] for key in shared)


_CONDITIONS = (
    ("governor_before", "governor"),
    ("temperature_c_after", "temperature °C"),
    ("throttling_during_run", "throttling"),
    ("load", "load"),
)


def changed_conditions(record: RunRecord, baseline: RunRecord) -> list[str]:
    """The board conditions that differ between the baseline night and tonight, as readable phrases."""
    changes = []
    for key, label in _CONDITIONS:
        before, now = baseline.conditions.get(key), record.conditions.get(key)
        if isinstance(before, float) and isinstance(now, float):
            if abs(now - before) >= 2.0:  # a couple of degrees is the sensor's noise
                changes.append(f"{label} {before:.1f} → {now:.1f}")
        elif before != now and (before or now):
            changes.append(f"{label} {before or '—'} → {now or '—'}")
    if record.cv is not None and baseline.cv is not None and record.cv > max(2 * baseline.cv, 0.02):
        changes.append(f"timing spread (CV) {baseline.cv:.1%} → {record.cv:.1%}")
    return changes


def judge(
    record: RunRecord, baseline: Sequence[RunRecord], min_effect: float, *, min_nights: int = MIN_BASELINE_NIGHTS
) -> CellVerdict:
    """Compare one cell with its baseline nights (valid runs on the same board, model, backend and versions).

    A shift needs all of: a statistically real shift of the per-iteration samples (stats.compare_samples), an
    effect of at least `min_effect` and at least the night-to-night spread of the baseline, and a median outside
    the range of every baseline night. Nights differ more than iterations within a night, so one baseline night is
    not enough to call anything. What a shift means depends on the program (see the module docstring): for an
    unchanged program it is drift; for a changed one it is a suspicion (`suspect`) the caller re-tests.
    """
    if record.status == "infra":
        return CellVerdict(record, Kind.INFRA, record.error or "")
    if record.status != "ok":
        return CellVerdict(record, Kind.FAILED, record.error or "")
    if record.validity == "invalid":
        return CellVerdict(record, Kind.NOT_COMPARED, "this run is invalid: " + "; ".join(record.reasons))
    usable = [b for b in baseline if b.latencies_ms]
    pooled = [v for b in usable for v in b.latencies_ms]
    current = float(np.median(record.latencies_ms))
    baseline_median = float(np.median(pooled)) if pooled else None
    ratio = current / baseline_median if baseline_median else None
    if len(usable) < min_nights:
        detail = f"building a baseline: {len(usable)} valid night(s) so far, {min_nights} needed"
        return CellVerdict(record, Kind.NEW, detail, baseline_median, ratio)
    degraded = record.validity == "degraded"
    degraded_note = "tonight's run is degraded (" + "; ".join(record.reasons) + ")"
    reference = usable[0]

    if same_program(record, reference):
        # Only the nights of this very program say what it should do; the rest is the board's doing.
        nights = [b for b in usable if same_program(record, b)]
        shift = _shift(record, nights, min_effect)
        same_pooled = [v for b in nights for v in b.latencies_ms]
        drift = current / float(np.median(same_pooled))
        conditions = changed_conditions(record, reference)
        where = "; conditions changed: " + ", ".join(conditions) if conditions else "; no recorded condition changed"
        if degraded:
            detail = f"{degraded_note}, even after a re-measure; no program change, {drift - 1:+.1%} vs baseline"
            return CellVerdict(record, Kind.INCONCLUSIVE, detail + where, baseline_median, ratio, drift=drift)
        if shift is not None:
            detail = f"no program change: {shift} is board drift" + where
            return CellVerdict(record, Kind.DRIFT, detail, baseline_median, ratio, drift=drift)
        return CellVerdict(record, Kind.OK, "no program change; within noise", baseline_median, ratio, drift=drift)

    shift = _shift(record, usable, min_effect)
    if shift is None:
        if degraded:
            return CellVerdict(record, Kind.INCONCLUSIVE, f"{degraded_note}, even after a re-measure")
        return CellVerdict(record, Kind.OK, "program changed; within noise of the baseline", baseline_median, ratio)
    suspect = "slower" if current > (baseline_median or 0) else "faster"
    detail = f"program changed and looks {shift} against the baseline"
    if degraded:
        detail += f"; {degraded_note}"
    verdict = CellVerdict(record, Kind.UNCONFIRMED, detail, baseline_median, ratio, suspect=suspect)
    verdict.reference = reference
    if suspect == "slower":
        verdict.slower_ops = _slower_ops(record, usable, min_effect)
    return verdict


# Verdicts a memory finding may replace: it never hides a failure, a regression or a pending re-test.
_MEMORY_MAY_REPLACE = (Kind.OK, Kind.NEW, Kind.DRIFT, Kind.IMPROVEMENT)


def judge_memory(verdict: CellVerdict, baseline: Sequence[RunRecord], min_effect: float) -> CellVerdict:
    """Peak memory against the baseline nights, with the latency rules: a growth of at least `min_effect` beyond
    every baseline night is board drift for the same program and a regression for a changed one.

    Peak RSS of one program hardly moves between runs, so no interleaved re-test is needed to believe it; the
    verdict info keeps the figures either way, for the report.
    """
    record = verdict.record
    nights = [b.peak_rss_bytes for b in baseline if b.peak_rss_bytes and b.status == "ok"]
    if record.status != "ok" or not record.peak_rss_bytes or not nights:
        return verdict
    reference = float(np.median(nights))
    growth = record.peak_rss_bytes / reference - 1
    verdict.memory = {"peak_rss_bytes": record.peak_rss_bytes, "baseline_peak_rss_bytes": reference, "growth": growth}
    if len(nights) < MIN_BASELINE_NIGHTS or growth < min_effect or record.peak_rss_bytes <= max(nights):
        return verdict
    same = bool(baseline) and same_program(record, baseline[0])
    detail = (
        f"peak memory {record.peak_rss_bytes / 1e6:.1f} MB is {growth:+.1%} over the baseline's "
        f"{reference / 1e6:.1f} MB"
    )
    if verdict.verdict not in _MEMORY_MAY_REPLACE:
        verdict.detail += f"; {detail}"
        return verdict
    if same:
        verdict.verdict = Kind.DRIFT
        verdict.detail = f"no program change: {detail}, board drift" + (f"; {verdict.detail}" if verdict.detail else "")
    else:
        verdict.verdict = Kind.REGRESSION
        verdict.detail = f"program changed: {detail}" + (f"; {verdict.detail}" if verdict.detail else "")
    return verdict


def _shift(record: RunRecord, nights: Sequence[RunRecord], min_effect: float) -> str | None:
    """ "12.0% slower (p=…, CI …); baseline: …" when tonight is beyond the baseline nights, else None."""
    pooled = [v for b in nights for v in b.latencies_ms]
    medians = [float(np.median(b.latencies_ms)) for b in nights]
    spread = (max(medians) - min(medians)) / float(np.median(medians)) if len(medians) > 1 else 0.0
    threshold = max(min_effect, spread)
    verdict = compare_samples(pooled, record.latencies_ms, min_effect=threshold)
    current = float(np.median(record.latencies_ms))
    beyond = current > max(medians) if verdict.change == "slower" else current < min(medians)
    if not (verdict.is_change and beyond):
        return None
    return f"{verdict.reason}; baseline: {len(nights)} nights, {len(pooled)} samples, threshold {threshold:.1%}"


def confirm(verdict: CellVerdict, result: Interleaved | None, *, why_not: str | None = None) -> CellVerdict:
    """Settle a suspected cell with its interleaved re-test (None with `why_not` when it could not run)."""
    if result is None or result.error:
        reason = why_not or (result.reason if result else "no re-test")
        verdict.detail += f"; not confirmed: {reason}"
        verdict.retest = result.to_dict() if result else None
        return verdict
    verdict.retest = result.to_dict()
    figures = (
        f"interleaved re-test: baseline program {result.median_a_ms:.3f} ms, tonight's {result.median_b_ms:.3f} ms "
        f"({(result.ratio or 1) - 1:+.1%}, {result.timing})"
    )
    if result.confirmed and result.change == verdict.suspect:
        verdict.verdict = Kind.REGRESSION if result.change == "slower" else Kind.IMPROVEMENT
        verdict.detail += f"; confirmed by the {figures}: {result.reason}"
        if verdict.verdict == Kind.REGRESSION and verdict.slower_ops:
            verdict.detail += "; slower operators: " + ", ".join(op["op"] for op in verdict.slower_ops[:5])
        return verdict
    verdict.slower_ops = []
    verdict.detail += f"; not confirmed by the {figures}: {result.reason}"
    return verdict


def _slower_ops(record: RunRecord, baseline: Sequence[RunRecord], min_effect: float) -> list[dict[str, Any]]:
    total = record.median_ms or 0.0
    rows = []
    for key, (name, current) in record.ops.items():
        before = [b.ops[key][1] for b in baseline if key in b.ops]
        if not before:
            continue
        reference = float(np.median(before))
        delta = current - reference
        if reference > 0 and current / reference - 1 >= min_effect and delta >= OP_MIN_SHARE * total:
            rows.append({"op": f"{name} [{key}]", "baseline_ms": reference, "current_ms": current, "delta_ms": delta})
    return sorted(rows, key=lambda row: -row["delta_ms"])


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
    from orchestrator.transport import connect

    reference = verdict.reference
    kept = programs.find(reference.pte_sha256 if reference else None)
    if kept is None or reference is None or reference.pte_sha256 is None:
        return confirm(verdict, None, why_not="the baseline's program is not kept, so it cannot be re-run")
    artifact = job.artifact
    a = Program("baseline", kept, reference.pte_sha256)
    b = Program("tonight", artifact.pte, artifact.sha256)
    inputs = (artifact.paths.reference_inputs, artifact.sidecar["files"]["reference_inputs"]["sha256"])
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


def run_nightly(
    inventory: Inventory,
    *,
    night: str | None = None,
    history_url: str | None = None,
    reports_dir: Path | None = None,
    artifacts_root: Path | None = None,
    results_root: Path | None = None,
) -> NightReport:
    from orchestrator.lowering import lower as lowering
    from orchestrator.lowering.artifacts import load_artifact

    config = load_config(inventory)
    night = night or dt.date.today().isoformat()
    history = History(history_url or config.history_url)
    try:
        recorded = history.recorded_cells(night)
        specs: dict[str, ModelSpec] = {}
        plan: dict[str, list[tuple[str, str, RunParams]]] = {}
        skipped = []
        # Labgrid tag selectors become their places; every board of the matrix that is a place is reserved.
        boards: dict[str, Board] = {}
        expanded: dict[str, list[str]] = {}
        for entry in config.entries:
            for name in entry.boards:
                if name not in expanded:
                    found = labgrid.expand([inventory.boards[name]])
                    expanded[name] = [board.name for board in found]
                    boards.update((board.name, board) for board in found if board.name not in boards)
        for entry in config.entries:
            for board in [place for name in entry.boards for place in expanded[name]]:
                for spec in entry.models:
                    specs[spec.name] = spec
                    for backend in entry.backends:
                        if (board, spec.name, backend) in recorded:
                            skipped.append((board, spec.name, backend))
                        else:
                            plan.setdefault(board, []).append((spec.name, backend, entry.params))
        if skipped:
            console.info(f"{len(skipped)} cell(s) already recorded for {night}: skipped")

        # Lower on the workstation first, once per model (cached across nights when nothing changed).
        wanted: dict[str, set[str]] = {}
        for cells in plan.values():
            for model, backend, _ in cells:
                wanted.setdefault(model, set()).add(backend)
        lowering_errors: dict[str, str] = {}
        versions: dict[str, dict[str, str]] = {}
        for model, backends in wanted.items():
            try:
                result = lowering.lower(
                    specs[model], backends=sorted(backends), weights=config.weights, root=artifacts_root
                )
                versions[model] = next(iter(result.backends.values())).sidecar["versions"]
            except EtlabError as exc:
                lowering_errors[model] = first_line(exc)

        places: dict[str, PlaceWait] = {}
        started: set[str] = set()

        def on_board(board: Board) -> list[CellOutcome]:
            started.add(board.name)
            if board.labgrid is not None:
                lg = board.labgrid
                places[board.name] = PlaceWait(str(lg.place), lg.coordinator, lg.waited)
            jobs: dict[tuple[str, str], CellJob] = {}
            failed, threads = [], {}
            for model, backend, params in plan[board.name]:
                threads[(model, backend)] = params.threads or board.threads
                if model in lowering_errors:
                    failed.append(CellOutcome(board.name, model, backend, stage="lower", error=lowering_errors[model]))
                else:
                    jobs[(model, backend)] = CellJob(
                        load_artifact(model, backend, artifacts_root), params, config.accuracy
                    )
            remeasured: dict[tuple[str, str, str], dict[str, Any]] = {}
            held: list[CellOutcome] = []

            def record(cell: CellOutcome) -> None:
                run = record_from_cell(cell, night, versions.get(cell.model, {}), threads[(cell.model, cell.backend)])
                if cell.ok and (cell.model, cell.backend) in jobs:
                    artifact = jobs[(cell.model, cell.backend)].artifact
                    try:
                        # Tonight's program: tomorrow's baseline.
                        programs.keep(artifact.pte, artifact.sha256, programs.holder_id(history.url))
                    except (EtlabError, OSError) as exc:
                        console.warn(f"{board.name}: {cell.model}/{cell.backend}: program not kept: {exc}")
                history.record(run)

            def record_or_hold(cell: CellOutcome) -> None:
                # A degraded run is re-measured after the other cells, before it is recorded (a kill re-runs it).
                if cell.ok and cell.validity == "degraded":
                    held.append(cell)
                else:
                    record(cell)

            for cell in failed:
                record(cell)
            cells = run_cells_on_board(board, list(jobs.values()), on_cell=record_or_hold, results_root=results_root)
            for first in held:
                reasons = [r.reason for r in first.summary.validity.reasons] if first.summary else []
                console.warn(
                    f"{board.name}: {first.model}/{first.backend} is degraded ({'; '.join(reasons)}): "
                    f"re-measuring after a {config.cooldown_seconds:g} s cool-down"
                )
                time.sleep(config.cooldown_seconds)
                (again,) = run_cells_on_board(
                    board, [jobs[(first.model, first.backend)]], setup=False, results_root=results_root
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
                (run,) = [r for r in history.runs(night=night, cell=cell.cell)]
                baseline = _baseline(history, run, config)
                verdict = judge(run, baseline, config.min_effect, min_nights=config.min_baseline_nights)
                verdict.remeasured = remeasured.get(cell.cell)
                if verdict.suspect:
                    verdict = _retest(board, verdict, jobs[(cell.model, cell.backend)], config)
                    if run.validity == "degraded" and verdict.verdict == Kind.UNCONFIRMED:
                        verdict.verdict = Kind.INCONCLUSIVE  # degraded twice and the re-test settled nothing
                verdict = judge_memory(verdict, baseline, config.min_effect)
                history.set_verdict(run.run_id, verdict.verdict, verdict.info())
            return failed + cells

        outcomes = fan_out([boards[name] for name in plan], on_board)
        for outcome in outcomes:
            if not outcome.ok:  # a bug, or the board's labgrid place: still visible, and a reason to alarm
                console.error(f"{outcome.board.name}: {outcome.error}")
                lg = outcome.board.labgrid
                if lg is not None:
                    places.setdefault(outcome.board.name, PlaceWait(str(lg.place), lg.coordinator, None, outcome.error))
            if not outcome.ok and outcome.board.name not in started:
                # Never started (no labgrid place, e.g. --lg-wait ran out): its cells are recorded as failed.
                exc = outcome.exception
                for model, backend, params in plan[outcome.board.name]:
                    cell = CellOutcome(outcome.board.name, model, backend, stage=outcome.stage or "?",
                                       error=outcome.error, detail=outcome.detail,
                                       infrastructure=is_link_trouble(exc),
                                       exit_class=ExitCode.SOFTWARE if exc is None else failure_code(exc))  # fmt: skip
                    threads = params.threads or outcome.board.threads
                    history.record(record_from_cell(cell, night, versions.get(model, {}), threads))

        # Tonight's verdicts cover every cell recorded tonight, including those from an earlier, killed run.
        tonight = history.runs(night=night)
        verdicts = []
        trends: dict[tuple[str, str, str], list[RunRecord]] = {}
        for record in tonight:
            if record.verdict:
                verdict = CellVerdict.stored(record)
            else:  # recorded by a run killed before it judged the cell: judged now, without a re-test
                baseline = _baseline(history, record, config)
                verdict = judge(record, baseline, config.min_effect, min_nights=config.min_baseline_nights)
                if verdict.suspect:
                    verdict = confirm(verdict, None, why_not="the night was resumed after the cell ran")
                verdict = judge_memory(verdict, baseline, config.min_effect)
                history.set_verdict(record.run_id, verdict.verdict, verdict.info())
            verdicts.append(verdict)
            trends[record.cell] = list(reversed(history.runs(cell=record.cell, limit=60)))
        verdicts.sort(key=lambda v: v.cell)
        _keep_baselines_only(history, config)
        code = exit_code((v.verdict for v in verdicts), infrastructure_ok=all(o.ok for o in outcomes))
        report = NightReport(night, verdicts, trends, code, skipped, places=places)
        report.outputs = write_reports(report, reports_dir or config.reports_dir)
        return report
    finally:
        history.close()


def _keep_baselines_only(history: History, config: NightlyConfig) -> None:
    """Drop kept programs that no cell of this history uses as a baseline any more (tonight's included)."""
    wanted = history.baseline_programs(config.baseline_nights)
    for sha in programs.prune(wanted, programs.holder_id(history.url)):
        console.info(f"dropped kept program {sha[:12]}: no longer a baseline")
