"""The optional numerics pass: after the timing pass, the runner runs the variant's numerics program (the same
program with its operators' values made outputs) once, compares every output with the workstation's fp32 reference
and writes statistics per tensor; with a byte cap (`--numerics full`) the tensors themselves too, up to the cap.

It writes numerics.json, numerics_timings.json and numerics_runner.log (numerics_tensors.etlt with a cap) into the
bundle. Both files are hashed against their content-addressed names first. A failed numerics pass never fails the
bundle: run.json records why.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .process import RunOutcome, StopRequest, pass_verdict, run_in_own_group, without_options

NUMERICS_FILE = "numerics.json"
NUMERICS_TENSORS = "numerics_tensors.etlt"
NUMERICS_TIMINGS = "numerics_timings.json"
NUMERICS_LOG = "numerics_runner.log"


# A generate run's numerics pass is one forward call of the program on its own inputs (the prefill's ids and positions).
_GENERATE_OPTIONS = {"--prompt-len", "--new-tokens", "--context"}


def numerics_argv(
    timing_argv: list[str],
    bundle: Path,
    model: Path,
    reference: Path,
    full_cap: int | None,
    inputs: Path | None = None,
) -> list[str]:
    """The timing pass's command line with the numerics program, one untimed run and the pass's own files; without
    the timing pass's ETDump, outputs and `--start-fd` (the files were verified before). `inputs`: the numerics
    program's own inputs, in place of the timing pass's and of its generate loop."""
    replaced = {"--model", "--etdump", "--outputs", "--timings", "--start-fd", "--warmup", "--iterations"}
    if inputs is not None:
        replaced |= {"--inputs", *_GENERATE_OPTIONS}
    argv = without_options(timing_argv[1:], replaced)
    if inputs is not None:
        argv = [word for word in argv if word != "--generate"] + ["--inputs", str(inputs)]
    argv = [timing_argv[0], "--model", str(model), *argv, "--warmup", "0", "--iterations", "1"]
    argv += ["--reference", str(reference), "--numerics-out", str(bundle / NUMERICS_FILE)]
    argv += ["--timings", str(bundle / NUMERICS_TIMINGS)]
    if full_cap is not None:
        argv += ["--outputs", str(bundle / NUMERICS_TENSORS), "--outputs-cap", str(full_cap)]
    return argv


def run_numerics_pass(
    timing_argv: list[str],
    bundle: Path,
    files: tuple[Path, Path],
    full_cap: int | None,
    timeout: float,
    grace: float,
    pass_fds: tuple[int, ...],
    stop: StopRequest,
    inputs: Path | None = None,
) -> dict[str, Any]:
    """Run the numerics pass on (numerics program, reference), both verified by the caller (and `inputs`, the
    program's own inputs, when it has them); what run.json records."""
    model, reference = files
    argv = numerics_argv(timing_argv, bundle, model, reference, full_cap, inputs)
    outcome: RunOutcome = run_in_own_group(argv, bundle / NUMERICS_LOG, timeout, grace, pass_fds=pass_fds, stop=stop)
    ok, error = pass_verdict(outcome, (bundle / NUMERICS_FILE).is_file(), NUMERICS_LOG)
    return {
        "mode": "full" if full_cap is not None else "stats",
        "full_cap_bytes": full_cap,
        "argv": argv,
        "status": "ok" if ok else "failed",
        "error": error,
        "exit_code": outcome.exit_code,
        "duration_s": round(outcome.duration_s, 6),
    }
