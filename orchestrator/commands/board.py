"""Single steps across the selected boards: setup-board, push, run, pull, boards, gc.

Each fans out over boards in parallel, prints a per-board table, and returns the exit code
(non-zero when any board failed). The `*_task` functions take a task's raw options, check them (exit 64), then call
the step.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from orchestrator import console
from orchestrator.boards.fanout import BoardOutcome, exit_code, fan_out, stage
from orchestrator.boards.inventory import Board, load_inventory
from orchestrator.boards.limits import LIMITS_CAPTION, limits_cell
from orchestrator.boards.workdir import BoardWorkdir
from orchestrator.commands import options
from orchestrator.commands.common import (
    BoardOptions,
    LoweringGroup,
    RunOptions,
    check_generation,
    find_artifact,
    numerics_programs,
    select_all,
    select_boards,
)
from orchestrator.commands.program_options import ProgramOptions, no_choices_for_own_program, spec_programs
from orchestrator.commands.programs import exclusive, reference_without_pte, user_program
from orchestrator.commands.render_boards import print_details, print_gc, summarize
from orchestrator.deploy.agent_client import BoardAgent, GcResult
from orchestrator.deploy.board_status import board_statuses
from orchestrator.deploy.provision import setup_board
from orchestrator.deploy.runs import RunParams, profile, push_artifact, push_numerics
from orchestrator.errors import BundleError, EtlabError, ExitCode, UsageError
from orchestrator.lowering import programs
from orchestrator.lowering.artifacts import Artifact
from orchestrator.lowering.export.numerics import NumericsProgram
from orchestrator.lowering.lowered import find_lowered
from orchestrator.lowering.sources.pte import USER_PROGRAM
from orchestrator.lowering.variants import Variant
from orchestrator.results.store import new_run_id, pull_destination
from orchestrator.transport import connect
from orchestrator.transport.pull import pull_bundle


def _summarize_failures(outcomes: Sequence[BoardOutcome[Any]], title: str) -> int:
    """The per-board status table, shown when a board failed (the result table already covers success)."""
    if not all(o.ok for o in outcomes):
        summarize(outcomes, title=f"{title}: per board")
    return exit_code(outcomes)


def _finish(outcomes: Sequence[BoardOutcome[Any]], title: str, columns: list[str], row: Any) -> int:
    rows = [[o.board.name, *row(o.value)] for o in outcomes if o.ok]
    if rows:
        console.table(title, ["board", *columns], rows)
    return _summarize_failures(outcomes, title)


def setup_boards(boards: Sequence[Board], *, force: bool = False) -> int:
    def one(board: Board) -> Any:
        with stage("connect"), connect(board) as conn, stage("setup"):
            return setup_board(conn, force=force)

    outcomes = fan_out(boards, one)
    return _finish(
        outcomes,
        "setup-board",
        ["arch", "executorch", "runner", "limits", "result", "seconds"],
        lambda r: [r.arch, r.executorch_version, r.runner_version,
                   limits_cell(r.bandwidth, r.compute),
                   "; ".join(r.actions + r.limits_notes) or "already up to date: nothing to do", round(r.seconds, 2)],
    )  # fmt: skip


def push(boards: Sequence[Board], artifacts: Sequence[Artifact]) -> int:
    def one(board: Board) -> list[Any]:
        rows = []
        with stage("connect"), connect(board) as conn, stage("push"), console.transfer_progress() as progress:
            for artifact in artifacts:
                pushed = push_artifact(conn, artifact, progress)
                rate = pushed.model.mib_per_s
                rows.append((artifact.variant.name, pushed.model.remote_path, pushed.model.skipped, rate))
        return rows

    outcomes = fan_out(boards, one)
    rows = [
        [o.board.name, backend, path, "already there" if skipped else "pushed", round(rate, 1) if rate else None]
        for o in outcomes
        if o.ok
        for backend, path, skipped, rate in o.value or []
    ]
    if rows:
        console.table("push", ["board", "backend", "on the board", "result", "MiB/s"], rows)
    return _summarize_failures(outcomes, "push")


def run(
    boards: Sequence[Board],
    artifacts: Sequence[Artifact],
    params: RunParams,
    numerics: Mapping[Path, NumericsProgram] | None = None,
) -> int:
    """Profile the (pushed) models; bundles stay on the boards until `pull`. `numerics`: each artifact's numerics
    program by its .pte, for a numerics pass after the timing pass."""

    def one(board: Board) -> list[Any]:
        rows = []
        with stage("connect"), connect(board) as conn:
            for artifact in artifacts:
                with stage("push"):
                    pushed = push_artifact(conn, artifact)  # a no-op when the board holds it already
                    tapped = (numerics or {}).get(artifact.pte)
                    pushed_numerics = push_numerics(conn, tapped) if tapped is not None else None
                with stage("run"):
                    remote = profile(conn, artifact, pushed, params, new_run_id(), pushed_numerics)
                rows.append((artifact.variant.name, remote))
        if any(r.status != "ok" for _, r in rows):
            failed = next(r for _, r in rows if r.status != "ok")
            raise RunFailed(f"runner {failed.status} for {failed.run_id}: {failed.error}", rows)
        return rows

    outcomes = fan_out(boards, one)
    rows = []
    for o in outcomes:
        results = o.value if o.ok else getattr(o.exception, "rows", [])
        rows += [[o.board.name, backend, r.run_id, r.status, r.error] for backend, r in results or []]
    if rows:
        console.table("run", ["board", "backend", "run id", "status", "error"], rows, caption="next: fab pull")
    return _summarize_failures(outcomes, "run")


class RunFailed(EtlabError):
    """The runner failed or timed out on a board; its bundle is still there to pull."""

    exit_code = ExitCode.FAILED

    def __init__(self, message: str, rows: list[Any]) -> None:
        super().__init__(message)
        self.rows = rows


def pull(boards: Sequence[Board], *, run_id: str | None = None, latest: bool = False) -> int:
    """Pull bundles not yet on the workstation (all of them, the latest one, or one run id).

    Exit code 65 when a board sent a bundle that was refused (its other bundles are still pulled)."""

    def one(board: Board) -> tuple[list[Path], int]:
        pulled = []
        refused: list[str] = []
        with stage("connect"), connect(board) as conn:
            entries = BoardAgent(conn, conn.workdir).bundles()
            if run_id:
                entries = _matching_runs(entries, run_id)
            elif latest:
                entries = entries[:1]
            with stage("pull"):
                for entry in entries:
                    try:
                        dest = pull_destination(board.name, entry)
                    except BundleError as exc:
                        refused.append(str(exc))
                        continue
                    # A bundle already on the workstation is skipped; a refused one leaves nothing here.
                    if not dest.exists():
                        try:
                            pulled.append(pull_bundle(conn, BoardWorkdir(conn.workdir).bundle(entry["run_id"]), dest))
                        except BundleError as exc:
                            refused.append(str(exc))
                if refused:
                    raise RefusedBundles(refused, pulled)
        return pulled, len(entries)

    outcomes = fan_out(boards, one)
    rows = [[o.board.name, str(path)] for o in outcomes if o.ok and o.value for path in o.value[0]]
    matched = sum(o.value[1] for o in outcomes if o.ok and o.value)
    for outcome in outcomes:
        if isinstance(outcome.exception, RefusedBundles):
            matched += len(outcome.exception.reasons) + len(outcome.exception.pulled)
            rows += [[outcome.board.name, str(path)] for path in outcome.exception.pulled]
            for reason in outcome.exception.reasons:
                console.error(reason)
    if run_id and not matched:
        if all(o.ok for o in outcomes):
            where = ", ".join(board.name for board in boards)
            raise UsageError(f"no run {run_id!r} on the selected boards ({where})", hint="see the run ids: fab run")
        console.error(f"no run {run_id!r} on the boards that answered")
    elif rows:
        console.table("pull", ["board", "bundle"], rows)
    else:
        console.plain("nothing new to pull", stderr=False)
    # A refused bundle is class 65 (RefusedBundles), so the fan-out rule applies: mixed with other classes is 1.
    return _summarize_failures(outcomes, "pull")


class RefusedBundles(BundleError):
    """Bundles a board sent that break the name rules or their manifest (a file a board does not write, a hash that
    differs); they stay on the board, untouched."""

    def __init__(self, reasons: list[str], pulled: list[Path]) -> None:
        extra = f" (and {len(reasons) - 1} more)" if len(reasons) > 1 else ""
        super().__init__(reasons[0] + extra)
        self.reasons = reasons
        self.pulled = pulled


def _matching_runs(entries: list[dict[str, Any]], run_id: str) -> list[dict[str, Any]]:
    """The bundle with this run id, else the one it is a prefix of; a prefix of several is refused."""
    exact = [e for e in entries if e.get("run_id") == run_id]
    if exact:
        return exact[:1]
    found = [e for e in entries if str(e.get("run_id", "")).startswith(run_id)]
    if len(found) > 1:
        shown = ", ".join(str(e.get("run_id")) for e in found[:5])
        raise UsageError(f"run id prefix {run_id!r} is ambiguous: {shown}")
    return found


def boards_table(boards: Sequence[Board], inventory: str | None = None) -> int:
    """What each board is and how it is doing: reachable, arch, model, runtime, lock, temperature, governor; for a
    labgrid place also who reserved or locked it. Only looks: nothing is reserved or locked."""
    # here, not at the top: the service state lives in the history (SQLAlchemy, a quarter second), which push, run
    # and pull never read
    from orchestrator.commands.health import say_out_of_service, service_cell, service_states

    statuses, outcomes = board_statuses(boards)
    states = service_states(inventory)
    # the service column once a board has failed a health job; every board in service says nothing
    listed = [(states or {}).get(board.name) for board in boards]
    with_service = any(state is not None and (state.failures or not state.in_service) for state in listed)
    with_places = any(board.labgrid is not None for board in boards)
    rows = []
    for status in statuses:
        place = [status.place] if with_places else []
        reachable = "yes" if status.reachable else f"no: {status.error}"
        rows.append([
            status.name, status.address, reachable, status.arch, status.board_model or ("—" if status.reachable
            else None), status.runtime, status.lock, *place, status.temperature_c, status.governor, status.counters,
            status.limits, *([service_cell(states, status.name)] if with_service else []),
        ])  # fmt: skip
    columns = ["board", "address", "reachable", "arch", "board model", "runtime", "lock"]
    columns += ["labgrid place"] if with_places else []
    columns += ["temp °C", "governor", "counters", "limits"]
    console.table(
        "boards",
        [*columns, *(["service"] if with_service else [])],
        rows,
        caption=LIMITS_CAPTION,
        whole=["board", "address"],
    )  # a name or address cut short names no board
    print_details(outcomes)
    say_out_of_service(states)
    return exit_code(outcomes)


def gc(boards: Sequence[Board], keep: int) -> int:
    protect = sorted(programs.kept())  # nightly baselines stay on the boards while they are baselines

    def one(board: Board) -> GcResult:
        with stage("connect"), connect(board) as conn, stage("gc"):
            return BoardAgent(conn, conn.workdir).gc(keep, protect=protect)

    outcomes = fan_out(boards, one)
    print_gc(outcomes)
    return _summarize_failures(outcomes, "gc")


def artifacts_for(model: str, variants: Sequence[Variant]) -> list[Artifact]:
    return [find_artifact(model, variant) for variant in variants]


def chosen_artifacts(given: ProgramOptions, chosen: Sequence[Variant], new_tokens: int | None = None) -> list[Artifact]:
    """push and run: the user's .pte (`--pte`), or the lowered variants of the programs `--model`/`--spec` and the
    choices name (program_options.py)."""
    exclusive(given.pte, given.model, given.spec)
    reference_without_pte(given.pte, given.reference)
    lowered = find_lowered(given.model) if given.model is not None else None
    if lowered is not None and lowered.user_file:  # a program of the user's own: its artifacts are all there is
        no_choices_for_own_program(given, lowered.name)
        own = [lowered.sidecar.variant] if lowered.sidecar.origin.model_source == USER_PROGRAM else chosen
        return list(artifacts_for(lowered.name, own))
    if given.pte is not None:
        no_choices_for_own_program(given, given.pte)
        return [user_program(given.pte, given.reference, given.name)]
    if given.name is not None:
        raise UsageError("--name names the artifacts of --pte FILE: give it with --pte")
    return [
        artifact for program in spec_programs(given, new_tokens) for artifact in artifacts_for(program.name, chosen)
    ]


def setup_board_task(
    *, board: str | None, group: str | None, tag: str | None, inventory: str | None, lg_wait: str | None, force: bool
) -> int:
    """`fab setup-board`."""
    return setup_boards(select_boards(inventory, board, group, tag, lg_wait), force=force)


def push_task(given: dict[str, Any]) -> int:
    """`fab push`: the variants, then the programs, then the boards, each checked before anything is pushed."""
    program, lowering, boards = ProgramOptions.take(given), LoweringGroup.take(given), BoardOptions.take(given)
    options.all_taken(given)
    artifacts = chosen_artifacts(program, lowering.variants(default="xnnpack"))
    return push(boards.boards(), artifacts)


def run_task(given: dict[str, Any]) -> int:
    """`fab run`: every option checked (and `--new-tokens` against each program) before a board is touched."""
    program, lowering, boards = ProgramOptions.take(given), LoweringGroup.take(given), BoardOptions.take(given)
    params = RunOptions.take(given).params()
    options.all_taken(given)
    artifacts = chosen_artifacts(program, lowering.variants(default="xnnpack"), params.new_tokens)
    check_generation(artifacts, params)
    numerics = numerics_programs(artifacts, params)
    return run(boards.boards(), artifacts, params, numerics)


def pull_task(
    run_id: str | None, *, latest: bool, board: str | None, group: str | None, tag: str | None,
    inventory: str | None, lg_wait: str | None,
) -> int:  # fmt: skip
    """`fab pull [--run ID | --latest]`."""
    checked = None if run_id is None else options.run_id(run_id)
    return pull(select_boards(inventory, board, group, tag, lg_wait), run_id=checked, latest=latest)


def boards_task(
    *, board: str | None, group: str | None, tag: str | None, inventory: str | None, health: bool = False
) -> int:
    """`fab boards [--health]`: the selected boards, else every board of the inventory."""
    selected = select_boards(inventory, board, group, tag) if (board or group or tag) else None
    chosen = selected or select_all(load_inventory(Path(inventory) if inventory else None))
    if health:
        from orchestrator.commands.health import health_task  # the history's SQLAlchemy: as in boards_table

        return health_task(chosen, inventory)
    return boards_table(chosen, inventory)


def return_to_service(*, board: str | None, group: str | None, tag: str | None, inventory: str | None) -> int:
    """`fab return-to-service --board NAME`: a board (or group, tag) must be named: never the whole lab by default."""
    if not (board or group or tag):
        raise UsageError("name the board to bring back: --board NAME (or --group, --tag)")
    from orchestrator.commands.health import return_to_service_task  # the history's SQLAlchemy: as in boards_table

    return return_to_service_task(select_boards(inventory, board, group, tag), inventory)


def gc_task(
    keep: Any, *, board: str | None, group: str | None, tag: str | None, inventory: str | None, lg_wait: str | None
) -> int:
    """`fab gc [--keep N]` (default 20 bundles per board)."""
    kept = options.keep(20 if keep is None else keep)
    return gc(select_boards(inventory, board, group, tag, lg_wait), kept)
