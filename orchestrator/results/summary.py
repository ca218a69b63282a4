"""`analysis/summary.json` as types: the analysis writes a RunSummary, and every reader gets one back.

RunSummary is a versioned document (orchestrator/records.py): `summary_data()` writes it in its documented layout
(docs/DESIGN.md), `read_summary()` reads it back, refusing a document whose shape is wrong instead of letting `.get`
chains turn it into silent `None`s. The field types are the checks (a time is a number >= 0, a count or a byte
count an integer >= 0, never a bool, a share 0..1, the validity one of valid/degraded/invalid); anything else is a
SummaryError (exit 65) naming the file and the field, so no reader crashes on it later. Absent and null mean
unknown; fields a reader does not know are ignored; a document from a newer etlab is refused by its version. The
sections whose content is a report in its own right (board conditions, profile) stay mappings. The outputs'
checks (correctness, accuracy) are summary_outputs.py's.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Annotated, Any, ClassVar, Literal, get_args

import msgspec

from orchestrator.errors import AnalysisError
from orchestrator.records import (
    Count,
    Document,
    Duration,
    RecordError,
    Share,
    complete,
    from_data,
    read_document,
    write_document,
)
from orchestrator.results.modules import ModuleTree
from orchestrator.results.op_roofline import OperatorRooflines
from orchestrator.results.summary_outputs import Accuracy, Correctness

SUMMARY_SCHEMA = 1
ValidityStatus = Literal["valid", "degraded", "invalid"]
VALIDITY_LEVELS: tuple[ValidityStatus, ...] = get_args(ValidityStatus)
RunId = Annotated[str, msgspec.Meta(min_length=1, description="a run id")]


class SummaryError(RecordError, AnalysisError):
    """A summary.json field that is not what an analysis writes: the file, the field and what is wrong (exit 65).
    An AnalysisError too, as every reader of an analysis's files catches."""


@dataclass(frozen=True)
class WarmLatency:
    """The measured (warm) iterations."""

    min_ms: Duration
    median_ms: Duration
    mean_ms: Duration
    p90_ms: Duration
    max_ms: Duration
    cv: Duration


@dataclass(frozen=True)
class HashingTimes:
    """The agent hashing the model and the inputs before the run (run.json's `hashing_ms`)."""

    model: Duration | None = None
    inputs: Duration | None = None


@dataclass(frozen=True)
class Latency:
    load_ms: Duration | None = None
    method_init_ms: Duration | None = None
    first_run_ms: Duration | None = None
    warmup_runs: Count = 0
    iterations: Count = 0
    iterations_requested: Count | None = None
    stopped_early: bool | None = None
    threads: Count | None = None
    warm: WarmLatency | None = None
    hashing_ms: HashingTimes | None = None

    @property
    def median_ms(self) -> float | None:
        return self.warm.median_ms if self.warm else None


@dataclass(frozen=True)
class Reason:
    level: str  # "degraded" or "invalid"
    reason: str


@dataclass(frozen=True)
class Validity:
    status: ValidityStatus
    reasons: tuple[Reason, ...] = ()


@dataclass(frozen=True)
class ProgramInfo:
    """The program the run profiled."""

    name: str | None = None
    backend: str | None = None
    pte: str | None = None
    sha256: str | None = None
    weights: str | None = None
    size_bytes: Count | None = None  # the .pte's size (from its sidecar)
    parameters: Count | None = None  # the model's parameters (from its sidecar)


# The accuracy gate of quantized runs against fp32 eager (README "Quantized variants"). 8da4w measured 11-20 dB
# and 3/5 top-5 overlap on full-size models, int8 28-42 dB: the defaults pass both and catch a broken program.
# Top-1 agreement is over the rows of a logits output (batch x positions): 0.9 still asks one row of one, and lets a
# few of a fill-mask model's 128 positions flip (padding's among them).


