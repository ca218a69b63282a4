"""Command line: every command prints exactly one JSON document on stdout; logs go to stderr.

Exit codes: 0 ok, 1 the operation failed, 2 usage, 3 lock timeout, 4 not provisioned.
"""

from __future__ import annotations

import errno
import functools
import json
import math
import sys
import traceback
from pathlib import Path
from typing import Any, Callable

import click

from . import AGENT_VERSION
from .bundles import collect_garbage, list_bundles
from .errors import AgentError, BadInput, ExitCode
from .files import log
from .health import health_check
from .info import collect_info
from .lock import BoardLock, current_holder, describe_holder
from .process import run_probe
from .profile import (
    DEFAULT_KILL_GRACE_SECONDS,
    DEFAULT_LOCK_TIMEOUT_SECONDS,
    DEFAULT_TIMEOUT_SECONDS,
    ProfileRequest,
    profile,
)
from .state import read_state, runner_from_state, update_state
from .timing import time_program
from .workdir import Workdir


def emit(document: dict[str, Any]) -> None:
    try:
        sys.stdout.write(json.dumps(document, indent=2) + "\n")
        sys.stdout.flush()
    except OSError:  # the caller went away (EPIPE, EIO); the work itself is already done and on disk
        pass


def json_command(function: Callable[..., tuple[dict[str, Any], int]]) -> Callable[..., None]:
    """Run a command body returning (document, exit code); turn errors into a JSON answer and exit code."""

    @functools.wraps(function)
    def wrapper(*args: Any, **kwargs: Any) -> None:
        try:
            document, code = function(*args, **kwargs)
        except AgentError as exc:
            log(f"error: {exc}")
            document, code = dict({"error": str(exc), "exit_code": exc.exit_code}, **exc.details), exc.exit_code
        except Exception as exc:
            code = ExitCode.FAILED
            if isinstance(exc, OSError) and exc.errno == errno.ENOSPC:  # a full SD card is not a bug
                where = exc.filename or next((str(a.root) for a in args if isinstance(a, Workdir)), "the board")
                log(f"error: no space left on {where}")
                document = {"error": f"no space left on {where}", "exit_code": code}
            else:
                traceback.print_exc(file=sys.stderr)
                document = {"error": f"internal error: {type(exc).__name__}: {exc}", "exit_code": code}
        emit(document)
        sys.exit(code)

    return wrapper


class Seconds(click.ParamType):
    """A finite number of seconds: NaN and infinities are refused (a NaN timeout never fires, and a hung runner
    would hold the board lock forever)."""

    name = "seconds"

    def __init__(self, *, allow_zero: bool = True) -> None:
        self.allow_zero = allow_zero

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> float:
        try:
            number = float(value)
        except (TypeError, ValueError):
            self.fail(f"{value!r} is not a number of seconds", param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number of seconds", param, ctx)
        if number < 0 or (number == 0 and not self.allow_zero):
            self.fail(f"{value!r} must be {'>= 0' if self.allow_zero else '> 0'}", param, ctx)
        return number


SECONDS = Seconds()
PROBE_ANSWER_CAP = 64 * 1024  # the runner's probe answers in under 1 kB
POSITIVE_SECONDS = Seconds(allow_zero=False)


def parse_labels(labels: tuple[str, ...]) -> dict[str, str]:
    parsed = {}
    for label in labels:
        key, sep, value = label.partition("=")
        if not sep or not key.strip():
            raise BadInput(f"invalid --label {label!r}: expected key=value")
        parsed[key.strip()] = value
    return parsed


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--workdir",
    default="~/.etlab",
    show_default=True,
    envvar="ETLAB_WORKDIR",
    help="Board workdir (~ is expanded).",
)
@click.version_option(AGENT_VERSION, prog_name="etlab_agent")
@click.pass_context
def cli(ctx: click.Context, workdir: str) -> None:
    """etlab board agent: board facts, profiling under the board lock, bundles and provisioning helpers."""
    ctx.obj = Workdir(Path(workdir))


@cli.command()
@click.option("--runner", type=click.Path(dir_okay=False), help="Probe this runner instead of the provisioned one.")
@click.pass_obj
@json_command
def info(workdir: Workdir, runner: str | None) -> tuple[dict[str, Any], int]:
    """Board facts: model, CPU, frequencies, temperature, throttling, memory, versions, lock holder."""
    return collect_info(workdir, Path(runner).expanduser() if runner else None), ExitCode.OK


