"""`fab advise`: a run's findings (advice/), their predicted savings and fixes; `--try` measures the proposed
change (its rewrites, a text-generation program's attention, the layers a quantized program keeps in float) on the
board, speed and accuracy. Every analysis also prints the top
findings in one line each (`advise_quietly`)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from orchestrator import console
from orchestrator.advice.advisor import advise
from orchestrator.advice.documents import write_advice
from orchestrator.advice.facts import run_facts
from orchestrator.advice.findings import Advice, RunFacts
from orchestrator.commands import options
from orchestrator.commands.common import find_artifact, one_board
from orchestrator.commands.options import TrialOptions
from orchestrator.commands.render_advice import print_advice_lines, render_advice, render_trial
from orchestrator.errors import AnalysisError, ArtifactError, UsageError
from orchestrator.fsutil import atomic_write_json
from orchestrator.lowering.artifacts import Artifact
from orchestrator.lowering.program import AS_SPECIFIED, ProgramName
from orchestrator.lowering.variants import QUANTIZED_ON, SCHEMES, Variant
from orchestrator.records import to_data
from orchestrator.results.documents import ANALYSIS_DIR
from orchestrator.results.store import LocalRun, find_run

TRIAL_FILE = "advice_trial.json"


def _artifact(run: LocalRun) -> Artifact | None:
    try:
        return find_artifact(run.model, run.backend)
    except ArtifactError:
        return None


def advise_run(
    run: LocalRun, artifact: Artifact | None, results_root: Path | None = None
) -> tuple[RunFacts, Advice, list[str]]:
    """The run's facts and advice, the advice written into it (advice.json and the overlays); AnalysisError if it
    has no profile."""
    facts, notes = run_facts(run, artifact, results_root=results_root)
    advice = advise(facts)
    write_advice(run.path, advice)
    return facts, advice, notes


def advise_quietly(run: LocalRun, who: str = "", results_root: Path | None = None) -> Advice | None:
    """After an analysis: the top findings in one line each. Advice never fails the analysis it follows."""
    try:
        _, advice, _ = advise_run(run, _artifact(run), results_root)
    except AnalysisError as exc:
        console.warn(f"{who}no advice: {exc}")
        return None
    print_advice_lines(advice, who)
    return advice


def advise_task(
    run_id: Any, *, model: str | None, board: str | None, try_: bool, each: bool, rounds: Any, retest_seconds: Any,
    inventory: str | None, trust_remote_code: bool = False, trust_code: bool = False,
) -> int:  # fmt: skip
    """`fab advise`: its options checked (exit 64), then `advise_on`."""
    trial = options.advice_trial(try_, each, rounds, retest_seconds, inventory)
    if (trust_code or trust_remote_code) and trial is None:
        raise UsageError("--trust-code and --trust-remote-code are for --try (it lowers the model again)")
    if trial is not None:
        trial = replace(trial, trust_code=trust_code, trust_remote_code=trust_remote_code)
    return advise_on(None if run_id is None else options.run_id(run_id), model=model, board=board, trial=trial)


def advise_on(
    run_id: str | None = None,
    *,
    model: str | None = None,
    board: str | None = None,
    trial: TrialOptions | None = None,
) -> int:
    """`fab advise [--run ID | --model M [--board B]] [--try [--each]]`: the latest run when neither is given."""
    run = find_run(run_id) if run_id else find_run(latest=True, model=model, board=board)
    artifact = _artifact(run)
    facts, advice, notes = advise_run(run, artifact)
    render_advice(advice, notes)
    if trial is None:
        return 0
    change = advice.change
    quantize = advice.quantize if facts.sidecar is not None and not facts.sidecar.variant.quantized else None
    if change == AS_SPECIFIED and quantize is None:
        console.info(console.escape(f"run {run.run_id}: no change to the program proposed: nothing to try"))
        return 0
    if artifact is None or facts.spec is None or facts.sidecar is None:
        raise UsageError(
            f"--try needs the program run {run.run_id} profiled, lowered by etlab from a spec: "
            f"{notes[0] if notes else 'it is not in artifacts/'}",
            hint=f"lower it again (fab lower --model {run.model}), run it, then advise",
        )
    if facts.applied_rewrites:
        base = facts.sidecar.identity.base
        raise UsageError(
            f"--try measures rewrites against the model as exported; run {run.run_id} profiled {run.model}, "
            f"which has rewrites applied already ({', '.join(facts.applied_rewrites)})",
            hint=f"profile the model as exported (fab deploy-and-profile --model {base}), then advise on that run",
        )
    if facts.spec.keep_float:
        base = str(replace(ProgramName.parse(facts.spec.name), keep_float_digest=None))
        raise UsageError(
            f"--try measures keeping layers in float against the quantized model; run {run.run_id} profiled "
            f"{run.model}, which keeps {', '.join(facts.spec.keep_float)} in float already",
            hint=f"profile the quantized model (fab deploy-and-profile --model {base} --quantize "
            f"{facts.sidecar.variant.scheme.name} --numerics), then advise on that run",
        )
    target = one_board(trial.inventory, run.board if board is None else board, what="--try needs",
                       example=f"fab advise --run {run.run_id} --try --board local")  # fmt: skip
    # here, not at the top: the trial brings the lowering and the A/B re-test, which every analysis's advice
    # (advise_quietly, on a warm deploy's path) needs none of
    from orchestrator.advice.trial import try_change
    from orchestrator.deploy.runs import RunParams

    trying = ", ".join([*change.rewrites.names, *([f"--attention {change.attention}"] if change.attention else []),
                        *([f"--keep-float {','.join(change.keep_float)}"] if change.keep_float else []),
                        *([f"--quantize {quantize}"] if quantize else [])])  # fmt: skip
    console.info(
        console.escape(
            f"trying {trying} on {target.name}: lowering, checking outputs, then interleaved A/B "
            f"({trial.rounds} rounds, at most {trial.retest_seconds:g} s per variant)"
        )
    )
    spec = facts.spec.allowed(trust_remote_code=trial.trust_remote_code, trust_code=trial.trust_code)
    report = try_change(
        spec, facts.sidecar.variant, change, target, RunParams(), each=trial.each,
        predicted_ms=advice.predicted_parts, profiled_ms=advice.method_ms, weights=facts.sidecar.weights,
        rounds=trial.rounds, budget_seconds=trial.retest_seconds,
        quantize_to=Variant(QUANTIZED_ON, SCHEMES[quantize]) if quantize else None,
    )  # fmt: skip
    atomic_write_json(run.path / ANALYSIS_DIR / TRIAL_FILE, to_data(report.outcome))
    render_trial(report)
    return 0
