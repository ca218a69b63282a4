"""`compare`: did run B get slower or faster than run A, overall and per operator, or is it noise?

Both runs must be analysed bundles of the same program: the same model, the same .pte (sha256) and so the same
instruction list. Comparing different builds of the same topology (a re-lowering with identical instructions) is
allowed only on request, since their kernels or weights may differ.

The overall verdict uses the runs' per-iteration latencies (timings.json); per-operator verdicts use the per-execution
ETDump samples in analysis/ops.json. Both use `stats.compare_samples` (Mann-Whitney U, bootstrap CI of the median
ratio, 5% minimum effect). Per-operator tests are many at once, so their alpha is divided by the number of operators
tested (Bonferroni), which keeps a clean run from showing spurious per-op changes. The XNNPACK nodes inside the
delegates are tested the same way (`delegate_ops`, from ops.json's per-node samples; an older ops.json has none: their
medians are shown, untested), and `op_types` rolls both up by operator type; with the `rest` of each median (between
operators, the runner's overhead) they add up to the median change. An operator has changed when its own test says so
and by at least MATERIAL_SHARE of A's median. Every figure is a median or a sum of medians. A diverging overlay (blue
faster, white unchanged, red slower) of the median change in ms is written into run B's model_explorer/ folder, next to
its own overlays.

Runs of different quantization schemes of one model (fp32 `xnnpack` vs `xnnpack-int8-dynamic`, ...) are compared too:
the programs differ by design, so the instruction lists and builds are not required to match, per-operator deltas are
shown only where both runs have the same operator at the same instruction, and the verdict is `ok` with the explanation
of what differs and why that is expected (a scheme is a choice, not a regression). Only runs of different models are
refused.

The verdict (results/verdicts.py) follows the nightly's rules: the same program on both sides is "drift" (run-to-run,
never a regression); a degraded side is "inconclusive"; different builds that differ are "unconfirmed" until
`interleaved_verdict` re-runs both programs alternately on a board.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from orchestrator.errors import AnalysisError, UsageError
from orchestrator.fsutil import atomic_write_json, read_json, unreadable
from orchestrator.lowering.variants import UnknownVariant, Variant
from orchestrator.records import Document, to_data, write_document
from orchestrator.results.documents import ANALYSIS_DIR, NotAnalysed, load_summary
from orchestrator.results.ops_record import DelegateNodeTiming, InstructionTiming, OpsRecord, load_ops
from orchestrator.results.overlays import OVERLAY_DIR, write_diff_overlay
from orchestrator.results.stats import DEFAULT_ALPHA, DEFAULT_MIN_EFFECT, Verdict, compare_samples
from orchestrator.results.summary import Generation, Memory, RunSummary
from orchestrator.results.validity import condition_changes, number_list
from orchestrator.results.verdicts import Kind

MATERIAL_SHARE = 0.005  # a change under this share of A's median is real but too small to call changed (50 ns)


class CompareError(UsageError):
    """The two runs cannot be compared (different models or programs, or not analysed)."""


class RebuiltProgram(CompareError):
    """The runs profiled different builds of the same program, which a comparison allows only when asked to
    (`allow_rebuilt`; the command layer names its option)."""


@dataclass(frozen=True)
class OpDelta:
    """One instruction (or, with `graph`, one XNNPACK node inside a delegate: `node_id` its node, `op` its type) on
    both sides: its medians, B - A, and its own verdict (None: not tested)."""

    node_id: str
    op: str | None
    median_a_ms: float | None
    median_b_ms: float | None
    delta_ms: float | None
    verdict: Verdict | None
    graph: str | None = None  # the delegate's graph id (Model Explorer's); None: a top-level instruction
    module: str | None = None  # the model's module it came from (the source map); None: unknown

    @property
    def where(self) -> str:
        """The node as a user finds it: `forward_0_3`, or `forward_0_5 #12` (XNN node 12 in that delegate call)."""
        return f"{self.graph.rsplit('::', 1)[-1]} #{self.node_id}" if self.graph else self.node_id

    @classmethod
    def of(cls, row_a: InstructionTiming, row_b: InstructionTiming, verdict: Verdict | None) -> OpDelta:
        median_a, median_b = row_a.timed_median_ms, row_b.timed_median_ms
        delta = median_b - median_a if median_a is not None and median_b is not None else None
        return cls(row_a.node_id, row_a.op, median_a, median_b, delta, verdict, module=row_a.module)


@dataclass(frozen=True)
class OpTypeDelta:
    """One operator type on both sides (`aten::where`, `XNNFullyConnected`): its calls and the sums of their medians,
    each as a share of its run's median (ops.json's baseline). A delegate's time beyond its placed nodes counts
    under the delegate's own name."""

    op_type: str
    count: int
    a_ms: float
    b_ms: float
    delta_ms: float
    share_a: float | None  # 0-1
    share_b: float | None


