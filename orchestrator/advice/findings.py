"""Findings: what the advisor says about one run, each a measured cause with a predicted saving and a fix.

A finding names the operators it is about (and their nodes, for Model Explorer), their measured time per run and
share of the method, the cause in one sentence, the saving predicted from those measured times, and the fix: a
rewrite etlab can apply (`--rewrites NAME`), a lowering option (`--attention etlab`, `--backend xnnpack`), a change in
the user's code, a limit of ExecuTorch's lowering (nothing to change in the model), or a board condition.
Detectors (detectors.py, DETECTORS) find them; advisor.py runs them.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from orchestrator.lowering.program import AS_SPECIFIED, ATTENTION, KEEP_FLOAT, ProgramChoice
from orchestrator.lowering.rewrites.registry import RewriteRequest
from orchestrator.lowering.sidecar import Sidecar
from orchestrator.lowering.spec import ModelSpec
from orchestrator.lowering.variants import Variant
from orchestrator.records import Count, Duration
from orchestrator.results.numerics import NumericsDocument
from orchestrator.results.ops_record import DelegateNodeTiming, OpsRecord
from orchestrator.results.summary import RunSummary

ADVICE_FILE = "advice.json"
QUANTIZE = "quantize"  # Advice.predicted_parts' key of the quantize finding's saving
FIX_KINDS = ("rewrite", "code", "option", "lowering", "board")
ONE_LINE_FINDINGS = 3  # what an analysis prints at least; `fab advise` shows them all
SHOWN_SHARE = 0.03  # and every other finding worth this share of the run


@dataclass(frozen=True, kw_only=True)  # built by keyword: sixteen fields, several of one type
class Finding:
    """One finding as advice.json holds it (the field order is the file's key order); the types are its checks."""

    id: str = ""  # "F1": findings numbered by what they are worth, largest first (the advisor numbers them)
    kind: str  # the detector that found it (DETECTORS)
    title: str  # what, in a few words: "gelu_new's pow(x, 3) in portable kernels"
    operators: tuple[str, ...]  # the operators it is about: "aten::pow.Tensor_Scalar_out", "XNNFullyConnected"
    nodes: dict[str, tuple[str, ...]]  # Model Explorer graph id → node ids
    calls: Count  # operator calls per run
    measured_ms: Duration  # their measured time per run (the sum of their medians)
    share: Duration  # of the run's median time (OpsRecord.share), 0-1
    cause: str  # one sentence
    saving_ms: Duration | None  # predicted from the measured times; None: not predicted (see `saving_note`)
    saving_is_bound: bool = False  # `saving_ms` is an upper bound (what the operators take), not a prediction
    saving_note: str = ""  # how the saving was predicted, or why it was not
    saving_mb: Duration | None = None  # a size finding: megabytes the program would shed
    fix_kind: str  # FIX_KINDS
    fix: str  # what to do
    rewrite: str | None = None  # the REWRITES name etlab can apply
    attention: str | None = None  # the attention a text-generation program is lowered again with (`--attention`)
    where: tuple[str, ...] = ()  # the model's source lines and modules of its operators (the run's source map)
    # An accuracy finding (a quantized program's most sensitive layers): the layers its fix keeps in float, the
    # output's SQNR now and predicted with the fix, what the fix is predicted to cost, and whether the accuracy gate
    # failed (a program that fails it is not shippable: such a finding ranks first).
    keep_float: tuple[str, ...] = ()
    sqnr_db: float | None = None
    predicted_sqnr_db: float | None = None
    cost_ms: float | None = None  # signed: below 0, keeping them float saves time (int8 slower on this board)
    gate_failed: bool = False
    quantize: str | None = None  # a quantize finding's scheme: the program `fab advise --try` measures beside fp32

    @property
    def worth_ms(self) -> float | None:
        """What a time finding is worth per run: its predicted saving (or its bound), else the measured time of the
        operators it is about, the most it could save (an unpredicted 89% of the run is not worth less than a
        predicted 5%). None for a finding about no time: accuracy, a size, the board's conditions."""
        if self.keep_float:
            return None
        if self.saving_ms is not None:
            return self.saving_ms
        return self.measured_ms if self.share > 0 else None


CONVOLUTION_TYPES = ("XNNConv2d", "XNNDepthwiseConv2d")  # the XNNPACK flatbuffer's node types (1-D ones too)
GEMM_TYPES = ("XNNFullyConnected", *CONVOLUTION_TYPES)


@dataclass(frozen=True)
class BoardRatios:
    """A board's int8 time over fp32 time per GEMM node type (XNNFullyConnected, XNNConv2d, ...), measured on the
    other models it ran both ways with `scheme`; `sources` names those runs. `by_shape`: the same per type and
    output size (`shape_key`), where those runs had nodes of that size: a small GEMM gains less from int8 than a
    large one (its fixed costs: quantizing the input, packing)."""

    scheme: Variant
    ratios: dict[str, float]
    sources: tuple[str, ...]
    by_shape: dict[str, float] = field(default_factory=dict)

    def ratio(self, node_type: str, shape: tuple[int, ...] | None) -> float:
        """The ratio for a node: its type and size's, else its type's, else the mean of every type's."""
        key = shape_key(node_type, shape)
        if key is not None and key in self.by_shape:
            return self.by_shape[key]
        return self.ratios.get(node_type, sum(self.ratios.values()) / len(self.ratios))


def shape_key(node_type: str, shape: tuple[int, ...] | None) -> str | None:
    """`XNNFullyConnected@2^14`: a GEMM node's type and its output's size, to the nearest power of two (elements)."""
    if not shape:
        return None
    size = 1
    for dim in shape:
        size *= max(1, int(dim))
    return f"{node_type}@2^{round(math.log2(size))}"


@dataclass(frozen=True)
class RunFacts:
    """What the detectors read. `sidecar` and `spec` are None for a program etlab did not lower (`--pte`);
    `quantized_peer` is the same model's quantized run on the same board (of a scheme among the program's scheme's
    peers, quantize.Scheme.peers), when one was measured, and `quantized_peer_variant` the program it ran."""

    ops: OpsRecord
    summary: RunSummary
    sidecar: Sidecar | None = None
    spec: ModelSpec | None = None
    quantized_peer: OpsRecord | None = None
    quantized_peer_variant: Variant | None = None
    board_ratios: BoardRatios | None = None  # without a quantized peer: the board's ratios from other models
    numerics: NumericsDocument | None = None  # the run's numerics pass (analysis/numerics.json), if it had one
    float_peer: OpsRecord | None = None  # a quantized run: the same model's fp32 run on the same board, if measured

    @property
    def applied_rewrites(self) -> tuple[str, ...]:
        return self.sidecar.applied_rewrites if self.sidecar is not None else ()


@dataclass(frozen=True)
class Advice:
    """advice.json: the findings on one run, and the savings they predict (derived from the findings)."""

    run_id: str
    model: str | None
    backend: str | None
    board: str | None
    method_ms: Duration  # the run's median time, what every share is of (OpsRecord.method_median_ms)
    # Derived from the findings (written for the reports that read the file): point predictions only, bounds and
    # unpredicted findings excluded.
    predicted_ms: float = field(default=0.0, kw_only=True)
    predicted_share: float | None = field(default=None, kw_only=True)
    findings: tuple[Finding, ...] = field(default_factory=tuple)

    def __post_init__(self) -> None:
        predicted = sum(f.saving_ms for f in self.findings if f.saving_ms is not None and not f.saving_is_bound)
        object.__setattr__(self, "predicted_ms", predicted)
        object.__setattr__(self, "predicted_share", predicted / self.method_ms if self.method_ms else None)

    @property
    def rewrites(self) -> tuple[str, ...]:
        """The rewrites the findings propose, in the findings' order."""
        return tuple(dict.fromkeys(f.rewrite for f in self.findings if f.rewrite))

    @property
    def attention(self) -> str | None:
        """The attention the findings propose lowering the program with (`--attention`), if any."""
        return next((f.attention for f in self.findings if f.attention), None)

    @property
    def keep_float(self) -> tuple[str, ...]:
        """The layers the findings propose keeping in float (a quantized program's accuracy finding), if any."""
        return next((f.keep_float for f in self.findings if f.keep_float), ())

    @property
    def change(self) -> ProgramChoice:
        """The one change the findings propose to the program: its attention, its rewrites and the layers it keeps
        in float, as `--attention`, `--rewrites` and `--keep-float` (AS_SPECIFIED: none)."""
        if not self.rewrites and self.attention is None and not self.keep_float:
            return AS_SPECIFIED
        return ProgramChoice(
            attention=self.attention, rewrites=RewriteRequest(names=self.rewrites), keep_float=self.keep_float
        )

    @property
    def predicted_parts(self) -> dict[str, float]:
        """The predicted saving of each part of `change`: per rewrite by its name, the attention's as ATTENTION,
        the layers kept in float's as KEEP_FLOAT (a cost: negative), the quantized program's as QUANTIZE."""
        parts = {name: self.predicted_for(name) for name in self.rewrites}
        if self.attention is not None:
            parts[ATTENTION] = sum(f.saving_ms or 0.0 for f in self.findings if f.attention)
        if self.keep_float:
            parts[KEEP_FLOAT] = -sum(f.cost_ms or 0.0 for f in self.findings if f.keep_float)
        if self.quantize is not None:
            parts[QUANTIZE] = sum(f.saving_ms or 0.0 for f in self.findings if f.quantize)
        return parts

    @property
    def quantize(self) -> str | None:
        """The scheme the quantize finding proposes (an fp32 run's), which `--try` measures; None without one."""
        return next((f.quantize for f in self.findings if f.quantize), None)

    def predicted_for(self, rewrite: str) -> float:
        return sum(f.saving_ms or 0.0 for f in self.findings if f.rewrite == rewrite)


def shown_findings(advice: Advice, limit: int = ONE_LINE_FINDINGS) -> list[Finding]:
    """The findings an analysis prints one line each, and every page and report lists: the top `limit`, then every
    other one worth SHOWN_SHARE of the run, predicted or not (an unpredicted 89% of fp32 matmuls is never folded into
    "more"), and every accuracy finding (another axis than time). The rest are `fab advise`'s."""

    def worth_share(finding: Finding) -> float:
        worth = finding.worth_ms
        return worth / advice.method_ms if worth is not None and advice.method_ms else 0.0

    return [f for k, f in enumerate(advice.findings) if k < limit or f.keep_float or worth_share(f) >= SHOWN_SHARE]


def delegate_node_fields(facts: RunFacts, pairs: Sequence[tuple[str, DelegateNodeTiming]]) -> dict[str, Any]:
    """A finding's fields for delegate nodes ((graph id, node) pairs): types, ids per graph, count, time, share."""
    nodes: dict[str, list[str]] = defaultdict(list)
    for graph, node in pairs:
        nodes[graph].append(node.node)
    measured = sum(node.ms for _, node in pairs)
    return {
        "operators": tuple(sorted({node.type for _, node in pairs})),
        "nodes": {graph: tuple(ids) for graph, ids in nodes.items()},
        "calls": len(pairs),
        "measured_ms": measured,
        "share": facts.ops.share(measured),
    }
