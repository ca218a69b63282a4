"""The board's health job: the facts a lab needs before it trusts a board with a night, and one run of the
verification program against its reference. The agent reports; the workstation judges (deploy/health.py)."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from .info import cpufreq_policies, meminfo, parse_throttled, run_vcgencmd
from .timing import runner_answer
from .workdir import Workdir

ANSWER_CAP = 64 * 1024  # the runner's numerics.json for the verification program is under 2 kB


def _free_mb(folder: Path) -> int | None:
    """Free space where runs write their bundles (the workdir's filesystem when bundles/ is not there yet)."""
    for candidate in (folder, folder.parent):
        try:
            return shutil.disk_usage(candidate).free // (1 << 20)
        except OSError:
            continue
    return None


def _verification(
    workdir: Workdir, model: Path, inputs: Path, reference: Path, timeout: float, lock_timeout: float
) -> dict[str, Any]:
    """One run of the verification program on the provisioned runner, compared with its reference by the runner."""

    def argv(runner: Path, out: Path) -> list[str]:
        return [str(runner), "--model", str(model), "--inputs", str(inputs), "--reference", str(reference),
                "--numerics-out", str(out), "--warmup", "0", "--iterations", "1", "--threads", "1"]  # fmt: skip

    files = [(model, "verification program"), (inputs, "verification inputs"), (reference, "reference")]
    return runner_answer(workdir, files, argv, "numerics", ANSWER_CAP, timeout, "health", lock_timeout)


def health_check(
    workdir: Workdir, model: Path, inputs: Path, reference: Path, timeout: float, lock_timeout: float
) -> dict[str, Any]:
    """Disk, memory, throttling and governors now, and the verification run under the board lock (a run holding
    the board finishes first)."""
    memory = meminfo()
    available_kb = memory.get("available_kb")
    verification = _verification(workdir, model, inputs, reference, timeout, lock_timeout)
    return {
        "disk_free_mb": _free_mb(workdir.bundles),
        "memory_available_mb": available_kb // 1024 if isinstance(available_kb, int) else None,
        "throttled": parse_throttled(run_vcgencmd("get_throttled")),
        "governors": [policy["governor"] for policy in cpufreq_policies()],
        "verification": verification,
    }
