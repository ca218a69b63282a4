"""A nightly cell's outcome as the history keeps it: RunRecord, and its one reader.

A record has one reader, `read_run_record`, whether it comes from a history row or a pending file, and one JSON form,
`to_data(record)` (orchestrator/records.py). Its field types carry every check: types, ranges, the columns' sizes
(which PostgreSQL enforces and SQLite does not) and text a database can store. No SQLAlchemy here: the judging, the
reports and the pending files use records without the database; the history's tables (history.py) take their
columns' sizes from TEXT_SIZES.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import socket
import sys
from dataclasses import dataclass, field
from typing import Annotated, Any

import msgspec

from orchestrator.deploy.limits import MAX_THREADS
from orchestrator.names import is_night
from orchestrator.records import RecordError, Sha256, complete, from_data
from orchestrator.results.summary import VALIDITY_LEVELS, EnergySummary, Generation
from orchestrator.results.verdicts import Kind
from orchestrator.strictjson import MAX_MAGNITUDE, JsonDataError

# The `runs` columns' lengths (history.py's table declares them from here): a record's text is checked against them.
TEXT_SIZES = {
    "run_id": 96, "night": 10, "board": 128, "model": 128, "backend": 32, "status": 16, "validity": 16,
    "stage": 32, "versions_key": 200, "pte_sha256": 64, "verdict": 24, "host": 128,
}  # fmt: skip
OP_KEY_SIZE, OP_NAME_SIZE = 64, 200  # op_medians' columns: a record's operator keys and names

# Text a database column stores as it is: PostgreSQL refuses NUL, and UTF-8 has no lone surrogate (which a JSON file
# can spell: "\ud800").
_STORABLE = "^[^\x00\ud800-\udfff]*$"


def _text(size: int | None = None, least: int = 0) -> msgspec.Meta:
    return msgspec.Meta(min_length=least, max_length=size, pattern=_STORABLE)


Text = Annotated[str, _text()]
RunId = Annotated[str, _text(TEXT_SIZES["run_id"], 1)]
Night = Annotated[str, _text(TEXT_SIZES["night"], 1)]  # and a real date (is_night): __post_init__
Board = Annotated[str, _text(TEXT_SIZES["board"], 1)]
Model = Annotated[str, _text(TEXT_SIZES["model"], 1)]
Backend = Annotated[str, _text(TEXT_SIZES["backend"], 1)]
Stage = Annotated[str, _text(TEXT_SIZES["stage"])]
Host = Annotated[str, _text(TEXT_SIZES["host"])]
BundlePath = Annotated[str, _text(4096)]
OpKey = Annotated[str, _text(OP_KEY_SIZE, 1)]
OpName = Annotated[str, _text(OP_NAME_SIZE)]
Finite = Annotated[float, msgspec.Meta(ge=-sys.float_info.max, le=sys.float_info.max, description="a finite number")]
Threads = Annotated[int, msgspec.Meta(ge=1, le=MAX_THREADS)]
Bytes = Annotated[int, msgspec.Meta(ge=0, le=MAX_MAGNITUDE)]
STATUSES = ("ok", "failed", "infra")


def _one_of(words: tuple[str, ...]) -> msgspec.Meta:
    """A closed set of words, checked when read; typed `str` for the code that builds records from other text."""
    return msgspec.Meta(pattern=f"^({'|'.join(words)})$", description=f"one of {', '.join(words)}")


Status = Annotated[str, _one_of(STATUSES)]
Validity = Annotated[str, _one_of(VALIDITY_LEVELS)]
Verdict = Annotated[str, _one_of(tuple(kind.value for kind in Kind))]


@dataclass
class RunRecord:
    """One nightly cell's outcome, as stored (a pending file holds `to_data(record)`)."""

    run_id: RunId
    night: Night
    board: Board
    model: Model
    backend: Backend
    status: Status
    validity: Validity = "invalid"
    reasons: list[Text] = field(default_factory=list)
    error: Text | None = None
    stage: Stage | None = None
    versions: dict[str, Text] = field(default_factory=dict)
    pte_sha256: Sha256 | None = None
    threads: Threads | None = None
    median_ms: Finite | None = None
    p90_ms: Finite | None = None
    mean_ms: Finite | None = None
    cv: Finite | None = None
    conditions: dict[str, Any] = field(default_factory=dict)
    bundle_path: BundlePath | None = None
    latencies_ms: list[Finite] = field(default_factory=list)
    ops: dict[OpKey, tuple[OpName, Finite]] = field(default_factory=dict)  # op_key -> (name, median ms)
    created_at: dt.datetime | None = None
    environment: dict[str, Text] = field(default_factory=dict)
    verdict: Verdict | None = None
    verdict_info: dict[str, Any] = field(default_factory=dict)  # CellVerdict.info(): checked by VerdictFigures
    peak_rss_bytes: Bytes | None = None
    planned_bytes: Bytes | None = None
    generation: Generation | None = None  # text-generation programs: TTFT, decode tok/s, token agreement, ...
    host: Host | None = None  # the workstation or lab worker that ran the cell
    energy: EnergySummary | None = None  # summary.json's `energy`: measured, or why not (None: not recorded)

    def __post_init__(self) -> None:
        if not is_night(self.night):
            raise ValueError(f"night: expected a night, YYYY-MM-DD, got {self.night!r}")

    @property
    def identity(self) -> tuple[str | None, str]:
        """What ran: the .pte's sha256 and the versions around it (workstation, runtime, runner, board image)."""
        return (self.pte_sha256, versions_key({**self.versions, **self.environment}))

    @property
    def cell(self) -> tuple[str, str, str]:
        return (self.board, self.model, self.backend)

    @property
    def joules_per_inference(self) -> float | None:
        """The energy of one inference (of a language model: one whole generation); None when not measured."""
        return self.energy.joules_per_inference if self.energy and self.energy.status == "measured" else None

    @property
    def mj_per_token(self) -> float | None:
        """A language model's millijoules per generated token; None when not measured."""
        joules = self.energy.joules_per_token if self.energy and self.energy.status == "measured" else None
        return joules * 1000 if joules is not None else None

    @property
    def roofline_share(self) -> float | None:
        """A language model's decode against its board's memory roofline (a share, 0.62); None when not measured."""
        roofline = self.generation.roofline if self.generation is not None else None
        return roofline.share if roofline is not None else None


