"""The nightly history store: every run with its conditions, per-iteration latencies and per-op medians.

SQLAlchemy Core, so the default SQLite file and a shared lab's PostgreSQL URL take the same code path.
Each run is written in one transaction: a crash leaves the previous history intact.

Schema changes only ever add nullable columns; `History()` adds the missing ones to an existing database
(SQLite or PostgreSQL), so a history written by an older etlab still opens, and its old rows keep working.

A history that cannot be used says why before a nightly runs anything: `check_url` refuses a URL that names no
history it could keep (at the command edge, exit 64), `reach` connects to a server history before the nightly takes
its lock (a server that cannot be reached is HistoryUnreachable, exit 75, the host named), `History(check=True)`
runs SQLite's integrity check (a corrupt file is HistoryError, exit 65, naming the file and what is wrong), and
`wait_writable()` makes a test write, rolled back, waiting for a history another writer holds locked
(HistoryBusy, exit 75, once the wait runs out).

A record has one reader, `RunRecord.from_dict`, whether it comes from a history row or a pending file (every field
checked: types, ranges, the columns' sizes, which PostgreSQL enforces and SQLite does not), and one JSON form,
`RunRecord.to_dict`.
"""

from __future__ import annotations

import datetime as dt
import functools
import hashlib
import json
import math
import re
import sqlite3
import time
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from sqlalchemy import (
    JSON,
    Column,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    UniqueConstraint,
    create_engine,
    event,
    func,
    inspect,
    select,
    text,
)
from sqlalchemy.engine import URL, Engine, make_url
from sqlalchemy.exc import ArgumentError, DatabaseError, DBAPIError

from orchestrator import console, paths, strictjson
from orchestrator.deploy.limits import MAX_THREADS
from orchestrator.errors import EtlabError, ExitCode
from orchestrator.names import is_night
from orchestrator.results.summary import VALIDITY_LEVELS, Generation, SummaryError
from orchestrator.results.verdicts import Kind
from orchestrator.strictjson import MAX_MAGNITUDE, JsonDataError

DEFAULT_BUSY_SECONDS = 30.0  # how long a write waits for another writer's lock before it fails
CONNECT_SECONDS = 10  # a server history that has not answered by then cannot be reached
INTEGRITY_PROBLEMS = 5  # problems of a corrupt file named in the message (integrity_check lists up to 100)
NOTE_SECONDS = 60.0  # repeat the "history locked" line this often while waiting


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


metadata = MetaData()

runs = Table(
    "runs",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("run_id", String(96), nullable=False, unique=True),
    Column("night", String(10), nullable=False, index=True),  # YYYY-MM-DD of the nightly
    Column("board", String(128), nullable=False),
    Column("model", String(128), nullable=False),
    Column("backend", String(32), nullable=False),
    Column("status", String(16), nullable=False),  # ok | failed | infra
    Column("validity", String(16), nullable=False),  # valid | degraded | invalid
    Column("reasons", JSON, nullable=False, default=list),
    Column("error", Text),
    Column("stage", String(32)),  # where a failed cell failed
    Column("versions", JSON, nullable=False, default=dict),
    Column("versions_key", String(200), nullable=False, default=""),
    Column("pte_sha256", String(64)),
    Column("threads", Integer),
    Column("median_ms", Float),
    Column("p90_ms", Float),
    Column("mean_ms", Float),
    Column("cv", Float),
    Column("conditions", JSON, nullable=False, default=dict),
    Column("bundle_path", Text),
    Column("created_at", DateTime(timezone=True), nullable=False),
    # Added with verdicts (issue 11); nullable so older databases migrate by adding them.
    Column("environment", JSON),  # runner version, runtime version, board image: part of the program's identity
    Column("verdict", String(24)),  # orchestrator.results.verdicts.Kind, set once the cell is judged
    Column("verdict_info", JSON),  # detail, ratio, drift, re-measure and interleaved re-test figures
    # Added with memory footprint (issue 13).
    Column("peak_rss_bytes", Integer),  # the run's peak RSS over every phase
    Column("planned_bytes", Integer),  # the program's planned arenas
    # Added with language models (issue 26): summary.json's `generation` figures (Generation.to_dict()).
    Column("generation", JSON),
    UniqueConstraint("night", "board", "model", "backend", name="one_cell_per_night"),
)
# A cell's nights (trends, baselines) and a board's latest run (the dashboard), without scanning every run.
CELL_NIGHTS = Index("runs_cell_night", runs.c.board, runs.c.model, runs.c.backend, runs.c.night)