@dataclass(frozen=True)
class Memory:
    """Peak memory per phase (the runner's RSS) and what the program accounts for.

    `other_bytes` is the peak minus the process's RSS before loading, the planned arenas and the constants: memory
    that belongs to delegates (XNNPACK's packed weights and workspace) and everything else the runtime allocates.
    """

    peak_rss_bytes: Count | None = None
    phases: dict[str, dict[str, Count | None]] = field(default_factory=dict)
    peak_reset: bool = False  # True: each phase's peak covers that phase alone (clear_refs worked)
    baseline_rss_bytes: Count | None = None
    planned_arenas: tuple[Count, ...] = ()
    planned_bytes: Count | None = None
    constants_bytes: Count | None = None
    delegate_data_bytes: Count | None = None
    pte_bytes: Count | None = None
    peak_live_bytes: Count | None = None
    other_bytes: Count | None = None


@dataclass(frozen=True)
class Counters:
    """The counters pass: what was captured, what was not and why, and the whole-method figures."""

    status: str  # ok, failed
    error: str | None = None
    requested: tuple[str, ...] = ()
    captured: tuple[str, ...] = ()
    derived: tuple[str, ...] = ()
    missing: tuple[dict[str, str], ...] = ()  # {"name", "error", "reason"}
    threads: Count | None = None
    scope: str = ""
    multiplexed: bool = False
    scaling: str = ""
    executions: Count = 0
    totals: dict[str, float] = field(default_factory=dict)  # per execution, whole method
    consistency: dict[str, Any] = field(default_factory=dict)  # the hottest instruction vs the timing pass


@dataclass(frozen=True)
class NumericsRow:
    """One operator of the numerics pass against fp32 eager (results/numerics.py)."""

    node: str  # the exported program's node
    op: str
    module: str | None = None
    source: str | None = None  # file:line of the user's code
    sqnr_db: float = 0.0
    introduced_db: float = 0.0  # the SQNR of the error this operator added itself (lower: worse)
    introduced_share: float = 0.0  # that error's share of its output's
    max_abs_error: float | None = None
    cosine: float | None = None
    nan: Count = 0
    inf: Count = 0


@dataclass(frozen=True)
class NumericsSummary:
    """The numerics pass: where accuracy goes, operator by operator (delegates included)."""

    status: str  # ok, failed
    error: str | None = None
    mode: str | None = None  # stats, full
    taps: Count = 0
    output_sqnr_db: tuple[float, ...] = ()  # the numerics program's outputs against fp32 eager
    losing_most: tuple[NumericsRow, ...] = ()  # by the error each added (lowest introduced SQNR first), at most 10
    collapse: NumericsRow | None = None  # the first output all zeros where fp32's is not
    nonfinite: NumericsRow | None = None  # the first with NaN or Inf


@dataclass(frozen=True)
class TokenCheck:
    """The board's generated ids against eager greedy generation from the same prompt (results/generation.py)."""

    compared: Count = 0  # ids compared: the shorter of the run's and the reference's
    matching: Count = 0
    agreement: Share | None = None  # matching / compared; None when nothing was compared
    first_divergence: Count | None = None  # the index of the first id that differs, None when all compared match
    reference_tokens: Count = 0


@dataclass(frozen=True)
class EnergySummary:
    """summary.json's `energy` (results/energy.py): the board's power while the program ran, and its joules."""

    status: Literal["measured", "not measured"]
    why: str | None = None  # why not measured (no sensor on this board, a Pi 4, a PC): never 0
    source: str | None = None  # "vcgencmd pmic_read_adc"
    samples: Count = 0  # the samples taken while the program executed
    mean_watts: Duration | None = None
    joules_per_inference: Duration | None = None  # mean watts x the median iteration (an ordinary run)
    joules_per_token: Duration | None = None  # mean watts / decode tokens per second (a language model)


