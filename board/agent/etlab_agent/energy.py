"""Energy of a run (issue 55): a Raspberry Pi 5's PMIC read while the runner runs.

`vcgencmd pmic_read_adc` prints each rail's current and voltage, one reading a line:

      VDD_CORE_A current(3)=2.10000000A
      VDD_CORE_V volt(11)=0.89000000V
      EXT5V_V volt(24)=5.15000000V

A rail's power is its current times its voltage (the lines named `<rail>_A` and `<rail>_V`); the board's is their
sum over the rails that have both (EXT5V has a voltage and no current: the 5 V input is not metered). A sample is
one reading of every rail, taken every `SAMPLE_INTERVAL_S` in a thread while the runner runs: a process spawn each,
so the rate is low (a few per second; at 50 Hz the spawns slowed a decode several times over, as measured
elsewhere). The samples, each with its time since the runner started and the time the runner was released to
execute, go to `energy.json` in the bundle; the workstation checks them (untrusted like any board file) and turns
them into joules (orchestrator/results/energy.py).

A board whose `vcgencmd pmic_read_adc` does not answer (no vcgencmd, a Pi 4, a workstation) samples nothing and
says why in run.json: energy is "not measured" there, never 0.
"""

from __future__ import annotations

import math
import re
import threading
import time
from pathlib import Path
from typing import Any

from .files import atomic_write_json
from .info import vcgencmd_path
from .process import run_probe

ENERGY_FILE = "energy.json"
ENERGY_SCHEMA = 1
SAMPLE_INTERVAL_S = 0.25
SAMPLE_TIMEOUT_S = 2.0
MAX_SAMPLES = 20_000  # over an hour at 4 Hz: a longer run keeps its first hour of samples
MAX_OUTPUT = 16 * 1024  # a reading is about 1.5 kB
_READING = re.compile(r"^\s*(\S+)_([AV])\s+(?:current|volt)\(\d+\)=(\S+?)([AV])\s*$")


def read_rails(text: str) -> dict[str, dict[str, float]]:
    """`pmic_read_adc`'s lines as {rail: {"A": amps, "V": volts}}; lines of another form are skipped."""
    rails: dict[str, dict[str, float]] = {}
    for line in text.splitlines():
        found = _READING.match(line)
        if found is None or found.group(2) != found.group(4):
            continue
        try:
            value = float(found.group(3))
        except ValueError:
            continue
        rails.setdefault(found.group(1), {})[found.group(2)] = value
    return rails


def sample_once(tool: str) -> dict[str, Any]:
    """One reading: {"watts", "rails"} (rails with both current and voltage), or {"watts": None, "error"}."""
    answer = run_probe([tool, "pmic_read_adc"], SAMPLE_TIMEOUT_S)
    if answer is None:
        return {"watts": None, "rails": 0, "error": f"vcgencmd pmic_read_adc did not answer in {SAMPLE_TIMEOUT_S:g} s",
                "refused": True}  # fmt: skip
    code, stdout, stderr = answer
    if code != 0:  # a board without the command (a Pi 4: "Command not registered")
        said = stderr.decode("utf-8", errors="replace").strip().splitlines()[-1:] or [f"exit {code}"]
        return {"watts": None, "rails": 0, "error": f"vcgencmd pmic_read_adc: {said[0][:200]}", "refused": True}
    rails = read_rails(stdout[:MAX_OUTPUT].decode("utf-8", errors="replace"))
    paired = {name: values for name, values in rails.items() if "A" in values and "V" in values}
    if not paired:
        return {"watts": None, "rails": 0, "error": "vcgencmd pmic_read_adc printed no rail with current and volts"}
    watts = sum(values["A"] * values["V"] for values in paired.values())
    if not math.isfinite(watts):
        return {"watts": None, "rails": len(paired), "error": "a rail's reading is not a finite number"}
    return {"watts": watts, "rails": len(paired), "error": None}


class EnergySampler:
    """Samples the PMIC in a thread from `start()` to `stop()`; `write(bundle)` writes energy.json. A board without
    the sensor (the first reading fails) samples nothing: `why_not` says why."""

    def __init__(self, interval_s: float = SAMPLE_INTERVAL_S) -> None:
        self.interval_s = interval_s
        self.tool = vcgencmd_path()
        self.samples: list[dict[str, Any]] = []
        self.why_not: str | None = None if self.tool else "no vcgencmd on this board"
        self.executing_from_s: float | None = None  # the runner released to execute, since start()
        self.ended_s: float | None = None
        self._started = 0.0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> EnergySampler:
        self._started = time.monotonic()
        if self.tool is None:
            return self
        first = sample_once(self.tool)
        if first.pop("refused", False):  # no sensor here (a Pi 4, a PC): not measured
            self.why_not = first["error"]
            return self
        self._record(first)  # an answer, even a malformed one: the workstation judges it
        self._thread = threading.Thread(target=self._loop, name="etlab-energy", daemon=True)
        self._thread.start()
        return self

    def executing(self, at_monotonic: float | None) -> None:
        """The time the runner was let go to execute (the gate's `g`), when it was."""
        if at_monotonic is not None:
            self.executing_from_s = max(0.0, at_monotonic - self._started)

    def stop(self) -> None:
        self.ended_s = time.monotonic() - self._started
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=SAMPLE_TIMEOUT_S + 1)

    def _loop(self) -> None:
        assert self.tool is not None
        while not self._stop.wait(self.interval_s) and len(self.samples) < MAX_SAMPLES:
            self._record(sample_once(self.tool))

    def _record(self, sample: dict[str, Any]) -> None:
        sample.pop("refused", None)  # mid-run, a reading that fails is a failed sample like any other
        self.samples.append({"t_s": round(time.monotonic() - self._started, 6), **sample})

    def record(self) -> dict[str, Any]:
        """What run.json says of it."""
        if self.why_not is not None or not self.samples:
            return {"status": "not measured", "why": self.why_not or "no sample"}
        return {"status": "measured", "file": ENERGY_FILE, "samples": len(self.samples)}

    def write(self, bundle: Path) -> None:
        if self.why_not is not None or not self.samples:
            return
        atomic_write_json(
            bundle / ENERGY_FILE,
            {
                "schema": ENERGY_SCHEMA,
                "source": "vcgencmd pmic_read_adc",
                "interval_s": self.interval_s,
                "executing_from_s": self.executing_from_s,
                "ended_s": self.ended_s,
                "samples": self.samples,
            },
        )
