"""Mixed precision: which layers of a quantized program to keep in float, read from its numerics pass, with the
accuracy that wins back and the time it costs.

Every operator's numerics row says how much error it introduced itself (results/numerics.py: `introduced_db`, the
SQNR of what it added, relative to its own output). The proposal assumes each operator's added relative error
reaches the output in proportion: the output's error power is shared among the operators by their added error
powers, so keeping a set K of layers in float leaves `e_out * (1 - sum_K e_k / sum_all e_j)` of it, an SQNR gain of
`-10 log10(1 - share_K)`. Only linears and convolutions can be kept (`--keep-float` names modules); the layers are
taken in order of added error until they hold `TARGET_SHARE` of it, at most `MAX_KEPT` of them, and only when the
first holds at least `MIN_LAYER_SHARE` (an error spread evenly is not a few layers' fault). bench/bench_numerics.py
measures the prediction against the mixed-precision program's own numerics.

The time it costs: the kept layers' int8 nodes in this run against the same layers in the model's fp32 run on this
board (measured), else at this board's int8/fp32 ratio of their node types (other models' runs), else unknown.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace

from orchestrator.advice.findings import GEMM_TYPES, Finding, RunFacts, delegate_node_fields
from orchestrator.lowering.program import ProgramName
from orchestrator.results.numerics import EXACT_DB, OperatorRecord
from orchestrator.results.ops_record import DelegateNodeTiming

TARGET_SHARE = 0.5  # keep layers until they hold half the added error: at least 3 dB back
MAX_KEPT = 8
MIN_LAYER_SHARE = 0.15
LOSSY_SQNR_DB = 40.0  # an output below this is a large loss for int8 (its usual 28-42 dB): worth a proposal
WRAPPED = "model."  # etlab's wrappers hold the user's model as `model`; the user's own paths are without it
_WEIGHTED_OPS = frozenset({"linear", "addmm", "conv1d", "conv2d", "conv3d", "convolution", "conv_transpose1d",
                           "conv_transpose2d"})  # fmt: skip


def user_path(module: str | None) -> str | None:
    """A module's path as the user's model names it (an etlab wrapper's `model.` taken off)."""
    return module.removeprefix(WRAPPED) if module else module


def _short(op: str) -> str:
    return op.removeprefix("aten.").split(".")[0]


def is_weighted(row: OperatorRecord) -> bool:
    """A linear or convolution (measured alone, or with the activation it is fused with)."""
    return _short(row.op) in _WEIGHTED_OPS or any(_short(op) in _WEIGHTED_OPS for op in row.fused)


def added_error(row: OperatorRecord) -> float:
    """The relative error power the operator added (0 for one at fp32's rounding)."""
    return 0.0 if row.introduced_db >= EXACT_DB else 10.0 ** (-row.introduced_db / 10.0)


@dataclass(frozen=True)
class KeptLayer:
    module: str  # as the user's model names it
    share: float  # of the program's added error


@dataclass(frozen=True)
class Proposal:
    """The layers to keep in float, the output's SQNR now and predicted with them kept."""

    layers: tuple[KeptLayer, ...]
    sqnr_db: float
    predicted_sqnr_db: float

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(layer.module for layer in self.layers)

    @property
    def share(self) -> float:
        return sum(layer.share for layer in self.layers)


def ranked_layers(operators: Iterable[OperatorRecord]) -> list[KeptLayer]:
    """Every linear and convolution by the share of the program's added error it holds, largest first."""
    rows = list(operators)
    total = sum(added_error(row) for row in rows)
    if total <= 0:
        return []
    by_layer: dict[str, float] = defaultdict(float)
    for row in rows:
        module = user_path(row.module)
        if module and is_weighted(row):
            by_layer[module] += added_error(row)
    ranked = sorted(by_layer.items(), key=lambda item: (-item[1], item[0]))
    return [KeptLayer(module, round(error / total, 4)) for module, error in ranked]


def predicted_sqnr_db(sqnr_db: float, share: float) -> float:
    """The output's SQNR once layers holding `share` of the added error are kept in float (the proportional model)."""
    remaining = max(1.0 - share, 10.0 ** (-EXACT_DB / 10.0))
    return round(min(EXACT_DB, sqnr_db - 10.0 * math.log10(remaining)), 2)


def propose(operators: Iterable[OperatorRecord], output_sqnr_db: Iterable[float]) -> Proposal | None:
    """The layers to keep in float (module paths), or None when no few layers hold the loss."""
    outputs = list(output_sqnr_db)
    ranked = ranked_layers(operators)
    if not ranked or not outputs or ranked[0].share < MIN_LAYER_SHARE:
        return None
    kept: list[KeptLayer] = []
    for layer in ranked[:MAX_KEPT]:
        kept.append(layer)
        if sum(layer.share for layer in kept) >= TARGET_SHARE:
            break
    sqnr = min(outputs)
    return Proposal(tuple(kept), sqnr, predicted_sqnr_db(sqnr, sum(layer.share for layer in kept)))


def find_sensitive_layers(facts: RunFacts, _explained: frozenset[str]) -> list[Finding]:
    """A quantized program that loses accuracy (its gate failed, or its output under LOSSY_SQNR_DB), whose numerics
    pass shows a few layers introducing most of the loss: keep them in float."""
    sidecar, numerics = facts.sidecar, facts.numerics
    if sidecar is None or not sidecar.variant.quantized or numerics is None or facts.spec is None:
        return []
    if facts.spec.generates:
        return []
    accuracy = facts.summary.accuracy
    gate_failed = accuracy is not None and accuracy.verdict == "fail"
    if not gate_failed and min(numerics.output_sqnr_db, default=0.0) >= LOSSY_SQNR_DB:
        return []
    proposal = propose(numerics.operators, numerics.output_sqnr_db)
    if proposal is None:
        return []
    kept = {*proposal.names}
    gemms = [(d.graph_id, node) for d in facts.ops.delegates for node in d.nodes
             if node.type in GEMM_TYPES and user_path(node.module) in kept]  # fmt: skip
    cost, note = _keep_float_cost(facts, [node for _, node in gemms])
    layers = ", ".join(f"{layer.module} ({layer.share:.0%})" for layer in proposal.layers)
    already = facts.spec.keep_float
    names = tuple(sorted({*already, *proposal.names}))
    model = str(replace(ProgramName.parse(facts.spec.name), keep_float_digest=None))  # the program it refines
    return [
        Finding(
            kind="keep-float",
            title=f"{len(proposal.layers)} layer{'s hold' if len(proposal.layers) > 1 else ' holds'} most of the "
            "quantization loss",
            **delegate_node_fields(facts, gemms),
            cause=f"the output's SQNR is {proposal.sqnr_db:.1f} dB"
            f"{' (accuracy gate failed)' if gate_failed else ''}; of the error the operators add, {layers}",
            saving_ms=None,
            saving_note=note,
            fix_kind="option",
            fix=f"--model {model} --quantize {sidecar.variant.scheme.name} --keep-float {','.join(names)}",
            keep_float=names,
            sqnr_db=proposal.sqnr_db,
            predicted_sqnr_db=proposal.predicted_sqnr_db,
            cost_ms=cost,
            gate_failed=gate_failed,
        )
    ]


def _keep_float_cost(facts: RunFacts, nodes: Sequence[DelegateNodeTiming]) -> tuple[float | None, str]:
    """What keeping these int8 nodes in fp32 costs: the same layers in the model's fp32 run on this board, else at
    the board's int8/fp32 ratio of their types; else unknown."""
    int8_ms = sum(node.ms for node in nodes)
    modules = {user_path(node.module) for node in nodes}
    if facts.float_peer is not None:
        fp32 = [n for d in facts.float_peer.delegates for n in d.nodes
                if n.type in GEMM_TYPES and user_path(n.module) in modules]  # fmt: skip
        if fp32:
            cost = sum(node.ms for node in fp32) - int8_ms
            return cost, (f"accuracy, not time: costs {cost:+.3f} ms, measured: the same layers in fp32 run "
                          f"{facts.float_peer.run_id}")  # fmt: skip
    if facts.board_ratios is not None and nodes:
        cost = sum(node.ms / facts.board_ratios.ratio(node.type, node.shape) for node in nodes) - int8_ms
        return cost, (f"accuracy, not time: costs {cost:+.3f} ms, predicted from this board's int8/fp32 ratios "
                      f"(measured on {'; '.join(facts.board_ratios.sources)})")  # fmt: skip
    return None, "accuracy, not time: its time cost not predicted (no fp32 run of the model on this board)"