@dataclass(frozen=True)
class RestOfMethod:
    """Each run's median beyond the sum of its operators' (`op_types`): time between operators, the runner's
    overhead, operators in one run only; with it, the per-type deltas add up to the median change."""

    a_ms: float
    b_ms: float
    delta_ms: float


@dataclass(frozen=True)
class RunSide:
    run_id: str
    path: str
    median_ms: float | None


@dataclass(frozen=True)
class ComparisonReport(Document):
    """analysis/compare_vs_<run A>.json in run B's folder: what `compare` found (written with write_document)."""

    memory: tuple[MemoryDelta, ...]
    generation: tuple[GenerationRatio, ...]
    per_operator: str
    run_a: RunSide
    run_b: RunSide
    total: Verdict
    verdict: str
    verdict_detail: str
    retest: dict[str, Any] | None
    notes: tuple[str, ...]
    ops: tuple[OpDelta, ...]
    overlay: str | None
    delegate_ops: tuple[OpDelta, ...] = ()  # added later: an older report has none (read as none)
    op_types: tuple[OpTypeDelta, ...] = ()
    rest: RestOfMethod | None = None
    conditions: tuple[str, ...] = ()  # the board conditions that differ between the runs (validity.py)


@dataclass
class Comparison:
    run_a: Path
    run_b: Path
    run_id_a: str
    run_id_b: str
    total: Verdict
    median_a_ms: float | None
    median_b_ms: float | None
    ops: list[OpDelta]
    notes: list[str] = field(default_factory=list)
    overlay: Path | None = None
    report: Path | None = None
    verdict: Kind = Kind.OK
    verdict_detail: str = ""
    sha_a: str | None = None
    sha_b: str | None = None
    retest: dict[str, Any] | None = None
    memory: list[MemoryDelta] = field(default_factory=list)  # memory_deltas(): one row per figure
    generation: list[GenerationRatio] = field(default_factory=list)  # generation_ratios(): language models only
    delegate_ops: list[OpDelta] = field(default_factory=list)  # the XNNPACK nodes inside delegates, both sides
    op_types: list[OpTypeDelta] = field(default_factory=list)  # op_type_deltas(): by operator type
    share_base_a_ms: float | None = None  # A's run median as ops.json's shares take it (OpsRecord.method_median_ms)
    rest: RestOfMethod | None = None  # rest_of_method(): None when a side has no median
    conditions: list[str] = field(default_factory=list)  # condition_changes(): firmware, kernel, config.txt, ...

    def changed(self, op: OpDelta) -> bool:
        """Whether the operator changed: its own test found a change, of at least MATERIAL_SHARE of A's median."""
        floor = MATERIAL_SHARE * (self.share_base_a_ms or 0.0)
        return bool(op.verdict and op.verdict.is_change and abs(op.delta_ms or 0.0) >= floor)

    @property
    def per_operator_scope(self) -> str:
        """What one per-operator figure is: a whole execution, or one decode step of a generation."""
        if self.generation:
            return "one decode step (analysis/ops.json; the prefill's is ops_prefill.json)"
        return "one execution"

    def document(self) -> ComparisonReport:
        """The comparison as its report file holds it."""
        return ComparisonReport(
            memory=tuple(self.memory),
            generation=tuple(self.generation),
            per_operator=self.per_operator_scope,
            run_a=RunSide(self.run_id_a, str(self.run_a), self.median_a_ms),
            run_b=RunSide(self.run_id_b, str(self.run_b), self.median_b_ms),
            total=self.total,
            verdict=self.verdict.value,
            verdict_detail=self.verdict_detail,
            retest=self.retest,
            notes=tuple(self.notes),
            ops=tuple(self.ops),
            overlay=str(self.overlay) if self.overlay else None,
            delegate_ops=tuple(self.delegate_ops),
            op_types=tuple(self.op_types),
            rest=self.rest,
            conditions=tuple(self.conditions),
        )


