"""What the dashboard's pages show, assembled from etlab's typed records: the runs under results/ (`list_runs`,
`load_summary`, `load_ops`, the bundle's timings through `read_bundle`) and the nightly history (`History`,
`RunRecord`) and the advisor's `load_advice`. Nothing here parses a bundle file its own way.

Every page gets a typed record (records.py) for its Jinja2 template, turned into plain JSON once for its plots;
board-controlled text stays text here and is escaped where it is written.
"""

from __future__ import annotations

import dataclasses
import hashlib
import statistics
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from orchestrator.advice.documents import finding_lines, load_advice
from orchestrator.advice.findings import shown_findings
from orchestrator.deploy.board_status import BoardStatus
from orchestrator.errors import AnalysisError, EtlabError
from orchestrator.lab.history import History
from orchestrator.lab.matrix import DEFAULT_BASELINE_NIGHTS
from orchestrator.lab.run_record import RunRecord
from orchestrator.records import to_data
from orchestrator.results.bundle_reader import read_bundle
from orchestrator.results.compare import MATERIAL_SHARE, CompareError, compare_runs
from orchestrator.results.compare_modules import module_deltas
from orchestrator.results.documents import NotAnalysed, load_summary
from orchestrator.results.ops_record import load_ops
from orchestrator.results.store import LocalRun, list_runs
from orchestrator.results.summary import RunSummary
from orchestrator.results.validity import number_list
from orchestrator.results.verdicts import Kind
from orchestrator.servers.dashboard.records import (
    AdviceRow,
    BoardNow,
    BoardRow,
    Column,
    ComparePage,
    CountersView,
    DelegateGroup,
    GenerationView,
    Grid,
    GridCell,
    MemoryPhase,
    MemoryView,
    MissingCounter,
    NightSpan,
    OperatorRow,
    OperatorType,
    OverviewPage,
    PhaseTime,
    PulledRun,
    Reason,
    RunPage,
    RunRow,
    Split,
    TrendCell,
    TrendPage,
    TrendPoint,
    ValidityView,
)
from orchestrator.servers.dashboard.where import NO_MODULES, TOP_OPERATORS, module_times, operator_rows
from orchestrator.servers.dashboard.words import conditions_in_words

# The grid's colours, by verdict: one legend for the overview, the trends and the compare page.
VERDICT_ORDER = (
    "regression", "failed", "infra", "unconfirmed", "drift", "inconclusive", "not compared", "improvement", "new", "ok",
)  # fmt: skip
Cell = tuple[str, str, str]  # board, model, backend


class NotFound(EtlabError):
    """A page asked for a run or a cell this lab does not have (the server answers 404)."""


def cell_key(cell: Cell) -> str:
    """A short stable name for a cell: board names come from inventories and boards, so never a file name as is."""
    return hashlib.sha256("\0".join(cell).encode()).hexdigest()[:16]


def _verdict(record: RunRecord) -> str:
    if record.verdict:
        return str(record.verdict)
    return {"failed": Kind.FAILED, "infra": Kind.INFRA}.get(record.status, Kind.NEW).value


@dataclass
class Lab:
    """The lab's data sources: a results folder and a history, either of which may be missing."""

    results_root: Path | None = None
    history: History | None = None
    baseline_nights: int = DEFAULT_BASELINE_NIGHTS
    _runs: list[LocalRun] | None = field(default=None, repr=False)

    def runs(self) -> list[LocalRun]:
        """Every pulled run, oldest first (read once per Lab: a page load makes a new one when it needs fresh data)."""
        if self._runs is None:
            root = self.results_root
            self._runs = list_runs(root) if root is not None and root.is_dir() else []
        return self._runs

    def find(self, run_id: str) -> LocalRun:
        found = [run for run in self.runs() if run.run_id == run_id]
        if not found:
            raise NotFound(f"no run {run_id!r} in the results folder")
        return found[0]

    def has_run(self, run_id: str) -> bool:
        return any(run.run_id == run_id for run in self.runs())


# ---------------------------------------------------------------- overview


