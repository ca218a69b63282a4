"""Shared labs on labgrid: boards that are labgrid places, reserved and locked through the lab's coordinator.

A place's `NetworkService` resource gives the board's address, user and port; from there the board is a plain SSH
board (host keys, keys, timeouts, transfers). Before a job touches the board, `held()` reserves the place (waiting
in the coordinator's queue, saying who holds it), locks it (labgrid's "acquire"), and releases the lock and cancels
the reservation whatever happens. etlab's own board flock stays: it keeps two etlab processes apart on the board;
labgrid arbitrates between people, CI and tools.

Why labgrid's Python client (`labgrid.remote.client.ClientSession`) rather than `labgrid-client` subprocesses:
every `labgrid-client` call starts Python and imports labgrid (about a second here) and a job needs four of them
(reserve, acquire, release, cancel) against a budget of 0.5 s per board job; the session also hands us the
coordinator's exact state (who holds a place, whose reservation it is allocated to) instead of text meant for
people, over one gRPC connection whose loss we see at once. The session is asyncio: it runs on its own event loop
in a daemon thread, one per coordinator, and board threads call into it with run_coroutine_threadsafe.

A killed etlab leaves its place locked (labgrid keeps locks of clients that went away). etlab notes each
reservation in `.etlab/labgrid/` with its pid, so the next etlab on this workstation releases a place whose
etlab died; anyone can also release it by hand: `labgrid-client -x HOST:PORT -p PLACE release` (README).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import time
from collections.abc import Iterator, Sequence
from dataclasses import replace
from typing import Any

from rich.markup import escape

from orchestrator import console, paths
from orchestrator.boards.inventory import Board, LabgridPlace
from orchestrator.boards.labgrid_session import (  # noqa: F401 - the public surface
    NOTE_SECONDS,
    POLL_SECONDS,
    CoordinatorLost,
    LabgridError,
    PlaceStatus,
    PlaceWaitTimeout,
    Session,
    acquire,
    cancel,
    close_sessions,
    existing_session,
    interrupt,
    place_statuses,
    poll,
    release,
    reserve,
    session_for,
    stopping,
)
from orchestrator.errors import BoardDataError, UsageError, first_line
from orchestrator.fsutil import read_json
from orchestrator.names import is_valid_name

# ---------------------------------------------------------------- places left by a killed etlab


def _marker(coordinator: str, place: str) -> Any:
    if not is_valid_name(place):  # never a path: checked when the place was named (inventory, expand)
        raise BoardDataError(f"labgrid place {place!r} on {coordinator}: not a usable name")
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", coordinator)
    folder = paths.state_dir() / "labgrid"
    folder.mkdir(parents=True, exist_ok=True)
    return folder / f"{safe}--{place}.json"


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _recover(session: Session, place: str) -> None:
    """Release the place if an etlab of this workstation that died still holds it (its note names a dead pid and
    the reservation the place is still allocated to)."""
    marker = _marker(session.address, place)
    with open(marker.parent / "recover.lock", "a+") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one recovery at a time, so a fresh lock is never taken for a stale one
        try:
            note = read_json(marker)
        except (OSError, ValueError):
            return
        if not isinstance(note, dict) or _pid_alive(int(note.get("pid", 0))):
            return
        token = str(note.get("token", ""))

        async def state(client: Any) -> tuple[str | None, str | None]:
            await client.sync_with_coordinator()
            found = client.places.get(place)
            return (found.reservation, found.acquired) if found is not None else (None, None)

        reservation, acquired = session.run(f"look at place {place}", state)
        if reservation == token and acquired in (None, session.name):
            release(session, place, token) if acquired else cancel(session, token)
            console.warn(f"released labgrid place {place}, left locked by an etlab that died (pid {note.get('pid')})")
        marker.unlink(missing_ok=True)


def _note(session: Session, place: str, token: str, board: str) -> None:
    marker = _marker(session.address, place)
    marker.write_text(json.dumps({"pid": os.getpid(), "token": token, "board": board, "client": session.name}))


def _unnote(session: Session, place: str, token: str) -> None:
    marker = _marker(session.address, place)
    with contextlib.suppress(OSError, ValueError):
        note = read_json(marker)
        if isinstance(note, dict) and note.get("token") == token:
            marker.unlink()


# ---------------------------------------------------------------- what the rest of etlab uses


def expand(boards: Sequence[Board]) -> list[Board]:
    """Tag selectors become one board per matching place (named after the place); other boards stay."""
    found: dict[str, Board] = {}
    for board in boards:
        lg = board.labgrid
        if lg is None or lg.place is not None:
            found.setdefault(board.name, board)
            continue
        wanted = set(lg.tags)
        matching = sorted(
            name for name, status in place_statuses(lg.coordinator).items() if wanted <= set(status.tags.items())
        )
        if not matching:
            raise UsageError(
                f"{board.name}: no labgrid place on {lg.coordinator} matches {lg.selector}",
                hint=f"see the places and their tags: labgrid-client -x {lg.coordinator} places -v",
            )
        for name in matching:
            found.setdefault(
                name, board.replace(name=_usable_name(name, board, lg), labgrid=replace(lg, place=name, tags=()))
            )
    return list(found.values())


def _usable_name(place: str, board: Board, lg: LabgridPlace) -> str:
    """A place's name from the coordinator becomes a board name, and so a folder name (results/<board>/...): it
    passes the name rule, or the selection is refused (a place named `..` or holding `/` never becomes a path)."""
    if not is_valid_name(place):
        raise BoardDataError(
            f"{board.name}: labgrid place {place!r} on {lg.coordinator} matches {lg.selector}, but its name cannot "
            "be a board name (1-64 letters, digits, '.', '_' or '-', starting with a letter or digit)",
            hint=f"rename the place on the coordinator, or give the tags only usable places have: "
            f"labgrid-client -x {lg.coordinator} places -v",
        )
    return place


def with_wait(boards: Sequence[Board], wait: float | None) -> list[Board]:
    """--lg-wait on every labgrid board."""
    return [b.replace(labgrid=replace(b.labgrid, wait=wait)) if b.labgrid else b for b in boards]


def status(board: Board) -> PlaceStatus:
    """The board's place as the coordinator sees it (nothing reserved)."""
    lg = _place_of(board)
    assert lg.place is not None
    statuses = place_statuses(lg.coordinator)
    if lg.place not in statuses:
        raise LabgridError(f"no labgrid place {lg.place!r} on {lg.coordinator}")
    return statuses[lg.place]