samples = Table(
    "samples",
    metadata,
    Column("run", Integer, ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True),
    Column("iteration", Integer, primary_key=True),
    Column("latency_ms", Float, nullable=False),
)

_OP_KEY_SIZE, _OP_NAME_SIZE = 64, 200  # the columns' lengths: a record's keys and names are checked against them
op_medians = Table(
    "op_medians",
    metadata,
    Column("run", Integer, ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True),
    Column("op_key", String(_OP_KEY_SIZE), primary_key=True),  # "<chain>:<instruction>"
    Column("op_name", String(_OP_NAME_SIZE), nullable=False),
    Column("median_ms", Float, nullable=False),
)


@dataclass
class RunRecord:
    """One nightly cell's outcome, as stored."""

    run_id: str
    night: str
    board: str
    model: str
    backend: str
    status: str
    validity: str = "invalid"
    reasons: list[str] = field(default_factory=list)
    error: str | None = None
    stage: str | None = None
    versions: dict[str, str] = field(default_factory=dict)
    pte_sha256: str | None = None
    threads: int | None = None
    median_ms: float | None = None
    p90_ms: float | None = None
    mean_ms: float | None = None
    cv: float | None = None
    conditions: dict[str, Any] = field(default_factory=dict)
    bundle_path: str | None = None
    latencies_ms: list[float] = field(default_factory=list)
    ops: dict[str, tuple[str, float]] = field(default_factory=dict)  # op_key -> (name, median ms)
    created_at: dt.datetime | None = None
    environment: dict[str, str] = field(default_factory=dict)
    verdict: str | None = None
    verdict_info: dict[str, Any] = field(default_factory=dict)
    peak_rss_bytes: int | None = None
    planned_bytes: int | None = None
    generation: Generation | None = None  # text-generation programs: TTFT, decode tok/s, token agreement, ...

    @property
    def identity(self) -> tuple[str | None, str]:
        """What ran: the .pte's sha256 and the versions around it (workstation, runtime, runner, board image)."""
        return (self.pte_sha256, versions_key({**self.versions, **self.environment}))

    @property
    def cell(self) -> tuple[str, str, str]:
        return (self.board, self.model, self.backend)

    def to_dict(self) -> dict[str, Any]:
        """The record as JSON data (a pending file), as `from_dict` reads it back."""
        data = {name: getattr(self, name) for name in _PLAIN_FIELDS}
        data["ops"] = {key: [name, ms] for key, (name, ms) in self.ops.items()}
        data["created_at"] = self.created_at.isoformat() if self.created_at else None
        data["generation"] = self.generation.to_dict() if self.generation else None
        return data

    @classmethod
    def from_dict(cls, data: Any, where: str, within: str = "") -> RunRecord:
        """The one reader of a record (a history row, a pending file): every field checked, JsonDataError naming
        `where` and the field (after `within`, the record's own place in a file) otherwise. Keys it does not know
        are left out (a newer etlab's)."""
        return _RecordReader(data, where, within).record()


# Fields to_dict writes as they are (JSON already); ops, created_at and generation have their own form.
_PLAIN_FIELDS = tuple(f.name for f in fields(RunRecord) if f.name not in ("ops", "created_at", "generation"))
# RunRecord fields stored as columns of `runs` under the same name.
_STORED_FIELDS = (
    "run_id", "night", "board", "model", "backend", "status", "validity", "reasons", "error", "stage", "versions",
    "pte_sha256", "threads", "median_ms", "p90_ms", "mean_ms", "cv", "conditions", "bundle_path", "environment",
    "verdict", "verdict_info", "peak_rss_bytes", "planned_bytes",
)  # fmt: skip


