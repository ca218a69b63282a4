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

import asyncio
import atexit
import concurrent.futures
import contextlib
import fcntl
import json
import logging
import os
import re
import threading
import time
from collections.abc import Callable, Coroutine, Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Any, TypeVar

from rich.markup import escape

from orchestrator import console, paths
from orchestrator.boards.inventory import Board, LabgridPlace
from orchestrator.errors import BoardError, UsageError, first_line

_T = TypeVar("_T")

CONNECT_TIMEOUT = 10.0  # to reach the coordinator and sync the first state
CALL_TIMEOUT = 15.0  # any one request; the coordinator answers on loopback in milliseconds
POLL_SECONDS = 0.25  # while waiting in the queue; a poll also keeps the reservation alive (60 s without one)
NOTE_SECONDS = 15.0  # repeat the "waiting for" line this often even when the holder is the same
DEFAULT_PORT = 20408  # labgrid's


class LabgridError(BoardError):
    """The labgrid side failed for a board: coordinator unreachable or lost, place unusable, or the wait ran out."""


class PlaceWaitTimeout(LabgridError):
    """--lg-wait ran out; the message names the holder."""


class CoordinatorLost(LabgridError):
    """The coordinator went away while a place was reserved or held."""


@dataclass(frozen=True)
class NetworkService:
    address: str
    port: int
    username: str


@dataclass(frozen=True)
class PlaceStatus:
    """A place as the coordinator sees it."""

    name: str
    tags: dict[str, str]
    acquired: str | None  # the client holding its lock, `host/user`
    reserved_for: str | None  # the owner of the reservation it is allocated to
    service: NetworkService | None
    problem: str | None = None  # why its NetworkService cannot be used, if so

    @property
    def holder(self) -> str | None:
        """Who has the place: the lock holder, else the owner of the reservation it is allocated to."""
        if self.acquired:
            return self.acquired
        return f"{self.reserved_for} (reserved)" if self.reserved_for else None


# ---------------------------------------------------------------- the session with one coordinator


class Session:
    """One labgrid client session, on its own event loop thread; every method is called from other threads."""

    def __init__(self, address: str) -> None:
        self.address = address
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="etlab-labgrid", daemon=True)
        self.thread.start()
        self.client: Any = None
        self.held: dict[str, str] = {}  # place -> reservation token, for the exit safety net
        try:
            self.client = self._call(self._start(), CONNECT_TIMEOUT, "connect")
        except BaseException:
            self.loop.call_soon_threadsafe(self.loop.stop)
            raise

    @property
    def name(self) -> str:
        """Our client name on the coordinator, `host/user` (labgrid's LG_HOSTNAME and LG_USERNAME apply)."""
        return f"{self.client.gethostname()}/{self.client.getuser()}"

    @property
    def lost(self) -> bool:
        return self.client is not None and self.client.stopping.is_set()

    async def _start(self) -> Any:
        from labgrid.remote.client import ClientSession

        logging.getLogger().addFilter(_not_labgrid)

        loop = asyncio.get_running_loop()
        assert isinstance(loop, asyncio.BaseEventLoop)
        client = ClientSession(_grpc_address(self.address), loop)
        await client.start()
        return client

    def _call(self, coro: Coroutine[Any, Any, _T], timeout: float, what: str) -> _T:
        import grpc
        from labgrid.remote.client import Error as ClientError

        future = asyncio.run_coroutine_threadsafe(asyncio.wait_for(coro, timeout), self.loop)
        try:
            return future.result(timeout + 5)
        except (TimeoutError, concurrent.futures.TimeoutError, asyncio.TimeoutError):
            future.cancel()
            raise CoordinatorLost(
                f"labgrid coordinator {self.address} did not answer within {timeout:g} s ({what})"
            ) from None
        except grpc.aio.AioRpcError as exc:
            if exc.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED):
                raise CoordinatorLost(f"labgrid coordinator {self.address} is unavailable ({what})") from None
            raise LabgridError(f"labgrid coordinator {self.address}: {what}: {exc.details()}") from None
        except ClientError:  # "Could not connect to coordinator" from the session's start, and the like
            raise CoordinatorLost(f"labgrid coordinator {self.address} is unavailable ({what})") from None

    def run(self, what: str, fn: Callable[[Any], Coroutine[Any, Any, _T]], timeout: float = CALL_TIMEOUT) -> _T:
        """`fn(client)` on the session's loop; a session that lost its coordinator fails at once."""
        if self.lost:
            raise CoordinatorLost(f"lost the labgrid coordinator {self.address} ({what})")
        return self._call(fn(self.client), timeout, what)

    def close(self) -> None:
        async def stop() -> None:
            with contextlib.suppress(Exception):
                await self.client.stop()
            with contextlib.suppress(Exception):
                await self.client.close()

        if self.client is not None:
            with contextlib.suppress(Exception):
                asyncio.run_coroutine_threadsafe(asyncio.wait_for(stop(), 5), self.loop).result(6)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)


