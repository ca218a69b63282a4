"""A history's URL and its server: checked, shown, connected to, and the errors a history raises.

A history that cannot be used says why before a nightly runs anything: `check_url` refuses a URL that names no
history it could keep (at the command edge, exit 64), `reach` connects to a server history before the nightly takes
its lock (a server that cannot be reached is HistoryUnreachable, exit 75, the host named). HistoryError (exit 65) and
HistoryBusy (exit 75) are the store's own (history.py), here so that what only needs a URL (the matrix check, the
nightly lock) need not load the store.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

from sqlalchemy import create_engine, text
from sqlalchemy.engine import URL, Engine, make_url
from sqlalchemy.exc import ArgumentError, DBAPIError

from orchestrator import paths
from orchestrator.errors import EtlabError, ExitCode

CONNECT_SECONDS = 10  # a server history that has not answered by then cannot be reached


class HistoryError(EtlabError):
    """The history cannot be used: a corrupt or unreadable file, a database that refuses writes."""

    exit_code = ExitCode.DATA


class HistoryBusy(EtlabError):
    """Another writer kept the history locked longer than we wait: try again later."""

    exit_code = ExitCode.TEMPFAIL


class HistoryUnreachable(EtlabError):
    """The history's server does not answer (down, or not reachable from here): try again later."""

    exit_code = ExitCode.TEMPFAIL


class BadHistoryUrl(ValueError):
    """A URL that names no history etlab can keep; the caller names where it came from (an option, a file's field)."""


# What the messages offer; any SQLAlchemy URL whose driver is installed works, these two are tested.
HISTORY_FORMS = (
    "sqlite:///PATH (a SQLite file; sqlite:////abs/path for an absolute one) or "
    "postgresql+psycopg://USER[:PASSWORD]@HOST[:PORT]/DATABASE"
)


def default_url() -> str:
    return f"sqlite:///{paths.state_dir() / 'history.sqlite'}"


def describe_url(url: str) -> str:
    """A history for messages: a SQLite file's path, else the URL without its password."""
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite":
        return parsed.database or ":memory:"
    return parsed.render_as_string(hide_password=True)


def check_url(url: str) -> str:
    """A history URL checked without connecting, returned as given: SQLAlchemy parses it, its database and driver
    are installed, and a SQLite history is a file (an in-memory one would be gone before a cell is recorded).
    BadHistoryUrl says what is wrong; HISTORY_FORMS what would do."""
    try:
        parsed = make_url(url)
    except (ArgumentError, ValueError, TypeError):
        raise BadHistoryUrl("not a database URL") from None
    try:
        dialect = parsed.get_dialect()
    except ArgumentError:  # NoSuchModuleError: SQLAlchemy has no such database
        raise BadHistoryUrl(f"SQLAlchemy knows no database {parsed.drivername!r}") from None
    try:
        dialect.import_dbapi()
    except ImportError as exc:
        raise BadHistoryUrl(f"the driver of {parsed.drivername}:// is not installed ({exc.name or exc})") from None
    if parsed.get_backend_name() == "sqlite" and (
        parsed.database in (None, "", ":memory:") or parsed.query.get("mode") == "memory"
    ):
        raise BadHistoryUrl("an in-memory SQLite database keeps nothing once etlab ends: name a file")
    return url


def shown_url(url: str) -> str:
    """A URL as given, for a message about it: without its password when it parses."""
    try:
        return make_url(url).render_as_string(hide_password=True)
    except (ArgumentError, ValueError, TypeError):
        return url


def make_engine(url: str, **options: Any) -> Engine:
    """An engine on the history whose connections give up after CONNECT_SECONDS on a server that does not answer
    (a blackholed host would otherwise hang for minutes), unless the URL sets its own timeout."""
    parsed = make_url(url)
    if parsed.get_backend_name() == "postgresql" and "connect_timeout" not in parsed.query:
        options["connect_args"] = {"connect_timeout": CONNECT_SECONDS}
    return create_engine(parsed, future=True, **options)


def server_of(parsed: URL) -> str:
    """host[:port] of a server history, for messages."""
    return (parsed.host or "localhost") + (f":{parsed.port}" if parsed.port else "")


def unreachable(url: str, exc: BaseException) -> HistoryUnreachable | None:
    """A failure to connect to a server history where no server answered (down, refused, unknown host, timed out):
    try again later. None for SQLite, and when the server did answer: a SQLSTATE, or libpq's "FATAL:" before the
    server's own words during the connection's start-up (a bad password, no such database)."""
    orig = getattr(exc, "orig", exc)
    parsed = make_url(url)
    answered = getattr(orig, "sqlstate", None) or getattr(orig, "pgcode", None) or "FATAL:" in str(orig)
    if parsed.get_backend_name() == "sqlite" or answered:
        return None
    return HistoryUnreachable(
        f"the history's server {server_of(parsed)} cannot be reached: {problem(exc)}",
        hint=f"is the server running and reachable from this machine? ({describe_url(url)})",
    )


def reach(url: str) -> None:
    """Connect to a server history once, before a nightly takes its lock or runs a cell: HistoryUnreachable (75)
    when no server answers, HistoryError (65) when it refuses us. A SQLite file has nothing to reach."""
    if make_url(url).get_backend_name() == "sqlite":
        return
    engine = make_engine(url)
    try:
        with engine.connect() as connection:
            connection.execute(text("select 1"))
    except DBAPIError as exc:
        raise unreachable(url, exc) or HistoryError(
            f"the history {describe_url(url)} refused the connection: {problem(exc)}",
            hint="check the URL's user, password and database, and the server's log",
        ) from None
    finally:
        engine.dispose()


def history_id(url: str) -> str:
    """A short stable id of the database a URL names (a SQLite file by its absolute path, a server's URL without
    its password): the same history under another spelling or a changed password keeps its id."""
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite":
        name = f"sqlite:{Path(parsed.database or '').resolve()}"
    else:
        name = parsed.set(password=None).render_as_string(hide_password=True)
    return hashlib.sha256(name.encode()).hexdigest()[:12]


def problem(exc: BaseException) -> str:
    """What a database error says, without SQLAlchemy's wrapping: "database is locked", "disk I/O error"."""
    text = str(getattr(exc, "orig", None) or exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