@dataclass(frozen=True)
class _Run:
    path: Path
    summary: RunSummary
    ops: OpsRecord
    iterations_ms: list[float]

    @property
    def run_id(self) -> str:
        return self.summary.run_id


def _load(run: Path) -> _Run:
    """An analysed run: CompareError when it has not been analysed (or has no profile), AnalysisError (bad data,
    exit 65, the file and field named) when what it holds is unreadable."""
    run = Path(run)
    try:
        summary = load_summary(run)
    except NotAnalysed as exc:
        raise CompareError(str(exc), hint="run the analysis first (it writes analysis/summary.json)") from None
    ops_path = run / ANALYSIS_DIR / "ops.json"
    if not ops_path.is_file():
        raise CompareError(f"{run} has no per-operator profile ({ops_path.name}): was it run without ETDump?")
    ops = load_ops(run)
    timings_path = run / "timings.json"
    try:
        timings = read_json(timings_path) if timings_path.is_file() else {}
    except (OSError, ValueError) as exc:
        raise AnalysisError(unreadable(timings_path, exc)) from None
    iterations = number_list(timings.get("iterations_ms") if isinstance(timings, dict) else None)
    return _Run(run, summary, ops, iterations)


def _instruction_signature(run: _Run) -> list[tuple[str, str, str | None]]:
    return [(row.node_id, row.kind, row.op) for row in run.ops.instructions]


def scheme_of(run: _Run) -> str:
    """How reports name the run's scheme: fp32 for portable/xnnpack, else the scheme (variants.Variant.parse).

    A backend this etlab does not know (a bundle from another version) is named as it is: never taken for fp32.
    """
    backend = run.summary.model.backend
    if not backend:
        return "fp32"
    try:
        return Variant.parse(backend).scheme.label
    except UnknownVariant:
        return backend


def across_schemes(a: _Run, b: _Run) -> bool:
    return scheme_of(a) != scheme_of(b)


def scheme_notes(a: _Run, b: _Run) -> list[str]:
    """What differs between two schemes of one model, and why those differences are expected."""
    sa, sb = scheme_of(a), scheme_of(b)
    notes = [
        f"different quantization schemes ({sa} vs {sb}): the programs differ by design, so different "
        ".pte builds, instruction lists, sizes and outputs are expected",
        "per-operator deltas are shown only where both programs run the same operator at the same instruction",
    ]
    for run in (a, b):
        accuracy = run.summary.accuracy
        if accuracy is not None:
            meaning = "" if accuracy.meaningful else " (random weights: not meaningful)"
            notes.append(f"run {run.run_id} ({scheme_of(run)}) accuracy vs fp32 eager: {accuracy.verdict}{meaning}")
    return notes