def _not_labgrid(record: logging.LogRecord) -> bool:
    """labgrid's client logs a lost coordinator on the root logger; etlab reports it itself, per board."""
    return f"{os.sep}labgrid{os.sep}" not in record.pathname


def _grpc_address(address: str) -> str:
    return address if re.search(r":[0-9]+$", address) else f"{address}:{DEFAULT_PORT}"


_sessions: dict[str, Session] = {}
_sessions_lock = threading.Lock()
_stopping = threading.Event()  # set on Ctrl+C: waits in the queue give up


def _session(address: str) -> Session:
    with _sessions_lock:
        session = _sessions.get(address)
        if session is None or session.lost:
            try:
                session = Session(address)
            except LabgridError as exc:
                raise CoordinatorLost(
                    str(exc),
                    hint="is labgrid-coordinator running there? (defaults.labgrid.coordinator or LG_COORDINATOR)",
                ) from None
            _sessions[address] = session
        return session


def interrupt() -> None:
    """Ctrl+C: every board still waiting in a labgrid queue gives up (held places are released as jobs end)."""
    _stopping.set()


@atexit.register
def close_sessions() -> None:
    """The safety net: a place still held at exit (a job thread cut short) is released before the session ends."""
    with _sessions_lock:
        sessions = list(_sessions.values())
        _sessions.clear()
    for session in sessions:
        for place, token in list(session.held.items()):
            with contextlib.suppress(Exception):
                _release(session, place, token)
        session.close()


# ---------------------------------------------------------------- coordinator requests


def _pb2() -> Any:
    from labgrid.remote.generated import labgrid_coordinator_pb2

    return labgrid_coordinator_pb2


def _reservations(client: Any) -> Coroutine[Any, Any, dict[str, Any]]:
    async def get() -> dict[str, Any]:
        response = await client.stub.GetReservations(_pb2().GetReservationsRequest())
        return {r.token: r for r in response.reservations}

    return get()


def _status_of(client: Any, place: Any, reservations: dict[str, Any]) -> PlaceStatus:
    """A PlaceStatus from the session's view of the place and the resources its matches select."""
    services: list[Any] = []
    for exporter, groups in sorted(client.resources.items()):
        for group_name, group in sorted(groups.items()):
            for resource_name, resource in sorted(group.items()):
                if resource.cls != "NetworkService":
                    continue
                if place.getmatch((exporter, group_name, resource.cls, resource_name)) is not None:
                    services.append(resource)
    service, problem = None, None
    if not services:
        problem = "no NetworkService resource matches the place"
    elif len(services) > 1:
        problem = f"{len(services)} NetworkService resources match the place; etlab needs exactly one"
    else:
        params = services[0].params
        extra = services[0].extra or {}
        if extra.get("proxy_required"):
            problem = "its NetworkService needs the exporter as SSH proxy (isolated exporter), which etlab lacks"
        elif not params.get("address"):
            problem = "its NetworkService has no address"
        else:
            service = NetworkService(str(params["address"]), int(params.get("port") or 22), params.get("username", ""))
    reservation = reservations.get(place.reservation) if place.reservation else None
    return PlaceStatus(
        name=place.name,
        tags=dict(place.tags),
        acquired=place.acquired,
        reserved_for=reservation.owner if reservation is not None else None,
        service=service,
        problem=problem,
    )


def place_statuses(coordinator: str) -> dict[str, PlaceStatus]:
    """Every place of the coordinator, with its holders and NetworkService."""
    session = _session(coordinator)

    async def get(client: Any) -> dict[str, PlaceStatus]:
        await client.sync_with_coordinator()
        reservations = await _reservations(client)
        return {name: _status_of(client, place, reservations) for name, place in client.places.items()}

    return session.run("list places", get)


def _reserve(session: Session, place: str) -> tuple[str, str]:
    """A reservation for exactly this place (labgrid's `name` filter): (token, state)."""

    async def reserve(client: Any) -> tuple[str, str]:
        pb2 = _pb2()
        request = pb2.CreateReservationRequest(filters={"main": pb2.Reservation.Filter(filter={"name": place})}, prio=0)
        response = await client.stub.CreateReservation(request)
        return response.reservation.token, _state_name(response.reservation.state)

    return session.run(f"reserve place {place}", reserve)


