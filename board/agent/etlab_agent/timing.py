"""A program timed by the runner alone, under the board lock: the workstation's compute probe (a lowered GEMM)."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from .lock import BoardLock, describe_holder
from .process import run_probe
from .profile import CorruptContent, verify_file
from .state import runner_from_state
from .workdir import Workdir

TIMINGS_CAP = 256 * 1024  # a timings.json of a few hundred iterations is a few kB


def time_program(
    workdir: Workdir,
    model: Path,
    threads: int | None,
    iterations: int,
    warmup: int,
    timeout: float,
    lock_timeout: float,
) -> dict[str, Any]:
    """`{"exit_code", "timings": the runner's timings.json as text, "error"}`; a corrupt copy of the program is
    removed (so the next push sends it again) and said in `error`."""
    try:
        verify_file(workdir, model, "probe program")
    except CorruptContent as exc:
        return {"exit_code": None, "timings": None, "error": str(exc)[:400]}
    runner, _ = runner_from_state(workdir)
    with tempfile.TemporaryDirectory(prefix=".tmp-timing-", dir=workdir.root) as scratch:
        timings = Path(scratch) / "timings.json"
        argv = [str(runner), "--model", str(model), "--warmup", str(warmup), "--iterations", str(iterations),
                "--timings", str(timings)] + (["--threads", str(threads)] if threads else [])  # fmt: skip
        with BoardLock(workdir).acquired(describe_holder("time-program", None), lock_timeout):
            answer = run_probe(argv, timeout)
        if answer is None:
            return {"exit_code": None, "timings": None, "error": f"the runner did not finish in {timeout:g} s"}
        code, _stdout, stderr = answer
        error = stderr.decode("utf-8", errors="replace").strip().splitlines()[-1:] if code else []
        text = None
        if code == 0:
            try:
                with timings.open("rb") as handle:
                    text = handle.read(TIMINGS_CAP + 1).decode("utf-8", errors="replace")
            except OSError:
                text = None
    return {"exit_code": code, "timings": text, "error": error[0][:400] if error else None}
