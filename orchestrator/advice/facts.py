"""A run's facts for the advisor, read from the results folder and the artifacts: its profile (ops.json), summary,
the sidecar of the program it ran (when it is still that build), the spec it was lowered from, and the same model's
quantized run on the same board (for a measured quantization saving; which schemes count: quantize.Scheme.peers),
else this board's int8-against-fp32 ratios per GEMM node type from the other models it ran both ways."""

from __future__ import annotations

from pathlib import Path

from orchestrator.advice.findings import GEMM_TYPES, BoardRatios, RunFacts, shape_key
from orchestrator.errors import AnalysisError, SpecError
from orchestrator.lowering.artifacts import Artifact
from orchestrator.lowering.lowered import spec_from_record
from orchestrator.lowering.program import ProgramName
from orchestrator.lowering.spec import ModelSpec, is_user_program
from orchestrator.lowering.variants import QUANTIZED_ON, Variant
from orchestrator.results.documents import load_summary
from orchestrator.results.numerics import NoNumerics, NumericsDocument, read_numerics_document
from orchestrator.results.ops_record import OpsRecord, load_ops
from orchestrator.results.store import LocalRun, list_runs


def _spec_of(artifact: Artifact) -> ModelSpec | None:
    record = artifact.sidecar.spec
    if is_user_program(record.get("model_source")):
        return None  # a program the user lowered: no spec, no rewrite to offer
    try:
        return spec_from_record(record, f"{artifact.model}'s sidecar")
    except SpecError:
        return None


def _quantized_peer(run: LocalRun, variant: Variant, every: list[LocalRun]) -> tuple[OpsRecord | None, Variant | None]:
    """The newest analysed run of the same model on the same board of one of `variant`'s peers (in their order)."""
    runs = [r for r in every if r.board == run.board and r.model == run.model]
    for peer_variant in variant.peers:
        for peer in reversed([r for r in runs if r.backend == peer_variant.name]):
            try:
                return load_ops(peer.path), peer_variant
            except AnalysisError:
                continue
    return None, None


def _float_peer(run: LocalRun, every: list[LocalRun]) -> OpsRecord | None:
    """A quantized run's fp32 twin: the newest analysed XNNPACK run of the same model (the model itself for a
    mixed-precision program) on the same board."""
    named = ProgramName.parse(run.model or "")
    model = str(ProgramName(named.base, named.attention, named.context, named.rewrites, named.rewrites_digest))
    runs = [r for r in every if r.board == run.board and r.model == model and r.backend == QUANTIZED_ON]
    for peer in reversed(runs):
        try:
            return load_ops(peer.path)
        except AnalysisError:
            continue
    return None


def _numerics(run: LocalRun) -> tuple[NumericsDocument | None, str | None]:
    try:
        return read_numerics_document(run.path), None
    except NoNumerics:
        return None, None
    except AnalysisError as exc:
        return None, f"its numerics are unusable ({exc}): the accuracy findings are skipped"


def _gemm_ms_by_key(ops: OpsRecord) -> dict[str, float]:
    """Each GEMM node type's time, and each (type, output size) class's (`shape_key`)."""
    found: dict[str, float] = {}
    for delegate in ops.delegates:
        for node in delegate.nodes:
            if node.type in GEMM_TYPES:
                for key in (node.type, shape_key(node.type, node.shape)):
                    if key is not None:
                        found[key] = found.get(key, 0.0) + node.ms
    return found


def _board_ratios(run: LocalRun, variant: Variant, every: list[LocalRun]) -> BoardRatios | None:
    """This board's int8-against-fp32 time of each GEMM node type, and of each type and output size, from the other
    models it ran both ways: for each model, its newest analysed fp32 run and its newest run of the first of
    `variant`'s peers it has (the same board, the same backend), summed over the models. None when the board ran no
    model both ways."""
    runs = [r for r in every if r.board == run.board and r.model != run.model]
    fp32: dict[str, float] = {}
    quantized: dict[str, float] = {}
    sources: list[str] = []
    scheme: Variant | None = None
    for model in sorted({r.model for r in runs}):
        mine = [r for r in runs if r.model == model]
        base = [r for r in mine if r.backend == variant.name]
        for peer_variant in variant.peers:
            peers = [r for r in mine if r.backend == peer_variant.name]
            if not base or not peers or (scheme is not None and peer_variant != scheme):
                continue
            try:
                a, b = load_ops(base[-1].path), load_ops(peers[-1].path)
            except AnalysisError:
                continue
            before, after = _gemm_ms_by_key(a), _gemm_ms_by_key(b)
            for key in before.keys() & after.keys():
                fp32[key] = fp32.get(key, 0.0) + before[key]
                quantized[key] = quantized.get(key, 0.0) + after[key]
            scheme = peer_variant
            sources.append(f"{model} ({base[-1].run_id} against {peers[-1].run_id})")
            break
    found = {key: quantized[key] / ms for key, ms in fp32.items() if ms > 0}
    ratios = {key: ratio for key, ratio in found.items() if "@" not in key}
    if scheme is None or not ratios:
        return None
    by_shape = {key: ratio for key, ratio in found.items() if "@" in key}
    return BoardRatios(scheme, ratios, tuple(sources), by_shape)


def run_facts(
    run: LocalRun, artifact: Artifact | None, *, results_root: Path | None = None
) -> tuple[RunFacts, list[str]]:
    """The run's facts, and notes on what is missing. AnalysisError when the run has no analysed profile."""
    summary = load_summary(run.path)
    ops = load_ops(run.path)
    notes = []
    sidecar = spec = None
    if artifact is not None:
        spec = _spec_of(artifact)
        if summary.model.sha256 and artifact.sidecar.sha256.lower() == summary.model.sha256.lower():
            sidecar = artifact.sidecar
        else:
            notes.append(f"{artifact.pte.name} was lowered again since this run: its output shapes and rewrites "
                         "are not this run's, so the findings that need them are skipped")  # fmt: skip
    else:
        notes.append("no artifact for this run's program: findings from the profile alone")
    peer, peer_variant, ratios, float_peer = None, None, None, None
    if sidecar is not None:
        every = list_runs(results_root)  # read once: each peer below is looked for among them
        peer, peer_variant = _quantized_peer(run, sidecar.variant, every)
        if peer is None and sidecar.variant.peers:
            ratios = _board_ratios(run, sidecar.variant, every)
        if sidecar.variant.quantized:
            float_peer = _float_peer(run, every)
            if float_peer is None:  # the kept layers' fp32 time from the board's ratios of this scheme, if any
                found = _board_ratios(run, Variant(QUANTIZED_ON), every)
                ratios = found if found is not None and found.scheme == sidecar.variant else None
    numerics, problem = _numerics(run)
    notes += [problem] if problem else []
    return RunFacts(ops, summary, sidecar, spec, peer, peer_variant, ratios, numerics, float_peer), notes
