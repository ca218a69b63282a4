"""`fab advise`: a run's findings (advice/), their predicted savings and fixes; `--try` measures the proposed
rewrites on the board. Every analysis also prints the top findings in one line each (`advise_quietly`)."""

from __future__ import annotations

from pathlib import Path

from orchestrator import console
from orchestrator.advice.advisor import advise
from orchestrator.advice.documents import write_advice
from orchestrator.advice.facts import run_facts
from orchestrator.advice.findings import Advice
from orchestrator.commands.common import find_artifact
from orchestrator.commands.render_advice import print_advice_lines, render_advice
from orchestrator.errors import AnalysisError, ArtifactError
from orchestrator.lowering.artifacts import Artifact
from orchestrator.results.store import LocalRun, find_run


def _artifact(run: LocalRun) -> Artifact | None:
    try:
        return find_artifact(run.model, run.backend)
    except ArtifactError:
        return None


def advise_run(run: LocalRun, results_root: Path | None = None) -> tuple[Advice, list[str]]:
    """The run's advice, written into it (advice.json and the overlays); AnalysisError if it has no profile."""
    facts, notes = run_facts(run, _artifact(run), results_root=results_root)
    advice = advise(facts)
    write_advice(run.path, advice)
    return advice, notes


def advise_quietly(run: LocalRun, who: str = "", results_root: Path | None = None) -> Advice | None:
    """After an analysis: the top findings in one line each. Advice never fails the analysis it follows."""
    try:
        advice, _ = advise_run(run, results_root)
    except AnalysisError as exc:
        console.warn(console.escape(f"{who}no advice: {exc}"))
        return None
    print_advice_lines(advice, who)
    return advice


def advise_task(run_id: str | None = None, *, model: str | None = None, board: str | None = None) -> int:
    """`fab advise [--run ID | --model M [--board B]]`: the latest run when neither is given."""
    run = find_run(run_id) if run_id else find_run(latest=True, model=model, board=board)
    advice, notes = advise_run(run)
    render_advice(advice, notes)
    return 0
