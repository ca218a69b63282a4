"""A board's own limits, measured once at `fab setup-board` and kept with its state: the memory read bandwidth
(the runner's `--probe-bandwidth`: every thread sums its slice of a buffer far larger than the last-level cache).

It is the roofline of an LLM decode step, which reads every weight once a token. It is re-measured whenever the
board is provisioned (a new runner, a new ExecuTorch) and when the state has none for the runner it holds, and it
travels with every run in `board_info_before.json`'s state, so a bundle says which bandwidth it was judged against.

The probe's answer is untrusted like everything a board sends: strict JSON, every field typed, a bandwidth above
0 and at most 1 TB/s (no board's memory comes near; a larger figure is a broken probe). A malformed answer is
refused (exit 65, naming the field); a board whose runner cannot run the probe says why and still runs programs.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Annotated, Any

import msgspec

from orchestrator import strictjson
from orchestrator.errors import BoardDataError
from orchestrator.records import Count, RecordError, Sha256, from_data, to_data

STATE_KEY = "limits"  # the board state's key (board/agent/etlab_agent/state.py STATE_KEYS)
MAX_BYTES_PER_S = 1e12  # 1 TB/s
PROBE_TIMEOUT_S = 300.0  # an emulated board reads its 256 MiB slowly
PROBE_ROUNDS = 4

BytesPerSecond = Annotated[
    float, msgspec.Meta(gt=0, le=MAX_BYTES_PER_S, description="bytes per second, above 0 and at most 1 TB/s")
]


@dataclass(frozen=True)
class ProbeAnswer:
    """`etlab_runner --probe-bandwidth`'s JSON (board/runner/README.md)."""

    probe: str
    threads: Annotated[int, msgspec.Meta(ge=1)]
    buffer_bytes: Annotated[int, msgspec.Meta(ge=1)]
    llc_bytes: Count
    rounds: Annotated[int, msgspec.Meta(ge=1)]
    round_seconds: tuple[Annotated[float, msgspec.Meta(gt=0)], ...]
    best_bytes_per_s: BytesPerSecond
    median_bytes_per_s: BytesPerSecond
    checksum: Count


@dataclass(frozen=True)
class ReadBandwidth:
    """The board's memory read bandwidth at `threads` threads, as measured with the runner built from
    `runner_source_sha256`."""

    bytes_per_s: BytesPerSecond  # the best round: the least disturbed
    median_bytes_per_s: BytesPerSecond
    threads: Annotated[int, msgspec.Meta(ge=1)]
    buffer_bytes: Annotated[int, msgspec.Meta(ge=1)]
    llc_bytes: Count
    runner_source_sha256: Sha256
    measured_at: str

    @property
    def gb_per_s(self) -> float:
        return self.bytes_per_s / 1e9


def read_probe(text: str, board: str, runner_source_sha256: str) -> ReadBandwidth:
    """The runner's answer checked field by field (BoardDataError, 65, naming the field)."""
    where = f"{board}: etlab_runner --probe-bandwidth"
    try:
        answer = from_data(strictjson.loads(text, where=where), ProbeAnswer, where=where)
    except ValueError as exc:  # strict JSON's and the record's refusals name what is wrong
        raise BoardDataError(str(exc)) from None
    if answer.probe != "read_bandwidth" or len(answer.round_seconds) != answer.rounds:
        raise BoardDataError(f"{where}: not a read-bandwidth answer ({answer.probe}, {answer.rounds} rounds)")
    if answer.median_bytes_per_s > answer.best_bytes_per_s * (1 + 1e-9):
        raise BoardDataError(f"{where}: median_bytes_per_s is above the best round's")
    return ReadBandwidth(
        bytes_per_s=answer.best_bytes_per_s,
        median_bytes_per_s=answer.median_bytes_per_s,
        threads=answer.threads,
        buffer_bytes=answer.buffer_bytes,
        llc_bytes=answer.llc_bytes,
        runner_source_sha256=runner_source_sha256,
        measured_at=dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
    )


def state_value(bandwidth: ReadBandwidth) -> str:
    """How the state keeps it (state values are text)."""
    return json.dumps(to_data(bandwidth), sort_keys=True, separators=(",", ":"))


def recorded_bandwidth(state: Mapping[str, Any] | None, where: str) -> ReadBandwidth | None:
    """The bandwidth a state (the board's, or a bundle's copy of it) records; None when it records none.
    RecordError (65) when what it records is malformed or absurd."""
    text = (state or {}).get(STATE_KEY)
    if text is None:
        return None
    if not isinstance(text, str):
        raise RecordError(where, STATE_KEY, "expected the bandwidth record as text")
    try:
        data = strictjson.loads(text, where=f"{where}: {STATE_KEY}")
    except ValueError as exc:
        raise RecordError(where, STATE_KEY, str(exc)) from None
    return from_data(data, ReadBandwidth, where=where, field=STATE_KEY)


def current(state: Mapping[str, Any] | None, runner_source_sha256: str) -> bool:
    """Whether the state's bandwidth was measured with the runner it holds now."""
    try:
        recorded = recorded_bandwidth(state, "state")
    except RecordError:
        return False
    return recorded is not None and recorded.runner_source_sha256 == runner_source_sha256
