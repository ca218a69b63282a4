"""One nightly per history and night: a lock held for the night's whole run, naming its holder.

- SQLite: an flock on `<history file>.night-<night>.lock` beside the file, the holder (host, pid, since) in
  `<history file>.night-<night>.json`. The kernel drops an flock with its process, so a killed nightly never leaves
  its night locked; the holder removes both files on its way out.
- PostgreSQL: a session advisory lock (etlab's key, the night as YYYYMMDD) on a connection kept open for the night,
  and the holder in the `etlab_nightly_holders` table, written once the lock is held: the lock decides, the row only
  says who has it. The server drops the lock with the connection.
- Other servers have no lock: the nightly still checks each cell against the history just before it runs.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import fcntl
import json
import os
import socket
import time
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from orchestrator import console
from orchestrator.errors import EtlabError, ExitCode
from orchestrator.fsutil import atomic_write_text, read_json
from orchestrator.lab.history_url import HistoryError, describe_url, make_engine, problem, unreachable

POLL_SECONDS = 1.0  # while waiting for another nightly (--wait)
NOTE_SECONDS = 300.0  # repeat the "waiting for" line this often even when the holder is the same
_PG_KEY = zlib.crc32(b"etlab nightly") & 0x7FFFFFFF  # the advisory lock's first key: etlab's nightly


class NightBusy(EtlabError):
    """Another nightly runs the same night on the same history."""

    exit_code = ExitCode.TEMPFAIL


@dataclass(frozen=True)
class Holder:
    host: str
    pid: int
    since: str  # ISO 8601, UTC

    @classmethod
    def me(cls) -> Holder:
        now = dt.datetime.now(dt.timezone.utc).replace(microsecond=0)
        return cls(socket.gethostname(), os.getpid(), now.isoformat())

    @classmethod
    def parse(cls, data: Any) -> Holder | None:
        if not isinstance(data, dict):
            return None
        try:
            return cls(str(data["host"]), int(data["pid"]), str(data["since"]))
        except (KeyError, TypeError, ValueError):
            return None

    def __str__(self) -> str:
        try:
            ago = dt.datetime.now(dt.timezone.utc) - dt.datetime.fromisoformat(self.since)
            age = f" ({console.format_seconds(max(0.0, ago.total_seconds()))} ago)"
        except ValueError:
            age = ""
        return f"host {self.host}, pid {self.pid}, since {self.since}{age}"


UNKNOWN = "an etlab that has not said who it is yet"


class _Lock:
    def try_acquire(self) -> Holder | str | None:
        """None once held; else who holds it (a Holder, or text when it cannot be told)."""
        raise NotImplementedError

    def release(self) -> None:
        raise NotImplementedError


class _FileLock(_Lock):
    def __init__(self, database: Path, night: str) -> None:
        self.path = database.with_name(f"{database.name}.night-{night}.lock")
        self.note = database.with_name(f"{database.name}.night-{night}.json")
        self.fd: int | None = None

    def try_acquire(self) -> Holder | str | None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        while True:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                return self._holder()
            # The previous holder removes the file as it leaves: a lock on a removed file locks nothing.
            try:
                same = os.stat(self.path).st_ino == os.fstat(fd).st_ino
            except FileNotFoundError:
                same = False
            if same:
                self.fd = fd
                atomic_write_text(self.note, json.dumps(Holder.me().__dict__) + "\n")
                return None
            os.close(fd)

    def _holder(self) -> Holder | str:
        try:
            return Holder.parse(read_json(self.note)) or f"unknown (unreadable {self.note})"
        except FileNotFoundError:
            return UNKNOWN
        except (OSError, ValueError) as exc:
            return f"unknown ({self.note}: {exc})"

    def release(self) -> None:
        if self.fd is None:
            return
        # Removed while still held, so a waiting nightly never takes a lock on a file that is going away.
        with contextlib.suppress(OSError):
            self.note.unlink()
        with contextlib.suppress(OSError):
            self.path.unlink()
        os.close(self.fd)
        self.fd = None


class _PostgresLock(_Lock):
    def __init__(self, url: str, night: str) -> None:
        self.engine = make_engine(url)
        self.url = url
        self.keys = {"a": _PG_KEY, "b": int(night.replace("-", ""))}
        self.night = night
        self.connection: Any = None

    def try_acquire(self) -> Holder | str | None:
        from sqlalchemy import text
        from sqlalchemy.exc import DBAPIError

        try:
            connection = self.engine.connect().execution_options(isolation_level="AUTOCOMMIT")
        except DBAPIError as exc:  # checked just before (history.reach): the server went away since
            raise unreachable(self.url, exc) or HistoryError(
                f"the night's lock on the history {describe_url(self.url)} cannot be had: {problem(exc)}"
            ) from None
        kept = False  # the connection holds the lock from here on: release() closes it
        try:
            held = connection.execute(text("select pg_try_advisory_lock(:a, :b)"), self.keys).scalar()
            if not held:
                return self._holder(connection)
            self.connection, kept = connection, True
            self._note(self.connection)
            return None
        finally:
            if not kept:
                connection.close()

    def _note(self, connection: Any) -> None:
        from sqlalchemy import text

        me = Holder.me()
        with contextlib.suppress(Exception):  # two nightlies of other nights may create it at once
            connection.execute(
                text(
                    "create table if not exists etlab_nightly_holders "
                    "(night varchar(10) primary key, host text not null, pid integer not null, since text not null)"
                )
            )
        # Under the lock: nobody else writes this night's row.
        connection.execute(text("delete from etlab_nightly_holders where night = :night"), {"night": self.night})
        connection.execute(
            text("insert into etlab_nightly_holders values (:night, :host, :pid, :since)"),
            {"night": self.night, **me.__dict__},
        )

    def _holder(self, connection: Any) -> Holder | str:
        from sqlalchemy import text
        from sqlalchemy.exc import SQLAlchemyError

        try:
            row = connection.execute(
                text("select host, pid, since from etlab_nightly_holders where night = :night"), {"night": self.night}
            ).first()
        except SQLAlchemyError:
            return UNKNOWN
        return (Holder.parse(dict(row._mapping)) if row is not None else None) or UNKNOWN  # None would mean "ours"

    def release(self) -> None:
        from sqlalchemy import text

        if self.connection is not None:
            with contextlib.suppress(Exception):  # a lost connection has dropped the lock already
                self.connection.execute(
                    text("delete from etlab_nightly_holders where night = :night"), {"night": self.night}
                )
                self.connection.execute(text("select pg_advisory_unlock(:a, :b)"), self.keys)
            with contextlib.suppress(Exception):
                self.connection.close()
            self.connection = None
        self.engine.dispose()


class _NoLock(_Lock):
    def try_acquire(self) -> Holder | str | None:
        return None

    def release(self) -> None:
        pass


def _lock_for(url: str, night: str) -> _Lock:
    from sqlalchemy.engine import make_url

    parsed = make_url(url)
    backend = parsed.get_backend_name()
    if backend == "sqlite":
        if not parsed.database or parsed.database == ":memory:":
            return _NoLock()  # a private in-memory history: nobody to share it with
        return _FileLock(Path(parsed.database).resolve(), night)
    if backend == "postgresql":
        return _PostgresLock(url, night)
    console.warn(f"no nightly lock on a {backend} history: only the per-cell check keeps two nightlies apart")
    return _NoLock()


@contextlib.contextmanager
def night_lock(url: str, night: str, where: str, *, wait: bool = False) -> Iterator[None]:
    """Hold the night of this history for the block; held by another nightly: NightBusy, or wait with `wait`."""
    lock = _lock_for(url, night)
    holder = lock.try_acquire()
    started = time.monotonic()
    last: Holder | str | None = None
    noted = 0.0
    while holder is not None:
        message = f"night {night} of the history {where} is being run by another nightly: {holder}"
        if not wait:
            raise NightBusy(message)  # the command layer says how to wait for it
        now = time.monotonic()
        if holder != last or now - noted >= NOTE_SECONDS:
            console.info(f"{console.escape(message)}: waiting ({console.format_seconds(now - started)} so far)")
            last, noted = holder, now
        time.sleep(POLL_SECONDS)
        holder = lock.try_acquire()
    try:
        yield
    finally:
        lock.release()


def try_night(url: str, night: str) -> _Lock | None:
    """The night's lock if nobody holds it (the caller releases it), else None."""
    lock = _lock_for(url, night)
    if lock.try_acquire() is None:
        return lock
    return None