def check_comparable(a: _Run, b: _Run, *, allow_rebuilt: bool) -> list[str]:
    """Raise CompareError unless the runs profiled the same program; return notes for the report."""
    name_a, name_b = a.summary.model.name, b.summary.model.name
    if name_a and name_b and name_a != name_b:
        raise CompareError(f"refusing to compare different models: {a.run_id} ran {name_a}, {b.run_id} ran {name_b}")
    if across_schemes(a, b):
        notes = scheme_notes(a, b)
        for run in (a, b):
            if run.summary.validity.status != "valid":
                notes.append(f"run {run.run_id} is {run.summary.validity.status}")
        return notes
    signature_a, signature_b = _instruction_signature(a), _instruction_signature(b)
    if signature_a != signature_b:
        pairs = zip(signature_a, signature_b, strict=False)
        first = next((f"{x[0]} is {x[2] or x[1]} vs {y[2] or y[1]}" for x, y in pairs if x != y), "one is longer")
        raise CompareError(
            f"refusing to compare different programs: {len(signature_a)} vs {len(signature_b)} instructions ({first})"
        )
    sha_a, sha_b = a.summary.model.sha256, b.summary.model.sha256
    notes = []
    if sha_a != sha_b:
        if not allow_rebuilt:
            raise RebuiltProgram(
                f"refusing to compare different .pte builds ({str(sha_a)[:12]} vs {str(sha_b)[:12]}), "
                "although their instructions match"
            )
        notes.append("the runs used different builds of the same program (same instructions, different .pte)")
    for run in (a, b):
        validity = run.summary.validity.status
        if validity != "valid":
            notes.append(f"run {run.run_id} is {validity}")
    return notes


def measured(total: Verdict) -> str:
    """The overall figure as detail, never a claim: the verdict alone says what the shift means."""
    if total.ratio is None:
        return total.reason
    if total.p_value is None or total.ci_low is None or total.ci_high is None:
        return f"median {(total.ratio - 1) * 100:+.1f}%"
    return f"median {(total.ratio - 1) * 100:+.1f}% (p={total.p_value:.2g}, CI {total.ci_low:.3f}-{total.ci_high:.3f})"


def run_verdict(a: _Run, b: _Run, total: Verdict) -> tuple[Kind, str]:
    """The nightly's rules for two runs: same program → drift; a degraded side → inconclusive; else unconfirmed."""
    sha_a, sha_b = a.summary.model.sha256, b.summary.model.sha256
    figure = measured(total)
    not_valid = []
    for run in (a, b):
        validity = run.summary.validity
        if validity.status != "valid":
            reasons = "; ".join(r.reason for r in validity.reasons)
            not_valid.append(f"run {run.run_id} is {validity.status} ({reasons})")
    if not_valid:
        return Kind.INCONCLUSIVE, "; ".join(not_valid) + f"; the measured {figure} cannot be trusted"
    if across_schemes(a, b):
        ratio = f"{1 / total.ratio:.2f}× the speed of" if total.ratio else "not measurably different from"
        return Kind.OK, (
            f"{scheme_of(b)} runs at {ratio} {scheme_of(a)} ({figure}); a different scheme is a choice, "
            "not a regression"
        )
    if sha_a and sha_a == sha_b:
        if total.is_change:
            return Kind.DRIFT, f"no program change; the measured {figure} is run-to-run drift"
        return Kind.OK, f"no program change; within noise ({total.reason})"
    if total.is_change:
        return Kind.UNCONFIRMED, (
            f"different programs, measured {figure}: two runs cannot tell the program from the board; "
            "re-run them interleaved (--interleave N --board B) to confirm"
        )
    return Kind.OK, f"different programs, within noise ({total.reason})"


def interleaved_verdict(comparison: Comparison, result: Any) -> None:
    """Settle the comparison with an interleaved A/B re-test (abtest.Interleaved): the only way to a regression."""
    comparison.retest = to_data(result.outcome)
    if result.error:
        comparison.verdict = Kind.INCONCLUSIVE
        comparison.verdict_detail = f"the interleaved re-test stopped: {result.error}"
        return
    figures = f"interleaved, {result.timing}: A {result.median_a_ms:.3f} ms, B {result.median_b_ms:.3f} ms"
    if comparison.sha_a and comparison.sha_a == comparison.sha_b:
        comparison.verdict = Kind.DRIFT if result.change in ("slower", "faster") else Kind.OK
        comparison.verdict_detail = f"no program change; {figures}: {result.reason}"
    elif result.confirmed:
        comparison.verdict = Kind.REGRESSION if result.change == "slower" else Kind.IMPROVEMENT
        comparison.verdict_detail = f"confirmed {result.change}: {figures}: {result.reason}"
    else:
        comparison.verdict = Kind.UNCONFIRMED if result.change in ("slower", "faster") else Kind.OK
        comparison.verdict_detail = f"not confirmed: {figures}: {result.reason}"


