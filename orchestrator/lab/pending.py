"""Cells measured but not recorded: when the history fails to record a cell after it ran, the nightly keeps it here,
and `fab nightly --record-pending` (or the next nightly) records it.

    <reports>/nightly-<night>/pending/<board>--<model>--<backend>.json
        {"schema": 1, "history": <the history's holder id>, "record": <RunRecord fields, verdict included>}

The file names the history it belongs to (a hash of its URL), so another history never records it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
from pathlib import Path

from sqlalchemy.exc import IntegrityError, SQLAlchemyError

from orchestrator import console
from orchestrator.fsutil import atomic_write_json, read_json
from orchestrator.lab import nightlock
from orchestrator.lab.history import History, RunRecord, problem
from orchestrator.lowering.programs import holder_id

SCHEMA = 1
_FIELDS = {f.name for f in dataclasses.fields(RunRecord)}


def folder(reports_dir: Path, night: str) -> Path:
    return reports_dir / f"nightly-{night}" / "pending"


def path_of(reports_dir: Path, record: RunRecord) -> Path:
    board, model, backend = record.cell
    return folder(reports_dir, record.night) / f"{board}--{model}--{backend}.json"


def write(reports_dir: Path, history_url: str, record: RunRecord) -> Path:
    """Keep the record (written atomically: a kill leaves the previous version or none)."""
    data = dataclasses.asdict(record)
    data["ops"] = {key: list(value) for key, value in record.ops.items()}
    data["created_at"] = (record.created_at or dt.datetime.now(dt.timezone.utc)).isoformat()
    path = path_of(reports_dir, record)
    atomic_write_json(path, {"schema": SCHEMA, "history": holder_id(history_url), "record": data})
    return path


def _load(path: Path, history: str) -> RunRecord | None:
    """The record in a pending file of this history; None for another history's file. ValueError when unreadable."""
    try:
        document = read_json(path)
    except (OSError, ValueError, RecursionError) as exc:
        raise ValueError(f"{path}: unreadable: {exc}") from None
    if (
        not isinstance(document, dict)
        or document.get("schema") != SCHEMA
        or not isinstance(document.get("record"), dict)
    ):
        raise ValueError(f"{path}: not a pending nightly result")
    if document.get("history") != history:
        return None
    data = {key: value for key, value in document["record"].items() if key in _FIELDS}
    try:
        data["ops"] = {str(key): (str(name), float(ms)) for key, (name, ms) in (data.get("ops") or {}).items()}
        data["created_at"] = dt.datetime.fromisoformat(data["created_at"]) if data.get("created_at") else None
        return RunRecord(**data)
    except (TypeError, ValueError, KeyError) as exc:
        raise ValueError(f"{path}: malformed record: {exc}") from None


def nights_pending(reports_dir: Path) -> list[str]:
    return sorted(p.parent.name.removeprefix("nightly-") for p in reports_dir.glob("nightly-*/pending"))


def record_pending(history: History, reports_dir: Path, *, held_night: str | None = None) -> tuple[int, list[str]]:
    """Record every pending result of this history; returns (how many were recorded, why some were left).

    The night `held_night` is ours (its lock is held); another night whose nightly runs now is left for later."""
    mine = holder_id(history.url)
    recorded, left = 0, []
    for night in nights_pending(reports_dir):
        files = sorted(folder(reports_dir, night).glob("*.json"))
        if not files:
            continue
        lock = None if night == held_night else nightlock.try_night(history.url, night)
        if night != held_night and lock is None:
            left.append(f"night {night} is being run by another nightly: its pending results wait for it to end")
            continue
        try:
            for path in files:
                try:
                    record = _load(path, mine)
                except ValueError as exc:
                    left.append(str(exc))
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
                    left.append(f"{label}: still not recorded: {problem(exc)}")
                    return recorded, left  # the history fails: the rest would too
                else:
                    recorded += 1
                    console.info(console.escape(f"recorded the pending result of {label}"))
                path.unlink(missing_ok=True)
            with contextlib.suppress(OSError):  # the night's folder goes once nothing is pending
                folder(reports_dir, night).rmdir()
                folder(reports_dir, night).parent.rmdir()
        finally:
            if lock is not None:
                lock.release()
    return recorded, left
