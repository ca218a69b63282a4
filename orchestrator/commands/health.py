"""Board health (issue 55): `fab boards --health` runs the health job on the selected boards now, `fab
return-to-service` brings an out-of-service board back after one that passes, and `fab boards` shows each board's
service state. The state lives in the history the nightly records into (lab/service.py), so every host of a lab
sees the same; without one, the default SQLite history."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from sqlalchemy.exc import SQLAlchemyError

from orchestrator import console
from orchestrator.boards.fanout import BoardOutcome, fan_out, stage
from orchestrator.boards.inventory import Board, load_inventory
from orchestrator.commands.render_boards import print_details
from orchestrator.deploy.health import CHECKS, HealthCheck, HealthReport, check_health, unreachable
from orchestrator.errors import EtlabError, ExitCode, InventoryError
from orchestrator.lab import service
from orchestrator.lab.history import History
from orchestrator.lab.history_url import default_url, problem
from orchestrator.lab.matrix import load_history_url
from orchestrator.transport import connect


def history_url(inventory: str | None) -> str:
    """The inventory's nightly history, else the default one (where `fab nightly` records without one). A malformed
    `history:` is named (64), never another history read or written in its place."""
    try:
        found = load_inventory(Path(inventory) if inventory else None)
    except InventoryError:
        if inventory:  # named by the user: its problems are theirs to fix
            raise
        return default_url()
    if found.nightly_node is None:
        return default_url()
    return load_history_url(found) or default_url()


def _open(url: str, *, create: bool) -> History | None:
    """The history, or None (said) when it cannot be opened; a default SQLite file is not made just to be read."""
    if not create and url.startswith("sqlite:///") and not Path(url.removeprefix("sqlite:///")).is_file():
        return None
    try:
        return History(url)
    except (EtlabError, SQLAlchemyError) as exc:
        console.warn(f"service state unknown: {problem(exc)}")
        return None


def service_states(inventory: str | None) -> dict[str, service.ServiceState] | None:
    """Each board's service state for `fab boards` (None: no history to read it from)."""
    history = _open(history_url(inventory), create=False)
    if history is None:
        return None
    try:
        return service.states(history)
    except SQLAlchemyError as exc:
        console.warn(f"service state unknown: {problem(exc)}")
        return None
    finally:
        history.close()


def service_cell(states: dict[str, service.ServiceState] | None, board: str) -> str:
    if states is None:
        return "—"
    found = states.get(board)
    if found is None or found.in_service:
        return "in service" if found is None or not found.failures else f"in service ({found.failures} failed)"
    return f"OUT since {service.when(found.out_since)}"


def say_out_of_service(states: dict[str, service.ServiceState] | None) -> None:
    """Under a boards table: why each board that is out of service is out, and how it comes back."""
    for found in sorted((states or {}).values(), key=lambda s: s.board):
        if not found.in_service:
            console.warn(f"{found.board}: {found.describe()}; {service.bring_back_hint(found.board)}")


def _check_cell(check: HealthCheck | None) -> str:
    return "—" if check is None else ("ok" if check.ok else "FAILED")


def _health_jobs(boards: Sequence[Board]) -> list[tuple[BoardOutcome[HealthReport], HealthReport]]:
    def one(board: Board) -> HealthReport:
        with stage("connect"), connect(board) as conn, stage("health"):
            return check_health(conn)

    outcomes = fan_out(boards, one)
    return [(o, o.value if o.ok and o.value else unreachable(o.board.name, o.error or "?")) for o in outcomes]


def _record(history: History | None, report: HealthReport, *, returning: bool) -> service.ServiceState | None:
    if history is None:
        return None
    try:
        write = service.return_to_service if returning else service.record_health
        return write(history, report)
    except SQLAlchemyError as exc:
        console.warn(f"{report.board}: health job not recorded ({problem(exc)})")
        return None


def health_task(boards: Sequence[Board], inventory: str | None) -> int:
    """`fab boards --health`: each board's health job, a row of checks each, recorded (two failures in a row take a
    board out of service). Exit 0 when every board passed, 1 when one failed its checks, 69 when one was not
    reached."""
    history = _open(history_url(inventory), create=True)
    try:
        jobs = _health_jobs(boards)
        rows, states = [], {}
        for _outcome, report in jobs:
            after = _record(history, report, returning=False)
            if after is not None:
                states[report.board] = after
            by_name = {check.name: check for check in report.checks}
            cells = [_check_cell(by_name.get(name)) for name in CHECKS]
            shown = service_cell(states if after else None, report.board)
            rows.append([report.board, "ok" if report.ok else "FAILED", *cells, shown])
    finally:
        if history is not None:
            history.close()
    console.table("health", ["board", "health", *CHECKS, "service"], rows)
    for _outcome, report in jobs:
        if not report.ok:
            console.warn(f"{report.board}: health job failed: {report.reason}")
    say_out_of_service(states)
    print_details([outcome for outcome, _ in jobs])
    if any(not outcome.ok for outcome, _ in jobs):
        return ExitCode.UNAVAILABLE
    return ExitCode.OK if all(report.ok for _, report in jobs) else ExitCode.FAILED


def return_to_service_task(boards: Sequence[Board], inventory: str | None) -> int:
    """`fab return-to-service`: the health job on each board; one that passes is back in service. Exit 0 when every
    board is in service afterwards, 1 when one failed its health job again (it stays out, its streak grows)."""
    history = _open(history_url(inventory), create=True)
    if history is None:
        raise EtlabError("no history to keep the boards' service state in", hint="see the warning above")
    code = ExitCode.OK
    try:
        for _outcome, report in _health_jobs(boards):
            after = _record(history, report, returning=True)
            if report.ok and after is not None and after.in_service:
                console.info(f"{report.board}: back in service (health job passed)")
            else:
                code = ExitCode.FAILED
                state = after.describe() if after is not None else "service state not recorded"
                console.error(f"{report.board}: health job failed: {report.reason}; {state}")
    finally:
        history.close()
    return code
