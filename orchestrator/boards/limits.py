"""A board's own limits, measured once at `fab setup-board` (deploy/board_limits.py) and kept with its state: the
memory read bandwidth (the runner's `--probe-bandwidth`: every thread sums its slice of a buffer far larger than the
last-level cache), and the peak arithmetic rate of XNNPACK's fp32 and int8 GEMMs (ComputePeak, state key `compute`).

It is the roofline of an LLM decode step, which reads every weight once a token. It is re-measured when the runner
or the board changes: whenever the board is provisioned (a new runner, a new ExecuTorch), when the state has none for
the runner it holds, and when the board's conditions differ from those recorded with it (MeasuredUnder: its kernel,
firmware, config.txt and cpufreq governor, which move a Pi's limits; a record from before they were kept counts as
unknown and is measured again once). deploy/board_limits.py compares them with results/validity.py's
condition_changes. It travels with every run in `board_info_before.json`'s state, so a bundle says which bandwidth
it was judged against.

The probe's answer is untrusted like everything a board sends: strict JSON, every field typed, a bandwidth above
0 and at most 1 TB/s (no board's memory comes near; a larger figure is a broken probe). A malformed answer is
refused (exit 65, naming the field); a board whose runner cannot run the probe says why and still runs programs.
A recorded measure is read back as strictly (RecordError, 65, naming the field), its conditions too.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Annotated, Any, TypeVar

import msgspec

from orchestrator import strictjson
from orchestrator.errors import BoardDataError
from orchestrator.records import Count, RecordError, Sha256, from_data, to_data

STATE_KEY = "limits"  # the board state's key (board/agent/etlab_agent/state.py STATE_KEYS)
MAX_BYTES_PER_S = 1e12  # 1 TB/s
PROBE_TIMEOUT_S = 300.0  # an emulated board reads its 256 MiB slowly
PROBE_ROUNDS = 4

Condition = Annotated[str, msgspec.Meta(max_length=200, description="a board condition, at most 200 characters")]


@dataclass(frozen=True)
class MeasuredUnder:
    """The board's conditions a limit was measured under, from the agent's `info` as results/validity.py's
    board_conditions reads it; None where the board does not say (no vcgencmd, no config.txt, no cpufreq)."""

    kernel: Condition | None
    firmware: Condition | None  # `vcgencmd version`'s build date and version
    config_txt_sha256: Sha256 | None
    governor: Condition | None


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
    conditions: MeasuredUnder | None = None  # None: recorded before conditions were kept (unknown)

    @property
    def gb_per_s(self) -> float:
        return self.bytes_per_s / 1e9


def read_probe(
    text: str, board: str, runner_source_sha256: str, conditions: MeasuredUnder | None = None
) -> ReadBandwidth:
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
        conditions=conditions,
    )


def state_value(bandwidth: ReadBandwidth) -> str:
    """How the state keeps it (state values are text)."""
    return json.dumps(to_data(bandwidth), sort_keys=True, separators=(",", ":"))


def recorded_bandwidth(state: Mapping[str, Any] | None, where: str) -> ReadBandwidth | None:
    """The bandwidth a state (the board's, or a bundle's copy of it) records; None when it records none.
    RecordError (65) when what it records is malformed or absurd."""
    return _recorded(state, where, STATE_KEY, ReadBandwidth)


_Record = TypeVar("_Record")


def _recorded(state: Mapping[str, Any] | None, where: str, key: str, kind: type[_Record]) -> _Record | None:
    text = (state or {}).get(key)
    if text is None:
        return None
    if not isinstance(text, str):
        raise RecordError(where, key, "expected the record as text")
    try:
        data = strictjson.loads(text, where=f"{where}: {key}")
    except ValueError as exc:
        raise RecordError(where, key, str(exc)) from None
    return from_data(data, kind, where=where, field=key)


def current_compute(state: Mapping[str, Any] | None, runner_source_sha256: str) -> bool:
    """Whether the state's compute peak was measured with the runner it holds now."""
    return _measured_with(state, COMPUTE_STATE_KEY, runner_source_sha256)


