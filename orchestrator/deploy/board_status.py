"""How each board is doing right now, as data: reachable, architecture, board model, runtime, lock holder (and a
labgrid place's holder), temperature, governor, counters. `fab boards` draws it as a table; the dashboard's
overview polls it. Only looks: nothing is reserved or locked. Every text a board sent stays text (callers render
it inert).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from orchestrator.boards import labgrid
from orchestrator.boards.fanout import BoardOutcome, fan_out, stage
from orchestrator.boards.inventory import Board
from orchestrator.boards.limits import limits_cell, recorded_bandwidth, recorded_compute
from orchestrator.deploy.agent_client import BoardAgent
from orchestrator.deploy.provision import probe
from orchestrator.records import RecordError
from orchestrator.transport import connect


@dataclass(frozen=True)
class BoardStatus:
    name: str
    address: str | None
    reachable: bool
    error: str | None = None  # why it is not reachable (one line)
    arch: str | None = None
    board_model: str | None = None
    runtime: str | None = None  # the ExecuTorch version it is provisioned with, or "not provisioned"
    lock: str | None = None  # "free", or who holds the board lock
    place: str | None = None  # a labgrid place: its name and who locked or reserved it
    temperature_c: float | None = None
    governor: str | None = None
    counters: str | None = None  # its PMU, paranoid level and the counters that open
    limits: str | None = None  # its read bandwidth and peak GEMM rates as setup-board measured them, or why not
    checked_at: float = 0.0  # time.time() of the look


def place_text(place: labgrid.PlaceStatus | None) -> str | None:
    """A labgrid place, its name and who locked or reserved it."""
    if place is None:
        return None
    if place.acquired:
        return f"{place.name}: locked by {place.acquired}"
    if place.reserved_for:
        return f"{place.name}: reserved for {place.reserved_for}"
    return f"{place.name}: free"


def holder_text(holder: Any) -> str:
    if not holder:
        return "free"
    if isinstance(holder, dict):
        origin = holder.get("client") or holder.get("hostname", "?")
        return f"{holder.get('run_id', '?')} ({holder.get('user', '?')}@{origin})"
    return str(holder)


def perf_text(perf: Any) -> str | None:
    """The board's counter facts: its PMU (or none: a board condition, not an error), paranoid level and which
    counters open, e.g. "no PMU; paranoid 2; opens task_clock, page_faults, context_switches"."""
    if not isinstance(perf, dict):
        return None
    pmu = perf.get("hardware_pmu")
    parts = [f"PMU {pmu}" if pmu else "no PMU", f"paranoid {perf.get('perf_event_paranoid')}"]
    counters = perf.get("counters")
    if isinstance(counters, dict):
        opened = [name for name, status in counters.items() if status == "ok"]
        parts.append(f"opens {', '.join(opened)}" if opened else "opens none")
    return "; ".join(parts)


def limits_text(board: str, state: Any) -> str | None:
    """ "10.1 GB/s, 274/371 GOP/s" (boards/limits.py limits_cell), or why they are not known."""
    if not isinstance(state, dict):
        return None
    try:
        where = f"{board}: state.json"
        return limits_cell(recorded_bandwidth(state, where), recorded_compute(state, where))
    except RecordError as exc:
        return f"unreadable ({exc.field}): fab setup-board measures it again"


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _text(value: Any) -> str | None:
    return None if value is None else str(value)


def board_statuses(boards: Sequence[Board]) -> tuple[list[BoardStatus], list[BoardOutcome[Any]]]:
    """Every board looked at in parallel: its status, and the fan-out's outcomes (a failure's whole reason)."""
    places: dict[str, labgrid.PlaceStatus] = {}

    def one(board: Board) -> dict[str, Any]:
        if board.labgrid is not None:
            with stage("labgrid"):
                places[board.name] = labgrid.status(board)
                board = labgrid.resolved(board, places[board.name])
        with stage("connect"), connect(board) as conn:
            facts = probe(conn, conn.workdir)
            info: dict[str, Any] = {}
            if facts.get("agent_present") and facts.get("state"):
                info = BoardAgent(conn, conn.workdir).info()
            return {"facts": facts, "info": info, "address": board.address}

    outcomes = fan_out(boards, one, hold=False)
    now = time.time()
    statuses = []
    for o in outcomes:
        place = place_text(places.get(o.board.name))
        if not o.ok:
            service = places[o.board.name].service if o.board.name in places else None
            shown = f"{service.address}:{service.port}" if service else o.board.address
            statuses.append(BoardStatus(o.board.name, shown, False, o.error or "unreachable", place=place,
                                        checked_at=now))  # fmt: skip
            continue
        assert o.value is not None  # a board that answered has its facts
        facts, info = o.value["facts"], o.value["info"]
        statuses.append(
            BoardStatus(
                o.board.name,
                o.value["address"],
                True,
                arch=_text(facts.get("arch")),
                board_model=_text(info.get("model")),
                runtime=_text((facts.get("state") or {}).get("executorch_version")) or "not provisioned",
                lock=holder_text(info.get("lock_holder")),  # the agent's `info` key (board/agent/README.md)
                place=place,
                temperature_c=_number(info.get("temperature_c")),
                governor=_text(info.get("governor")),
                counters=perf_text(info.get("perf")),
                limits=limits_text(o.board.name, facts.get("state")),
                checked_at=now,
            )
        )
    return statuses, outcomes
