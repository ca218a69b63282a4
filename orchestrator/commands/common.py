"""Glue between Fabric tasks and the library: turn errors into messages and meaningful exit codes."""

from __future__ import annotations

import contextlib
import functools
import os
import traceback
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar, overload

from invoke.exceptions import Exit

from orchestrator import console, exiting, interrupts
from orchestrator.commands import options
from orchestrator.config import did_you_mean
from orchestrator.errors import EtlabError, ExitCode, UsageError

if TYPE_CHECKING:
    from orchestrator.boards.inventory import Board, Inventory
    from orchestrator.deploy.runs import RunParams
    from orchestrator.lowering.artifacts import Artifact
    from orchestrator.lowering.rewrites.registry import RewriteRequest
    from orchestrator.lowering.spec import ModelSpec
    from orchestrator.lowering.variants import Variant

F = TypeVar("F", bound=Callable[..., Any])


def split_list(value: str | None) -> list[str] | None:
    """`--board a,b` → ["a", "b"]; None stays None."""
    if value is None:
        return None
    return [item.strip() for item in value.split(",") if item.strip()]


def _interrupted() -> NoReturn:
    said = False
    while True:
        try:
            # From here until the process ends, a further Ctrl+C or SIGTERM (a second one, or one that
            # no_lost_interrupts delivers again late) is ignored: exit 130 in one line, never a traceback, never
            # the signal's own status (-2) because one landed while the exit unwound.
            interrupts.stay_quiet()
            interrupts.interrupt()  # whatever is still running on a board for us stops too
            if not said:
                said = True
                console.error("interrupted")
            break
        except KeyboardInterrupt:
            continue  # one came before the signals were quieted
    interrupts.deaf_until_exit()
    raise Exit(code=ExitCode.INTERRUPTED) from None


def handle_errors(func: F) -> F:
    """Run a task body: EtlabError → one clear message and its exit code; an int result is the exit code."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        exiting.task_started()
        console.quiet_third_party()
        interrupts.reset()
        try:
            # SIGTERM (a cancelled CI job, `kill`) stops like Ctrl+C: boards are stopped, locks and places released.
            with interrupts.sigterm_interrupts(), interrupts.no_lost_interrupts(), console.warnings_once():
                code = func(*args, **kwargs)
        except EtlabError as exc:
            console.error(str(_naming_options(exc)))
            raise Exit(code=exc.exit_code) from None
        except KeyboardInterrupt:
            _interrupted()
        except Exit:
            raise
        except Exception as exc:
            if interrupts.caused_by_interrupt(exc):  # e.g. Python wraps one raised in __set_name__ in a RuntimeError
                _interrupted()
            if os.environ.get("ETLAB_DEBUG"):
                raise
            console.error("internal error (set ETLAB_DEBUG=1 for the full traceback):")
            console.plain(traceback.format_exc(limit=-3).rstrip())  # inert: the message may quote a board
            _log_internal_error(func.__name__, traceback.format_exc())
            raise Exit(code=ExitCode.SOFTWARE) from None
        if isinstance(code, int) and code != 0:
            if code == ExitCode.SOFTWARE:
                _log_internal_error(func.__name__, "a board's job ended in an internal error")
            raise Exit(code=code)
        return None

    return wrapper  # type: ignore[return-value]


def _naming_options(exc: EtlabError) -> EtlabError:
    """A library error with the option that mends it, which the library does not name."""
    # here, not at the top: fab imports this module at start-up, and only a failed task gets here
    from orchestrator.lowering.spec import UntrustedFactory
    from orchestrator.lowering.weights import PretrainedUnavailable

    if isinstance(exc, PretrainedUnavailable):
        exc.hint = "use --weights random to build the architecture from its config"
    elif isinstance(exc, UntrustedFactory):
        exc.hint = "pass --trust-code on the command line if you trust the factory's code"
    return exc


def _log_internal_error(task: str, detail: str) -> None:
    """Exit 70 is etlab's own bug: the test suite collects every one (ETLAB_INTERNAL_ERROR_LOG) and fails on any."""
    path = os.environ.get("ETLAB_INTERNAL_ERROR_LOG")
    if path:
        import json
        import sys

        with open(path, "a", encoding="utf-8") as log:
            log.write(json.dumps({"task": task, "argv": sys.argv, "detail": detail[-4000:]}) + "\n")