@cli.command(name="profile")
@click.option("--model", required=True, help="The .pte to run.")
@click.option("--run-id", required=True, help="Names the bundle folder: [A-Za-z0-9._-]+.")
@click.option("--inputs", help="ETLT inputs file (default: the runner generates inputs).")
@click.option("--label", "labels", multiple=True, metavar="KEY=VALUE", help="Recorded in run.json (repeatable).")
@click.option("--warmup", type=click.IntRange(min=0))
@click.option("--iterations", type=click.IntRange(min=1))
@click.option("--threads", type=click.IntRange(min=1))
@click.option("--max-seconds", type=SECONDS)
@click.option("--method", help="Program method to run (runner default: forward).")
@click.option("--timeout", type=POSITIVE_SECONDS, default=DEFAULT_TIMEOUT_SECONDS, show_default=True)
@click.option("--lock-timeout", type=SECONDS, default=DEFAULT_LOCK_TIMEOUT_SECONDS, show_default=True)
@click.option(
    "--kill-grace",
    type=SECONDS,
    default=DEFAULT_KILL_GRACE_SECONDS,
    show_default=True,
    help="Seconds between SIGTERM and SIGKILL when the runner is stopped.",
)
@click.option("--no-etdump", is_flag=True, help="Do not record an ETDump.")
@click.option("--runner", help="Runner binary (default: the provisioned one from state.json).")
@click.option("--counters", help="After the timing pass, a single-threaded counters pass: 'default' or a,b,c.")
@click.option("--numerics-model", help="After the timing pass, a numerics pass of this program (its taps).")
@click.option("--numerics-reference", help="The numerics pass's fp32 reference values (ETLT).")
@click.option(
    "--numerics-full-cap", type=click.IntRange(min=0), help="Keep the numerics pass's tensors too, up to these bytes."
)
@click.option(
    "--numerics-inputs", help="The numerics program's own inputs (a generate run's: one prefill call's ids, positions)."
)
@click.option("--generate", is_flag=True, help="Each run is one greedy generation (the runner's generate mode).")
@click.option("--prompt-len", type=click.IntRange(min=1), help="Generated prompt length, or the --inputs prompt's.")
@click.option("--new-tokens", type=click.IntRange(min=1), help="Tokens per generation (runner default: 16).")
@click.option("--context", type=click.IntRange(min=2), help="KV cache capacity: prompt + new tokens must fit.")
@click.pass_obj
@json_command
def profile_command(
    workdir: Workdir,
    model: str,
    run_id: str,
    inputs: str | None,
    labels: tuple[str, ...],
    warmup: int | None,
    iterations: int | None,
    threads: int | None,
    max_seconds: float | None,
    method: str | None,
    timeout: float,
    lock_timeout: float,
    kill_grace: float,
    no_etdump: bool,
    runner: str | None,
    counters: str | None,
    numerics_model: str | None,
    numerics_reference: str | None,
    numerics_full_cap: int | None,
    numerics_inputs: str | None,
    generate: bool,
    prompt_len: int | None,
    new_tokens: int | None,
    context: int | None,
) -> tuple[dict[str, Any], int]:
    """Run the native runner once under the board lock and write <wd>/bundles/<run-id>/."""
    generate_only = {"--prompt-len": prompt_len, "--new-tokens": new_tokens, "--context": context}
    given = [flag for flag, value in generate_only.items() if value is not None]
    if given and not generate:
        raise BadInput(f"{given[0]} needs --generate")
    if (numerics_model is None) != (numerics_reference is None):
        raise BadInput("--numerics-model and --numerics-reference go together")
    if numerics_full_cap is not None and numerics_model is None:
        raise BadInput("--numerics-full-cap needs --numerics-model")
    request = ProfileRequest(
        model=Path(model),
        run_id=run_id,
        inputs=Path(inputs) if inputs else None,
        labels=parse_labels(labels),
        warmup=warmup,
        iterations=iterations,
        threads=threads,
        max_seconds=max_seconds,
        method=method,
        timeout=timeout,
        lock_timeout=lock_timeout,
        etdump=not no_etdump,
        runner=Path(runner) if runner else None,
        kill_grace=kill_grace,
        counters=counters,
        numerics=(Path(numerics_model), Path(numerics_reference)) if numerics_model and numerics_reference else None,
        numerics_full_cap=numerics_full_cap,
        numerics_inputs=Path(numerics_inputs) if numerics_inputs else None,
        generate=generate,
        prompt_len=prompt_len,
        new_tokens=new_tokens,
        context=context,
    )
    result = profile(workdir, request)
    return result, ExitCode.OK if result["status"] == "ok" else ExitCode.FAILED