def overview(
    lab: Lab, inventory_boards: Iterable[str] = (), live: Mapping[str, BoardStatus] | None = None
) -> OverviewPage:
    """The boards (with `live`, the latest look at them), and the latest night as a board × model × backend grid of
    verdicts."""
    night = lab.history.latest_night() if lab.history else None
    records = lab.history.records(night=night) if lab.history and night else []
    local = {run.run_id for run in lab.runs()}
    medians = {r.cell: r.median_ms for r in records}
    cells = [
        GridCell(
            **_advised(r, medians),
            **_findings(lab, r.run_id if r.run_id in local else None),
            board=r.board,
            model=r.model,
            backend=r.backend,
            key=cell_key(r.cell),
            verdict=_verdict(r),
            median_ms=r.median_ms,
            decode_tokens_per_s=r.generation.decode_tokens_per_s if r.generation else None,
            run_id=r.run_id,
            has_run=r.run_id in local,
            detail=str((r.verdict_info or {}).get("detail") or r.error or ""),
        )
        for r in sorted(records, key=lambda r: r.cell)
    ]
    boards = sorted({r.board for r in records})
    columns = sorted({(r.model, r.backend) for r in records})
    grid = {(c.board, c.model, c.backend): c for c in cells}
    return OverviewPage(
        night=night,
        boards=board_rows(lab, inventory_boards, live),
        looked=live is not None,
        grid=Grid(
            boards=boards,
            columns=[Column(model=m, backend=b) for m, b in columns],
            rows=[[grid.get((board, m, b)) for m, b in columns] for board in boards],
        ),
        counts={
            v: sum(1 for c in cells if c.verdict == v) for v in VERDICT_ORDER if any(c.verdict == v for c in cells)
        },
        runs=pulled_runs(lab, 50),
    )


def _advised(record: RunRecord, medians: Mapping[Cell, float | None]) -> dict[str, Any]:
    """An advised program's cell (its model is the exported one's name and its rewrites, dot-joined): the model as
    exported on the same board and backend that night, and the ratio of their medians."""
    exported = [
        (model, median)
        for (board, model, backend), median in medians.items()
        if (board, backend) == (record.board, record.backend) and record.model.startswith(f"{model}.")
    ]
    if not exported:
        return {}
    model, median = max(exported, key=lambda pair: len(pair[0]))  # the longest name: the program it rewrites
    return {"advised_of": model, "ratio": record.median_ms / median if record.median_ms and median else None}


def _findings(lab: Lab, run_id: str | None) -> dict[str, Any]:
    """The advisor's findings for a pulled run as an analysis prints them, one line each, with how many of how many
    (none when it has no advice.json or a damaged one): the nightly report lists the same."""
    if run_id is None or not lab.has_run(run_id):
        return {}
    found = finding_lines(lab.find(run_id).path)
    return {"findings": list(found.lines), "findings_said": found.said, "findings_more": found.more}


def _run_row(run: LocalRun) -> RunRow:
    return RunRow(run_id=run.run_id, board=run.board, model=run.model, backend=run.backend)


def pulled_runs(lab: Lab, limit: int | None = None) -> list[PulledRun]:
    """The pulled runs, newest first, with their date, median, validity and night (the last `limit` of them)."""
    nights = {r.run_id: r.night for r in lab.history.records()} if lab.history else {}
    chosen = lab.runs()[-limit:] if limit else lab.runs()
    rows = []
    for run in reversed(chosen):
        try:
            summary: RunSummary | None = load_summary(run.path)
        except AnalysisError:
            summary = None
        warm = summary.latency.warm if summary else None
        stamp = run.run_id.split("-", 1)[0]
        date = f"{stamp[:4]}-{stamp[4:6]}-{stamp[6:8]}" if len(stamp) >= 8 and stamp[:8].isdigit() else ""
        rows.append(
            PulledRun(
                **vars(_run_row(run)),
                date=date,
                median_ms=warm.median_ms if warm else None,
                validity=summary.validity.status if summary else None,
                night=nights.get(run.run_id),
            )
        )
    return rows