@dataclass(frozen=True)
class RetestFigures:
    """The figures the reports format of a verdict's interleaved re-test (abtest.Retest; other keys pass)."""

    seconds: Finite | None = None
    ratio: Finite | None = None
    budget_seconds: Finite | None = None
    rounds: Finite | None = None


@dataclass(frozen=True)
class VerdictFigures:
    """CellVerdict.info()'s keys, typed as the reports read them; `verdict_info` stays whole (a newer etlab's other
    keys pass)."""

    baseline_median_ms: Finite | None = None
    ratio: Finite | None = None
    drift: Finite | None = None
    detail: str | None = None
    slower_ops: list[dict[str, Any]] | None = None
    retest: RetestFigures | None = None
    remeasured: dict[str, Any] | None = None
    memory: dict[str, Any] | None = None


# RunRecord fields stored as columns of history.py's `runs` under the same name.
STORED_FIELDS = (
    "run_id", "night", "board", "model", "backend", "status", "validity", "reasons", "error", "stage", "versions",
    "pte_sha256", "threads", "median_ms", "p90_ms", "mean_ms", "cv", "conditions", "bundle_path", "environment",
    "verdict", "verdict_info", "peak_rss_bytes", "planned_bytes", "host",
)  # fmt: skip


def read_run_record(data: Any, where: str, within: str = "") -> RunRecord:
    """The one reader of a record (a history row, a pending file): every field checked, JsonDataError naming `where`
    and the field (after `within`, the record's own place in a file) otherwise. Keys it does not know are left out
    (a newer etlab's); null is what a history row's empty column holds: the field's default."""
    try:
        if not isinstance(data, dict):
            raise RecordError(where, within, f"a run record must be a mapping, got {type(data).__name__}")
        present = {key: value for key, value in data.items() if value is not None}
        record = from_data(present, RunRecord, where=where, field=within)
        from_data(record.verdict_info, VerdictFigures, where=where, field=_join(within, "verdict_info"))
    except RecordError as exc:
        problem = _UNSTORABLE if repr(_STORABLE) in exc.problem else exc.problem  # say why, not the pattern
        raise JsonDataError(exc.where, problem, exc.field or None) from None
    return complete(record)  # its generation figures written again (a page, a pending file) in full


_UNSTORABLE = "holds a NUL or a lone surrogate, which a database cannot store"


def _join(within: str, name: str) -> str:
    return f"{within}.{name}" if within else name


def versions_key(versions: dict[str, str]) -> str:
    return json.dumps(versions, sort_keys=True)


def host_name() -> str:
    """The name a host's records carry: ETLAB_HOST, else the machine's name."""
    return (os.environ.get("ETLAB_HOST") or socket.gethostname() or "?")[:128]