def current(state: Mapping[str, Any] | None, runner_source_sha256: str) -> bool:
    """Whether the state's bandwidth was measured with the runner it holds now."""
    return _measured_with(state, STATE_KEY, runner_source_sha256)


def _measured_with(state: Mapping[str, Any] | None, key: str, runner_source_sha256: str) -> bool:
    kind: type[ReadBandwidth | ComputePeak] = ReadBandwidth if key == STATE_KEY else ComputePeak
    try:
        recorded = _recorded(state, "state", key, kind)
    except RecordError:
        return False
    return recorded is not None and recorded.runner_source_sha256 == runner_source_sha256


# ---------------------------------------------------------------- peak arithmetic rate

COMPUTE_STATE_KEY = "compute"  # the board state's key for the peak arithmetic rate
MAX_OPS_PER_S = 1e15  # 1 POP/s: far above any board's CPU; a larger figure is a broken probe

OpsPerSecond = Annotated[
    float, msgspec.Meta(gt=0, le=MAX_OPS_PER_S, description="operations per second, above 0 and at most 1e15")
]


@dataclass(frozen=True)
class ComputePeak:
    """The board's peak arithmetic rate for the kernels it runs: XNNPACK's fp32 GEMM and its int8 GEMM (8-bit
    weights, activations quantized per row at run time), each timed as a lowered Linear program the runner runs at
    `threads` threads, as measured with the runner built from `runner_source_sha256`. A multiply-add is 2 ops."""

    fp32_flops_per_s: OpsPerSecond
    int8_ops_per_s: OpsPerSecond | None  # None: the int8 program could not run on this board
    threads: Annotated[int, msgspec.Meta(ge=1)]
    gemm: tuple[Annotated[int, msgspec.Meta(ge=1)], ...]  # M, K, N of the timed GEMM
    runner_source_sha256: Sha256
    measured_at: str
    conditions: MeasuredUnder | None = None  # None: recorded before conditions were kept (unknown)

    @property
    def fp32_gflops(self) -> float:
        return self.fp32_flops_per_s / 1e9

    @property
    def int8_gops(self) -> float | None:
        return None if self.int8_ops_per_s is None else self.int8_ops_per_s / 1e9


def compute_state_value(peak: ComputePeak) -> str:
    return json.dumps(to_data(peak), sort_keys=True, separators=(",", ":"))


def recorded_compute(state: Mapping[str, Any] | None, where: str) -> ComputePeak | None:
    """The peak arithmetic rate a state (the board's, or a bundle's copy) records; None when it records none.
    RecordError (65) when what it records is malformed or absurd."""
    return _recorded(state, where, COMPUTE_STATE_KEY, ComputePeak)


def peak_text(peak: ComputePeak | None) -> str:
    """ "212 GFLOP/s fp32, 690 GOP/s int8"."""
    if peak is None:
        return "not measured: fab setup-board"
    int8 = peak.int8_gops
    return f"{rate_text(peak.fp32_gflops)} GFLOP/s fp32" + (f", {rate_text(int8)} GOP/s int8" if int8 else "")


LIMITS_CAPTION = "limits: memory read bandwidth, peak GEMM rate fp32/int8 (fab setup-board measures them)"


def limits_cell(bandwidth: ReadBandwidth | None, peak: ComputePeak | None) -> str:
    """A board's limits in one table cell: "10.1 GB/s, 274/371 GOP/s" (fp32 GFLOP/s / int8 GOP/s)."""
    if bandwidth is None and peak is None:
        return "not measured: fab setup-board"
    read = f"{bandwidth.gb_per_s:.1f} GB/s" if bandwidth is not None else "read not measured"
    if peak is None:
        return f"{read}, peak not measured"
    int8 = peak.int8_gops
    return f"{read}, {rate_text(peak.fp32_gflops)}/{rate_text(int8) if int8 else '—'} GOP/s"


def rate_text(value: float) -> str:
    """Three significant figures without an exponent: 274, 15.3, 0.452."""
    return f"{value:.0f}" if value >= 100 else f"{value:.1f}" if value >= 10 else f"{value:.2g}"