@cli.command()
@click.pass_obj
@json_command
def bundles(workdir: Workdir) -> tuple[dict[str, Any], int]:
    """List result bundles, newest first."""
    return {"bundles": list_bundles(workdir)}, ExitCode.OK


@cli.command()
@click.option("--keep", type=click.IntRange(min=0), required=True, help="How many of the newest bundles to keep.")
@click.option(
    "--model-days",
    type=SECONDS,
    default=1.0,
    show_default=True,
    help="Keep unreferenced models/inputs used within this many days.",
)
@click.option("--lock-timeout", type=SECONDS, default=DEFAULT_LOCK_TIMEOUT_SECONDS, show_default=True)
@click.option("--dry-run", is_flag=True, help="Report what would be removed, remove nothing.")
@click.option("--protect", multiple=True, help="Never remove the model with this sha256 (a nightly baseline).")
@click.pass_obj
@json_command
def gc(
    workdir: Workdir, keep: int, model_days: float, lock_timeout: float, dry_run: bool, protect: tuple[str, ...]
) -> tuple[dict[str, Any], int]:
    """Remove old bundles, stale .tmp-* folders and models/inputs no kept bundle uses."""
    return collect_garbage(workdir, keep, model_days, lock_timeout, dry_run, protect=set(protect)), ExitCode.OK


@cli.command(name="probe-bandwidth")
@click.option("--threads", type=click.IntRange(min=1), help="Threads reading (default: every core).")
@click.option("--rounds", type=click.IntRange(min=1, max=100), default=4, show_default=True)
@click.option("--timeout", type=POSITIVE_SECONDS, default=300.0, show_default=True)
@click.option("--lock-timeout", type=SECONDS, default=DEFAULT_LOCK_TIMEOUT_SECONDS, show_default=True)
@click.pass_obj
@json_command
def probe_bandwidth(
    workdir: Workdir, threads: int | None, rounds: int, timeout: float, lock_timeout: float
) -> tuple[dict[str, Any], int]:
    """The provisioned runner's --probe-bandwidth under the board lock (no run reads memory meanwhile); its answer
    as text, for the workstation to check (it is board data)."""
    runner, _ = runner_from_state(workdir)
    argv = [str(runner), "--probe-bandwidth", "--probe-rounds", str(rounds)]
    argv += ["--threads", str(threads)] if threads else []
    with BoardLock(workdir).acquired(describe_holder("probe-bandwidth", None), lock_timeout):
        answer = run_probe(argv, timeout)
    if answer is None:
        return {"exit_code": None, "answer": None, "error": f"the probe did not finish in {timeout:g} s"}, ExitCode.OK
    code, stdout, stderr = answer
    error = stderr.decode("utf-8", errors="replace").strip().splitlines()[-1:] if code else []
    return {
        "exit_code": code,
        "answer": stdout[:PROBE_ANSWER_CAP].decode("utf-8", errors="replace"),
        "error": error[0][:400] if error else None,
    }, ExitCode.OK


@cli.command()
@click.option("--model", required=True, help="The verification program (.pte), pushed content-addressed.")
@click.option("--inputs", required=True, help="Its inputs (ETLT).")
@click.option("--reference", required=True, help="Its outputs on the workstation (ETLT), compared by the runner.")
@click.option("--timeout", type=POSITIVE_SECONDS, default=120.0, show_default=True)
@click.option("--lock-timeout", type=SECONDS, default=DEFAULT_LOCK_TIMEOUT_SECONDS, show_default=True)
@click.pass_obj
@json_command
def health(
    workdir: Workdir, model: str, inputs: str, reference: str, timeout: float, lock_timeout: float
) -> tuple[dict[str, Any], int]:
    """The health job: disk and memory free, throttling, governors, and the verification program run against its
    reference under the board lock. Facts only: the workstation judges them."""
    paths = [Path(p).expanduser() for p in (model, inputs, reference)]
    return health_check(workdir, *paths, timeout, lock_timeout), ExitCode.OK


@cli.command(name="time-program")
@click.option("--model", required=True, help="The program (.pte), pushed content-addressed.")
@click.option("--threads", type=click.IntRange(min=1), help="Threads (default: every core).")
@click.option("--iterations", type=click.IntRange(min=1, max=1000), default=10, show_default=True)
@click.option("--warmup", type=click.IntRange(min=0, max=1000), default=2, show_default=True)
@click.option("--timeout", type=POSITIVE_SECONDS, default=300.0, show_default=True)
@click.option("--lock-timeout", type=SECONDS, default=DEFAULT_LOCK_TIMEOUT_SECONDS, show_default=True)
@click.pass_obj
@json_command
def time_program_command(
    workdir: Workdir, model: str, threads: int | None, iterations: int, warmup: int, timeout: float, lock_timeout: float
) -> tuple[dict[str, Any], int]:
    """The runner's timings of a program under the board lock, as text for the workstation to check (the compute
    probe's GEMMs); no bundle."""
    document = time_program(workdir, Path(model).expanduser(), threads, iterations, warmup, timeout, lock_timeout)
    return document, ExitCode.OK


