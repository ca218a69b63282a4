"""`fab deploy-and-profile`: lower, then on every board set up, push, run, pull and analyse; then explore."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from rich.markup import escape

from orchestrator import console, prefetch
from orchestrator.boards.fanout import fan_out
from orchestrator.boards.inventory import Board
from orchestrator.commands import options
from orchestrator.commands.common import (
    AccuracyOptions,
    BoardOptions,
    LoweringGroup,
    LoweringOptions,
    RunOptions,
    check_generation,
    find_artifact,
    naming_calibration,
    naming_keep_float,
    naming_port,
    naming_rewrites,
    numerics_programs,
)
from orchestrator.commands.program_options import ProgramOptions
from orchestrator.commands.programs import profiled
from orchestrator.commands.render import print_cells, print_context_scaling
from orchestrator.commands.render_generation import print_generation_markdown
from orchestrator.commands.render_lowering import print_lowering
from orchestrator.deploy.cells import CellJob, CellOutcome, is_link_trouble, run_cells_on_board
from orchestrator.deploy.runs import RunParams
from orchestrator.errors import AnalysisError, ExitCode, combined_exit_code, failure_code
from orchestrator.lowering.artifacts import Artifact, ArtifactPaths
from orchestrator.lowering.export import lower as lowerer
from orchestrator.lowering.export.user_programs import reference_outputs_of
from orchestrator.lowering.program import Program
from orchestrator.lowering.variants import Variant
from orchestrator.results.store import LocalRun


def deploy_task(given: dict[str, Any]) -> int:
    """`fab deploy-and-profile`: every option is checked before the chain lowers, connects or starts anything.
    `given`: the task's options by name, each taken by its group."""
    program, run = ProgramOptions.take(given), RunOptions.take(given)
    lowering, accuracy, boards = LoweringGroup.take(given), AccuracyOptions.take(given), BoardOptions.take(given)
    no_explore, no_browser = bool(given.pop("no_explore", False)), bool(given.pop("no_browser", False))
    port, markdown = given.pop("port", None), bool(given.pop("markdown", False))
    options.all_taken(given)
    params = run.params()
    checked = lowering.options()
    listen = options.port(8081 if port is None else port)
    chosen = lowering.variants(default="xnnpack")
    thresholds = accuracy.thresholds()
    target = profiled(program, params.new_tokens)
    return deploy_and_profile(
        target,
        variants=chosen,
        lowering=checked,
        accuracy=thresholds,
        boards=boards.boards(),
        params=params,
        explore=not no_explore,
        port=listen,
        open_browser=not no_browser,
        # Model Explorer shows both fp32 programs: the portable one is lowered for it when no --backend was asked
        lower_both=lowering.backend is None and not no_explore,
        markdown=markdown,
    )


def deploy_and_profile(
    programs: Sequence[Program] | Artifact,
    *,
    variants: Sequence[Variant],
    boards: Sequence[Board],
    params: RunParams,
    lowering: LoweringOptions | None = None,
    explore: bool = True,
    host: str = "127.0.0.1",
    port: int = 8081,
    open_browser: bool = True,
    results_root: Path | None = None,
    artifacts_root: Path | None = None,
    accuracy: dict[str, float] | None = None,
    lower_both: bool = True,
    markdown: bool = False,
) -> int:
    """`programs`: a model's programs (several: one per KV cache size, `--context`, profiled side by side and
    compared in one table and one plot), or the user's own (`--pte`, an Artifact: profiled as it is). `lower_both`:
    lower both fp32 programs too (for Model Explorer), not only `variants`; `markdown`: a language model's figures
    as markdown too, to paste into an issue."""
    if isinstance(programs, Artifact):  # `--pte`: the user's own program, profiled as it is
        return deploy_program(programs, boards=boards, params=params, accuracy=accuracy, explore=explore, host=host,
                              port=port, open_browser=open_browser, results_root=results_root,
                              markdown=markdown)  # fmt: skip
    # For Model Explorer both fp32 backends are lowered too (cached after the first time), so it shows every program,
    # the quantized ones next to the fp32 ones; otherwise only what was asked.
    both = [Variant("portable"), Variant("xnnpack")] if lower_both else []
    wanted = list(dict.fromkeys([*both, *variants]))
    checked = lowering or LoweringOptions("auto", None, None)
    jobs, paths = [], []
    for program in programs:
        kept = ",".join(program.spec.keep_float) or None
        # a mixed-precision program has no fp32 variant of its own: Model Explorer shows its quantized one
        chosen = [variant for variant in wanted if variant.quantized or variant in variants] if kept else wanted
        with naming_calibration(), naming_rewrites(program.rewrites), naming_keep_float(kept):
            lowered = lowerer.lower(
                program.spec,
                variants=chosen,
                weights=checked.weights,
                root=artifacts_root,
                calibration=checked.calibration,
                jobs=checked.jobs,
                rewrites=program.rewrites,
            )
        print_lowering(lowered)
        paths.append(lowered.paths)
        jobs += [
            CellJob(find_artifact(program.name, variant, artifacts_root), params, accuracy) for variant in variants
        ]
    check_generation([job.artifact for job in jobs], params)
    specs = {program.name: program.spec for program in programs}
    numerics = numerics_programs([job.artifact for job in jobs], params, checked.calibration, specs)
    jobs = [replace(job, numerics=numerics.get(job.artifact.pte)) for job in jobs]
    return _profile(jobs, paths[0], boards, results_root, explore=explore, host=host, port=port,
                    open_browser=open_browser, scaling=len(programs) > 1, markdown=markdown)  # fmt: skip