def _delegate_medians(run: _Run) -> dict[str, dict[str, float]]:
    found: dict[str, dict[str, float]] = {}
    for delegate in run.ops.delegates:
        if delegate.placed:
            found[delegate.graph_id] = {n.node: n.median_ms for n in delegate.nodes if n.median_ms is not None}
    return found


MEMORY_FIGURES = ("peak_rss_bytes", "planned_bytes", "constants_bytes", "other_bytes", "pte_bytes")
# What each figure is, in words (summary.Memory), and each phase a peak is of.
MEMORY_LABELS = {
    "peak_rss_bytes": "peak RSS",
    "planned_bytes": "planned activation arenas",
    "constants_bytes": "constants (weights)",
    "other_bytes": "delegates and runtime (the rest of the peak)",
    "pte_bytes": ".pte file",
}
PHASE_LABELS = {
    "start": "at start",
    "load": "at program load",
    "method_init": "at method init",
    "first_execution": "at the first execution",
    "decode": "during decode",
    "end": "at the end",
}


def memory_label(figure: str) -> str:
    """`peak_rss_bytes.method_init` → "peak RSS at method init"."""
    name, _, phase = figure.partition(".")
    label = MEMORY_LABELS.get(name, name)
    return f"{label} {PHASE_LABELS.get(phase, phase.replace('_', ' '))}" if phase else label


@dataclass(frozen=True)
class MemoryDelta:
    """One memory figure (bytes) on both sides, B - A and B / A - 1; `label` says it in words."""

    figure: str
    a: int | None
    b: int | None
    delta: int | None
    ratio: float | None
    label: str = ""


@dataclass(frozen=True)
class GenerationRatio:
    """One generation figure on both sides and B / A."""

    figure: str
    label: str
    a: float | None
    b: float | None
    ratio: float | None


def memory_deltas(a: Memory | None, b: Memory | None) -> list[MemoryDelta]:
    """Each memory figure on both sides and B - A, plus the peak of every phase; empty when a side has none."""
    if a is None or b is None:
        return []
    rows = []
    pairs = [(name, getattr(a, name), getattr(b, name)) for name in MEMORY_FIGURES]
    pairs += [
        (f"peak_rss_bytes.{phase}", a.phases[phase].get("peak_rss_bytes"), b.phases[phase].get("peak_rss_bytes"))
        for phase in a.phases
        if phase in b.phases
    ]
    for name, value_a, value_b in pairs:
        if value_a is None and value_b is None:
            continue
        delta = value_b - value_a if value_a is not None and value_b is not None else None
        ratio = value_b / value_a - 1 if delta is not None and value_a else None
        rows.append(MemoryDelta(name, value_a, value_b, delta, ratio, memory_label(name)))
    return rows


# summary.json's generation figures compared, as (figure, what it is): higher is better only for tokens per second.
GENERATION_FIGURES = (
    ("ttft_ms", "time to first token ms"),
    ("decode_tokens_per_s", "decode tokens/s"),
    ("token_ms.median", "decode step median ms"),
)


def generation_ratios(a: Generation | None, b: Generation | None) -> list[GenerationRatio]:
    """Both runs' TTFT, decode speed and step median, with B / A (both generated text); the verdict stays latency's."""
    if a is None or b is None:
        return []
    rows = []
    for name, label in GENERATION_FIGURES:
        value_a, value_b = (
            (run.token_ms.get("median") if name == "token_ms.median" else getattr(run, name)) for run in (a, b)
        )
        ratio = value_b / value_a if value_a and value_b is not None else None
        rows.append(GenerationRatio(name, label, value_a, value_b, ratio))
    return rows


