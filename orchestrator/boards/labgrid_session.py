"""The session with one labgrid coordinator, and the requests etlab makes of it (reserve, poll, acquire, release).

labgrid's Python client is asyncio: each coordinator gets one session on its own event loop in a daemon thread,
and board threads call into it with run_coroutine_threadsafe (why not `labgrid-client`: boards/labgrid.py).
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import contextlib
import logging
import os
import re
import threading
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any, TypeVar

from orchestrator.errors import BoardError

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
stopping = threading.Event()  # set on Ctrl+C: waits in the queue give up


def session_for(address: str) -> Session:
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
    stopping.set()


def existing_session(address: str) -> Session | None:
    """The session with this coordinator, if one is open."""
    with _sessions_lock:
        return _sessions.get(address)


@atexit.register
def close_sessions() -> None:
    """The safety net: a place still held at exit (a job thread cut short) is released before the session ends."""
    with _sessions_lock:
        sessions = list(_sessions.values())
        _sessions.clear()
    for session in sessions:
        for place, token in list(session.held.items()):
            with contextlib.suppress(Exception):
                release(session, place, token)
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
    session = session_for(coordinator)

    async def get(client: Any) -> dict[str, PlaceStatus]:
        await client.sync_with_coordinator()
        reservations = await _reservations(client)
        return {name: _status_of(client, place, reservations) for name, place in client.places.items()}

    return session.run("list places", get)


def reserve(session: Session, place: str) -> tuple[str, str]:
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


def poll(session: Session, place: str, token: str) -> tuple[str, str | None]:
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


def acquire(session: Session, place: str) -> PlaceStatus:
    async def acquire(client: Any) -> PlaceStatus:
        await client.stub.AcquirePlace(_pb2().AcquirePlaceRequest(placename=place))
        await client.sync_with_coordinator()  # the place's update (its acquired resources) has arrived
        return _status_of(client, client.places[place], await _reservations(client))

    return session.run(f"lock place {place}", acquire)


def release(session: Session, place: str, token: str | None) -> None:
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


def cancel(session: Session, token: str) -> None:
    async def cancel(client: Any) -> None:
        await client.stub.CancelReservation(_pb2().CancelReservationRequest(token=token))

    with contextlib.suppress(LabgridError):
        session.run("cancel reservation", cancel)