def select_boards(
    inventory: str | None, board: str | None, group: str | None, tag: str | None, lg_wait: Any = None
) -> list[Board]:
    """Boards chosen by --board/--group/--tag from --inventory (default inventory.yaml); labgrid tag selectors
    expanded to their places, which wait at most --lg-wait seconds for their place."""
    from pathlib import Path

    # here, not at the top: fab imports this module at start-up
    from orchestrator.boards import labgrid
    from orchestrator.boards.inventory import load_inventory

    wait = None if lg_wait is None else options.seconds("--lg-wait", lg_wait)
    selected = load_inventory(Path(inventory) if inventory else None).select(split_list(board), group, tag)
    return labgrid.with_wait(labgrid.expand(selected), wait)


def select_all(inventory: Inventory) -> list[Board]:
    """Every board of an inventory, labgrid tag selectors expanded to their places."""
    # here, not at the top: fab imports this module at start-up
    from orchestrator.boards import labgrid

    return labgrid.expand(list(inventory.boards.values()))


def model_spec(
    model: str | None, spec: str | None, *, trust_remote_code: bool = False, trust_code: bool = False
) -> ModelSpec:
    """`--model NAME` or `--spec FILE`, exactly one (exit 64, the options named)."""
    # here, not at the top: fab imports this module at start-up
    from orchestrator.lowering.builtins import resolve_spec
    from orchestrator.lowering.spec import RemoteCodeInSpec, UnknownModel

    if (model is None) == (spec is None):
        raise UsageError("give exactly one of --model NAME or --spec FILE")
    try:
        return resolve_spec(model, spec, trust_remote_code=trust_remote_code, trust_code=trust_code)
    except UnknownModel as exc:
        # here, not at the top: fab imports this module at start-up
        from orchestrator.commands.lowered import known_lowered_models, lowered_model_spec

        assert model is not None  # a spec file is never unknown
        found = lowered_model_spec(model, trust_remote_code=trust_remote_code, trust_code=trust_code)
        if found is not None:
            return found
        lowered = known_lowered_models()
        if lowered:
            exc.args = (f"{exc.args[0]}; lowered from spec files or your own programs: {', '.join(lowered)}",)
        exc.hint = "or pass your own spec with --spec path/to/model_spec.json"
        raise
    except RemoteCodeInSpec as exc:
        exc.hint = "pass --trust-remote-code on the command line if you trust the model folder's code"
        raise


def variants(backend: str | None, quantize: Any = "none", default: str = "portable,xnnpack") -> list[Variant]:
    """`--backend portable,xnnpack --quantize none,int8-dynamic` → the variants they ask for (variants.combine):
    order kept, no duplicates, every name checked against the registry (exit 64, the option named)."""
    # here, not at the top: fab imports this module at start-up
    from orchestrator.lowering.variants import BACKENDS, SCHEMES, UnknownVariant, Variant, combine, parse_schemes

    names = split_list(backend or default) or []
    unknown = [name for name in names if name not in BACKENDS]
    if unknown or not names:
        meant = did_you_mean(unknown[0], BACKENDS) if unknown else ""
        raise UsageError(
            f"--backend: unknown backend {', '.join(unknown) or '(none)'}{meant}; choose from: {', '.join(BACKENDS)}"
        )
    if isinstance(quantize, bool):  # `--quantize` without a value
        raise UsageError(f"--quantize: give a scheme; choose from: {', '.join(SCHEMES)}")
    try:
        schemes = parse_schemes(split_list(str(quantize if quantize is not None else "none")) or [])
    except UnknownVariant as exc:
        raise UsageError(f"--quantize: {exc}") from None
    return list(combine([Variant.parse(name) for name in names], schemes))


def lower_options(variant: Variant) -> str:
    """The `fab lower` options that make `variant`: `--backend xnnpack` or `--quantize int8-dynamic`."""
    return f"--quantize {variant.scheme.name}" if variant.quantized else f"--backend {variant.name}"