STATUSES = ("ok", "failed", "infra")
_SHA256 = re.compile(r"[0-9a-f]{64}")
_VERDICTS = tuple(kind.value for kind in Kind)


def _storable(text: str) -> bool:
    """Text a database column stores as it is: PostgreSQL refuses NUL, and UTF-8 has no unpaired surrogate (which a
    JSON file can spell: "\\ud800")."""
    if "\x00" in text:
        return False
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _is_sha256(text: str) -> bool:
    return _SHA256.fullmatch(text) is not None


def _column_size(name: str) -> int | None:
    return getattr(runs.c[name].type, "length", None)


class _RecordReader:
    """RunRecord.from_dict's checks, one per kind of field; each failure names the field."""

    def __init__(self, data: Any, where: str, within: str) -> None:
        self.data, self.where, self.within = data, where, within
        if not isinstance(data, dict):
            raise JsonDataError(where, f"a run record must be a mapping, got {_kind(data)}", within or None)

    def fail(self, name: str, problem: str) -> JsonDataError:
        return JsonDataError(self.where, problem, f"{self.within}.{name}" if self.within else name)

    def text(self, name: str, *, required: bool = False, size: int | None = None, choices: tuple[str, ...] = (),
             check: Callable[[str], bool] | None = None, expected: str = "") -> str | None:  # fmt: skip
        value = self.data.get(name)
        if value is None and not required:
            return None
        size = size or _column_size(name)
        if not isinstance(value, str) or (required and not value):
            raise self.fail(name, f"expected {'a non-empty ' if required else ''}text, got {_kind(value)}")
        if not _storable(value):
            raise self.fail(name, f"holds a NUL or a lone surrogate, which a database cannot store: {_shown(value)}")
        if choices and value not in choices:
            raise self.fail(name, f"expected one of {', '.join(choices)}, got {_shown(value)}")
        if size is not None and len(value) > size:
            raise self.fail(name, f"longer than {size} characters ({len(value)})")
        if check is not None and not check(value):
            raise self.fail(name, f"expected {expected}, got {_shown(value)}")
        return value

    def required(self, name: str, **checks: Any) -> str:
        value = self.text(name, required=True, **checks)
        assert value is not None  # required: text() raised otherwise
        return value

    def number(self, name: str) -> float | None:
        value = self.data.get(name)
        return None if value is None else self._number(name, value)

    def _number(self, name: str, value: Any) -> float:
        if not isinstance(value, int | float) or isinstance(value, bool) or not math.isfinite(value):
            raise self.fail(name, f"expected a finite number, got {_kind(value)}")
        return float(value)

    def count(self, name: str, low: int, high: int) -> int | None:
        value = self.data.get(name)
        if value is None:
            return None
        if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
            raise self.fail(name, f"expected a whole number from {low} to {high}, got {_kind(value)}")
        return value

    def mapping(self, name: str) -> dict[str, Any]:
        value = self.data.get(name)
        if value is None:
            return {}
        if not isinstance(value, dict):
            raise self.fail(name, f"expected a mapping, got {_kind(value)}")
        return value

    def texts(self, name: str) -> list[str]:
        value = self.data.get(name)
        if value is None:
            return []
        if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
            raise self.fail(name, f"expected a list of texts, got {_kind(value)}")
        return list(value)

    def text_mapping(self, name: str) -> dict[str, str]:
        value = self.mapping(name)
        for key, item in value.items():
            if not isinstance(item, str):
                raise self.fail(f"{name}.{key}", f"expected text, got {_kind(item)}")
        return dict(value)

    def latencies(self) -> list[float]:
        value = self.data.get("latencies_ms")
        if value is None:
            return []
        if not isinstance(value, list):
            raise self.fail("latencies_ms", f"expected a list of numbers, got {_kind(value)}")
        return [self._number(f"latencies_ms[{i}]", item) for i, item in enumerate(value)]

    def ops(self) -> dict[str, tuple[str, float]]:
        ops: dict[str, tuple[str, float]] = {}
        key_size, name_size = _OP_KEY_SIZE, _OP_NAME_SIZE
        for key, item in self.mapping("ops").items():
            where = f"ops.{key}"
            if not key or len(key) > key_size or not _storable(key):
                raise self.fail(where, f"an operator key must be 1 to {key_size} characters a database can store")
            if not isinstance(item, list | tuple) or len(item) != 2 or not isinstance(item[0], str):
                raise self.fail(where, f"expected [operator name, median ms], got {_kind(item)}")
            if len(item[0]) > name_size or not _storable(item[0]):
                raise self.fail(where, f"an operator name must be at most {name_size} characters a database can store")
            ops[key] = (item[0], self._number(where, item[1]))
        return ops

    def verdict_info(self) -> dict[str, Any]:
        """CellVerdict.info()'s keys, typed as the reports read them (a newer etlab's other keys pass)."""
        info = self.mapping("verdict_info")
        for key in ("baseline_median_ms", "ratio", "drift"):
            if info.get(key) is not None:
                self._number(f"verdict_info.{key}", info[key])
        if not isinstance(info.get("detail", ""), str | None):
            raise self.fail("verdict_info.detail", f"expected text, got {_kind(info['detail'])}")
        slower = info.get("slower_ops")
        if slower is not None and not (isinstance(slower, list) and all(isinstance(op, dict) for op in slower)):
            raise self.fail("verdict_info.slower_ops", f"expected a list of mappings, got {_kind(slower)}")
        for key in ("retest", "remeasured", "memory"):
            if info.get(key) is not None and not isinstance(info[key], dict):
                raise self.fail(f"verdict_info.{key}", f"expected a mapping, got {_kind(info[key])}")
        for key in ("seconds", "ratio", "budget_seconds", "rounds"):  # the figures the reports format
            if (info.get("retest") or {}).get(key) is not None:
                self._number(f"verdict_info.retest.{key}", info["retest"][key])
        return dict(info)

    def created_at(self) -> dt.datetime | None:
        value = self.data.get("created_at")
        if value is None or isinstance(value, dt.datetime):
            return value
        if isinstance(value, str) and len(value) <= 40:
            try:
                return dt.datetime.fromisoformat(value)
            except ValueError:
                pass
        raise self.fail("created_at", f"expected an ISO 8601 time, got {_kind(value)}")

    def generation(self) -> Generation | None:
        try:  # summary.json's own typed reader: a record holds what a run's summary said
            return Generation.from_dict(self.data.get("generation"))
        except SummaryError as exc:  # field "generation.token_ms", problem "must be a mapping, got list"
            raise self.fail(exc.field, exc.problem) from None

    def record(self) -> RunRecord:
        return RunRecord(
            run_id=self.required("run_id"),
            night=self.required("night", check=is_night, expected="a night, YYYY-MM-DD"),
            board=self.required("board"),
            model=self.required("model"),
            backend=self.required("backend"),
            status=self.required("status", choices=STATUSES),
            validity=self.text("validity", choices=VALIDITY_LEVELS) or "invalid",
            reasons=self.texts("reasons"),
            error=self.text("error"),
            stage=self.text("stage"),
            versions=self.text_mapping("versions"),
            pte_sha256=self.text("pte_sha256", check=_is_sha256, expected="a sha256 (64 hex digits)"),
            threads=self.count("threads", 1, MAX_THREADS),
            median_ms=self.number("median_ms"),
            p90_ms=self.number("p90_ms"),
            mean_ms=self.number("mean_ms"),
            cv=self.number("cv"),
            conditions=dict(self.mapping("conditions")),
            bundle_path=self.text("bundle_path", size=4096),
            latencies_ms=self.latencies(),
            ops=self.ops(),
            created_at=self.created_at(),
            environment=self.text_mapping("environment"),
            verdict=self.text("verdict", choices=_VERDICTS),
            verdict_info=self.verdict_info(),
            peak_rss_bytes=self.count("peak_rss_bytes", 0, MAX_MAGNITUDE),
            planned_bytes=self.count("planned_bytes", 0, MAX_MAGNITUDE),
            generation=self.generation(),
        )