def board_rows(
    lab: Lab, inventory_boards: Iterable[str] = (), live: Mapping[str, BoardStatus] | None = None
) -> list[BoardRow]:
    """Each board known to the inventory, the history or the results folder, with its last run's conditions and,
    when it was looked at, whether it is reachable and who holds it now."""
    last_night = lab.history.boards() if lab.history else {}
    last_local: dict[str, LocalRun] = {run.board: run for run in lab.runs()}
    rows = []
    for name in sorted({*inventory_boards, *last_night, *last_local}):
        conditions: dict[str, Any] = {}
        last = None
        if name in last_local:
            last = last_local[name].run_id
            try:
                conditions = load_summary(last_local[name].path).board_conditions
            except AnalysisError:
                conditions = {}
        if name in last_night and lab.history is not None and not conditions:
            latest = lab.history.records(board=name, limit=1)
            if latest:
                conditions, last = latest[0].conditions or {}, last or latest[0].run_id
        rows.append(
            BoardRow(
                name=name,
                in_inventory=name in set(inventory_boards),
                last_night=last_night.get(name),
                last_run=last,
                board_model=conditions.get("board_model"),
                temperature_c=conditions.get("temperature_c_after") or conditions.get("temperature_c_before"),
                governor=conditions.get("governor_after") or conditions.get("governor_before"),
                throttling=list(conditions.get("throttling_during_run") or []),
                now=_looked_at(live.get(name)) if live is not None else None,
            )
        )
    return rows


def _looked_at(status: BoardStatus | None) -> BoardNow:
    """The latest look at a board: not yet looked at (a board of the history only, or the first look is running)."""
    if status is None:
        return BoardNow(reachable=None, text="not looked at", lock=None)
    holders = [text for text in (status.lock, status.place) if text]
    return BoardNow(
        reachable=status.reachable,
        text="yes" if status.reachable else f"no: {status.error}",
        lock="; ".join(holders) or None,
        runtime=status.runtime,
        checked_at=status.checked_at,
    )


# ---------------------------------------------------------------- trends


def trend(lab: Lab, cell: Cell) -> TrendPage:
    """One cell night by night: medians, p90, peak memory, energy and a language model's roofline share (None on a
    night that did not measure them), verdicts, program changes and the baseline window."""
    if lab.history is None:
        raise NotFound("no nightly history")
    records = list(reversed(lab.history.records(cell=cell)))
    if not records:
        raise NotFound(f"no nights of {'/'.join(cell)} in the history")
    local = {run.run_id for run in lab.runs()}
    points = []
    previous_sha = None
    for record in records:
        points.append(
            TrendPoint(
                night=record.night,
                run_id=record.run_id,
                has_run=record.run_id in local,
                median_ms=record.median_ms,
                p90_ms=record.p90_ms,
                decode_tokens_per_s=record.generation.decode_tokens_per_s if record.generation else None,
                ttft_ms=record.generation.ttft_ms if record.generation else None,
                peak_mb=record.peak_rss_bytes / 1e6 if record.peak_rss_bytes else None,
                joules_per_inference=record.joules_per_inference,
                mj_per_token=record.mj_per_token,
                roofline_share=record.roofline_share,
                verdict=_verdict(record),
                validity=record.validity,
                reasons=list(record.reasons or []),
                pte_sha256=record.pte_sha256,
                new_program=previous_sha is not None and record.pte_sha256 not in (None, previous_sha),
                detail=str((record.verdict_info or {}).get("detail") or record.error or ""),
            )
        )
        previous_sha = record.pte_sha256 or previous_sha
    # The baseline of the latest night: the nights before it that may be one (ran, valid, not inconclusive).
    latest = points[-1]
    eligible = [
        p for p in points[:-1] if p.validity != "invalid" and p.verdict not in ("inconclusive", "failed", "infra")
    ]
    window = eligible[-lab.baseline_nights :]
    return TrendPage(
        cell=TrendCell(board=cell[0], model=cell[1], backend=cell[2], key=cell_key(cell)),
        points=points,
        generates=any(p.decode_tokens_per_s is not None for p in points),
        measures_energy=any(p.joules_per_inference is not None or p.mj_per_token is not None for p in points),
        baseline=NightSpan(first=window[0].night, last=window[-1].night) if window else None,
        latest=latest,
    )


def cells(lab: Lab) -> list[Cell]:
    """Every cell the history has."""
    if lab.history is None:
        return []
    return sorted({r.cell for r in lab.history.records()})


# ---------------------------------------------------------------- one run


