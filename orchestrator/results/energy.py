"""Energy of a run: the board agent's PMIC samples (energy.json, board/agent/etlab_agent/energy.py) turned into the
board's mean power while the program executed and the joules of an inference or a generated token.

energy.json is untrusted like every board file: capped, strict JSON, every field typed, each sample's watts a
finite number above 0 and at most `MAX_WATTS` (a Raspberry Pi draws a few watts; 1 kW is no board's), its times in
order. A file that fails is refused (AnalysisError, 65) naming the field, and the raw bundle is kept. A board
without the sensor says "not measured" with its reason (run.json's `energy`), never 0.

- mean watts: over the samples taken from the moment the runner was released to execute (the agent's gate) to its
  end; with none there (a run shorter than the interval), over every sample.
- joules per inference: mean watts x the run's median iteration; per generated token: mean watts / the decode's
  tokens per second (the decode steps are most of a generation).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import msgspec

from orchestrator import strictjson
from orchestrator.errors import AnalysisError
from orchestrator.records import RecordError, from_data
from orchestrator.results.summary import EnergySummary

ENERGY_FILE = "energy.json"
ENERGY_SCHEMA = 1
MAX_BYTES = 8 << 20  # 20,000 samples of about 80 bytes
MAX_WATTS = 1000.0

Watts = Annotated[float, msgspec.Meta(gt=0, le=MAX_WATTS, description="watts, above 0 and at most 1 kW")]
Seconds = Annotated[float, msgspec.Meta(ge=0, description="seconds, 0 or more")]


@dataclass(frozen=True)
class PowerSample:
    t_s: Seconds  # since the runner started
    watts: Watts
    rails: Annotated[int, msgspec.Meta(ge=1)]
    error: None = None


@dataclass(frozen=True)
class EnergyFile:
    schema: int
    source: str
    interval_s: Annotated[float, msgspec.Meta(gt=0)]
    executing_from_s: Seconds | None
    ended_s: Seconds | None
    samples: tuple[PowerSample, ...]


def read_energy(path: Path) -> EnergyFile:
    """energy.json checked (AnalysisError, 65, naming the field)."""
    where = str(path)
    try:
        with open(path, "rb") as handle:
            data = handle.read(MAX_BYTES + 1)
    except OSError as exc:
        raise AnalysisError(f"{where}: unreadable ({exc.strerror})") from None
    if len(data) > MAX_BYTES:
        raise AnalysisError(f"{where}: larger than {MAX_BYTES} bytes: not an energy record")
    try:
        record = from_data(strictjson.loads(data, where=where), EnergyFile, where=where)
    except RecordError as exc:
        raise AnalysisError(str(exc)) from None
    except ValueError as exc:
        raise AnalysisError(str(exc)) from None
    if record.schema != ENERGY_SCHEMA:
        raise AnalysisError(f"{where}: schema: expected {ENERGY_SCHEMA}, got {record.schema}")
    if not record.samples:
        raise AnalysisError(f"{where}: samples: none (a board without the sensor writes no file)")
    times = [sample.t_s for sample in record.samples]
    if times != sorted(times):
        raise AnalysisError(f"{where}: samples: their times are not in order")
    return record


def energy_summary(
    bundle: Path, run_record: dict[str, Any], median_ms: float | None, decode_tokens_per_s: float | None
) -> EnergySummary | None:
    """The run's energy, or why it was not measured; None for a bundle from before energy was recorded."""
    said = run_record.get("energy")
    if not isinstance(said, dict):
        return None
    path = bundle / ENERGY_FILE
    if said.get("status") != "measured" or not path.is_file():
        why = said.get("why") if isinstance(said.get("why"), str) else "the board recorded no power"
        return EnergySummary(status="not measured", why=str(why)[:200])
    record = read_energy(path)
    start, end = record.executing_from_s, record.ended_s
    window = [s for s in record.samples if (start is None or s.t_s >= start) and (end is None or s.t_s <= end)]
    used = window or list(record.samples)
    mean = sum(sample.watts for sample in used) / len(used)
    return EnergySummary(
        status="measured",
        source=record.source[:80],
        samples=len(used),
        mean_watts=mean,
        joules_per_inference=mean * median_ms / 1000.0 if median_ms else None,
        joules_per_token=mean / decode_tokens_per_s if decode_tokens_per_s else None,
    )
