"""The advisor on each cell the nightly measures, as `fab deploy-and-profile` runs it after its analysis: the run's
findings written into its bundle (analysis/advice.json and the advice overlays), so the dashboard's night cells, the
run pages and the nightly report carry them (read back by advice/documents.py's finding_lines)."""

from __future__ import annotations

from pathlib import Path

from orchestrator import console
from orchestrator.advice.advisor import advise
from orchestrator.advice.documents import write_advice
from orchestrator.advice.facts import run_facts
from orchestrator.deploy.cells import CellOutcome
from orchestrator.errors import AnalysisError
from orchestrator.lowering.artifacts import Artifact
from orchestrator.results.store import LocalRun


def advise_cell(cell: CellOutcome, artifact: Artifact | None, results_root: Path | None = None) -> int | None:
    """The advisor's findings for a measured cell, written into its bundle; how many (None: no advice, and why is
    warned once: advice never fails the night)."""
    if cell.bundle is None or cell.summary is None or cell.summary.profile is None:
        return None
    run = LocalRun(cell.bundle, cell.board, cell.model, cell.variant.name, cell.bundle.name)
    try:
        facts, _ = run_facts(run, artifact, results_root=results_root)
        advice = advise(facts)
        write_advice(run.path, advice)
    except AnalysisError as exc:
        console.warn(f"[{cell.board}] {cell.model}/{cell.variant}: no advice: {exc}")
        return None
    return len(advice.findings)
