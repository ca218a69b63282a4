"""What the command layer shares: options parsed once into typed values (boards, models, variants, rewrites, run
parameters, contexts, attention), each refused with the option named (exit 64), and library errors given the option
that mends them. Task bodies import it; `fab` itself starts with commands/handling.py alone."""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from orchestrator import console
from orchestrator.boards import labgrid
from orchestrator.boards.inventory import Board, Inventory, load_inventory
from orchestrator.commands import options
from orchestrator.config import did_you_mean
from orchestrator.deploy.runs import RunParams
from orchestrator.errors import ArtifactError, UsageError
from orchestrator.lowering.artifacts import Artifact, MissingArtifact, load_artifact
from orchestrator.lowering.export.numerics import (
    CalibrationNeeded,
    NumericsProgram,
    NumericsUnavailable,
    check_measurable,
    make_numerics,
)
from orchestrator.lowering.program import KeepFloatRefused, ProgramName
from orchestrator.lowering.quantize.calibration import CalibrationError
from orchestrator.lowering.rewrites.registry import (
    RewriteNotFound,
)
from orchestrator.lowering.spec import ModelSpec
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


@dataclass(frozen=True)
class BoardOptions(options.OptionGroup):
    """`--board`, `--group`, `--tag`, `--inventory`, `--lg-wait`: the boards a task works on."""

    board: str | None = None
    group: str | None = None
    tag: str | None = None
    inventory: str | None = None
    lg_wait: Any = None

    def boards(self) -> list[Board]:
        return select_boards(self.inventory, self.board, self.group, self.tag, self.lg_wait)


def select_all(inventory: Inventory) -> list[Board]:
    """Every board of an inventory, labgrid tag selectors expanded to their places."""
    return labgrid.expand(list(inventory.boards.values()))


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


def lower_options(model: str, variant: Variant) -> str:
    """The `fab lower` options that make program `model`'s `variant`: `--model gpt2-tiny --rewrites tanh-gelu
    --backend xnnpack`, `--model smollm2-gen-tiny --context 128 --quantize int8-dynamic` (a program in the short form
    of its rewrites, or one keeping layers in float, is known by its name alone)."""
    named = ProgramName.parse(model)
    by_name = named.rewrites_digest is not None or named.keep_float_digest is not None
    words = [f"--model {model if by_name else named.base}"]
    if not by_name:
        words += [f"--attention {named.attention}"] if named.attention else []
        words += [f"--context {named.context}"] if named.context is not None else []
        words += [f"--rewrites {','.join(named.rewrites)}"] if named.rewrites else []
    words.append(f"--quantize {variant.scheme.name}" if variant.quantized else f"--backend {variant.name}")
    return " ".join(words)


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
        raise ArtifactError(str(exc), hint=f"run: fab lower {lower_options(model, chosen)}") from None


@dataclass(frozen=True)
class LoweringOptions:
    """`--weights`, `--jobs` and `--calibration`, each checked once, here (exit 64), before the cache is looked at:
    a bad value must not invalidate it. The lowering below checks none of them again."""

    weights: str  # auto, pretrained or random
    jobs: int | None  # None: as many as the idle cores (load average) and memory allow
    calibration: Path | None  # an existing file; its samples are checked against the model's vocabulary later


def lowering_options(weights: Any = "auto", jobs: Any = None, calibration: Any = None) -> LoweringOptions:
    mode = options.weights(weights)
    workers = None if jobs is None else options.count("--jobs", jobs, minimum=1, maximum=options.MAX_THREADS)
    path = Path(calibration) if calibration else None
    if path is not None and not path.is_file():
        raise UsageError(f"--calibration {calibration}: no such file")
    return LoweringOptions(mode, workers, path)


@contextlib.contextmanager
def naming_rewrites(value: Any) -> Iterator[None]:
    """A rewrite asked for by name whose pattern the loaded model lacks, named with the option."""
    try:
        yield
    except RewriteNotFound as exc:
        raise UsageError(f"--rewrites {value}: {exc}", hint="--rewrites auto applies only what the model has") from None


@contextlib.contextmanager
def naming_keep_float(value: Any) -> Iterator[None]:
    """Layers kept in float that cannot be, named with the option."""
    try:
        yield
    except KeepFloatRefused as exc:
        shown = f" {value}" if value is not None else ""
        raise UsageError(f"--keep-float{shown}: {exc}", hint=f"--keep-float takes {exc.fix}") from None


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


@dataclass(frozen=True)
class RunOptions(options.OptionGroup):
    """How a program runs on a board: `--iterations`, `--warmup`, `--threads`, `--max-seconds`, `--timeout`,
    `--counters`, `--new-tokens`, `--numerics`."""

    iterations: Any = None
    warmup: Any = None
    threads: Any = None
    max_seconds: Any = None
    timeout: Any = None
    counters: Any = None
    new_tokens: Any = None
    numerics: Any = None

    def params(self) -> RunParams:
        return replace(
            run_params(self.iterations, self.warmup, self.threads, self.max_seconds, self.timeout, self.counters,
                       self.new_tokens),
            numerics=options.numerics(self.numerics),
        )  # fmt: skip


@dataclass(frozen=True)
class AccuracyOptions(options.OptionGroup):
    """The accuracy gate of quantized runs: `--min-sqnr`, `--min-top1`, `--min-top5`."""

    min_sqnr: Any = None
    min_top1: Any = None
    min_top5: Any = None

    def thresholds(self) -> dict[str, float]:
        return options.accuracy_thresholds(self.min_sqnr, self.min_top1, self.min_top5)


@dataclass(frozen=True)
class LoweringGroup(options.OptionGroup):
    """How etlab lowers: `--backend`, `--quantize` (the variants), `--weights`, `--jobs`, `--calibration`."""

    backend: str | None = None
    quantize: Any = "none"
    weights: Any = "auto"
    jobs: Any = None
    calibration: Any = None

    def variants(self, default: str = "portable,xnnpack") -> list[Variant]:
        return variants(self.backend, self.quantize, default)

    def options(self) -> LoweringOptions:
        return lowering_options(self.weights, self.jobs, self.calibration)


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


def numerics_programs(
    artifacts: Iterable[Artifact],
    params: RunParams,
    calibration: Path | None = None,
    specs: Mapping[str, ModelSpec] | None = None,
) -> dict[Path, NumericsProgram]:
    """`--numerics`: each artifact's numerics program by its .pte (cached, else made now); every program refused
    (exit 64) before any is made. `specs`: the command line's by model (its permission to run a factory)."""
    if params.numerics is None:
        return {}
    chosen = list(artifacts)
    for artifact in chosen:
        check_measurable(artifact)
    made = {}
    for artifact in chosen:
        try:
            made[artifact.pte] = make_numerics(
                artifact, spec=(specs or {}).get(artifact.model), calibration=calibration
            )
        except CalibrationNeeded as exc:
            exc.hint = "give the same file: fab deploy-and-profile --numerics --calibration FILE"
            raise
        except NumericsUnavailable as exc:  # the pass is skipped, not the run
            console.warn(f"{exc}: no numerics pass for it")
    return made


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