def _advice(run_dir: Path) -> tuple[list[AdviceRow], str | None]:
    """The advisor's findings (id, title, predicted saving, fix) when an analysis or `fab advise` wrote them; a
    damaged advice.json shows as no findings and why (the run page still loads)."""
    try:
        advice = load_advice(run_dir)
    except AnalysisError as exc:
        return [], str(exc)
    if advice is None:
        return [], None
    printed = {f.id for f in shown_findings(advice)}
    findings = [
        AdviceRow(id=f.id, title=f.title, saving_ms=None if f.saving_is_bound else f.saving_ms, fix=f.fix,
                  printed=f.id in printed)
        for f in advice.findings
    ]  # fmt: skip
    return findings, None


def _iterations(run_dir: Path) -> tuple[list[float], list[float], str | None]:
    """Warm-up and timed iterations as the board's timings.json has them (finite numbers only), and why there are
    none when the bundle cannot be read."""
    try:
        timings = read_bundle(run_dir).timings
    except AnalysisError as exc:
        return [], [], str(exc)
    return number_list(timings.get("warmup_ms")), number_list(timings.get("iterations_ms")), None


def run_page(lab: Lab, run_id: str) -> RunPage:
    """Everything one run's page shows. A run that was pulled but not analysed, or whose files cannot be read (the
    file and the field named), gets its page all the same, saying so."""
    run = lab.find(run_id)
    summary: RunSummary | None = None
    problem = analyse_command = None
    try:
        summary = load_summary(run.path)
    except NotAnalysed:
        analyse_command = f"fab analyze --run {run.run_id}"
    except AnalysisError as exc:
        problem = str(exc)
    warmup, iterations, iterations_problem = _iterations(run.path)
    advice, advice_problem = _advice(run.path)
    earlier = [r.run_id for r in lab.runs() if (r.board, r.model, r.backend) == (run.board, run.model, run.backend)]
    position = earlier.index(run.run_id)
    page = RunPage(
        run=_run_row(run),
        problem=problem,
        analyse_command=analyse_command,
        warmup_ms=warmup,
        iterations_ms=iterations,
        iterations_problem=iterations_problem,
        advice=advice,
        advice_problem=advice_problem,
        explore_command=f"fab explore --run {run.run_id}",
        # the comparison a static export carries too (default_pairs)
        previous_run=earlier[position - 1] if position > 0 else None,
    )
    if summary is None:
        return page
    latency = summary.latency
    operators, groups, types, operators_problem, split = _operators(run.path)
    return dataclasses.replace(
        page,
        status=summary.status,
        error=summary.error,
        program=dict(vars(summary.model)),
        phases=[
            PhaseTime(phase=name, ms=value)
            for name, value in (
                ("load", latency.load_ms),
                ("method init", latency.method_init_ms),
                ("first run", latency.first_run_ms),
            )
            if value is not None
        ],
        warm=to_data(latency.warm),
        threads=latency.threads,
        validity=ValidityView(
            status=summary.validity.status,
            reasons=[Reason(level=r.level, reason=r.reason) for r in summary.validity.reasons],
        ),
        conditions=summary.board_conditions,
        conditions_said=conditions_in_words(summary.board_conditions),
        correctness=to_data(summary.correctness),
        accuracy=to_data(summary.accuracy),
        generation=_generation(summary),
        memory=_memory(summary),
        counters=_counters(summary),
        numerics=to_data(summary.numerics),
        versions=summary.versions,
        operators=operators,
        operators_problem=operators_problem,
        split=split,
        delegate_groups=groups,
        operator_types=types,
        modules=module_times(summary.modules) if summary.modules is not None else [],
        modules_note=None if summary.modules is not None else NO_MODULES,
    )


def _operators(
    run_dir: Path,
) -> tuple[list[OperatorRow], list[DelegateGroup], list[OperatorType], str | None, Split | None]:
    """Top operators (the XNNPACK nodes inside delegates among them, where.py) with their share of the method, the
    delegate calls they run in, and the delegated / non-delegated split (or why none)."""
    try:
        ops = load_ops(run_dir)
    except AnalysisError as exc:
        return [], [], [], str(exc), None
    operators, groups, types = operator_rows(ops, TOP_OPERATORS)
    delegated = ops.delegated_median_ms  # medians, as the shares beside it
    kernels = sum(i.median_ms for i in ops.kernel_calls())
    split = Split(
        delegated_ms=delegated,
        non_delegated_ms=kernels,
        other_ms=max(0.0, ops.method_median_ms - delegated - kernels),
    )
    return operators, groups, types, None, split


