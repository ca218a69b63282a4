"""setup-board's measures of a board's own limits, kept with its state (boards/limits.py reads them back):

- its memory read bandwidth: the runner's `--probe-bandwidth` at the board's thread count;
- its peak arithmetic rate for the kernels it runs: XNNPACK's fp32 GEMM and its int8 GEMM (8-bit weights per
  channel, activations quantized per row at run time, as `--quantize int8-dynamic` lowers a Linear), each a lowered
  Linear program of GEMM's shape that the runner times (the best of ITERATIONS runs: the least disturbed).

Each measure keeps the board's conditions it was measured under (limits.MeasuredUnder, from the agent's `info`);
setup-board measures both again when they differ from the board's conditions now (changed_conditions, with
results/validity.py's condition_changes), and says what changed.

A probe that cannot run is said and the board still runs programs; an answer that is malformed or absurd is refused
(BoardDataError, 65), naming the field.
"""

from __future__ import annotations

import datetime as dt
import math
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from orchestrator import console, paths, strictjson
from orchestrator.boards import limits
from orchestrator.boards.limits import ComputePeak, MeasuredUnder, ReadBandwidth
from orchestrator.deploy.agent_client import BoardAgent
from orchestrator.errors import BoardDataError
from orchestrator.fsutil import atomic_path, file_lock
from orchestrator.records import RecordError, from_data, to_data
from orchestrator.results.validity import board_conditions, condition_changes
from orchestrator.transport import BoardConnection
from orchestrator.transport.transfer import push_file
from orchestrator.versions import executorch_version

GEMM = (128, 1024, 1024)  # M, K, N: 268 M multiply-adds, 4 MiB of fp32 weights (an LLM's prefill GEMMs are wider)
ITERATIONS, WARMUP = 6, 1  # the best run of six: the least disturbed
PROBE_LOCK_TIMEOUT_S = 600.0  # a run holding the board finishes first: a probe never runs beside it
COMPUTE_TIMEOUT_S = 600.0  # an emulated board runs its GEMMs slowly
KINDS = ("fp32", "int8")

_LOWER_LOCK = threading.Lock()  # boards set up in parallel threads lower the probe programs once


@dataclass
class MeasuredLimits:
    bandwidth: ReadBandwidth | None = None
    compute: ComputePeak | None = None
    notes: list[str] = field(default_factory=list)  # why a measure is missing


@dataclass(frozen=True)
class _Timings:
    iterations_ms: tuple[float, ...]


def measure(
    conn: BoardConnection,
    agent: BoardAgent,
    runner_source: str,
    *,
    bandwidth: bool = True,
    conditions: MeasuredUnder | None = None,
) -> MeasuredLimits:
    """The board's limits into its state, each with the board's conditions (`conditions`, else asked of the agent);
    `bandwidth=False` measures the compute peak alone."""
    measured = MeasuredLimits()
    under = conditions if conditions is not None else conditions_now(agent)
    if bandwidth:
        measured.bandwidth = _bandwidth(conn, agent, runner_source, under, measured.notes)
    measured.compute = _compute(conn, agent, runner_source, under, measured.notes)
    return measured


# ---------------------------------------------------------------- the conditions the limits were measured under

UNKNOWN_CONDITIONS = "board conditions not recorded"  # a limit recorded before they were kept


def conditions_now(agent: BoardAgent) -> MeasuredUnder:
    """The board's conditions now, from its agent's `info` (one round trip), read as a run's are
    (results/validity.py board_conditions); BoardDataError (65) naming the field when they are malformed."""
    found = board_conditions(agent.info(), None)
    where = f"{agent.board_name}: info"
    values = {key: found[key] for key in ("kernel", "firmware", "config_txt_sha256")}
    try:
        return from_data({**values, "governor": found["governor_before"]}, MeasuredUnder, where=where)
    except RecordError as exc:
        raise BoardDataError(str(exc)) from None


def changed_conditions(state: Mapping[str, Any] | None, now: MeasuredUnder, where: str) -> list[str]:
    """How the board's conditions `now` differ from those its recorded limits were measured under, as readable
    phrases (condition_changes: "kernel 6.6.51 → 6.6.62"; UNKNOWN_CONDITIONS for a limit recorded before they were
    kept); [] when nothing changed. A missing or malformed limit is no change here: limits.current already has it
    measured again."""
    changes: list[str] = []
    for read in (limits.recorded_bandwidth, limits.recorded_compute):
        try:
            recorded = read(state, where)
        except RecordError:
            continue
        if recorded is None:
            continue
        phrases = (
            [UNKNOWN_CONDITIONS]
            if recorded.conditions is None
            else condition_changes(_as_conditions(recorded.conditions), _as_conditions(now))
        )
        changes += [phrase for phrase in phrases if phrase not in changes]
    return changes


def _as_conditions(under: MeasuredUnder) -> dict[str, str | None]:
    """As results/validity.py's board_conditions names them, for condition_changes."""
    return {"kernel": under.kernel, "firmware": under.firmware, "config_txt_sha256": under.config_txt_sha256,
            "governor_before": under.governor}  # fmt: skip


# ---------------------------------------------------------------- the probes


