"""A nightly cell's outcome as the history keeps it: RunRecord, and its one reader.

A record has one reader, `RunRecord.from_dict`, whether it comes from a history row or a pending file (every field
checked: types, ranges, the columns' sizes, which PostgreSQL enforces and SQLite does not), and one JSON form,
`RunRecord.to_dict`. No SQLAlchemy here: the judging, the reports and the pending files use records without the
database; the history's tables (history.py) take their columns' sizes from TEXT_SIZES.
"""

from __future__ import annotations

import datetime as dt
import json
import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from typing import Any

from orchestrator.deploy.limits import MAX_THREADS
from orchestrator.names import is_night
from orchestrator.records import to_data
from orchestrator.results.summary import VALIDITY_LEVELS, Generation, SummaryError, read_generation
from orchestrator.results.verdicts import Kind
from orchestrator.strictjson import MAX_MAGNITUDE, JsonDataError

# The `runs` columns' lengths (history.py's table declares them from here): a record's text is checked against them.
TEXT_SIZES = {
    "run_id": 96, "night": 10, "board": 128, "model": 128, "backend": 32, "status": 16, "validity": 16,
    "stage": 32, "versions_key": 200, "pte_sha256": 64, "verdict": 24,
}  # fmt: skip
OP_KEY_SIZE, OP_NAME_SIZE = 64, 200  # op_medians' columns: a record's operator keys and names


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
        data["generation"] = to_data(self.generation)
        return data

    @classmethod
    def from_dict(cls, data: Any, where: str, within: str = "") -> RunRecord:
        """The one reader of a record (a history row, a pending file): every field checked, JsonDataError naming
        `where` and the field (after `within`, the record's own place in a file) otherwise. Keys it does not know
        are left out (a newer etlab's)."""
        return _RecordReader(data, where, within).record()


# Fields to_dict writes as they are (JSON already); ops, created_at and generation have their own form.
_PLAIN_FIELDS = tuple(f.name for f in fields(RunRecord) if f.name not in ("ops", "created_at", "generation"))
# RunRecord fields stored as columns of history.py's `runs` under the same name.
STORED_FIELDS = (
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
        size = size or TEXT_SIZES.get(name)
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
        key_size, name_size = OP_KEY_SIZE, OP_NAME_SIZE
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
            return read_generation(self.data.get("generation"), "record")
        except SummaryError as exc:  # field "generation.token_ms", problem "expected an object, got array"
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
