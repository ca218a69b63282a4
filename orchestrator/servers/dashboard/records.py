"""The typed records each dashboard page shows: what data.py assembles, what the templates read by attribute and,
turned into plain JSON once (`plain`), what the page's script plots.

Records that other layers already type (a run's correctness, accuracy, a comparison's operators) travel in their
own serialized form, the one their files use.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from orchestrator.results.compare_modules import ModuleDelta

# ---------------------------------------------------------------- shared


@dataclass(frozen=True, kw_only=True)
class RunRow:
    run_id: str
    board: str
    model: str
    backend: str


@dataclass(frozen=True, kw_only=True)
class PulledRun(RunRow):
    """A pulled run as the overview lists it and the compare picker offers it: what tells it apart from the others."""

    date: str  # from its run id (run ids start with their UTC time: 20261110T020000Z-...)
    median_ms: float | None
    validity: str | None  # None: not analysed (or unreadable)
    night: str | None  # the nightly night that recorded it, if any


@dataclass(frozen=True, kw_only=True)
class ProblemPage:
    """A page that could not be made from its data: the file and the field named."""

    problem: str


# ---------------------------------------------------------------- overview


@dataclass(frozen=True, kw_only=True)
class GridCell:
    board: str
    model: str
    backend: str
    key: str
    verdict: str
    median_ms: float | None
    decode_tokens_per_s: float | None  # a language model's figure: its median is one whole generation
    run_id: str | None
    has_run: bool
    detail: str
    advised_of: str | None = None  # an advised program's model as exported, run on the same board and night
    ratio: float | None = None  # its median / the one as exported (below 1: the rewrites save time)
    findings: list[str] = field(default_factory=list)  # the advisor's findings an analysis prints, one line each
    findings_said: str = ""  # how many of how many: "5 of 8 findings"
    findings_more: str | None = None  # where the rest are, when some are not listed


@dataclass(frozen=True, kw_only=True)
class Column:
    model: str
    backend: str


@dataclass(frozen=True, kw_only=True)
class Grid:
    boards: list[str]
    columns: list[Column]
    rows: list[list[GridCell | None]]  # one per board, one entry per column


@dataclass(frozen=True, kw_only=True)
class BoardNow:
    """The latest look at a board (reachable None: not looked at yet)."""

    reachable: bool | None
    text: str
    lock: str | None
    runtime: str | None = None
    checked_at: float | None = None


@dataclass(frozen=True, kw_only=True)
class BoardRow:
    name: str
    in_inventory: bool
    last_night: str | None
    last_run: str | None
    board_model: Any
    temperature_c: Any
    governor: Any
    throttling: list[Any]
    now: BoardNow | None


@dataclass(frozen=True, kw_only=True)
class OverviewPage:
    night: str | None
    boards: list[BoardRow]
    looked: bool
    grid: Grid
    counts: dict[str, int]
    runs: list[PulledRun]


# ---------------------------------------------------------------- trends


@dataclass(frozen=True, kw_only=True)
class TrendCell:
    board: str
    model: str
    backend: str
    key: str


@dataclass(frozen=True, kw_only=True)
class TrendPoint:
    night: str
    run_id: str | None
    has_run: bool
    median_ms: float | None
    p90_ms: float | None
    decode_tokens_per_s: float | None
    ttft_ms: float | None
    peak_mb: float | None
    joules_per_inference: float | None  # None: not measured (a gap in the trend, never 0)
    mj_per_token: float | None  # a language model's energy per generated token
    roofline_share: float | None  # a language model's decode share of its board's memory roofline
    verdict: str
    validity: str | None
    reasons: list[Any]
    pte_sha256: str | None
    new_program: bool
    detail: str


@dataclass(frozen=True, kw_only=True)
class NightSpan:
    first: str
    last: str


@dataclass(frozen=True, kw_only=True)
class TrendPage:
    cell: TrendCell
    points: list[TrendPoint]
    generates: bool
    measures_energy: bool  # some night measured the board's energy
    baseline: NightSpan | None  # the latest night's baseline window
    latest: TrendPoint


# ---------------------------------------------------------------- one run


@dataclass(frozen=True, kw_only=True)
class AdviceRow:
    id: str
    title: str
    saving_ms: float | None  # None: the saving is a bound, not a prediction
    fix: str
    printed: bool = False  # one an analysis prints, and the night's grid and the nightly report list


@dataclass(frozen=True, kw_only=True)
class PhaseTime:
    phase: str
    ms: float


@dataclass(frozen=True, kw_only=True)
class Reason:
    level: str
    reason: str


@dataclass(frozen=True, kw_only=True)
class ValidityView:
    status: str
    reasons: list[Reason]


@dataclass(frozen=True, kw_only=True)
class OperatorRow:
    node_id: str
    kind: str
    op: str
    mean_ms: float
    median_ms: float | None
    share: float  # % of the method's mean
    module: str | None = None  # the model's module it came from (the program's source map); None: unknown
    source: str | None = None  # "modeling_distilbert.py:182 in forward"
    inside: str | None = None  # an XNNPACK node's: the delegate call it runs in
    shape: str | None = None  # an XNNPACK node's output dims: "1×128×768"
    # a FC/conv/bmm node against the board's limits: "memory-bound 71%", "compute-bound 38%"; None: not measured
    roofline: str | None = None


@dataclass(frozen=True, kw_only=True)
class OperatorType:
    """Every row of one operator summed: "aten::where ×4 = 49 %"."""

    op: str
    kind: str
    count: int
    mean_ms: float
    median_ms: float  # the sum of its rows' medians
    share: float  # % of the method's mean


@dataclass(frozen=True, kw_only=True)
class DelegateGroup:
    """A delegate call whose time is shown by its XNNPACK nodes: the call's total, and how much of it was placed."""

    node_id: str
    op: str
    median_ms: float
    placed_ms: float  # of median_ms, its nodes' medians (the rest: the delegate's own overhead)
    nodes: int  # timed nodes
    share: float  # % of the method's median


