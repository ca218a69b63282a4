"""A night handed to the lab's workers: `fab nightly` with a `lab:` section (lab/lab_settings.py).

The workstation keeps what makes a night one night: its lock, the plan, the verdicts of cells nobody judged and the
reports (lab/nightly.py). The workers do the work, as Dask tasks placed by their resources (lab/cluster.py):
1. each program is lowered once, on a worker with the memory for it, and published to the lab's store by its cache
   key (lab/artifact_store.py; what the store holds already is fetched, not lowered again);
2. each board's cells run on a worker that reaches the board (lab/board_night.py, as one host would run them),
   recorded in the one history as each finishes, with the host named.
A worker that dies mid-night has its tasks rescheduled by Dask on another worker that can take them; a cell it had
recorded is skipped there (checked just before each cell runs), so every cell is recorded once. A task no live worker
can take for `wait_seconds` is given up, and its cells recorded as infrastructure failures. A scheduler lost
mid-night (killed, restarted) takes every task with it: the cells not recorded by then are recorded as
infrastructure failures naming it (a resumed night runs them again), and the report says how to resume.

What a worker returns is data this module checks as it checks a board's: msgpack (cluster.connect), then typed.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import msgspec

from orchestrator import console
from orchestrator.boards.inventory import Board
from orchestrator.deploy.cells import CellOutcome
from orchestrator.lab import cluster, worker_tasks
from orchestrator.lab.board_night import PlannedCell, Recorder, record_from_cell, wanted_programs
from orchestrator.lab.lab_settings import LabSettings
from orchestrator.lab.matrix import NightlyConfig
from orchestrator.lab.run_record import read_run_record
from orchestrator.lowering.program import Program
from orchestrator.lowering.variants import Variant
from orchestrator.records import Sha256
from orchestrator.strictjson import JsonDataError

POLL_SECONDS = 0.5


class LoweringReply(msgspec.Struct, forbid_unknown_fields=False):
    host: str
    error: str | None = None
    keys: dict[str, Sha256] = {}  # variant -> the store's key for it
    versions: dict[str, str] = {}
    lowered: list[str] = []
    repaired: list[str] = []  # store entries refused as bad data and published again: what was wrong
    seconds: float = 0.0
    infrastructure: bool = False


class BoardReply(msgspec.Struct, forbid_unknown_fields=False):
    board: str
    host: str
    ok: bool
    error: str | None = None
    stage: str | None = None
    infrastructure: bool = False
    skipped: list[list[str]] = []
    pending: list[dict[str, Any]] = []
    ran: int = 0
    seconds: float = 0.0


@dataclass
class LabOutcome:
    infrastructure_ok: bool = True
    versions: dict[str, dict[str, str]] = field(default_factory=dict)
    lost: str | None = None  # the scheduler was lost mid-night: why, as said to the user


@dataclass
class _Task:
    label: str
    future: Any
    needs: dict[str, float]
    unplaceable_since: float | None = None


def run_on_lab(
    settings: LabSettings,
    config: NightlyConfig,
    night: str,
    history_url: str,
    recorder: Recorder,
    plan: dict[Board, list[PlannedCell]],
) -> LabOutcome:
    outcome = LabOutcome()
    client = cluster.connect(settings)
    try:
        workers = _workers(client)
        offered = ", ".join(f"{name} ({_offer_text(res)})" for name, res in sorted(workers.items())) or "none"
        console.info(
            console.escape(
                f"lab {settings.scheduler}: {len(workers)} worker(s) run this etlab ({cluster.revision()}): "
            )
            + console.escape(offered)
        )
        keys, lowering_errors, unplaced = _lower(client, settings, config, night, wanted_programs(plan), outcome)
        # A program the lab could not lower (no worker with the memory, the store unreachable): its cells are the
        # lab's failure, not the model's; recorded here, and no board waits for them.
        runnable: dict[Board, list[PlannedCell]] = {}
        for board, cells in plan.items():
            for model, why in unplaced.items():
                unrun = [cell for cell in cells if cell.model == model]
                _record_unrun(recorder, night, board, unrun, outcome.versions, f"not lowered: {why}", True, None)
            if left := [cell for cell in cells if cell.model not in unplaced]:
                runnable[board] = left
        if unplaced:
            outcome.infrastructure_ok = False
        failed = _boards(
            client, settings, config, night, history_url, runnable, keys, lowering_errors, outcome, recorder
        )
        for board, (error, infrastructure, host) in failed.items():
            _record_unrun(recorder, night, board, runnable[board], outcome.versions, error, infrastructure, host)
            outcome.infrastructure_ok = False
    except cluster.LabLost as exc:
        outcome.lost = str(exc)
        outcome.infrastructure_ok = False
        console.error(outcome.lost)
        for board, cells in plan.items():  # what the lost scheduler held: not run tonight, unless recorded
            _record_unrun(recorder, night, board, cells, outcome.versions, outcome.lost, True, None)
    finally:
        client.close(timeout=5)
    return outcome


def _workers(client: Any) -> dict[str, dict[str, float]]:
    """The live workers that run this etlab: name -> resources."""
    mine = cluster.revision_resource()
    found = {}
    try:
        workers = client.scheduler_info(n_workers=-1).get("workers", {})
    except (OSError, TimeoutError) as exc:
        raise cluster.LabLost(f"the lab's scheduler was lost mid-night: {exc}") from None
    for info in workers.values():
        resources = info.get("resources") or {}
        if mine in resources:
            found[str(info.get("name"))] = {str(k): float(v) for k, v in resources.items()}
    return found


def _offer_text(resources: dict[str, float]) -> str:
    boards = sorted(name.removeprefix(cluster.BOARD) for name in resources if name.startswith(cluster.BOARD))
    memory = resources.get(cluster.MEMORY)
    parts = [f"boards {', '.join(boards)}" if boards else "no boards"]
    if memory is not None:
        cores = resources.get(cluster.CORES)
        parts.append(f"lowers, {memory:g} GB free" + (f", {cores:g} cores" if cores else ""))
    return "; ".join(parts)


def _lower(
    client: Any,
    settings: LabSettings,
    config: NightlyConfig,
    night: str,
    wanted: dict[str, tuple[Program, list[Variant]]],
    outcome: LabOutcome,
) -> tuple[dict[tuple[str, str], str], dict[str, str], dict[str, str]]:
    """Each program lowered once for the lab: its variants' store keys; the models whose lowering failed (why); and
    those the lab could not lower (no worker could take it, lost, the store unreachable: why)."""
    needs = {cluster.revision_resource(): 1, cluster.LOWERING: 1, cluster.MEMORY: settings.lowering_gb}
    tasks = []
    for model, (program, variants) in wanted.items():
        future = client.submit(
            worker_tasks.lower_program, program, variants, config.weights, settings.store,
            key=f"lower {model} {night} {secrets.token_hex(3)}", resources=needs, pure=False,
        )  # fmt: skip
        tasks.append(_Task(model, future, needs))
    keys: dict[tuple[str, str], str] = {}
    errors: dict[str, str] = {}
    unplaced: dict[str, str] = {}

    def done(model: str, reply: Any, problem: str | None) -> None:
        lab_trouble = problem is not None
        if problem is None:
            try:
                checked = msgspec.convert(reply, LoweringReply)
                problem = checked.error or _bad_keys(checked, wanted[model][1])
                lab_trouble = checked.infrastructure
            except msgspec.ValidationError as exc:
                problem = f"the worker's reply is malformed: {exc}"
        if problem is not None:
            (unplaced if lab_trouble else errors)[model] = problem
            console.warn(f"{model}: not lowered for the lab: {problem}")
            return
        outcome.versions[model] = checked.versions
        for said in checked.repaired:  # store entries refused as bad data, published again
            console.warn(f"{model}: {said[:500]} (on {checked.host[:128]})")
        keys.update(((model, name), key) for name, key in checked.keys.items())
        how = f"lowered {', '.join(checked.lowered)}" if checked.lowered else "from the lab's store or cache"
        console.info(console.escape(f"{model}: {how} on {checked.host} ({checked.seconds:.1f} s)"))

    _gather(client, tasks, settings.wait_seconds, done)
    return keys, errors, unplaced


def _bad_keys(reply: LoweringReply, variants: list[Variant]) -> str | None:
    asked = {variant.name for variant in variants}
    if set(reply.keys) != asked:
        return f"the worker returned programs {sorted(reply.keys)} for {sorted(asked)}"
    return None


def _boards(
    client: Any,
    settings: LabSettings,
    config: NightlyConfig,
    night: str,
    history_url: str,
    plan: dict[Board, list[PlannedCell]],
    keys: dict[tuple[str, str], str],
    lowering_errors: dict[str, str],
    outcome: LabOutcome,
    recorder: Recorder,
) -> dict[Board, tuple[str, bool, str | None]]:
    """Every board's share on a worker that reaches it; the boards whose share did not run: (why, infra, host)."""
    by_name = {board.name: board for board in plan}
    failed: dict[Board, tuple[str, bool, str | None]] = {}
    tasks = []
    for board, cells in plan.items():
        job = worker_tasks.BoardJob(night, config, history_url, board.name, cells, settings.store,
                                    keys, outcome.versions, lowering_errors)  # fmt: skip
        needs = {cluster.revision_resource(): 1.0, cluster.board_resource(board.name): 1.0}
        future = client.submit(worker_tasks.night_on_board, job, key=f"board {board.name} {night} "
                               f"{secrets.token_hex(3)}", resources=needs, pure=False)  # fmt: skip
        tasks.append(_Task(board.name, future, needs))

    def done(name: str, reply: Any, problem: str | None) -> None:
        board = by_name[name]
        if problem is not None:
            failed[board] = (problem, True, None)
            return
        try:
            checked = msgspec.convert(reply, BoardReply)
            if checked.board != name:
                raise msgspec.ValidationError(f"a reply for board {checked.board!r}")
        except msgspec.ValidationError as exc:
            failed[board] = (f"the worker's reply is malformed: {exc}", True, None)
            return
        host = checked.host[:128]
        if checked.skipped:  # recorded tonight by a worker that left mid-way: tonight's cells, counted as run
            console.info(console.escape(f"{name}: {len(checked.skipped)} cell(s) recorded earlier tonight by a "
                                        "worker that left: not run again"))  # fmt: skip
        for index, data in enumerate(checked.pending):  # what the worker measured but could not record: ours now
            try:
                run = read_run_record(data, f"worker {host}", f"pending[{index}]")
            except JsonDataError as exc:
                console.warn(f"{name}: a result from {host} is refused: {exc}")
                continue
            if run.night == night and run.board == name:
                recorder.record(run)
        if not checked.ok:
            failed[board] = (checked.error or "failed on the worker", checked.infrastructure, host)
        said = f"{name}: {checked.ran} cell(s) on {host} in {checked.seconds:.1f} s"
        console.info(console.escape(said + (f": {checked.error}" if checked.error else "")))

    _gather(client, tasks, settings.wait_seconds, done)
    return failed