def _kind(value: Any) -> str:
    """A value for a message: short, and never the whole of a long one."""
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list | tuple):
        return "a list"
    if isinstance(value, str):
        return _shown(value)
    if isinstance(value, bool) or value is None:
        return json.dumps(value)
    text = repr(value)
    return text if len(text) <= 24 else f"a number of {len(text)} characters"


def _shown(text: str) -> str:
    return repr(text) if len(text) <= 40 else f"{text[:40]!r}... ({len(text)} characters)"


def versions_key(versions: dict[str, str]) -> str:
    return json.dumps(versions, sort_keys=True)


def default_url() -> str:
    return f"sqlite:///{paths.state_dir() / 'history.sqlite'}"


def _may_be_baseline() -> Any:
    """Runs that may be a baseline night: they ran, are not invalid, and were not judged inconclusive.

    An inconclusive night was degraded even after its re-measure (a CPU hog, throttling): the board was not fit to
    measure, so it must not widen the night-to-night spread that tomorrow's change has to beat.
    """
    return (
        (runs.c.status == "ok")
        & (runs.c.validity != "invalid")
        & (runs.c.verdict.is_(None) | (runs.c.verdict != "inconclusive"))
    )


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


_SQLITE_BUSY = 5  # SQLite's result code; sqlite3.SQLITE_BUSY only from Python 3.11