@cli.command(name="lock-status")
@click.pass_obj
@json_command
def lock_status(workdir: Workdir) -> tuple[dict[str, Any], int]:
    """Who holds the board lock (holder null when free)."""
    holder = current_holder(workdir)
    return {"held": holder is not None, "holder": holder}, ExitCode.OK


@cli.command()
@click.option("--wheel", required=True, help="The .whl to unpack.")
@click.option("--dest", required=True, help="Destination folder (replaced as a whole, atomically).")
@click.option("--member-prefix", "member_prefixes", multiple=True, help="Only members under this prefix (repeatable).")
@click.option("--strip-prefix", help="Remove this prefix from member paths (e.g. executorch/ or cmake/data/).")
@json_command
def unpack(
    wheel: str, dest: str, member_prefixes: tuple[str, ...], strip_prefix: str | None
) -> tuple[dict[str, Any], int]:
    """Unpack a wheel safely (no absolute or '..' members), keeping exec bits."""
    from .wheel import unpack_wheel

    return unpack_wheel(Path(wheel), Path(dest), member_prefixes, strip_prefix), ExitCode.OK


@cli.command(name="build-runner")
@click.option("--sdk", required=True, help="ExecuTorch SDK folder (include/, lib/, share/cmake/).")
@click.option("--source", required=True, help="The board/runner source folder.")
@click.option("--out", required=True, help="Output folder: <out>/etlab_runner, <out>/build.log, <out>/build/.")
@click.option("--jobs", type=click.IntRange(min=1), help="Parallel compile jobs (default: all cores).")
@click.option(
    "--timeout",
    type=POSITIVE_SECONDS,
    default=3600.0,
    show_default=True,
    help="Seconds allowed per build step.",
)
@click.pass_obj
@json_command
def build_runner_command(
    workdir: Workdir, sdk: str, source: str, out: str, jobs: int | None, timeout: float
) -> tuple[dict[str, Any], int]:
    """Build the native runner on this board."""
    from .build import build_runner

    return build_runner(workdir, Path(sdk), Path(source), Path(out), jobs, timeout), ExitCode.OK


@cli.command()
@click.pass_obj
@json_command
def state(workdir: Workdir) -> tuple[dict[str, Any], int]:
    """Print <wd>/state.json ("provisioned": false when absent)."""
    current = read_state(workdir)
    return {"provisioned": current is not None, "path": str(workdir.state), "state": current}, ExitCode.OK


@cli.command(name="set-state")
@click.argument("assignments", nargs=-1, metavar="KEY=VALUE...")
@click.option("--unset", "unset_keys", multiple=True, metavar="KEY", help="Remove a key (repeatable).")
@click.pass_obj
@json_command
def set_state(
    workdir: Workdir, assignments: tuple[str, ...], unset_keys: tuple[str, ...]
) -> tuple[dict[str, Any], int]:
    """Merge KEY=VALUE pairs into <wd>/state.json atomically (keys: see `state`; --unset KEY removes one)."""
    updates: dict[str, str | None] = {}
    for assignment in assignments:
        key, sep, value = assignment.partition("=")
        if not sep:
            raise BadInput(f"invalid assignment {assignment!r}: expected KEY=VALUE")
        updates[key] = value
    for key in unset_keys:
        updates[key] = None
    if not updates:
        raise BadInput("nothing to set: pass KEY=VALUE pairs or --unset KEY")
    return {"path": str(workdir.state), "state": update_state(workdir, updates)}, ExitCode.OK


def main(argv: list[str] | None = None) -> None:
    try:
        cli.main(args=argv, prog_name="etlab_agent", standalone_mode=False)
    except click.exceptions.UsageError as exc:
        exc.show(file=sys.stderr)
        emit({"error": exc.format_message(), "exit_code": ExitCode.USAGE})
        sys.exit(ExitCode.USAGE)
    except click.exceptions.Abort:
        emit({"error": "aborted", "exit_code": ExitCode.FAILED})
        sys.exit(ExitCode.FAILED)
    sys.exit(ExitCode.OK)
