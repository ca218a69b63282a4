"""Short runner jobs under the board lock whose answer is one file the runner writes (no bundle): the compute
probe's timed GEMMs (`time-program`) and the health job's verification run (health.py)."""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from .lock import BoardLock, describe_holder
from .process import run_probe
from .profile import CorruptContent, verify_file
from .state import runner_from_state
from .workdir import Workdir

TIMINGS_CAP = 256 * 1024  # a timings.json of a few hundred iterations is a few kB


def runner_answer(
    workdir: Workdir,
    files: Sequence[tuple[Path, str]],
    argv: Callable[[Path, Path], list[str]],
    key: str,
    cap: int,
    timeout: float,
    purpose: str,
    lock_timeout: float,
) -> dict[str, Any]:
    """`{"exit_code", key: the file the runner wrote (at most `cap` bytes, as text) | null, "error"}`. The `files`
    are hashed first (a corrupt copy is removed, so the next push sends it again, and said in `error`); `argv(runner,
    out)` is the runner's command line writing `out`, run under the board lock."""
    try:
        for path, what in files:
            verify_file(workdir, path, what)
    except CorruptContent as exc:
        return {"exit_code": None, key: None, "error": str(exc)[:400]}
    runner, _ = runner_from_state(workdir)
    with tempfile.TemporaryDirectory(prefix=f".tmp-{purpose}-", dir=workdir.root) as scratch:
        out = Path(scratch) / "answer.json"
        with BoardLock(workdir).acquired(describe_holder(purpose, None), lock_timeout):
            answer = run_probe(argv(runner, out), timeout)
        if answer is None:
            return {"exit_code": None, key: None, "error": f"the runner did not finish in {timeout:g} s"}
        code, _stdout, stderr = answer
        error = stderr.decode("utf-8", errors="replace").strip().splitlines()[-1:] if code else []
        text = None
        if code == 0:
            try:
                with out.open("rb") as handle:
                    text = handle.read(cap + 1).decode("utf-8", errors="replace")
            except OSError:
                text = None
    return {"exit_code": code, key: text, "error": error[0][:400] if error else None}


def time_program(
    workdir: Workdir,
    model: Path,
    threads: int | None,
    iterations: int,
    warmup: int,
    timeout: float,
    lock_timeout: float,
) -> dict[str, Any]:
    """`{"exit_code", "timings": the runner's timings.json as text, "error"}`."""

    def argv(runner: Path, out: Path) -> list[str]:
        return [str(runner), "--model", str(model), "--warmup", str(warmup), "--iterations", str(iterations),
                "--timings", str(out)] + (["--threads", str(threads)] if threads else [])  # fmt: skip

    files = [(model, "probe program")]
    return runner_answer(workdir, files, argv, "timings", TIMINGS_CAP, timeout, "time-program", lock_timeout)