def resolved(board: Board, place: PlaceStatus, waited: float | None = None) -> Board:
    """The board with the address, user and port of its place's NetworkService."""
    if place.service is None:
        raise LabgridError(f"labgrid place {place.name}: {place.problem}")
    service = place.service
    lg = _place_of(board)
    return board.replace(
        host=service.address,
        port=service.port,
        user=service.username or board.ssh.user,
        labgrid=replace(lg, waited=waited),
    )


def check_held(board: Board) -> None:
    """Between steps of a long job: fail the board as soon as its coordinator is gone."""
    lg = board.labgrid
    if lg is None:
        return
    session = existing_session(lg.coordinator)
    if session is not None and session.lost:
        raise _lost(lg)


def _lost(lg: LabgridPlace, during: BaseException | None = None) -> CoordinatorLost:
    ended = f" (the job ended with: {first_line(during)})" if during is not None else ""
    return CoordinatorLost(
        f"lost the labgrid coordinator {lg.coordinator} while holding place {lg.place}: the lab's lock on the "
        f"board is no longer guaranteed{ended}",
        hint=f"once the coordinator is back, check the place: labgrid-client -x {lg.coordinator} -p {lg.place} show",
    )


def _place_of(board: Board) -> LabgridPlace:
    if board.labgrid is None or board.labgrid.place is None:
        raise LabgridError(f"{board.name} is not a labgrid place")
    return board.labgrid


