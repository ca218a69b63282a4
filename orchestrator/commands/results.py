"""Tasks on pulled results: analyze, explore, compare. They work offline, from results/ and artifacts/.

The `*_task` functions take a task's raw options, check them (exit 64), then call the task."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from orchestrator import console
from orchestrator.commands import options
from orchestrator.commands.advise import advise_quietly
from orchestrator.commands.common import find_artifact, naming_port, one_board
from orchestrator.commands.render import render_modules, render_top_ops
from orchestrator.commands.render_compare import print_numerics_comparison, render_comparison
from orchestrator.commands.render_generation import GenerationRun, print_generation_markdown
from orchestrator.errors import AnalysisError, ArtifactError, ExitCode, UsageError
from orchestrator.lowering import programs
from orchestrator.lowering.artifacts import Artifact, ArtifactPaths
from orchestrator.lowering.export.user_programs import reference_outputs_of
from orchestrator.results.analysis import analyze_bundle
from orchestrator.results.compare import RebuiltProgram, compare_runs, interleaved_verdict, write_report
from orchestrator.results.documents import ANALYSIS_DIR, load_summary
from orchestrator.results.numerics import NoNumerics, compare_numerics, read_numerics_document
from orchestrator.results.overlays import write_program_overlays
from orchestrator.results.store import LocalRun, find_run
from orchestrator.results.summary import RunSummary
from orchestrator.results.trace import MEDIAN, TRACE_FILE, Execution
from orchestrator.results.verdicts import Kind


def _artifact_for(run: LocalRun) -> Artifact | None:
    try:
        return find_artifact(run.model, run.backend)
    except ArtifactError as exc:
        console.warn(f"{exc}; analysing without the program (no instruction names or delegate overlays)")
        return None


def analyze(
    run_id: str | None = None,
    *,
    latest: bool = False,
    bundle: Path | None = None,
    accuracy: dict[str, float] | None = None,
    by_module: bool = False,
    depth: int | None = None,
    execution: Execution = MEDIAN,
    markdown: bool = False,
) -> int:
    """`fab analyze`; `by_module`: also the time by module of the model, rolled up to `depth` components;
    `markdown`: a language model's figures as markdown too, to paste into an issue."""
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
            reference_outputs=reference_outputs_of(artifact) if artifact else None,
            accuracy_thresholds=accuracy,
            execution=execution,
        )
    except AnalysisError as exc:
        raise AnalysisError(f"{exc} (the raw bundle is kept at {run.path})", hint=exc.hint) from None
    render_top_ops(summary)
    if markdown:
        print_generation_markdown([_generation_run(summary.run)])
    for note in summary.notes:
        console.info(console.escape(note))
    if by_module:
        render_modules(summary.run, depth)
    if summary.profile is not None:
        advise_quietly(run)
    names = ", ".join(str(path.relative_to(run.path)) for path in summary.written)
    console.info(console.escape(f"wrote {names}\n  in {run.path}"))
    timeline = run.path / ANALYSIS_DIR / TRACE_FILE
    if timeline in summary.written:
        drawn = "; ".join(summary.timeline) or "one execution"
        console.info(
            console.escape(f"timeline of {drawn}: {timeline} (open it in https://ui.perfetto.dev or chrome://tracing; "
                           "--execution first|median|N draws another)")
        )  # fmt: skip
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
    # here, not at the top: Model Explorer's server is for this task only (`fab analyze` never starts it)
    from orchestrator.servers.explorer import launch_explorer, program_models, run_overlays

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
    overlays = run_overlays(run.path, required=False) if run else []  # refuses overlays a board wrote
    paths = ArtifactPaths.for_model(name)
    present, missing = program_models(paths)
    if not present:
        raise ArtifactError(f"no artifacts for model {name!r} in {paths.folder}", hint=f"run: fab lower --model {name}")
    for absent in missing:
        console.warn(f"{absent.name} is missing: not shown (fab lower --model {name} makes it)")
    if run and not overlays:
        console.warn(f"run {run.run_id} has no overlays yet: run fab analyze --run {run.run_id}")
    programs = sorted((p for p in present if p.suffix == ".pte"), key=lambda p: "xnnpack" not in p.name)
    if not run and programs:  # no board yet: the memory plan of one program (the UI renames repeated graph ids)
        overlays += write_program_overlays(programs[0], paths.folder / "model_explorer" / programs[0].stem)
    with naming_port():
        launch_explorer(present, overlays, host=host, port=port, open_browser=open_browser)
    return 0


def _program_of(run: LocalRun, sha256: str | None) -> Path:
    """The .pte a run profiled: a kept baseline program, or the current artifact when it is still that build."""
    kept = programs.find(sha256)
    if kept:
        return kept
    try:
        current = find_artifact(run.model, run.backend)
    except ArtifactError:
        current = None
    if current is not None and sha256 and current.sha256 == sha256:
        return current.pte
    raise ArtifactError(
        f"the program run {run.run_id} profiled (sha256 {str(sha256)[:12]}) is neither kept nor the current artifact",
        hint="only nightly baselines (.etlab/programs/) and the current artifacts/ can be re-run",
    )


def compare_numerics_runs(run_a: str, run_b: str) -> int:
    """`fab compare --numerics A B`: where two runs' values part ways, operator by operator."""
    first, second = find_run(run_a), find_run(run_b)
    try:
        comparison = compare_numerics(read_numerics_document(first.path), read_numerics_document(second.path))
    except NoNumerics as exc:
        exc.hint = "run both with --numerics (fab run --numerics, or deploy-and-profile --numerics), then fab analyze"
        raise
    if not comparison.pairs:
        raise AnalysisError(
            f"{first.run_id} and {second.run_id} measured no operator in common: not the same model's programs"
        )
    print_numerics_comparison(first, second, comparison)
    return ExitCode.OK