def _generation(summary: RunSummary) -> GenerationView | None:
    """A language model's figures as it is used: prompt and new tokens, time to first token, decode speed, the decode
    step's latency, memory per phase and the generated ids against eager greedy generation."""
    generation = summary.generation
    if generation is None:
        return None
    tokens = generation.tokens
    return GenerationView(
        prompt_len=generation.prompt_len,
        new_tokens=generation.new_tokens,
        context=generation.context,
        generations=generation.generations,
        ttft_ms=generation.ttft_ms,
        prefill_tokens_per_s=generation.prefill_tokens_per_s,
        decode_tokens_per_s=generation.decode_tokens_per_s,
        token_ms={key: generation.token_ms.get(key) for key in ("median", "p90", "max")},
        load_ms=generation.load_ms,
        kv_cache_bytes=generation.kv_cache_bytes,
        prefill_peak_bytes=generation.memory.get("prefill"),
        decode_peak_bytes=generation.memory.get("decode"),
        agreement=generation.token_agreement,
        compared=tokens.compared if tokens else None,
        first_divergence=tokens.first_divergence if tokens else None,
        ids=generation.ids_text,
    )


def _memory(summary: RunSummary) -> MemoryView | None:
    memory = summary.memory
    if memory is None:
        return None
    return MemoryView(
        phases=[
            MemoryPhase(phase=name, peak_rss_bytes=values.get("peak_rss_bytes"), rss_bytes=values.get("rss_bytes"))
            for name, values in memory.phases.items()
        ],
        peak_rss_bytes=memory.peak_rss_bytes,
        planned_bytes=memory.planned_bytes,
        planned_arenas=list(memory.planned_arenas),
        constants_bytes=memory.constants_bytes,
        baseline_rss_bytes=memory.baseline_rss_bytes,
        other_bytes=memory.other_bytes,
    )


def _counters(summary: RunSummary) -> CountersView | None:
    counters = summary.counters
    if counters is None:
        return None
    return CountersView(
        status=counters.status,
        error=counters.error,
        totals=counters.totals,
        missing=[MissingCounter(name=str(m.get("name")), reason=str(m.get("reason") or m.get("error") or ""))
                 for m in counters.missing],
    )  # fmt: skip


# ---------------------------------------------------------------- compare


def compare_page(lab: Lab, run_a: str, run_b: str) -> ComparePage:
    """Two runs: the per-operator deltas and the verdict with its rules (nothing written into the runs); every figure
    a median, and an operator changed only as `fab compare` says (its own test, and MATERIAL_SHARE of A's median)."""
    a, b = lab.find(run_a), lab.find(run_b)
    try:
        modules, modules_note = module_deltas(load_ops(a.path), load_ops(b.path))
    except AnalysisError as exc:
        modules, modules_note = [], f"No modules compared: {exc}"
    try:
        comparison = compare_runs(a.path, b.path, allow_rebuilt=True, write=False)
    except (CompareError, AnalysisError) as exc:
        return ComparePage(a=_run_row(a), b=_run_row(b), problem=str(exc), modules=modules, modules_note=modules_note)
    return ComparePage(
        modules=modules,
        modules_note=modules_note,
        a=_run_row(a),
        b=_run_row(b),
        verdict=comparison.verdict.value,
        verdict_detail=comparison.verdict_detail,
        median_a_ms=comparison.median_a_ms,
        median_b_ms=comparison.median_b_ms,
        total=to_data(comparison.total),
        notes=list(comparison.notes),
        memory=comparison.memory,
        generation=comparison.generation,
        per_operator=comparison.per_operator_scope,
        ops=sorted(
            (
                {**to_data(op), "where": op.where, "changed": comparison.changed(op)}
                for op in [*comparison.ops, *comparison.delegate_ops]
            ),
            key=lambda op: -abs(op["delta_ms"] or 0.0),
        ),
        op_types=to_data(list(comparison.op_types)),
        rest=to_data(comparison.rest),
        material_share=MATERIAL_SHARE,
    )


def default_pairs(lab: Lab) -> list[tuple[str, str]]:
    """Each run against the previous run of its cell: the comparisons a static export carries."""
    previous: dict[Cell, str] = {}
    pairs = []
    for run in lab.runs():
        cell = (run.board, run.model, run.backend)
        if cell in previous:
            pairs.append((previous[cell], run.run_id))
        previous[cell] = run.run_id
    return pairs


def median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None
