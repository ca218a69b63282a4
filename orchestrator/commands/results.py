"""Tasks on pulled results: analyze, explore, compare. They work offline, from results/ and artifacts/."""

from __future__ import annotations

from pathlib import Path

from orchestrator import console
from orchestrator.errors import AnalysisError, ArtifactError, UsageError
from orchestrator.lowering.artifacts import Artifact, ArtifactPaths, load_artifact
from orchestrator.results.store import LocalRun, find_run


def _artifact_for(run: LocalRun) -> Artifact | None:
    try:
        return load_artifact(run.model, run.backend)
    except ArtifactError as exc:
        console.warn(f"{exc}; analysing without the program (no instruction names or delegate overlays)")
        return None


def analyze(run_id: str | None = None, *, latest: bool = False, bundle: Path | None = None) -> int:
    from orchestrator.commands.render import render_top_ops
    from orchestrator.results.analysis import analyze_bundle

    if bundle is not None:
        path = Path(bundle)
        if not path.is_dir():
            raise UsageError(f"bundle folder {path} does not exist")
        run = LocalRun(path, "?", path.parent.parent.name, path.parent.name, path.name)
    else:
        run = find_run(run_id, latest=latest or not run_id)
    artifact = _artifact_for(run)
    try:
        summary = analyze_bundle(
            run.path,
            pte=artifact.pte if artifact else None,
            sidecar=artifact.sidecar if artifact else None,
            reference_outputs=artifact.paths.reference_outputs if artifact else None,
        )
    except AnalysisError as exc:
        raise AnalysisError(f"{exc} (the raw bundle is kept at {run.path})", hint=exc.hint) from None
    render_top_ops(summary)
    names = ", ".join(str(path.relative_to(run.path)) for path in summary.written)
    console.info(console.escape(f"wrote {names}\n  in {run.path}"))
    return 0


def explore(
    run_id: str | None = None,
    *,
    model: str | None = None,
    host: str = "127.0.0.1",
    port: int = 8081,
    open_browser: bool = True,
) -> int:
    """Model Explorer on a run (its overlays) or a model (no overlays, or the model's latest run)."""
    from orchestrator.results.explorer import launch_explorer, program_models, run_overlays

    if run_id:
        run = find_run(run_id)
        name = run.model
    elif model:
        name = model
        try:
            run = find_run(latest=True, model=model)
        except UsageError:
            run = None
    else:
        run = find_run(latest=True)
        name = run.model
    paths = ArtifactPaths.for_model(name)
    present, missing = program_models(paths)
    if not present:
        raise ArtifactError(f"no artifacts for model {name!r} in {paths.folder}", hint=f"run: fab lower --model {name}")
    for absent in missing:
        console.warn(f"{absent.name} is missing: not shown (fab lower --model {name} makes it)")
    overlays = run_overlays(run.path, required=False) if run else []
    if run and not overlays:
        console.warn(f"run {run.run_id} has no overlays yet: run fab analyze --run {run.run_id}")
    launch_explorer(present, overlays, host=host, port=port, open_browser=open_browser)
    return 0


def compare(run_a: str, run_b: str) -> int:
    from orchestrator.results.compare import compare_runs, render_comparison

    first, second = find_run(run_a), find_run(run_b)
    render_comparison(compare_runs(first.path, second.path))
    return 0