@contextlib.contextmanager
def held(board: Board) -> Iterator[Board]:
    """Reserve the board's place (waiting in the coordinator's queue, at most `--lg-wait`), lock it, and yield the
    board resolved through its NetworkService; the lock is released and the reservation cancelled on every way out."""
    lg = _place_of(board)
    place = lg.place
    assert place is not None
    session = session_for(lg.coordinator)
    _recover(session, place)
    started = time.monotonic()
    token, state = reserve(session, place)
    session.held[place] = token
    locked = False
    failed = True
    try:
        _note(session, place, token, board.name)
        if state == "waiting":
            _wait(session, board, place, token, started)
        elif state != "allocated":
            raise LabgridError(f"labgrid place {place}: reservation {token} is {state}")
        try:
            status = acquire(session, place)
        except CoordinatorLost as exc:
            locked = True  # the lock may have been taken before the link broke: release it if a new session can
            raise CoordinatorLost(
                f"lost the labgrid coordinator {lg.coordinator} while locking place {place}",
                hint=f"the place may be left locked: labgrid-client -x {lg.coordinator} -p {place} show",
            ) from exc
        locked = True
        waited = time.monotonic() - started
        after = console.format_seconds(waited)
        console.info(escape(f"  [{board.name}] labgrid place {place} locked (waited {after})"))
        try:
            yield resolved(board, status, waited)
        except Exception as exc:
            if session.lost:  # the job most likely failed because of it; say so first
                raise _lost(lg, exc) from exc
            raise
        if session.lost:
            raise _lost(lg)
        failed = False
    finally:
        session.held.pop(place, None)
        try:
            # A lost session may be a broken link, not a dead coordinator: release through a new one if it answers.
            target = session_for(lg.coordinator) if session.lost else session
            if locked:
                release(target, place, token)
            else:
                cancel(target, token)
            _unnote(target, place, token)
        except LabgridError as exc:
            if not failed:
                raise
            console.warn(
                f"{board.name}: could not release labgrid place {place} ({first_line(exc)}); "
                f"once the coordinator answers: labgrid-client -x {lg.coordinator} -p {place} release"
            )


@contextlib.contextmanager
def job(board: Board) -> Iterator[Board]:
    """One job on a board: under `held()` when the board is a labgrid place, else the board as it is."""
    if board.labgrid is None:
        yield board
    else:
        with held(board) as resolved_board:
            yield resolved_board


def _wait(session: Session, board: Board, place: str, token: str, started: float) -> None:
    """Poll our reservation until the coordinator allocates the place to it; say who holds it meanwhile."""
    wait = board.labgrid.wait if board.labgrid else None
    last_holder: str | None = None
    last_note = 0.0
    while True:
        state, holder = poll(session, place, token)
        if state in ("allocated", "acquired"):
            return
        if state != "waiting":
            raise LabgridError(f"labgrid place {place}: reservation {token} is {state}")
        now = time.monotonic()
        elapsed = now - started
        who = holder or "nobody (the coordinator has not allocated it yet)"
        if wait is not None and elapsed >= wait:
            raise PlaceWaitTimeout(
                f"labgrid place {place} is still held by {who} after waiting {console.format_seconds(elapsed)} "
                f"(the wait allowed: {wait:g} s)",
                hint=f"see the place: labgrid-client -x {session.address} -p {place} show",
            )
        if stopping.is_set():
            raise LabgridError(f"interrupted while waiting for labgrid place {place} (held by {who})")
        if holder != last_holder or now - last_note >= NOTE_SECONDS:
            console.info(
                escape(
                    f"  [{board.name}] waiting for labgrid place {place}: held by {who} "
                    f"({console.format_seconds(elapsed)} so far)"
                )
            )
            last_holder, last_note = holder, now
        delay = POLL_SECONDS if wait is None else min(POLL_SECONDS, max(0.0, wait - elapsed))
        stopping.wait(delay)