def _bandwidth(
    conn: BoardConnection, agent: BoardAgent, runner_source: str, under: MeasuredUnder, notes: list[str]
) -> ReadBandwidth | None:
    name = conn.board.name
    with console.StageTimer(prefix=f"{name}: ").stage("memory bandwidth probe", quiet=True):
        answer = agent.probe_bandwidth(conn.board.threads, limits.PROBE_ROUNDS, limits.PROBE_TIMEOUT_S,
                                       PROBE_LOCK_TIMEOUT_S)  # fmt: skip
    if answer.get("exit_code") != 0 or not isinstance(answer.get("answer"), str):
        why = str(answer.get("error") or f"exit {answer.get('exit_code')}")
        notes.append(f"read bandwidth not measured: {why[:200]}")
        console.warn(console.escape(f"{name}: {notes[-1]}"))
        return None
    found = limits.read_probe(answer["answer"], name, runner_source, under)  # BoardDataError (65) if malformed
    agent.set_state({limits.STATE_KEY: limits.state_value(found)})
    return found


def _compute(
    conn: BoardConnection, agent: BoardAgent, runner_source: str, under: MeasuredUnder, notes: list[str]
) -> ComputePeak | None:
    name = conn.board.name
    rates: dict[str, float | None] = {}
    with console.StageTimer(prefix=f"{name}: ").stage("compute probe (fp32 and int8 GEMM)", quiet=True):
        for kind, program in probe_programs().items():
            remote = push_file(conn, program, kind="models", suffix=".pte").remote_path
            answer = agent.time_program(remote, conn.board.threads, ITERATIONS, WARMUP, COMPUTE_TIMEOUT_S,
                                        PROBE_LOCK_TIMEOUT_S)  # fmt: skip
            rates[kind] = _rate(answer, f"{name}: the {kind} GEMM probe", notes)
    if rates["fp32"] is None:
        console.warn(console.escape(f"{name}: {notes[-1]}"))
        return None
    threads = conn.board.threads or _online_cores(conn)
    try:
        peak = ComputePeak(
            fp32_flops_per_s=rates["fp32"], int8_ops_per_s=rates["int8"], threads=threads, gemm=GEMM,
            runner_source_sha256=runner_source,
            measured_at=dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"), conditions=under,
        )  # fmt: skip
        peak = from_data(to_data(peak), ComputePeak, where=f"{name}: compute probe")  # the bounds, checked
    except RecordError as exc:
        raise BoardDataError(str(exc)) from None
    agent.set_state({limits.COMPUTE_STATE_KEY: limits.compute_state_value(peak)})
    return peak


def _online_cores(conn: BoardConnection) -> int:
    result = conn.run(["getconf", "_NPROCESSORS_ONLN"], timeout=30, check=False)
    text = result.stdout.strip()
    return int(text) if text.isdigit() and 0 < int(text) <= 4096 else 1


def _rate(answer: Mapping[str, object], where: str, notes: list[str]) -> float | None:
    """Operations per second from the runner's best iteration; None (said in `notes`) when the program did not run;
    BoardDataError (65) when the timings are malformed."""
    if answer.get("exit_code") != 0 or not isinstance(answer.get("timings"), str):
        notes.append(f"{where} did not run: {str(answer.get('error') or answer.get('exit_code'))[:200]}")
        return None
    try:
        timings = from_data(strictjson.loads(str(answer["timings"]), where=where), _Timings, where=where)
    except (ValueError, RecordError) as exc:
        raise BoardDataError(str(exc)) from None
    if len(timings.iterations_ms) != ITERATIONS or not all(
        math.isfinite(ms) and ms > 0 for ms in timings.iterations_ms
    ):
        raise BoardDataError(f"{where}: iterations_ms: expected {ITERATIONS} positive times")
    m, k, n = GEMM
    return 2.0 * m * k * n / (min(timings.iterations_ms) / 1000.0)


def probe_programs() -> dict[str, Path]:
    """The fp32 and int8 GEMM programs, lowered once per executorch version and GEMM shape."""
    m, k, n = GEMM
    folder = paths.cache_dir()
    found = {kind: folder / f"compute-probe-{kind}-{m}x{k}x{n}-executorch-{executorch_version()}.pte" for kind in KINDS}
    if all(target.is_file() for target in found.values()):
        return found
    folder.mkdir(parents=True, exist_ok=True)
    with _LOWER_LOCK, file_lock(folder / "compute-probe.lock"):  # one thread and one process lowers them
        for kind, target in found.items():
            if not target.is_file():
                _lower(kind, target)
    return found


def _lower(kind: str, target: Path) -> None:
    # here, not at the top: torch and executorch take seconds to import, and a cached probe program never needs them
    import torch
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.exir import to_edge_transform_and_lower

    from orchestrator.lowering.quantize.methods import int8_dynamic  # imports torchao: the same reason

    m, k, n = GEMM
    torch.manual_seed(0)
    model, example = torch.nn.Sequential(torch.nn.Linear(k, n, bias=False)).eval(), (torch.randn(m, k),)
    program = int8_dynamic(model, example, None, None) if kind == "int8" else torch.export.export(model, example)
    lowered = to_edge_transform_and_lower(program, partitioner=[XnnpackPartitioner()]).to_executorch()
    with atomic_path(target) as tmp:
        tmp.write_bytes(lowered.buffer)
