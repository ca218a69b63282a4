"""The optional counters pass: after the timing pass, the runner runs again single-threaded with a counter group
read around every kernel and delegate call, so the timing pass's latency is never perturbed by it.

It writes counters.json (per-instruction deltas keyed by ETDump event), counters_etdump.etdp (that pass's own
ETDump, which the keys refer to), counters_timings.json and counters_runner.log into the bundle. A failed counters
pass never fails the bundle: run.json records why.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .process import RunOutcome, StopRequest, pass_verdict, run_in_own_group, without_options

COUNTERS_FILE = "counters.json"
COUNTERS_ETDUMP = "counters_etdump.etdp"
COUNTERS_TIMINGS = "counters_timings.json"
COUNTERS_LOG = "counters_runner.log"
COUNTERS_THREADS = 1  # counters are read by the thread that runs the operators


def counters_argv(timing_argv: list[str], bundle: Path, counters: str) -> list[str]:
    """The timing pass's command line with one thread, the counter group and the pass's own output files; without
    the timing pass's `--start-fd` (the model was verified before the timing pass ran)."""
    argv = without_options(timing_argv, {"--threads", "--etdump", "--outputs", "--timings", "--start-fd"})
    return [
        *argv,
        "--threads",
        str(COUNTERS_THREADS),
        "--etdump",
        str(bundle / COUNTERS_ETDUMP),
        "--timings",
        str(bundle / COUNTERS_TIMINGS),
        "--counters",
        counters,
        "--counters-out",
        str(bundle / COUNTERS_FILE),
    ]


def run_counters_pass(
    timing_argv: list[str],
    bundle: Path,
    counters: str,
    timeout: float,
    grace: float,
    pass_fds: tuple[int, ...],
    stop: StopRequest,
) -> dict[str, Any]:
    """Run the counters pass; returns what run.json records about it."""
    argv = counters_argv(timing_argv, bundle, counters)
    outcome: RunOutcome = run_in_own_group(argv, bundle / COUNTERS_LOG, timeout, grace, pass_fds=pass_fds, stop=stop)
    ok, error = pass_verdict(outcome, (bundle / COUNTERS_FILE).is_file(), COUNTERS_LOG)
    return {
        "requested": counters,
        "threads": COUNTERS_THREADS,
        "argv": argv,
        "status": "ok" if ok else "failed",
        "error": error,
        "exit_code": outcome.exit_code,
        "duration_s": round(outcome.duration_s, 6),
    }
