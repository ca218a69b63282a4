"""The nightly history store: every run with its conditions, per-iteration latencies and per-op medians.

SQLAlchemy Core, so the default SQLite file and a shared lab's PostgreSQL URL take the same code path.
Each run is written in one transaction: a crash leaves the previous history intact.

Schema changes only ever add nullable columns; `History()` adds the missing ones to an existing database
(SQLite or PostgreSQL), so a history written by an older etlab still opens, and its old rows keep working.

`History(check=True)` runs SQLite's integrity check (a corrupt file is HistoryError, exit 65, naming the file and what
is wrong), and `wait_writable()` makes a test write, rolled back, waiting for a history another writer holds locked
(HistoryBusy, exit 75, once the wait runs out). The URL's checks and the errors are history_url.py's; the records it
stores and reads back (RunRecord, its one reader) are run_record.py's.
"""

from __future__ import annotations

import datetime as dt
import functools
import sqlite3
import time
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
    event,
    func,
    inspect,
    select,
    text,
)
from sqlalchemy.engine import Engine
from sqlalchemy.exc import DatabaseError

from orchestrator import console, strictjson
from orchestrator.lab.history_url import (
    HistoryBusy,
    HistoryError,
    HistoryUnreachable,
    default_url,
    describe_url,
    make_engine,
    problem,
    unreachable,
)
from orchestrator.lab.run_record import (
    OP_KEY_SIZE,
    OP_NAME_SIZE,
    STORED_FIELDS,
    TEXT_SIZES,
    RunRecord,
    read_run_record,
    versions_key,
)
from orchestrator.records import to_data

DEFAULT_BUSY_SECONDS = 30.0  # how long a write waits for another writer's lock before it fails
INTEGRITY_PROBLEMS = 5  # problems of a corrupt file named in the message (integrity_check lists up to 100)
NOTE_SECONDS = 60.0  # repeat the "history locked" line this often while waiting


metadata = MetaData()

runs = Table(
    "runs",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("run_id", String(TEXT_SIZES["run_id"]), nullable=False, unique=True),
    Column("night", String(TEXT_SIZES["night"]), nullable=False, index=True),  # YYYY-MM-DD of the nightly
    Column("board", String(TEXT_SIZES["board"]), nullable=False),
    Column("model", String(TEXT_SIZES["model"]), nullable=False),
    Column("backend", String(TEXT_SIZES["backend"]), nullable=False),
    Column("status", String(TEXT_SIZES["status"]), nullable=False),  # ok | failed | infra
    Column("validity", String(TEXT_SIZES["validity"]), nullable=False),  # valid | degraded | invalid
    Column("reasons", JSON, nullable=False, default=list),
    Column("error", Text),
    Column("stage", String(TEXT_SIZES["stage"])),  # where a failed cell failed
    Column("versions", JSON, nullable=False, default=dict),
    Column("versions_key", String(TEXT_SIZES["versions_key"]), nullable=False, default=""),
    Column("pte_sha256", String(TEXT_SIZES["pte_sha256"])),
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
    Column("verdict", String(TEXT_SIZES["verdict"])),  # results.verdicts.Kind, set once the cell is judged
    Column("verdict_info", JSON),  # detail, ratio, drift, re-measure and interleaved re-test figures
    # Added with memory footprint (issue 13).
    Column("peak_rss_bytes", Integer),  # the run's peak RSS over every phase
    Column("planned_bytes", Integer),  # the program's planned arenas
    # Added with language models (issue 26): summary.json's `generation` figures (records.to_data).
    Column("generation", JSON),
    # Added with lab nights (issue 39): the workstation or worker that ran the cell.
    Column("host", String(TEXT_SIZES["host"])),
    # Added with energy (issue 55): summary.json's `energy`, measured or why not (records.to_data).
    Column("energy", JSON),
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

op_medians = Table(
    "op_medians",
    metadata,
    Column("run", Integer, ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True),
    Column("op_key", String(OP_KEY_SIZE), primary_key=True),  # "<chain>:<instruction>"
    Column("op_name", String(OP_NAME_SIZE), nullable=False),
    Column("median_ms", Float, nullable=False),
)

# Added with health checks (issue 55): each board's health-job streak and service state (lab/service.py).
board_service = Table(
    "board_service",
    metadata,
    Column("board", String(TEXT_SIZES["board"]), primary_key=True),
    Column("failures", Integer, nullable=False, default=0),  # failed health jobs in a row
    Column("out_since", DateTime(timezone=True)),  # out of service since; null: in service
    Column("reason", Text),  # the failed checks that took it out
    Column("checked_at", DateTime(timezone=True)),  # the last health job
    Column("checks", JSON),  # the last health job's checks: [{"name", "ok", "detail"}]
)


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
                    **{name: getattr(run, name) for name in STORED_FIELDS},
                    versions_key=versions_key(run.versions),
                    generation=to_data(run.generation),
                    energy=to_data(run.energy),
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
        stored = {name: getattr(row, name) for name in STORED_FIELDS}
        stored.update(generation=row.generation, energy=row.energy, created_at=row.created_at, **details)
        return read_run_record(stored, f"the history {self.where}: run {row.run_id}")


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