def _is_locked(exc: BaseException) -> bool:
    """SQLite's "database is locked" (SQLITE_BUSY): another connection holds the write lock."""
    orig = getattr(exc, "orig", exc)
    return isinstance(orig, sqlite3.OperationalError) and (
        getattr(orig, "sqlite_errorcode", None) == _SQLITE_BUSY or "locked" in str(orig)
    )


class History:
    def __init__(
        self, url: str | None = None, *, busy_seconds: float = DEFAULT_BUSY_SECONDS, check: bool = False
    ) -> None:
        """Open (and create or migrate) the history; `check`: its integrity first (HistoryError when corrupt)."""
        self.url = url or default_url()
        self.where = describe_url(self.url)
        if self.url.startswith("sqlite:///"):
            try:
                Path(self.url.removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)
            except OSError as exc:  # a file where a folder should be, no permission
                raise HistoryError(f"the history {self.where} cannot be created: {exc.strerror or exc}") from None
        # JSON columns hold board values (conditions, reasons): written strictly (NaN as null), read strictly
        # (depth, numbers in range), so no row can carry what a page's JSON.parse or a reader would choke on.
        self.engine: Engine = make_engine(
            self.url,
            json_serializer=strictjson.dumps,
            json_deserializer=functools.partial(strictjson.loads, where=f"the history {self.where}"),
        )
        self.busy_seconds = busy_seconds
        if self.engine.dialect.name == "sqlite":
            event.listen(self.engine, "connect", lambda dbapi, _record: _sqlite_pragmas(dbapi, busy_seconds))
        try:
            if check:
                self._check_integrity()
            metadata.create_all(self.engine)
            self._migrate()
        except DatabaseError as exc:
            self.engine.dispose()
            if _is_locked(exc):
                raise HistoryBusy(
                    f"the history {self.where} stayed locked by another writer for {busy_seconds:g} s",
                    hint=self.locked_hint(),
                ) from None
            raise self._unusable(exc) from None
        except BaseException:
            self.engine.dispose()
            raise

    def _unusable(self, exc: BaseException) -> HistoryError | HistoryUnreachable:
        away = unreachable(self.url, exc)
        if away is not None:
            return away
        orig = getattr(exc, "orig", exc)
        reason = problem(exc)
        # sqlite3.DatabaseError itself (not OperationalError): the file's bytes, e.g. "file is not a database".
        damaged = type(orig) is sqlite3.DatabaseError
        what = "is corrupt or not a SQLite database" if damaged else "cannot be used"
        return HistoryError(f"the history {self.where} {what}: {reason}", hint=self._repair_hint())

    def _repair_hint(self) -> str:
        if self.engine.dialect.name != "sqlite":
            return "check the database server and its logs"
        return (
            f"keep a copy of {self.where}, then move it aside (the next nightly starts a new history) or restore a "
            f"backup; `sqlite3 {self.where} .recover | sqlite3 recovered.sqlite` saves what can be read"
        )

    def _check_integrity(self) -> None:
        """SQLite: PRAGMA integrity_check; a server database guards its own pages, so there it only connects."""
        with self.engine.connect() as connection:
            if self.engine.dialect.name != "sqlite":
                connection.execute(text("select 1"))
                return
            rows = [str(row[0]) for row in connection.exec_driver_sql(f"PRAGMA integrity_check({INTEGRITY_PROBLEMS})")]
        if rows != ["ok"]:
            # Each problem once, without the "*** in database main ***" headers.
            problems = [line for row in rows for line in row.splitlines() if line and not line.startswith("***")]
            raise HistoryError(
                f"the history {self.where} is corrupt (SQLite's integrity check): {'; '.join(problems)}",
                hint=self._repair_hint(),
            )

    def wait_writable(self, wait_seconds: float) -> None:
        """A test write (a probe row, rolled back); a history another writer holds locked is waited for, saying so,
        at most `wait_seconds` (then HistoryBusy). Any other failure to write is HistoryError."""
        started = time.monotonic()
        announced = 0.0
        while True:
            elapsed = time.monotonic() - started
            # The first try does not wait, so the message comes before the wait; then a few seconds at a time.
            attempt = 0.0 if not announced else max(0.0, min(10.0, wait_seconds - elapsed))
            try:
                self._test_write(attempt)
                if announced:
                    console.info(f"the history {self.where} is free again: continuing")
                return
            except DatabaseError as exc:
                if not _is_locked(exc):
                    raise self._unusable(exc) from None
            elapsed = time.monotonic() - started
            if elapsed >= wait_seconds:
                raise HistoryBusy(
                    f"the history {self.where} is still locked by another writer after waiting "
                    f"{console.format_seconds(elapsed)} (nightly.history_wait_seconds {wait_seconds:g})",
                    hint=self.locked_hint(),
                )
            now = time.monotonic()
            if not announced or now - announced >= NOTE_SECONDS:
                so_far = f", {console.format_seconds(elapsed)} so far" if announced else ""
                console.warn(
                    f"the history {self.where} is locked by another writer (a process in a write transaction): "
                    f"waiting for it (at most {console.format_seconds(wait_seconds)}{so_far})"
                )
                announced = now

    def _test_write(self, busy_seconds: float) -> None:
        probe = {name: "" for name in ("night", "board", "model", "backend", "status", "validity", "versions_key")}
        sqlite = self.engine.dialect.name == "sqlite"
        with self.engine.connect() as connection:
            if sqlite:
                connection.exec_driver_sql(f"PRAGMA busy_timeout={int(busy_seconds * 1000)}")
                connection.commit()
            try:
                connection.execute(
                    runs.insert().values(
                        **probe, run_id="etlab-history-write-test", reasons=[], versions={}, conditions={},
                        created_at=dt.datetime.now(dt.timezone.utc),
                    )
                )  # fmt: skip
            finally:
                connection.rollback()  # a test: nothing is ever written
                if sqlite:  # the connection goes back to the pool: with the history's own wait again
                    connection.exec_driver_sql(f"PRAGMA busy_timeout={int(self.busy_seconds * 1000)}")
                    connection.commit()

    def locked_hint(self) -> str:
        if self.engine.dialect.name != "sqlite":
            return "see the server's locks (pg_locks) and try again once the other writer is done"
        return f"see who has it open: fuser -v {self.where} (or lsof); try again once the other writer is done"

    def _migrate(self) -> None:
        """Add the columns and indexes an older etlab did not have (all columns nullable), in one transaction."""
        present = {column["name"] for column in inspect(self.engine).get_columns("runs")}
        missing = [column for column in runs.columns if column.name not in present]
        CELL_NIGHTS.create(self.engine, checkfirst=True)
        if not missing:
            return
        with self.engine.begin() as connection:
            for column in missing:
                kind = column.type.compile(dialect=self.engine.dialect)
                connection.execute(text(f'ALTER TABLE runs ADD COLUMN "{column.name}" {kind}'))

    def set_verdict(self, run_id: str, verdict: str, info: dict[str, Any]) -> None:
        """Store a cell's verdict, so a resumed night and later reports (board health) need not judge it again."""
        with self.engine.begin() as connection:
            connection.execute(
                runs.update().where(runs.c.run_id == run_id).values(verdict=str(verdict), verdict_info=info)
            )

    def close(self) -> None:
        self.engine.dispose()

    def record(self, run: RunRecord) -> None:
        """Insert a run with its samples and op medians in one transaction.

        An infrastructure failure recorded earlier for the same cell and night is replaced (the retry of a
        resumed night); anything else already recorded for the cell is a conflict.
        """
        created = run.created_at or dt.datetime.now(dt.timezone.utc)
        with self.engine.begin() as connection:
            connection.execute(
                runs.delete().where(_cell_is(run.cell) & (runs.c.night == run.night) & (runs.c.status == "infra"))
            )
            inserted = connection.execute(
                runs.insert().values(
                    **{name: getattr(run, name) for name in _STORED_FIELDS},
                    versions_key=versions_key(run.versions),
                    generation=run.generation.to_dict() if run.generation else None,
                    created_at=created,
                )
            ).inserted_primary_key
            assert inserted is not None  # a single-row INSERT always reports its key
            row_id = inserted[0]
            if run.latencies_ms:
                connection.execute(
                    samples.insert(),
                    [{"run": row_id, "iteration": i, "latency_ms": v} for i, v in enumerate(run.latencies_ms)],
                )
            if run.ops:
                connection.execute(
                    op_medians.insert(),
                    [{"run": row_id, "op_key": k, "op_name": n, "median_ms": m} for k, (n, m) in run.ops.items()],
                )

    def recorded_cells(self, night: str, *, include_infra: bool = False) -> set[tuple[str, str, str]]:
        """Cells of `night` already recorded; infrastructure failures are retried unless include_infra."""
        query = select(runs.c.board, runs.c.model, runs.c.backend, runs.c.status).where(runs.c.night == night)
        with self.engine.connect() as connection:
            return {
                (row.board, row.model, row.backend)
                for row in connection.execute(query)
                if include_infra or row.status != "infra"
            }

    def runs(
        self,
        *,
        night: str | None = None,
        cell: tuple[str, str, str] | None = None,
        before_night: str | None = None,
        versions: dict[str, str] | None = None,
        valid_only: bool = False,
        limit: int | None = None,
    ) -> list[RunRecord]:
        """Runs newest night first, with their samples and op medians; `valid_only`: those that may be a baseline."""
        query = _newest_first(select(runs), night, cell, limit)
        if before_night is not None:
            query = query.where(runs.c.night < before_night)
        if versions is not None:
            query = query.where(runs.c.versions_key == versions_key(versions))
        if valid_only:
            query = query.where(_may_be_baseline())
        with self.engine.connect() as connection:
            rows = list(connection.execute(query))
            return [self._load(connection, row) for row in rows]

    def records(
        self,
        *,
        night: str | None = None,
        cell: tuple[str, str, str] | None = None,
        board: str | None = None,
        limit: int | None = None,
    ) -> list[RunRecord]:
        """Runs newest night first, in one query: without their samples and op medians (`runs` loads those), for
        readers of many runs at once (the dashboard's grid and trends)."""
        query = _newest_first(select(runs), night, cell, limit)
        if board is not None:
            query = query.where(runs.c.board == board)
        with self.engine.connect() as connection:
            return [self._record(row) for row in connection.execute(query)]

    def latest_night(self) -> str | None:
        with self.engine.connect() as connection:
            return connection.execute(select(func.max(runs.c.night))).scalar()

    def boards(self) -> dict[str, str]:
        """Every board in the history, with the latest night it ran."""
        query = select(runs.c.board, func.max(runs.c.night)).group_by(runs.c.board)
        with self.engine.connect() as connection:
            return {board: night for board, night in connection.execute(query)}

    def baseline_programs(self, nights: int) -> set[str]:
        """The .pte sha256 of every cell's `nights` latest valid runs: the programs still in some baseline."""
        query = (
            select(runs.c.board, runs.c.model, runs.c.backend, runs.c.pte_sha256)
            .where(_may_be_baseline())
            .order_by(runs.c.night.desc(), runs.c.id.desc())
        )
        seen: dict[tuple[str, str, str], int] = {}
        wanted = set()
        with self.engine.connect() as connection:
            for row in connection.execute(query):
                cell = (row.board, row.model, row.backend)
                seen[cell] = seen.get(cell, 0) + 1
                if seen[cell] <= nights and row.pte_sha256:
                    wanted.add(row.pte_sha256)
        return wanted

    def nights(self) -> list[str]:
        with self.engine.connect() as connection:
            return [row[0] for row in connection.execute(select(runs.c.night).distinct().order_by(runs.c.night))]

    def _load(self, connection: Any, row: Any) -> RunRecord:
        latencies = [
            value
            for (value,) in connection.execute(
                select(samples.c.latency_ms).where(samples.c.run == row.id).order_by(samples.c.iteration)
            )
        ]
        ops = {
            op.op_key: (op.op_name, op.median_ms)
            for op in connection.execute(select(op_medians).where(op_medians.c.run == row.id))
        }
        return self._record(row, latencies_ms=latencies, ops=ops)

    def _record(self, row: Any, **details: Any) -> RunRecord:
        """A row read back through the one record reader (an older row's new columns are NULL: their defaults)."""
        stored = {name: getattr(row, name) for name in _STORED_FIELDS}
        stored.update(generation=row.generation, created_at=row.created_at, **details)
        return RunRecord.from_dict(stored, f"the history {self.where}: run {row.run_id}")


def _newest_first(query: Any, night: str | None, cell: tuple[str, str, str] | None, limit: int | None) -> Any:
    """`query` on runs narrowed to a night and a cell, newest night first, at most `limit` rows (a query's later
    `where` still narrows it before the limit applies)."""
    if night is not None:
        query = query.where(runs.c.night == night)
    if cell is not None:
        query = query.where(_cell_is(cell))
    query = query.order_by(runs.c.night.desc(), runs.c.id.desc())
    return query.limit(limit) if limit is not None else query


def _cell_is(cell: tuple[str, str, str]) -> Any:
    board, model, backend = cell
    return (runs.c.board == board) & (runs.c.model == model) & (runs.c.backend == backend)


def _sqlite_pragmas(dbapi_connection: Any, busy_seconds: float) -> None:
    # WAL + full sync: a killed writer never corrupts the file; foreign keys for cascading deletes.
    cursor = dbapi_connection.cursor()
    cursor.execute(f"PRAGMA busy_timeout={int(busy_seconds * 1000)}")  # first: the WAL switch may wait too
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA synchronous=FULL")
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.close()