def _state_name(state: int) -> str:
    from labgrid.remote.common import ReservationState

    return ReservationState(state).name


def _poll(session: Session, place: str, token: str) -> tuple[str, str | None]:
    """(our reservation's state, who has the place meanwhile)."""

    async def poll(client: Any) -> tuple[str, str | None]:
        response = await client.stub.PollReservation(_pb2().PollReservationRequest(token=token))
        state = _state_name(response.reservation.state)
        found = client.places.get(place)
        if found is None:
            return state, None
        reservations = await _reservations(client)
        holder = _status_of(client, found, reservations).holder
        if holder is None:  # free, but an older reservation is ahead of ours in the queue
            ahead = [
                r.owner
                for t, r in reservations.items()
                if t != token and _state_name(r.state) == "waiting" and _wants(r, place)
            ]
            holder = f"{ahead[0]} (queued first)" if ahead else None
        return state, holder

    return session.run(f"wait for place {place}", poll)


def _wants(reservation: Any, place: str) -> bool:
    return "main" in reservation.filters and dict(reservation.filters["main"].filter) == {"name": place}


def _acquire(session: Session, place: str) -> PlaceStatus:
    async def acquire(client: Any) -> PlaceStatus:
        await client.stub.AcquirePlace(_pb2().AcquirePlaceRequest(placename=place))
        await client.sync_with_coordinator()  # the place's update (its acquired resources) has arrived
        return _status_of(client, client.places[place], await _reservations(client))

    return session.run(f"lock place {place}", acquire)


def _release(session: Session, place: str, token: str | None) -> None:
    """Release our lock on the place (only ours: labgrid's `fromuser`) and cancel our reservation."""
    import grpc

    async def release(client: Any) -> None:
        pb2 = _pb2()
        await client.stub.ReleasePlace(pb2.ReleasePlaceRequest(placename=place, fromuser=session.name))
        if token:
            try:
                await client.stub.CancelReservation(pb2.CancelReservationRequest(token=token))
            except grpc.aio.AioRpcError as exc:
                if exc.code() != grpc.StatusCode.FAILED_PRECONDITION:  # already gone (expired)
                    raise

    session.run(f"release place {place}", release)
    session.held.pop(place, None)


def _cancel(session: Session, token: str) -> None:
    async def cancel(client: Any) -> None:
        await client.stub.CancelReservation(_pb2().CancelReservationRequest(token=token))

    with contextlib.suppress(LabgridError):
        session.run("cancel reservation", cancel)


# ---------------------------------------------------------------- places left by a killed etlab


def _marker(coordinator: str, place: str) -> Any:
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
            note = json.loads(marker.read_text())
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
            _release(session, place, token) if acquired else _cancel(session, token)
            console.warn(f"released labgrid place {place}, left locked by an etlab that died (pid {note.get('pid')})")
        marker.unlink(missing_ok=True)


def _note(session: Session, place: str, token: str, board: str) -> None:
    marker = _marker(session.address, place)
    marker.write_text(json.dumps({"pid": os.getpid(), "token": token, "board": board, "client": session.name}))


def _unnote(session: Session, place: str, token: str) -> None:
    marker = _marker(session.address, place)
    with contextlib.suppress(OSError, ValueError):
        if json.loads(marker.read_text()).get("token") == token:
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
            found.setdefault(name, board.replace(name=name, labgrid=replace(lg, place=name, tags=())))
    return list(found.values())


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
        user=service.username or board.user,
        labgrid=replace(lg, waited=waited),
    )


def check_held(board: Board) -> None:
    """Between steps of a long job: fail the board as soon as its coordinator is gone."""
    lg = board.labgrid
    if lg is None:
        return
    session = _sessions.get(lg.coordinator)
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
    session = _session(lg.coordinator)
    _recover(session, place)
    started = time.monotonic()
    token, state = _reserve(session, place)
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
            status = _acquire(session, place)
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
            target = _session(lg.coordinator) if session.lost else session
            if locked:
                _release(target, place, token)
            else:
                _cancel(target, token)
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
        state, holder = _poll(session, place, token)
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
                f"(--lg-wait {wait:g})",
                hint=f"see the place: labgrid-client -x {session.address} -p {place} show",
            )
        if _stopping.is_set():
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
        _stopping.wait(delay)