@dataclass(frozen=True, kw_only=True)
class ModuleTime:
    """One module of the model for the run page's chart and table (summary.json's `modules`)."""

    module: str
    parent: str  # "" for a top-level module
    name: str  # its last path component
    module_type: str | None
    total_ms: float  # its descendants included
    self_ms: float
    share: float  # % of the measured time


@dataclass(frozen=True, kw_only=True)
class Split:
    delegated_ms: float
    non_delegated_ms: float
    other_ms: float


@dataclass(frozen=True, kw_only=True)
class GenerationView:
    prompt_len: int | None
    new_tokens: int | None
    context: int | None
    generations: int | None
    ttft_ms: float | None
    prefill_tokens_per_s: float | None
    decode_tokens_per_s: float | None
    token_ms: dict[str, float | None]
    load_ms: float | None
    kv_cache_bytes: int | None
    prefill_peak_bytes: Any
    decode_peak_bytes: Any
    agreement: Any
    compared: Any
    first_divergence: Any
    ids: Any


@dataclass(frozen=True, kw_only=True)
class MemoryPhase:
    phase: str
    peak_rss_bytes: Any
    rss_bytes: Any


@dataclass(frozen=True, kw_only=True)
class MemoryView:
    phases: list[MemoryPhase]
    peak_rss_bytes: int | None
    planned_bytes: int | None
    planned_arenas: list[int]
    constants_bytes: int | None
    baseline_rss_bytes: int | None
    other_bytes: int | None


@dataclass(frozen=True, kw_only=True)
class MissingCounter:
    name: str
    reason: str


@dataclass(frozen=True, kw_only=True)
class CountersView:
    status: str | None
    error: str | None
    totals: Any
    missing: list[MissingCounter]


@dataclass(frozen=True, kw_only=True)
class RunPage:
    """Everything one run's page shows. Every field is always there: a run pulled but not analysed, or whose files
    cannot be read, gets its page all the same, saying why (`analyse_command`, `problem`), and what the analysis
    says stays unknown (None, empty) until there is one to read."""

    run: RunRow
    problem: str | None
    analyse_command: str | None
    warmup_ms: list[float]
    iterations_ms: list[float]
    iterations_problem: str | None
    advice: list[AdviceRow]
    advice_problem: str | None
    explore_command: str
    previous_run: str | None
    status: str | None = None
    error: str | None = None
    program: dict[str, Any] | None = None
    phases: list[PhaseTime] = field(default_factory=list)
    warm: dict[str, Any] | None = None
    threads: int | None = None
    validity: ValidityView | None = None
    conditions: dict[str, Any] = field(default_factory=dict)
    conditions_said: list[str] = field(default_factory=list)  # the board's conditions in words
    correctness: dict[str, Any] | None = None
    accuracy: dict[str, Any] | None = None
    generation: GenerationView | None = None
    memory: MemoryView | None = None
    counters: CountersView | None = None
    numerics: dict[str, Any] | None = None  # summary.json's `numerics`: where accuracy goes
    versions: dict[str, Any] = field(default_factory=dict)
    operators: list[OperatorRow] = field(default_factory=list)
    operators_problem: str | None = None
    split: Split | None = None
    delegate_groups: list[DelegateGroup] = field(default_factory=list)
    operator_types: list[OperatorType] = field(default_factory=list)
    modules: list[ModuleTime] = field(default_factory=list)
    modules_note: str | None = None  # why there is no time by module (an analysis from before source maps)


# ---------------------------------------------------------------- compare


@dataclass(frozen=True, kw_only=True)
class ComparePage:
    """Two runs (both None: the form alone) and their comparison, or why there is none (`problem`)."""

    a: RunRow | None
    b: RunRow | None
    problem: str | None = None
    notes: list[str] = field(default_factory=list)
    ops: list[dict[str, Any]] = field(default_factory=list)  # the comparison's operator records, largest change first
    op_types: list[dict[str, Any]] = field(default_factory=list)  # the same rolled up by operator type
    rest: dict[str, Any] | None = None  # the rest of the method (compare.RestOfMethod): so the types add up
    material_share: float = 0.0  # the floor below which a change is too small to call changed (compare.MATERIAL_SHARE)
    verdict: str | None = None
    verdict_detail: str | None = None
    median_a_ms: float | None = None
    median_b_ms: float | None = None
    total: dict[str, Any] | None = None
    memory: Any = None
    generation: Any = None
    per_operator: Any = None
    modules: list[ModuleDelta] = field(default_factory=list)  # common modules (medians), largest change first
    modules_note: str | None = None  # why there are none


def plain(record: Any) -> Any:
    """A page record as plain JSON data (mappings, lists, text, numbers): the page's `page-data` block."""
    if dataclasses.is_dataclass(record) and not isinstance(record, type):
        return dataclasses.asdict(record)
    return record
