"""Cells measured but not recorded: when the history fails to record a cell after it ran, the nightly keeps it here,
and `fab nightly --record-pending` (or the next nightly) records it.

    <reports>/nightly-<night>/pending/<board>--<model>--<backend>.json
        {"schema": 1, "history": <the history's holder id>, "record": to_data(RunRecord)}

The file names the history it belongs to (a hash of its URL), so another history never records it. A file is read
back through the history's own record reader (read_run_record): a damaged or edited one is reported with its
file and field, kept (nothing is lost, it can be mended) and skipped; it never stops the other files nor a nightly.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
from dataclasses import dataclass, field
from pathlib import Path

from sqlalchemy.exc import IntegrityError, SQLAlchemyError

from orchestrator import console
from orchestrator.fsutil import atomic_write_json, read_json
from orchestrator.lab import nightlock
from orchestrator.lab.history import History
from orchestrator.lab.history_url import problem
from orchestrator.lab.run_record import RunRecord, read_run_record
from orchestrator.lowering.programs import holder_id
from orchestrator.names import is_night
from orchestrator.records import to_data
from orchestrator.strictjson import JsonDataError

SCHEMA = 1


@dataclass
class Outcome:
    """What `record_pending` did: how many it recorded, and why the others are still pending."""

    recorded: int = 0
    malformed: list[str] = field(default_factory=list)  # files that cannot be read as a record: kept, named
    unrecorded: list[str] = field(default_factory=list)  # the history still fails to record them
    waiting: list[str] = field(default_factory=list)  # their night is being run by another nightly, which has them

    @property
    def left(self) -> list[str]:
        """Every reason a pending result is still there."""
        return [*self.malformed, *self.unrecorded, *self.waiting]

    @property
    def left_behind(self) -> list[str]:
        """Pending results that nobody else will record: a nightly that leaves them says so (exit 75)."""
        return [*self.malformed, *self.unrecorded]


def folder(reports_dir: Path, night: str) -> Path:
    return reports_dir / f"nightly-{night}" / "pending"


def path_of(reports_dir: Path, record: RunRecord) -> Path:
    board, model, backend = record.cell
    return folder(reports_dir, record.night) / f"{board}--{model}--{backend}.json"


def write(reports_dir: Path, history_url: str, record: RunRecord) -> Path:
    """Keep the record (written atomically: a kill leaves the previous version or none), with the time it was
    measured: recorded later, it keeps it."""
    stamped = dataclasses.replace(record, created_at=record.created_at or dt.datetime.now(dt.timezone.utc))
    path = path_of(reports_dir, record)
    atomic_write_json(path, {"schema": SCHEMA, "history": holder_id(history_url), "record": to_data(stamped)})
    return path


def load(path: Path, history: str) -> RunRecord | None:
    """The record in a pending file of the history whose holder id is `history`; None for another history's file.
    JsonDataError (naming the file and the field) for anything else: unreadable, not a pending file, a record that
    does not read back as one, or one of another night than its folder's."""
    try:
        document = read_json(path)
    except OSError as exc:
        raise JsonDataError(str(path), f"unreadable: {exc.strerror or exc}") from None
    if not isinstance(document, dict):
        raise JsonDataError(str(path), "not a pending nightly result (expected a mapping)")
    if document.get("schema") != SCHEMA:
        raise JsonDataError(str(path), f"not a pending nightly result of schema {SCHEMA}", "schema")
    if not isinstance(document.get("history"), str):
        raise JsonDataError(str(path), "expected the id of the history it belongs to", "history")
    if document["history"] != history:
        return None
    record = read_run_record(document.get("record"), str(path), "record")
    night = path.parent.parent.name.removeprefix("nightly-")
    if is_night(night) and record.night != night:  # its night's lock is the one held while it is recorded
        raise JsonDataError(str(path), f"{record.night} is not the night of its folder, {night}", "record.night")
    return record


def nights_pending(reports_dir: Path) -> list[str]:
    """The nights with a pending folder (a folder whose name is no night is not etlab's: left alone)."""
    nights = (p.parent.name.removeprefix("nightly-") for p in reports_dir.glob("nightly-*/pending"))
    return sorted(night for night in nights if is_night(night))


def record_pending(history: History, reports_dir: Path, *, held_night: str | None = None) -> Outcome:
    """Record every pending result of this history.

    The night `held_night` is ours (its lock is held); another night whose nightly runs now is left for later."""
    mine = holder_id(history.url)
    outcome = Outcome()
    for night in nights_pending(reports_dir):
        files = sorted(folder(reports_dir, night).glob("*.json"))
        if not files:
            continue
        lock = None if night == held_night else nightlock.try_night(history.url, night)
        if night != held_night and lock is None:
            outcome.waiting.append(
                f"night {night} is being run by another nightly: its pending results wait for it to end"
            )
            continue
        try:
            for path in files:
                try:
                    record = load(path, mine)
                except JsonDataError as exc:
                    outcome.malformed.append(f"{exc} (the file is kept: mend or remove it)")
                    continue
                if record is None:
                    continue
                label = f"{' / '.join(record.cell)} ({record.night})"
                try:
                    history.record(record)
                except IntegrityError:
                    console.warn(f"{label}: a later run of the night recorded the cell; the pending copy is dropped "
                                 f"(its bundle stays: {record.bundle_path})")  # fmt: skip
                except SQLAlchemyError as exc:
                    outcome.unrecorded.append(f"{label}: still not recorded: {problem(exc)}")
                    return outcome  # the history fails: the rest would too
                else:
                    outcome.recorded += 1
                    console.info(console.escape(f"recorded the pending result of {label}"))
                path.unlink(missing_ok=True)
            with contextlib.suppress(OSError):  # the night's folder goes once nothing is pending
                folder(reports_dir, night).rmdir()
                folder(reports_dir, night).parent.rmdir()
        finally:
            if lock is not None:
                lock.release()
    return outcome
