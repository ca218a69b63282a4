"""A run's facts for the advisor, read from the results folder and the artifacts: its profile (ops.json), summary,
the sidecar of the program it ran (when it is still that build), the spec it was lowered from, and the same model's
quantized run on the same board (for a measured quantization saving; which schemes count: quantize.Scheme.peers)."""

from __future__ import annotations

from pathlib import Path

from orchestrator.advice.findings import RunFacts
from orchestrator.errors import AnalysisError, SpecError
from orchestrator.lowering.artifacts import Artifact
from orchestrator.lowering.lowered import spec_from_record
from orchestrator.lowering.spec import ModelSpec, is_user_program
from orchestrator.lowering.variants import Variant
from orchestrator.results.documents import load_summary
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


def _quantized_peer(run: LocalRun, variant: Variant, root: Path | None) -> tuple[OpsRecord | None, Variant | None]:
    """The newest analysed run of the same model on the same board of one of `variant`'s peers (in their order)."""
    runs = [r for r in list_runs(root) if r.board == run.board and r.model == run.model]
    for peer_variant in variant.peers:
        for peer in reversed([r for r in runs if r.backend == peer_variant.name]):
            try:
                return load_ops(peer.path), peer_variant
            except AnalysisError:
                continue
    return None, None


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
    peer, peer_variant = (None, None)
    if sidecar is not None:
        peer, peer_variant = _quantized_peer(run, sidecar.variant, results_root)
    return RunFacts(ops, summary, sidecar, spec, peer, peer_variant), notes