def _gather(client: Any, tasks: list[_Task], wait_seconds: float, done: Callable[[str, Any, str | None], None]) -> None:
    """Wait for every task; one that no live worker can take for `wait_seconds` is cancelled (its worker left, or
    none ever had what it needs) and reported as a problem."""
    left = list(tasks)
    present = set(_workers(client))
    while left:
        time.sleep(POLL_SECONDS)
        now = time.monotonic()
        workers = _workers(client)
        if client.status != "running":  # the scheduler went: every task it held is gone (a new one knows none)
            raise cluster.LabLost(
                f"the lab's scheduler {client.scheduler.address if client.scheduler else '?'} was lost mid-night "
                f"(the workstation's connection to it closed: {client.status})"
            )
        for name in sorted(present - set(workers)):
            console.warn(f"worker {name} left the lab: what it held goes to another worker")
        for name in sorted(set(workers) - present):
            console.info(console.escape(f"worker {name} joined the lab"))
        present = set(workers)
        capacity = list(workers.values())
        for task in list(left):
            if task.future.done():
                left.remove(task)
                try:
                    done(task.label, task.future.result(), None)
                except Exception as exc:  # erred on the worker (or the worker died too often): not trusted, just said
                    done(task.label, None, f"the lab lost the task ({type(exc).__name__}: {str(exc)[:200]})")
                continue
            if any(all(res.get(name, 0) >= amount for name, amount in task.needs.items()) for res in capacity):
                task.unplaceable_since = None
                continue
            task.unplaceable_since = task.unplaceable_since or now
            if now - task.unplaceable_since >= wait_seconds:
                task.future.cancel()
                left.remove(task)
                needs = ", ".join(sorted(name for name in task.needs if name != cluster.revision_resource()))
                done(task.label, None, f"no worker of the lab could take it for {wait_seconds:g} s (needs {needs})")


def _record_unrun(
    recorder: Recorder,
    night: str,
    board: Board,
    cells: list[PlannedCell],
    versions: dict[str, dict[str, str]],
    error: str,
    infrastructure: bool,
    host: str | None,
) -> None:
    """The cells of a board whose share did not finish and are not in the history: recorded as failed."""
    for planned in cells:
        model, variant, params = planned.model, planned.variant, planned.params
        if recorder.recorded((board.name, model, variant.name)):
            continue
        cell = CellOutcome(board.name, model, variant, stage="lab", error=error, infrastructure=infrastructure)
        recorder.record(record_from_cell(cell, night, versions.get(model, {}), params.threads or board.threads, host))
