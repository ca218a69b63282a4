"""What the command layer shares: options parsed once into typed values (boards, models, variants, rewrites, run
parameters, contexts, attention), each refused with the option named (exit 64), and library errors given the option
that mends them. Task bodies import it; `fab` itself starts with commands/handling.py alone."""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, overload

from orchestrator.boards import labgrid
from orchestrator.boards.inventory import Board, Inventory, load_inventory
from orchestrator.commands import options
from orchestrator.commands.lowered import known_lowered_models, lowered_model_spec
from orchestrator.config import did_you_mean
from orchestrator.deploy.runs import RunParams
from orchestrator.errors import ArtifactError, UsageError
from orchestrator.lowering.artifacts import Artifact, MissingArtifact, load_artifact
from orchestrator.lowering.attention.choice import ATTENTIONS
from orchestrator.lowering.builtins import BUILTIN_SPECS, resolve_spec
from orchestrator.lowering.lowered import recorded_rewrites
from orchestrator.lowering.program_name import program_name, with_
from orchestrator.lowering.quantize.calibration import CalibrationError
from orchestrator.lowering.rewrites.registry import (
    RewriteNotFound,
    RewriteRequest,
    UnknownRewrite,
    check_request,
    parse_rewrites,
)
from orchestrator.lowering.spec import MAX_CONTEXT, ModelSpec, RemoteCodeInSpec, UnknownModel
from orchestrator.lowering.variants import BACKENDS, SCHEMES, UnknownVariant, Variant, combine, parse_schemes
from orchestrator.servers.errors import PortBusy


def split_list(value: str | None) -> list[str] | None:
    """`--board a,b` → ["a", "b"]; None stays None."""
    if value is None:
        return None
    return [item.strip() for item in value.split(",") if item.strip()]


def select_boards(
    inventory: str | None, board: str | None, group: str | None, tag: str | None, lg_wait: Any = None
) -> list[Board]:
    """Boards chosen by --board/--group/--tag from --inventory (default inventory.yaml); labgrid tag selectors
    expanded to their places, which wait at most --lg-wait seconds for their place."""
    wait = None if lg_wait is None else options.seconds("--lg-wait", lg_wait)
    selected = load_inventory(Path(inventory) if inventory else None).select(split_list(board), group, tag)
    return labgrid.with_wait(labgrid.expand(selected), wait)


def one_board(inventory: str | None, board: str | None, *, what: str, example: str) -> Board:
    """The one board `--board` names for work that runs on exactly one (`what`: "--interleave needs"): one name, and
    one board once a labgrid tag selector is expanded to its places (exit 64 otherwise, the option named)."""
    names = split_list(board) or []
    if len(names) != 1:
        raise UsageError(f"{what} exactly one --board, got {board or 'none'}", hint=f"e.g. {example}")
    boards = select_boards(inventory, names[0], None, None)
    if len(boards) != 1:
        raise UsageError(
            f"{what} exactly one board; --board {names[0]} is {len(boards)}: {', '.join(b.name for b in boards)}",
            hint=f"name one of them, e.g. {example.replace('local', boards[0].name) if boards else example}",
        )
    return boards[0]


def select_all(inventory: Inventory) -> list[Board]:
    """Every board of an inventory, labgrid tag selectors expanded to their places."""
    return labgrid.expand(list(inventory.boards.values()))


def model_spec(
    model: str | None, spec: str | None, *, trust_remote_code: bool = False, trust_code: bool = False
) -> ModelSpec:
    """`--model NAME` or `--spec FILE`, exactly one (exit 64, the options named)."""
    if (model is None) == (spec is None):
        raise UsageError("give exactly one of --model NAME or --spec FILE")
    try:
        return resolve_spec(model, spec, trust_remote_code=trust_remote_code, trust_code=trust_code)
    except UnknownModel as exc:
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
    records: it is lowered again only with them, under its own name (program_name.py).
    """
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
    if recorded and program_name(target, RewriteRequest(names=recorded)) == target.name:
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
    try:
        yield
    except RewriteNotFound as exc:
        raise UsageError(f"--rewrites {value}: {exc}", hint="--rewrites auto applies only what the model has") from None


@contextlib.contextmanager
def naming_calibration() -> Iterator[None]:
    """A calibration file's mistakes, found once the model's vocabulary is known, named with the option."""
    try:
        yield
    except CalibrationError as exc:
        raise UsageError(f"--calibration {exc.args[0]}", hint=exc.hint) from None


@contextlib.contextmanager
def naming_port() -> Iterator[None]:
    """A busy port for Model Explorer, with the option that picks another."""
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
        if target.positions(new_tokens) > context:
            raise UsageError(
                f"--context {context}: {target.name}'s prompt of {target.seq_len} tokens and {tokens} new ones need "
                f"{target.positions(new_tokens)} positions"
            )
    return [with_(target, context=context) for context in dict.fromkeys(contexts)]


@overload
def attention_spec(value: Any, target: ModelSpec) -> ModelSpec: ...
@overload
def attention_spec(value: Any, target: ModelSpec | Artifact) -> ModelSpec | Artifact: ...
def attention_spec(value: Any, target: ModelSpec | Artifact) -> ModelSpec | Artifact:
    """`--attention etlab|sdpa` for a text-generation spec: the program attending that way, under its own name when it
    is not the spec's own choice (exit 64 for another value or a model that does not generate). None: as it is."""
    if value is None:
        return target

    if value not in ATTENTIONS:
        meant = did_you_mean(str(value), ATTENTIONS)
        raise UsageError(f"--attention must be one of {', '.join(ATTENTIONS)}, got {value!r}{meant}")
    if not isinstance(target, ModelSpec):
        raise UsageError(f"--attention: {target.model} is a program of your own, lowered as you exported it")
    if not target.generates or not hasattr(target.options, "attention"):
        raise UsageError(f"--attention: {target.name} is not a text-generation model (it has no KV cache)")
    return with_(target, attention=str(value))


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