def _paired_nodes(a: _Run, b: _Run) -> list[tuple[str, DelegateNodeTiming, DelegateNodeTiming]]:
    """The XNNPACK nodes placed in both runs' delegates, by graph id (the .pte's: schemes never pair), node, type."""
    delegates_b = {d.graph_id: d for d in b.ops.delegates if d.placed}
    pairs = []
    for delegate in (d for d in a.ops.delegates if d.placed and d.graph_id in delegates_b):
        nodes_b = {node.node: node for node in delegates_b[delegate.graph_id].nodes}
        for node in delegate.nodes:
            other = nodes_b.get(node.node)
            if other is not None and other.type == node.type:
                pairs.append((delegate.graph_id, node, other))
    return pairs


def _node_delta(
    graph: str, a: DelegateNodeTiming, b: DelegateNodeTiming, *, min_effect: float, alpha: float
) -> OpDelta:
    verdict = None
    if a.samples_ms and b.samples_ms:
        verdict = compare_samples(list(a.samples_ms), list(b.samples_ms), min_effect=min_effect, alpha=alpha)
    delta = b.median_ms - a.median_ms if a.median_ms is not None and b.median_ms is not None else None
    return OpDelta(a.node, a.type, a.median_ms, b.median_ms, delta, verdict, graph=graph, module=a.module)


def op_type_deltas(
    a: OpsRecord,
    b: OpsRecord,
    paired: list[InstructionTiming],
    nodes: list[tuple[str, DelegateNodeTiming, DelegateNodeTiming]],
) -> list[OpTypeDelta]:
    """Both runs' time by operator type (TensorBoard's op-type view, side by side): the top-level kernels by
    operator, the placed XNNPACK nodes by type, and each delegate call's time beyond its placed nodes under the
    call's own name; the paired instructions and nodes only, largest change first."""
    rows_b = {row.node_id: row for row in b.instructions}
    placed = {graph for graph, _, _ in nodes}
    inside: dict[str, tuple[float, float]] = {}  # delegate call node id -> its placed nodes' medians, A and B
    sums: dict[str, list[float]] = {}  # type -> [count, A ms, B ms]

    def add(kind: str, ms_a: float, ms_b: float) -> None:
        entry = sums.setdefault(kind, [0, 0.0, 0.0])
        entry[0], entry[1], entry[2] = entry[0] + 1, entry[1] + ms_a, entry[2] + ms_b

    for graph, x, y in nodes:
        add(x.type, x.ms, y.ms)
        call = graph.rsplit("::", 1)[-1]
        before = inside.get(call, (0.0, 0.0))
        inside[call] = (before[0] + x.ms, before[1] + y.ms)
    graph_of = {d.node_id: d.graph_id for d in a.delegates}
    for row in paired:
        other = rows_b[row.node_id]
        if row.kind == "DelegateCall" and graph_of.get(row.node_id) in placed:
            in_a, in_b = inside.get(row.node_id, (0.0, 0.0))
            add(f"{row.operator} (outside its nodes)", max(0.0, row.median_ms - in_a), max(0.0, other.median_ms - in_b))
        else:
            add(row.operator, row.median_ms, other.median_ms)
    base_a, base_b = a.method_median_ms, b.method_median_ms
    rows = [
        OpTypeDelta(kind, int(count), ms_a, ms_b, ms_b - ms_a, ms_a / base_a if base_a else None,
                    ms_b / base_b if base_b else None)
        for kind, (count, ms_a, ms_b) in sums.items()
    ]  # fmt: skip
    rows.sort(key=lambda row: (-abs(row.delta_ms), -row.b_ms))
    return rows


def rest_of_method(median_a: float | None, median_b: float | None, op_types: list[OpTypeDelta]) -> RestOfMethod | None:
    """Each run's median beyond its operators' summed medians; None when a side has no median."""
    if median_a is None or median_b is None:
        return None
    rest_a, rest_b = median_a - sum(row.a_ms for row in op_types), median_b - sum(row.b_ms for row in op_types)
    return RestOfMethod(rest_a, rest_b, rest_b - rest_a)