def find_artifact(model: str, variant: Variant | str, root: Path | None = None) -> Artifact:
    """The lowered artifact of `model`/`variant` (a Variant, or a variant name read from a run), or an
    ArtifactError naming the `fab lower` that makes it."""
    # here, not at the top: fab imports this module at start-up
    from orchestrator.errors import ArtifactError
    from orchestrator.lowering.artifacts import MissingArtifact, load_artifact
    from orchestrator.lowering.variants import UnknownVariant, Variant

    try:
        chosen = variant if isinstance(variant, Variant) else Variant.parse(variant)
    except UnknownVariant as exc:
        raise ArtifactError(f"no artifact for model {model!r}: {exc}") from None
    try:
        return load_artifact(model, chosen, root)
    except MissingArtifact as exc:
        raise ArtifactError(str(exc), hint=f"run: fab lower --model {model} {lower_options(chosen)}") from None


@dataclass(frozen=True)
class LoweringOptions:
    """`--weights`, `--jobs` and `--calibration`, each checked once, here (exit 64), before the cache is looked at:
    a bad value must not invalidate it. The lowering below checks none of them again."""

    weights: str  # auto, pretrained or random
    jobs: int | None  # None: as many as the cores and memory allow
    calibration: Path | None  # an existing file; its samples are checked against the model's vocabulary later


def lowering_options(weights: Any = "auto", jobs: Any = None, calibration: Any = None) -> LoweringOptions:
    mode = options.weights(weights)
    workers = None if jobs is None else options.count("--jobs", jobs, minimum=1, maximum=options.MAX_THREADS)
    path = Path(calibration) if calibration else None
    if path is not None and not path.is_file():
        raise UsageError(f"--calibration {calibration}: no such file")
    return LoweringOptions(mode, workers, path)


def rewrite_request(value: Any, target: ModelSpec | Artifact) -> RewriteRequest:
    """`--rewrites auto|none|a,b` for the model `target` (a ModelSpec, or an Artifact of `--pte`, which etlab does
    not lower): a RewriteRequest, or UsageError naming the option (an unknown name, one that does not apply).

    A rewritten program found by its artifacts (`--model gpt2-tiny.tanh-gelu`) gets the rewrites its sidecar
    records: it is lowered again only with them, under its own name (`RewriteRequest.program_spec`).
    """
    # here, not at the top: fab imports this module at start-up
    from orchestrator.lowering.builtins import BUILTIN_SPECS
    from orchestrator.lowering.lowered import recorded_rewrites
    from orchestrator.lowering.rewrites.registry import RewriteRequest, UnknownRewrite, check_request, parse_rewrites
    from orchestrator.lowering.spec import ModelSpec

    try:
        request = parse_rewrites(str(value))
        if request != RewriteRequest() and not isinstance(target, ModelSpec):
            raise UnknownRewrite("not for --pte (your program is profiled as you lowered it)")
        if isinstance(target, ModelSpec):
            check_request(request, target)
    except UnknownRewrite as exc:
        raise UsageError(f"--rewrites {value}: {exc}", hint=exc.hint) from None
    if not isinstance(target, ModelSpec) or target.name in BUILTIN_SPECS:
        return request
    recorded = recorded_rewrites(target.name)
    if recorded and RewriteRequest(names=recorded).program_name(target) == target.name:
        if request not in (RewriteRequest(), RewriteRequest(names=recorded)) and request.resolve(target) != recorded:
            raise UsageError(
                f"--rewrites {value}: {target.name} is a rewritten program, lowered with {', '.join(recorded)}",
                hint="lower the model as exported with the rewrites you want: each set gets its own name",
            )
        return RewriteRequest(names=recorded)
    return request


@contextlib.contextmanager
def naming_rewrites(value: Any) -> Iterator[None]:
    """A rewrite asked for by name whose pattern the loaded model lacks, named with the option."""
    # here, not at the top: fab imports this module at start-up
    from orchestrator.lowering.rewrites.registry import RewriteNotFound

    try:
        yield
    except RewriteNotFound as exc:
        raise UsageError(f"--rewrites {value}: {exc}", hint="--rewrites auto applies only what the model has") from None


