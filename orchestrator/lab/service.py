"""Boards in and out of service (issue 55), kept in the history every host of a lab reaches.

A board whose health job (deploy/health.py) fails FAILURES_TO_OUT times in a row goes out of service: nights skip it
as an infrastructure failure, never a regression, and `fab boards` shows why and since when. A passing health job
resets the streak but never brings a board back by itself: `fab return-to-service` does, after one that passes
(LAVA's rule: a person looks at a board that kept failing).
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any

from sqlalchemy import select
from sqlalchemy.exc import SQLAlchemyError

from orchestrator import console
from orchestrator.deploy.cells import CellOutcome
from orchestrator.deploy.health import BoardUnhealthy, HealthReport, check_health, unreachable
from orchestrator.errors import EtlabError
from orchestrator.lab.history import History, board_service
from orchestrator.lab.history_url import problem
from orchestrator.transport import BoardConnection

FAILURES_TO_OUT = 2
REASON_CHARS = 500


@dataclass(frozen=True)
class ServiceState:
    """One board's service state: in service unless `out_since` is set."""

    board: str
    failures: int = 0  # failed health jobs in a row
    out_since: dt.datetime | None = None
    reason: str | None = None
    checked_at: dt.datetime | None = None
    checks: tuple[dict[str, Any], ...] = ()

    @property
    def in_service(self) -> bool:
        return self.out_since is None

    def describe(self) -> str:
        if self.in_service:
            streak = f" ({self.failures} failed health job(s) in a row)" if self.failures else ""
            return f"in service{streak}"
        return f"out of service since {when(self.out_since)}: {self.reason}"


def when(moment: dt.datetime | None) -> str:
    return "?" if moment is None else _utc(moment).strftime("%Y-%m-%d %H:%M UTC")


def _utc(moment: dt.datetime) -> dt.datetime:
    return moment.replace(tzinfo=dt.timezone.utc) if moment.tzinfo is None else moment  # SQLite keeps it naive


def _storable(text: str) -> str:
    return text.replace("\x00", "?")[:REASON_CHARS]  # board text: PostgreSQL refuses NUL


def _state(row: Any) -> ServiceState:
    checks = row.checks if isinstance(row.checks, list) else []
    return ServiceState(
        row.board,
        int(row.failures or 0),
        _utc(row.out_since) if row.out_since is not None else None,
        row.reason,
        _utc(row.checked_at) if row.checked_at is not None else None,
        tuple(c for c in checks if isinstance(c, dict)),
    )


def states(history: History) -> dict[str, ServiceState]:
    """Every board the history has a health job of."""
    with history.engine.connect() as connection:
        return {row.board: _state(row) for row in connection.execute(select(board_service))}


def state(history: History, board: str) -> ServiceState:
    with history.engine.connect() as connection:
        row = connection.execute(select(board_service).where(board_service.c.board == board)).first()
    return _state(row) if row is not None else ServiceState(board)


def _write(history: History, board: str, report: HealthReport, *, returning: bool) -> ServiceState:
    checks = [{"name": c.name, "ok": c.ok, "detail": _storable(c.detail)} for c in report.checks]
    with history.engine.begin() as connection:
        row = connection.execute(select(board_service).where(board_service.c.board == board)).first()
        before = _state(row) if row is not None else ServiceState(board)
        failures = 0 if report.ok else before.failures + 1
        out_since, reason = before.out_since, before.reason
        if returning and report.ok:
            out_since, reason = None, None
        elif out_since is None and failures >= FAILURES_TO_OUT:
            out_since, reason = report.at, _storable(report.reason)
        values = {"failures": failures, "out_since": out_since, "reason": reason, "checked_at": report.at,
                  "checks": checks}  # fmt: skip
        if row is None:
            connection.execute(board_service.insert().values(board=board, **values))
        else:
            connection.execute(board_service.update().where(board_service.c.board == board).values(**values))
    return ServiceState(board, failures, out_since, reason, report.at, tuple(checks))


def record_health(history: History, report: HealthReport) -> ServiceState:
    """A health job's outcome: the streak grows or resets; the second failure in a row takes the board out."""
    return _write(history, report.board, report, returning=False)


def return_to_service(history: History, report: HealthReport) -> ServiceState:
    """`fab return-to-service`: back in service when `report` passed; otherwise it counts as one more failure."""
    return _write(history, report.board, report, returning=True)


def bring_back_hint(board: str) -> str:
    return f"`fab return-to-service --board {board}` brings it back after a passing health job"


class NightHealth:
    """One board's health in a night: out of service (its cells skipped), or its health job run after the setup and
    before the first cell (`gate`), recorded in the history. A board that could not be reached or set up failed its
    health job too (`after`)."""

    def __init__(self, history: History, board: str) -> None:
        self.history, self.board, self.ran = history, board, False

    def out_of_service(self) -> ServiceState | None:
        """The board's state when it is out of service; None when it is in (or the history cannot say)."""
        try:
            found = state(self.history, self.board)
        except (SQLAlchemyError, EtlabError) as exc:
            console.warn(f"{self.board}: service state unknown ({problem(exc)}): taken as in service")
            return None
        return None if found.in_service else found

    def gate(self, conn: BoardConnection) -> None:
        self.ran = True
        report = check_health(conn)
        self._note(report)
        if not report.ok:
            raise BoardUnhealthy(f"health job failed: {report.reason}")

    def after(self, cells: list[CellOutcome]) -> None:
        failed_early = [c for c in cells if c.infrastructure and c.stage in ("connect", "setup")]
        if not self.ran and cells and len(failed_early) == len(cells):
            self._note(unreachable(self.board, failed_early[0].error or "unreachable"))

    def _note(self, report: HealthReport) -> None:
        try:
            after = record_health(self.history, report)
        except (SQLAlchemyError, EtlabError) as exc:
            console.warn(f"{self.board}: health job not recorded in the history ({problem(exc)})")
            return
        if not after.in_service and after.failures == FAILURES_TO_OUT:
            console.warn(f"{self.board}: out of service: {after.reason}; {bring_back_hint(self.board)}")
        elif not report.ok:
            console.warn(f"{self.board}: health job failed ({after.failures} of {FAILURES_TO_OUT} in a row before "
                         f"it goes out of service): {report.reason}")  # fmt: skip