def compare_runs(
    run_a: Path,
    run_b: Path,
    *,
    min_effect: float = DEFAULT_MIN_EFFECT,
    alpha: float = DEFAULT_ALPHA,
    allow_rebuilt: bool = False,
    write: bool = True,
) -> Comparison:
    """Compare two analysed runs of the same program (A = baseline, B = new). See the module docstring."""
    a, b = _load(run_a), _load(run_b)
    notes = check_comparable(a, b, allow_rebuilt=allow_rebuilt)
    total = compare_samples(a.iterations_ms, b.iterations_ms, min_effect=min_effect, alpha=alpha)
    rows_b: dict[str, InstructionTiming] = {row.node_id: row for row in b.ops.instructions}
    # Across schemes only the instructions that run the same operator in both programs are paired.
    paired = [
        row
        for row in a.ops.instructions
        if row.node_id in rows_b and (rows_b[row.node_id].kind, rows_b[row.node_id].op) == (row.kind, row.op)
    ]
    testable = [r for r in paired if r.samples and rows_b[r.node_id].samples]
    nodes = _paired_nodes(a, b)
    testable_nodes = [(x, y) for _, x, y in nodes if x.samples_ms and y.samples_ms]
    per_op_alpha = alpha / max(1, len(testable) + len(testable_nodes))
    ops = []
    for row_a in paired:
        row_b = rows_b[row_a.node_id]
        verdict = None
        if row_a.samples and row_b.samples:
            verdict = compare_samples(
                list(row_a.samples_ms), list(row_b.samples_ms), min_effect=min_effect, alpha=per_op_alpha
            )
        ops.append(OpDelta.of(row_a, row_b, verdict))
    comparison = Comparison(
        a.path, b.path, a.run_id, b.run_id, total, a.summary.latency.median_ms, b.summary.latency.median_ms, ops, notes
    )
    comparison.delegate_ops = [
        _node_delta(graph, x, y, min_effect=min_effect, alpha=per_op_alpha) for graph, x, y in nodes
    ]
    comparison.op_types = op_type_deltas(a.ops, b.ops, paired, nodes)
    comparison.share_base_a_ms = a.ops.method_median_ms
    comparison.rest = rest_of_method(comparison.median_a_ms, comparison.median_b_ms, comparison.op_types)
    comparison.sha_a, comparison.sha_b = a.summary.model.sha256, b.summary.model.sha256
    comparison.memory = memory_deltas(a.summary.memory, b.summary.memory)
    comparison.generation = generation_ratios(a.summary.generation, b.summary.generation)
    comparison.conditions = condition_changes(a.summary.board_conditions, b.summary.board_conditions)
    comparison.verdict, comparison.verdict_detail = run_verdict(a, b, total)
    if write:
        method = b.ops.method or "forward"
        values = {method: {op.node_id: op.delta_ms for op in ops if op.delta_ms is not None}}
        # Delegate graphs are named after the .pte file, so different schemes never pair (their XNN nodes differ).
        medians_a, medians_b = _delegate_medians(a), _delegate_medians(b)
        for graph_id in medians_a.keys() & medians_b.keys():
            shared = medians_a[graph_id].keys() & medians_b[graph_id].keys()
            values[graph_id] = {node: medians_b[graph_id][node] - medians_a[graph_id][node] for node in sorted(shared)}
        safe_id = "".join(c if c.isalnum() or c in "-_." else "_" for c in a.run_id)
        comparison.overlay = write_diff_overlay(
            b.path / OVERLAY_DIR / f"me_overlay_diff_vs_{safe_id}.json", values, f"Δ median ms vs {a.run_id}"
        )
        comparison.report = b.path / ANALYSIS_DIR / f"compare_vs_{safe_id}.json"
        write_report(comparison)
    return comparison


def write_report(comparison: Comparison) -> None:
    """The comparison into its report file (`comparison.report`; none: nothing to write)."""
    if comparison.report is not None:
        atomic_write_json(comparison.report, write_document(comparison.document()))