def compare(
    run_a: str,
    run_b: str,
    *,
    interleave: int = 0,
    retest_seconds: float | None = None,
    board: str | None = None,
    inventory: str | None = None,
    allow_rebuilt: bool = False,
    markdown: bool = False,
) -> int:
    """Compare two runs; with `interleave` rounds, re-run both programs alternately on one board first;
    `markdown`: both runs' generation figures as markdown too, to paste into an issue.

    The re-test stops starting rounds once `retest_seconds` (default: the nightly's 180 s) are spent, after at
    least 5 rounds. Exit 1 only for a confirmed regression (which needs the interleaved re-test), else 0.
    """
    # here, not at the top: the interleaved re-test and the board connection are compare's alone
    from orchestrator.boards import labgrid
    from orchestrator.deploy.abtest import DEFAULT_RETEST_SECONDS, MIN_ROUNDS, ABProgram
    from orchestrator.deploy.abtest import interleave as run_interleaved
    from orchestrator.deploy.runs import RunParams
    from orchestrator.transport import connect

    # Every combination is checked before a run is read or a file written (exit 64); `interleave` itself is checked
    # already (options.ab_rounds: 0, or at least MIN_ROUNDS).
    if not interleave and (board or retest_seconds is not None):
        given = "--board" if board else "--retest-seconds"
        raise UsageError(
            f"{given} only applies to the interleaved re-test", hint=f"add --interleave N (N >= {MIN_ROUNDS})"
        )
    target = None
    if interleave:
        target = one_board(inventory, board, what="--interleave needs", example="--interleave 6 "
                           "--board local")  # fmt: skip
    budget = DEFAULT_RETEST_SECONDS if retest_seconds is None else retest_seconds
    first, second = find_run(run_a), find_run(run_b)
    try:
        comparison = compare_runs(first.path, second.path, allow_rebuilt=allow_rebuilt or bool(interleave))
    except RebuiltProgram as exc:
        exc.hint = "pass --allow-rebuilt to compare a re-lowered program, or --interleave N --board B to re-run both"
        raise
    if target is not None:
        artifact = find_artifact(second.model, second.backend)
        a = ABProgram("A", _program_of(first, comparison.sha_a), str(comparison.sha_a))
        b = ABProgram("B", _program_of(second, comparison.sha_b), str(comparison.sha_b))
        inputs = (artifact.paths.reference_inputs, artifact.sidecar.reference_inputs_sha256)
        console.info(
            console.escape(
                f"re-running both programs interleaved on {target.name}: {interleave} rounds, at most {budget:g} s"
            )
        )
        with labgrid.job(target) as place, connect(place) as conn:
            result = run_interleaved(conn, a, b, inputs, RunParams(), rounds=interleave, budget_seconds=budget)
        interleaved_verdict(comparison, result)
        write_report(comparison)
    render_comparison(comparison)
    if markdown:
        print_generation_markdown([_generation_run(load_summary(run.path)) for run in (first, second)])
    return 1 if comparison.verdict == Kind.REGRESSION else 0


def _generation_run(summary: RunSummary) -> GenerationRun:
    return summary.board or "?", summary.model.name or "?", summary.model.backend or "?", summary


def analyze_task(
    run_id: str | None,
    *,
    latest: bool,
    bundle: str | None,
    min_sqnr: Any,
    min_top1: Any,
    min_top5: Any,
    by: Any = None,
    markdown: bool = False,
    execution: Any = None,
) -> int:
    """`fab analyze [--by module[:DEPTH]] [--markdown] [--execution first|median|N]`."""
    accuracy = options.accuracy_thresholds(min_sqnr, min_top1, min_top5)
    depth = options.grouping(by) if by is not None else None
    drawn = options.execution(execution) if execution is not None else MEDIAN
    return analyze(
        run_id, latest=latest, bundle=None if bundle is None else Path(bundle), accuracy=accuracy,
        by_module=by is not None, depth=depth, markdown=bool(markdown), execution=drawn,
    )  # fmt: skip


def explore_task(run_id: str | None, *, model: str | None, host: str, port: Any, no_browser: bool) -> int:
    """`fab explore` (Model Explorer on port 8081 unless told)."""
    listen = options.port(8081 if port is None else port)
    return explore(run_id, model=model, host=host, port=listen, open_browser=not no_browser)


def compare_task(
    run_a: Any, run_b: Any, *, interleave: Any, retest_seconds: Any, board: str | None, inventory: str | None,
    allow_rebuilt: bool, numerics: bool = False, markdown: bool = False,
) -> int:  # fmt: skip
    """`fab compare RUN_A RUN_B [--interleave N --board B | --numerics] [--markdown]`."""
    if numerics:
        if interleave is not None or retest_seconds is not None or board or allow_rebuilt or markdown:
            raise UsageError("--numerics compares the runs' numerics passes: it takes no --interleave, "
                             "--retest-seconds, --board, --allow-rebuilt or --markdown")  # fmt: skip
        return compare_numerics_runs(options.run_id(run_a, "RUN_A"), options.run_id(run_b, "RUN_B"))
    rounds = options.ab_rounds(0 if interleave is None else interleave)
    budget = None if retest_seconds is None else options.seconds("--retest-seconds", retest_seconds)
    return compare(
        options.run_id(run_a, "RUN_A"), options.run_id(run_b, "RUN_B"), interleave=rounds, retest_seconds=budget,
        board=board, inventory=inventory, allow_rebuilt=allow_rebuilt, markdown=bool(markdown),
    )  # fmt: skip