@dataclass(frozen=True)
class DecodeRoofline:
    """A decode step against the board's memory roofline (results/roofline.py)."""

    weights_bytes: Count  # the program's weights, each stored tensor once
    kv_bytes_per_token: Count  # the KV cache a decode step reads, on average over the run's steps
    bytes_per_token: Count
    achieved_gb_per_s: Duration  # bytes per token x decode tokens/s
    bandwidth_gb_per_s: Duration | None = None  # the board's read bandwidth (setup-board); None: not measured
    bandwidth_threads: Count | None = None
    share: Duration | None = None  # achieved / bandwidth (can pass 1 when the weights sit in a large cache)
    note: str | None = None  # why there is no share
    fits_in_cache: bool = False  # a step's bytes fit the board's last-level cache: memory is not what binds it
    # Where a step's time went, from the decode profile (ETDump's own cost included, so against its own step):
    kernels_ms: Duration | None = None  # the step's FC and batch matmul nodes
    profiled_step_ms: Duration | None = None  # the profiled step, whole
    outside_ms: Duration | None = None  # the step's kernels outside the delegates
    # What the rest is made of, per step: many small costs, or a few large ones
    kernel_calls: Count | None = None  # kernel calls outside the delegates
    delegate_calls: Count | None = None
    other_operators: Count | None = None  # the delegates' operators besides the products (runtime events)

    @property
    def share_text(self) -> str:
        """ "62% of 10.1 GB/s", or what is missing."""
        if self.share is None or self.bandwidth_gb_per_s is None:
            return f"{self.achieved_gb_per_s:.2f} GB/s (board not measured)"
        cached = " (fits in cache)" if self.fits_in_cache else ""
        return f"{self.share:.0%} of {self.bandwidth_gb_per_s:.1f} GB/s{cached}"


@dataclass(frozen=True)
class PrefillRoofline:
    """The prompt's prefill against the board's limits (results/roofline.py): the work of XNNPACK's matrix products
    over the prompt, and the least time the board's peak arithmetic rate and bandwidth allow for it."""

    ops: Count  # Fully Connected and batch matmuls over the prompt; a multiply-add is 2
    int8_ops: Count  # of `ops`, those on the int8 kernels (8- and 4-bit weights)
    bytes: Count  # what those nodes read and write, each value once per call
    calls: Count  # prefill calls: the prompt in chunks of the program's max_prompt_len
    achieved_gops: Duration  # ops / TTFT
    compute_ms: Duration | None = None  # the ops at the board's peaks (fp32 and int8)
    memory_ms: Duration | None = None  # the bytes at the board's read bandwidth
    bound: Literal["compute", "memory"] | None = None  # the larger of the two
    share: Duration | None = None  # the least time over TTFT: 1 is the roofline
    kernels_ms: Duration | None = None  # the prefill profile's time in those nodes (one call)
    note: str | None = None  # why there is no share

    @property
    def share_text(self) -> str:
        """ "41% of peak" (compute-bound), "80% of bandwidth" (memory-bound), or what is missing."""
        if self.share is None or self.bound is None:
            return f"{self.achieved_gops:.1f} GOP/s (board not measured)"
        return f"{self.share:.0%} of {'peak' if self.bound == 'compute' else 'bandwidth'}"


