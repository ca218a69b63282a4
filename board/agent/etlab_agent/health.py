"""The board's health job: the facts a lab needs before it trusts a board with a night, and one run of the
verification program against its reference. The agent reports; the workstation judges (deploy/health.py)."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import Any

from .info import cpufreq_policies, meminfo, parse_throttled, run_vcgencmd
from .lock import BoardLock, describe_holder
from .process import run_probe
from .profile import CorruptContent, verify_file
from .state import runner_from_state
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


def _verification(workdir: Workdir, model: Path, inputs: Path, reference: Path, timeout: float) -> dict[str, Any]:
    """One run of the verification program on the provisioned runner, compared with its reference by the runner."""
    try:
        for path, what in ((model, "verification program"), (inputs, "verification inputs"), (reference, "reference")):
            verify_file(workdir, path, what)  # a corrupt copy is removed, so the next push sends it again
    except CorruptContent as exc:
        return {"exit_code": None, "numerics": None, "error": str(exc)[:400]}
    runner, _ = runner_from_state(workdir)
    with tempfile.TemporaryDirectory(prefix=".tmp-health-", dir=workdir.root) as scratch:
        numerics = Path(scratch) / "numerics.json"
        argv = [str(runner), "--model", str(model), "--inputs", str(inputs), "--reference", str(reference),
                "--numerics-out", str(numerics), "--warmup", "0", "--iterations", "1", "--threads", "1"]  # fmt: skip
        answer = run_probe(argv, timeout)
        if answer is None:
            return {"exit_code": None, "numerics": None, "error": f"the runner did not finish in {timeout:g} s"}
        code, _stdout, stderr = answer
        error = stderr.decode("utf-8", errors="replace").strip().splitlines()[-1:] if code else []
        try:
            with numerics.open("rb") as handle:
                text = handle.read(ANSWER_CAP + 1).decode("utf-8", errors="replace") if code == 0 else None
        except OSError:
            text = None
    return {"exit_code": code, "numerics": text, "error": error[0][:400] if error else None}


def health_check(
    workdir: Workdir, model: Path, inputs: Path, reference: Path, timeout: float, lock_timeout: float
) -> dict[str, Any]:
    """Disk, memory, throttling and governors now, and the verification run under the board lock (a run holding
    the board finishes first)."""
    memory = meminfo()
    available_kb = memory.get("available_kb")
    with BoardLock(workdir).acquired(describe_holder("health", None), lock_timeout):
        verification = _verification(workdir, model, inputs, reference, timeout)
    return {
        "disk_free_mb": _free_mb(workdir.bundles),
        "memory_available_mb": available_kb // 1024 if isinstance(available_kb, int) else None,
        "throttled": parse_throttled(run_vcgencmd("get_throttled")),
        "governors": [policy["governor"] for policy in cpufreq_policies()],
        "verification": verification,
    }