@contextlib.contextmanager
def naming_calibration() -> Iterator[None]:
    """A calibration file's mistakes, found once the model's vocabulary is known, named with the option."""
    # here, not at the top: fab imports this module at start-up
    from orchestrator.lowering.quantize.calibration import CalibrationError

    try:
        yield
    except CalibrationError as exc:
        raise UsageError(f"--calibration {exc.args[0]}", hint=exc.hint) from None


@contextlib.contextmanager
def naming_port() -> Iterator[None]:
    """A busy port for Model Explorer, with the option that picks another."""
    # here, not at the top: fab imports this module at start-up
    from orchestrator.servers.explorer import PortBusy

    try:
        yield
    except PortBusy as exc:
        exc.hint = "stop it, or choose another port with --port"
        raise


def run_params(
    iterations: Any,
    warmup: Any,
    threads: Any,
    max_seconds: Any,
    timeout: Any,
    counters: Any = None,
    new_tokens: Any = None,
) -> RunParams:
    """RunParams from task options, each checked (exit 64); unset options keep the library defaults."""
    # here, not at the top: fab imports this module at start-up
    from orchestrator.deploy.runs import RunParams

    default = RunParams()
    return RunParams(
        iterations=default.iterations if iterations is None else options.count("--iterations", iterations, minimum=1),
        warmup=default.warmup if warmup is None else options.count("--warmup", warmup),
        threads=default.threads
        if threads is None
        else options.count("--threads", threads, minimum=1, maximum=options.MAX_THREADS),
        max_seconds=default.max_seconds if max_seconds is None else options.seconds("--max-seconds", max_seconds),
        timeout=default.timeout if timeout is None else options.seconds("--timeout", timeout, allow_zero=False),
        counters=options.counters(counters),
        new_tokens=default.new_tokens if new_tokens is None else options.count("--new-tokens", new_tokens, minimum=1),
    )


@overload
def context_specs(value: Any, target: ModelSpec, new_tokens: int | None = None) -> list[ModelSpec]: ...
@overload
def context_specs(
    value: Any, target: ModelSpec | Artifact, new_tokens: int | None = None
) -> list[ModelSpec | Artifact]: ...
def context_specs(
    value: Any, target: ModelSpec | Artifact, new_tokens: int | None = None
) -> list[ModelSpec] | list[ModelSpec | Artifact]:
    """`--context 128,512,1024` for a text-generation spec: one spec per KV cache size (its own program and name),
    each checked to hold the prompt and the new tokens (exit 64, the option named). None: the spec as it is."""
    if value is None:
        return [target]
    # here, not at the top: fab imports this module at start-up
    from orchestrator.lowering.spec import MAX_CONTEXT, ModelSpec

    if not isinstance(target, ModelSpec) or not target.generates:
        name = getattr(target, "name", None) or getattr(target, "model", "this program")
        raise UsageError(f"--context: {name} is not a text-generation model (it has no KV cache)")
    contexts = []
    for item in split_list(str(value)) or []:
        contexts.append(options.count("--context", item, minimum=2, maximum=MAX_CONTEXT))
    if not contexts:
        raise UsageError("--context: give one or more KV cache sizes, e.g. --context 128,512,1024")
    tokens = new_tokens or target.new_tokens
    for context in contexts:
        if target.seq_len + tokens > context:
            raise UsageError(
                f"--context {context}: {target.name}'s prompt of {target.seq_len} tokens and {tokens} new ones need "
                f"{target.seq_len + tokens} positions"
            )
    return [target.with_context(context) for context in dict.fromkeys(contexts)]