@dataclass(frozen=True)
class Generation:
    """summary.json's `generation`: the figures a user of a language model asks for."""

    prompt_len: Count
    new_tokens: Count
    context: Count | None
    generations: Count  # timed generations the figures come from
    ttft_ms: Duration | None  # time to first token: the prefill (median over the timed generations)
    prefill_tokens_per_s: Duration | None
    decode_tokens_per_s: Duration | None  # (N-1) decode steps over their time, median over the generations
    token_ms: dict[str, Duration | None] = field(default_factory=dict)  # decode step latency: median, p90, max
    load_ms: Duration | None = None  # loading the program and initialising the method
    kv_cache_bytes: Count | None = None
    memory: dict[str, Count | None] = field(default_factory=dict)  # peak RSS: prefill, decode
    tokens: TokenCheck | None = None  # None when no reference was given
    # The standard deviation of the timed generations' prefill and decode tokens/s (llama-bench's "± sd")
    prefill_tokens_per_s_sd: Duration | None = None
    decode_tokens_per_s_sd: Duration | None = None
    # Where the prompt came from; with a cached tokenizer and ids equal to eager's, the prompt and what followed
    prompt_source: str | None = None
    text: dict[str, str] | None = None
    roofline: DecodeRoofline | None = None  # the decode against the board's memory bandwidth
    prefill_roofline: PrefillRoofline | None = None  # the prefill against the board's peak arithmetic rate

    @property
    def token_agreement(self) -> float | None:
        """Generated ids equal to eager greedy's, as a share of those compared (None: not checked)."""
        return self.tokens.agreement if self.tokens is not None else None

    @property
    def ids_text(self) -> str:
        """The ids against eager greedy in a few words, for tables and pages: "= eager (8)", "75%, parts at 6"."""
        agreement = self.token_agreement
        if self.tokens is None or agreement is None:
            return "not checked"
        if self.tokens.first_divergence is None:
            return f"= eager ({self.tokens.compared})"
        return f"{agreement * 100:.0f}%, parts at {self.tokens.first_divergence}"


def _throttling(conditions: Mapping[str, Any]) -> None:
    """board_conditions stays a mapping (a report of its own), but the advisor reads its throttling as a list of
    text: checked here, as a field type cannot say it of one key."""
    throttling = conditions.get("throttling_during_run")
    if throttling is not None and not (isinstance(throttling, list) and all(isinstance(t, str) for t in throttling)):
        raise ValueError("board_conditions.throttling_during_run: expected a list of text")


@dataclass(frozen=True, kw_only=True)
class RunSummary(Document):
    """summary.json; the fields in the file's documented order (keyword-only, so the order is the layout's)."""

    SCHEMA: ClassVar[int] = SUMMARY_SCHEMA
    UPGRADES: ClassVar[Mapping[int, Callable[[dict[str, Any]], dict[str, Any]]]] = {}

    run_id: RunId
    status: str | None = None  # the run's status on the board: ok, failed or timeout
    error: str | None = None
    labels: dict[str, Any] = field(default_factory=dict)
    model: ProgramInfo = field(default_factory=ProgramInfo)
    board: str | None = None
    versions: dict[str, Any] = field(default_factory=dict)
    latency: Latency = field(default_factory=Latency)
    board_conditions: dict[str, Any] = field(default_factory=dict)
    correctness: Correctness = field(default_factory=Correctness)
    profile: dict[str, Any] | None = None  # top layers, delegation split, operator types, overlay coverage
    memory: Memory | None = None
    counters: Counters | None = None
    numerics: NumericsSummary | None = None  # runs with a numerics pass only
    accuracy: Accuracy | None = None  # quantized programs only
    generation: Generation | None = None  # text-generation programs only
    modules: ModuleTree | None = None  # the time by module of the model: programs with a source map only
    energy: EnergySummary | None = None  # None: a bundle from before energy was recorded
    # FC, convolutions and batch matmuls against the board's bandwidth and peak: the counts and the costliest few
    operator_roofline: OperatorRooflines | None = None
    validity: Validity

    def __post_init__(self) -> None:
        _throttling(self.board_conditions)


def summary_data(summary: RunSummary) -> dict[str, Any]:
    """The summary.json document, its version first, in its documented key order."""
    return write_document(summary)


def read_summary(data: Any, where: str = "summary.json") -> RunSummary:
    """The summary in a summary.json document (`where` names it in errors), every field checked: SummaryError."""
    try:
        return complete(read_document(data, RunSummary, where=where))
    except RecordError as exc:
        raise SummaryError(exc.where, exc.field, exc.problem) from None


def read_generation(data: Any, where: str, field: str = "generation") -> Generation | None:
    """A summary's `generation` section kept elsewhere (a history row, a pending record): SummaryError."""
    try:
        return complete(from_data(data, Generation | None, where=where, field=field))  # type: ignore[arg-type]
    except RecordError as exc:
        raise SummaryError(exc.where, exc.field, exc.problem) from None