def deploy_program(
    artifact: Artifact,
    *,
    boards: Sequence[Board],
    params: RunParams,
    accuracy: dict[str, float] | None = None,
    explore: bool = True,
    host: str = "127.0.0.1",
    port: int = 8081,
    open_browser: bool = True,
    results_root: Path | None = None,
    markdown: bool = False,
) -> int:
    """`fab deploy-and-profile --pte`: a program the user lowered, profiled as it is (nothing lowered)."""
    if reference_outputs_of(artifact) is None:
        console.info(f"{artifact.model}: no --reference outputs given: correctness is not checked")
    check_generation([artifact], params)
    numerics_programs([artifact], params)  # refuses a program it cannot measure (64)
    jobs = [CellJob(artifact, params, accuracy)]
    return _profile(jobs, artifact.paths, boards, results_root, explore=explore, host=host, port=port,
                    open_browser=open_browser, markdown=markdown)  # fmt: skip


_ADVISOR = "orchestrator.commands.advise"


def _profile(
    jobs: list[CellJob],
    artifact_paths: ArtifactPaths,
    boards: Sequence[Board],
    results_root: Path | None,
    *,
    explore: bool,
    host: str,
    port: int,
    open_browser: bool,
    scaling: bool = False,
    markdown: bool = False,
) -> int:
    """Every job on every board (set up, push, run, pull, analyse), the results table, then Model Explorer.

    `scaling`: the jobs are one model at several KV cache sizes: a table and a plot against the context too."""
    prefetch.in_background(_ADVISOR)  # while the boards work: the advice comes after them
    with console.steps_progress() as progress:
        outcomes = fan_out(
            boards, lambda board: run_cells_on_board(board, jobs, progress=progress, results_root=results_root)
        )
    cells = [cell for outcome in outcomes for cell in (outcome.value or [])]
    for outcome in outcomes:  # a bug, or no labgrid place for the board: keep it visible
        if not outcome.ok:
            cells += [
                CellOutcome(
                    outcome.board.name,
                    job.artifact.model,
                    job.artifact.variant,
                    error=outcome.error,
                    stage=outcome.stage or "?",
                    detail=outcome.detail,
                    exit_class=ExitCode.SOFTWARE if outcome.exception is None else failure_code(outcome.exception),
                    infrastructure=is_link_trouble(outcome.exception),
                )
                for job in jobs
            ]
    print_cells(cells)
    if markdown:
        print_generation_markdown([(c.board, c.model, c.variant.name, c.summary) for c in cells if c.summary])
    if scaling:
        print_context_scaling(cells, results_root)
    _advise(cells, {(job.artifact.model, job.artifact.variant): job.artifact for job in jobs}, results_root)
    code = combined_exit_code(cell.exit_class for cell in cells if not cell.ok)

    if explore:
        explore_cells(cells, artifact_paths, host=host, port=port, open_browser=open_browser)
    return code


def _advise(
    cells: Sequence[CellOutcome], artifacts: dict[tuple[str, Variant], Artifact], results_root: Path | None
) -> None:
    """Every analysed run advised (advice.json and its overlays, before Model Explorer starts: they go with the
    others), the advice said once per model. Advice never fails the runs it follows."""
    # here, not at the top: prefetched while the boards worked (an import of it now waits for that one)
    from orchestrator.commands.advise import advise_run
    from orchestrator.commands.render_deploy import print_model_advice

    advices = []
    for cell in cells:
        if cell.bundle is not None and cell.summary is not None and cell.summary.profile is not None:
            run = LocalRun(cell.bundle, cell.board, cell.model, cell.variant.name, cell.bundle.name)
            try:
                _, advice, _ = advise_run(run, artifacts.get((cell.model, cell.variant)), results_root)
            except AnalysisError as exc:
                console.warn(f"[{cell.board}] {cell.model}/{cell.variant}: no advice: {exc}")
                continue
            advices.append((cell, advice))
    print_model_advice(advices)


def explore_cells(
    cells: Sequence[CellOutcome], artifact_paths: Any, *, host: str, port: int, open_browser: bool
) -> None:
    """Open Model Explorer on the first board that produced overlays."""
    # here, not at the top: Model Explorer's server and its adapters are for --explore only, not every deploy
    from orchestrator.servers.explorer import launch_explorer, program_models, run_overlays

    analysed = [cell for cell in cells if cell.bundle and cell.summary]
    if not analysed:
        console.warn("no analysed run to explore")
        return
    board = analysed[0].board
    overlays = sorted(
        overlay
        for cell in analysed
        if cell.board == board and cell.bundle is not None
        for overlay in run_overlays(cell.bundle, required=False)
    )
    models, _ = program_models(artifact_paths)
    console.info(escape(f"Opening Model Explorer with the overlays of {board} (Ctrl+C to stop)"))
    with naming_port():
        launch_explorer(models, overlays, host=host, port=port, open_browser=open_browser)