@overload
def attention_spec(value: Any, target: ModelSpec) -> ModelSpec: ...
@overload
def attention_spec(value: Any, target: ModelSpec | Artifact) -> ModelSpec | Artifact: ...
def attention_spec(value: Any, target: ModelSpec | Artifact) -> ModelSpec | Artifact:
    """`--attention etlab|sdpa` for a text-generation spec: the program attending that way, under its own name when it
    is not the spec's own choice (exit 64 for another value or a model that does not generate). None: as it is."""
    if value is None:
        return target
    # here, not at the top: fab imports this module at start-up
    from orchestrator.lowering.attention.choice import ATTENTIONS, with_attention
    from orchestrator.lowering.spec import ModelSpec

    if value not in ATTENTIONS:
        meant = did_you_mean(str(value), ATTENTIONS)
        raise UsageError(f"--attention must be one of {', '.join(ATTENTIONS)}, got {value!r}{meant}")
    if not isinstance(target, ModelSpec):
        raise UsageError(f"--attention: {target.model} is a program of your own, lowered as you exported it")
    if not target.generates or not hasattr(target.options, "attention"):
        raise UsageError(f"--attention: {target.name} is not a text-generation model (it has no KV cache)")
    return with_attention(target, str(value))


def check_generation(artifacts: Iterable[Artifact], params: RunParams) -> None:
    """`--new-tokens` against each text-generation program's KV cache, before anything is pushed or run (exit 64).

    `--new-tokens` on a program that does not generate is refused too: it would be silently ignored."""
    if params.new_tokens is None:
        return
    for artifact in artifacts:
        generation = artifact.sidecar.generation
        if generation is None:
            raise UsageError(f"--new-tokens: {artifact.model} is not a text-generation program (it runs once per run)")
        needed = generation.prompt_len + params.new_tokens
        if needed > generation.context:
            raise UsageError(
                f"--new-tokens {params.new_tokens}: {artifact.model}'s prompt of {generation.prompt_len} tokens and "
                f"{params.new_tokens} new ones need {needed} positions; its KV cache holds {generation.context}",
                hint=f"at most --new-tokens {generation.context - generation.prompt_len}, or lower it with a larger "
                "context",
            )


def nightly_task(
    *, inventory: str | None, night: Any, history: Any, reports: str | None, wait: bool, record_pending: bool
) -> int:
    """`fab nightly`: `--night` and `--history` checked (exit 64), then the night."""
    date = None if night is None else options.night(night)
    url = None if history is None else options.history(history)
    return nightly_job(inventory, date, url, reports, wait=wait, record_pending=record_pending)


def nightly_job(
    inventory: str | None,
    night: str | None,
    history: str | None,
    reports: str | None,
    *,
    wait: bool = False,
    record_pending: bool = False,
) -> int:
    from pathlib import Path

    # here, not at the top: fab imports this module at start-up
    from orchestrator.boards.inventory import load_inventory
    from orchestrator.commands.render_night import print_night
    from orchestrator.lab.nightlock import NightBusy
    from orchestrator.lab.nightly import record_pending_results, run_nightly
    from orchestrator.lab.reports_folder import ReportsFolderTaken

    if record_pending:
        return record_pending_results(
            load_inventory(Path(inventory) if inventory else None),
            history_url=history,
            reports_dir=Path(reports) if reports else None,
        )
    from orchestrator.lab.lab_settings import load_lab_settings  # with the nightly's own, late: see above

    loaded = load_inventory(Path(inventory) if inventory else None)
    try:
        report = run_nightly(
            loaded,
            night=night,
            history_url=history,
            reports_dir=Path(reports) if reports else None,
            wait=wait,
            lab=load_lab_settings(loaded),
        )
    except NightBusy as exc:
        exc.hint = "`fab nightly --wait` waits for it, then runs only the cells it did not"
        raise
    except ReportsFolderTaken as exc:
        exc.hint = (
            "give each history its own reports folder: `reports:` in the inventory's nightly section, or --reports "
            f"DIR (if the history itself moved, remove {exc.marker} and this one takes the folder over)"
        )
        raise
    print_night(report)
    if "html" in report.outputs:  # the static dashboard next to the night's reports
        # here, not at the top: the dashboard's modules load Jinja2, which only this and `fab dashboard` need
        from orchestrator.commands.dashboard import nightly_dashboard, sources

        folder = report.outputs["html"].parent / f"dashboard-{report.night}"
        if nightly_dashboard(sources(inventory, history), folder) is not None:
            console.info(console.escape(f"dashboard: {folder / 'index.html'}"))
    return report.exit_code
