"""The nightly matrix: the inventory's `nightly:` section, checked with the inventory's own checker.

Every error names the file, the line and the field (`inventory.yaml:31: nightly.matrix[0].backend: unknown key
'backend' (did you mean 'backends'?)`), and every accepted key takes effect.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from yaml.nodes import Node, ScalarNode, SequenceNode

from orchestrator import paths
from orchestrator.boards.inventory import Board, Inventory
from orchestrator.config import (
    Check,
    Checker,
    Invalid,
    boolean,
    choice,
    describe,
    integer,
    is_null,
    names,
    number,
    string,
    tag,
    text,
    value_node,
)
from orchestrator.deploy.abtest import DEFAULT_RETEST_SECONDS, DEFAULT_ROUNDS, MIN_ROUNDS
from orchestrator.deploy.limits import MAX_COUNT, MAX_SECONDS, MAX_THREADS
from orchestrator.deploy.runs import RunParams
from orchestrator.errors import EtlabError, InventoryError, first_line
from orchestrator.lab.history_url import HISTORY_FORMS, BadHistoryUrl, check_url, shown_url
from orchestrator.lowering.attention.choice import ATTENTIONS
from orchestrator.lowering.builtins import resolve_spec
from orchestrator.lowering.program import (
    AS_SPECIFIED,
    Program,
    ProgramChoice,
    programs,
    refusals,
)
from orchestrator.lowering.rewrites.registry import NO_REWRITES, RewriteRequest, UnknownRewrite, parse_rewrites
from orchestrator.lowering.spec import MAX_CONTEXT, MIN_CONTEXT, ModelSpec
from orchestrator.lowering.variants import BACKENDS, SCHEMES, Variant, combine, parse_schemes
from orchestrator.lowering.weights import WEIGHT_MODES
from orchestrator.results.stats import DEFAULT_MIN_EFFECT
from orchestrator.results.summary_outputs import ACCURACY_DEFAULTS

DEFAULT_BASELINE_NIGHTS = 7
MIN_BASELINE_NIGHTS = 2
DEFAULT_COOLDOWN_SECONDS = 60.0  # before a degraded cell is re-measured
DEFAULT_HISTORY_WAIT_SECONDS = 300.0  # for a history another writer holds locked, before and after each cell
DEFAULT_ITERATIONS = 30
DEFAULT_WARMUP = 3


@dataclass(frozen=True)
class MatrixEntry:
    models: tuple[ModelSpec, ...]
    variants: tuple[Variant, ...]
    boards: tuple[Board, ...]  # as the inventory has them: a labgrid tag selector is expanded when the night runs
    params: RunParams
    # what makes its models other programs (`attention:`, `context:`, `rewrites:`), as the command line's options
    choice: ProgramChoice = AS_SPECIFIED
    advised: bool = False  # each model as exported too, beside its rewritten program (`rewrites`, else auto)

    @property
    def rewritten(self) -> ProgramChoice:
        """The choice of its rewritten programs: `rewrites`, or auto for an `advised` entry that names none."""
        return rewritten_choice(self.choice, self.advised)

    @property
    def exported(self) -> ProgramChoice:
        """The choice of its models as exported, beside the rewritten ones of an `advised` entry."""
        return replace(self.choice, rewrites=NO_REWRITES)

    def programs(self) -> list[Program]:
        """The programs the entry lowers and profiles, each under its own name (lowering/program.py): the models as
        exported (`advised`), then each with its rewrites; at each of its contexts."""
        rewritten = [program for spec in self.models for program in programs(spec, self.rewritten)]
        if not self.advised:
            return rewritten
        return [program for spec in self.models for program in programs(spec, self.exported)] + rewritten

    def advised_pairs(self) -> list[tuple[str, str]]:
        """(as exported, advised) program names of an `advised` entry, for the report's side by side."""
        if not self.advised:
            return []
        return [
            (plain.name, advised.name)
            for spec in self.models
            for plain, advised in zip(programs(spec, self.exported), programs(spec, self.rewritten), strict=True)
        ]


def rewritten_choice(choice: ProgramChoice, advised: bool) -> ProgramChoice:
    """`choice` as an entry's rewritten programs have it: an `advised` entry that names no rewrites gets auto."""
    if choice.rewrites != NO_REWRITES or not advised:
        return choice
    return replace(choice, rewrites=RewriteRequest(auto=True))


@dataclass(frozen=True)
class NightlyConfig:
    entries: tuple[MatrixEntry, ...]
    history_url: str | None = None
    reports_dir: Path = field(default_factory=lambda: paths.results_dir() / "nightly")
    baseline_nights: int = DEFAULT_BASELINE_NIGHTS
    min_baseline_nights: int = MIN_BASELINE_NIGHTS
    min_effect: float = DEFAULT_MIN_EFFECT
    weights: str = "auto"
    retest_seconds: float = DEFAULT_RETEST_SECONDS  # the interleaved re-test's budget per suspected cell
    retest_rounds: int = DEFAULT_ROUNDS
    cooldown_seconds: float = DEFAULT_COOLDOWN_SECONDS
    history_wait_seconds: float = DEFAULT_HISTORY_WAIT_SECONDS
    accuracy: dict[str, float] = field(default_factory=lambda: dict(ACCURACY_DEFAULTS))


def history_url(node: Node, _field: str) -> str:
    """`history:`, checked as `--history` is (history.check_url), without connecting."""
    url = string(node, "a history URL")
    try:
        return check_url(url)
    except BadHistoryUrl as exc:
        raise Invalid(f"{shown_url(url)!r}: {exc}; a history is {HISTORY_FORMS}") from None


def load_history_url(inventory: Inventory) -> str | None:
    """The nightly section's `history:` alone, checked (`file:line: nightly.history: ...`, exit 64): what `fab
    dashboard` reads of the section, even when the rest of it has problems."""
    node = value_node(inventory.nightly_node, "history") if inventory.nightly_node is not None else None
    if node is None or is_null(node):
        return None
    checker = Checker(inventory.path)
    url = checker.value(node, "nightly.history", history_url)
    if checker.problems:
        raise InventoryError("\n".join(checker.errors))
    return url


def numerics_mode(node: Node, field: str) -> str | None:
    """`numerics:` true (statistics per tensor), stats, full (the tensors too) or false (no numerics pass)."""
    if isinstance(node, ScalarNode) and tag(node) == "bool":
        return "stats" if boolean(node, field) else None
    return choice(("stats", "full"))(node, field)


# Run settings a matrix entry may override; the section's own values are the defaults.
# The same bounds as the command line's: RunParams checks nothing itself.
_RUN_FIELDS: dict[str, Check] = {
    "iterations": integer(1, MAX_COUNT),
    "warmup": integer(0, MAX_COUNT),
    "threads": integer(1, MAX_THREADS),
    "max_seconds": number(0, above=True, high=MAX_SECONDS, unit="a number of seconds"),
    "timeout": number(0, above=True, high=MAX_SECONDS, unit="a number of seconds"),
    "numerics": numerics_mode,
}
_SECTION_FIELDS: dict[str, Check] = {
    "history": history_url,
    "reports": text,
    "baseline_nights": integer(1),
    "min_baseline_nights": integer(1),
    "min_effect": number(0),
    "weights": choice(WEIGHT_MODES),
    "retest_seconds": number(0),
    "retest_rounds": integer(MIN_ROUNDS),
    "cooldown_seconds": number(0),
    "history_wait_seconds": number(0),
    # The accuracy gate of quantized cells (defaults: summary.ACCURACY_DEFAULTS).
    "min_sqnr_db": number(-1000, high=1000, unit="a number of dB"),
    "min_top1_agreement": number(0, high=1, unit="a fraction"),
    "min_top5_overlap": number(0, high=1, unit="a fraction"),
    **_RUN_FIELDS,
    "matrix": lambda node, _field: node,  # checked entry by entry below
}


def _contexts(node: Node, _field: str) -> tuple[int, ...]:
    """A KV cache size, or a list of them (as `--context 128,1024`)."""
    items = node.value if isinstance(node, SequenceNode) else [node]
    if not items:
        raise Invalid(f"expected a KV cache size or a list of them, got {describe(node)}")
    check = integer(MIN_CONTEXT, MAX_CONTEXT)
    found = []
    for item in items:
        if not isinstance(item, ScalarNode):
            raise Invalid(f"expected a KV cache size (an integer {MIN_CONTEXT}-{MAX_CONTEXT}), got {describe(item)}")
        found.append(check(item, _field))
    return tuple(dict.fromkeys(found))


_ENTRY_FIELDS: dict[str, Check] = {
    "models": names,
    "backends": names,
    "quantize": names,  # schemes of the registry (quantize.SCHEMES): none (fp32) keeps the backends, each other
    # scheme adds its cell xnnpack-<scheme> (variants.combine, as `--quantize`)
    "boards": names,
    "groups": names,
    "tags": names,
    "rewrites": names,  # auto, none, or names of rewrites.REWRITES (as `--rewrites`)
    "advised": boolean,  # the models as exported and with their rewrites (`rewrites`, else auto)
    "attention": choice(ATTENTIONS),  # text-generation models only (as `--attention`)
    "context": _contexts,  # KV cache sizes, text-generation models (`--context`)
    **_RUN_FIELDS,
}


def load_config(inventory: Inventory) -> NightlyConfig:
    """Check the inventory's `nightly:` section; all its problems are reported together."""
    node = inventory.nightly_node
    if node is None or is_null(node):
        raise InventoryError(
            f"{inventory.path}: no `nightly:` section", hint="see README.md (Nightly runs) for the matrix format"
        )
    checker = Checker(inventory.path)
    section = checker.fields(node, "nightly", _SECTION_FIELDS)
    defaults = {"iterations": DEFAULT_ITERATIONS, "warmup": DEFAULT_WARMUP}
    defaults.update({key: section[key] for key in _RUN_FIELDS if key in section})
    entries: list[MatrixEntry] = []
    if "matrix" not in section and not checker.problems:
        checker.error(node, "nightly.matrix", "is required: a list of {models, backends, boards/groups/tags}")
    elif "matrix" in section:
        seen: dict[tuple[str, str, str], int] = {}
        rewritten: dict[str, tuple[tuple[str, ...], int]] = {}
        for index, entry_node in enumerate(checker.items(section["matrix"], "nightly.matrix")):
            entry = _entry(checker, inventory, entry_node, f"nightly.matrix[{index}]", defaults)
            if entry is not None and not _duplicate_cells(checker, entry, entry_node, index, seen):
                _one_program(checker, entry, entry_node, index, rewritten)
                entries.append(entry)
    baseline_nights = section.get("baseline_nights", DEFAULT_BASELINE_NIGHTS)
    min_nights = section.get("min_baseline_nights", min(MIN_BASELINE_NIGHTS, baseline_nights))
    if min_nights > baseline_nights:
        at = _key_value(node, "min_baseline_nights") or node
        checker.error(at, "nightly.min_baseline_nights", f"must be <= baseline_nights ({baseline_nights})")
    if checker.problems:
        raise InventoryError("\n".join(checker.errors))
    return NightlyConfig(
        entries=tuple(entries),
        history_url=section.get("history"),
        reports_dir=Path(section["reports"]) if "reports" in section else paths.results_dir() / "nightly",
        baseline_nights=baseline_nights,
        min_baseline_nights=min_nights,
        min_effect=section.get("min_effect", DEFAULT_MIN_EFFECT),
        weights=section.get("weights", "auto"),
        retest_seconds=section.get("retest_seconds", DEFAULT_RETEST_SECONDS),
        retest_rounds=section.get("retest_rounds", DEFAULT_ROUNDS),
        cooldown_seconds=section.get("cooldown_seconds", DEFAULT_COOLDOWN_SECONDS),
        history_wait_seconds=section.get("history_wait_seconds", DEFAULT_HISTORY_WAIT_SECONDS),
        accuracy={key: float(section.get(key, default)) for key, default in ACCURACY_DEFAULTS.items()},
    )


def _key_value(node: Node, key: str) -> Node | None:
    return next((value for k, value in node.value if getattr(k, "value", None) == key), None)


def _entry(
    checker: Checker, inventory: Inventory, node: Node, where: str, defaults: dict[str, Any]
) -> MatrixEntry | None:
    before = len(checker.problems)
    found = checker.fields(node, where, _ENTRY_FIELDS)
    for required in ("models", "backends"):
        if required not in found and _key_value(node, required) is None:
            checker.error(node, f"{where}.{required}", "is required")
    models = []
    for model in found.get("models", ()):
        # A spec file path is relative to the inventory; anything else is a built-in name.
        try:
            spec_path = inventory.path.parent / model if model.endswith(".json") else None
            models.append(resolve_spec(None, spec_path) if spec_path else resolve_spec(model))
        except EtlabError as exc:
            checker.error(_key_value(node, "models") or node, f"{where}.models", first_line(exc))
    rewrites = NO_REWRITES
    try:
        rewrites = parse_rewrites(found.get("rewrites", ()))
    except UnknownRewrite as exc:
        checker.error(_key_value(node, "rewrites") or node, f"{where}.rewrites", first_line(exc))
    advised = found.get("advised", False) is True
    choice = ProgramChoice(found.get("attention"), tuple(found.get("context", ())), rewrites)
    for spec in models:  # the one check of a combination (program.py), named by its key
        for refused in refusals(spec, choice):
            checker.error(_key_value(node, refused.choice) or node, f"{where}.{refused.choice}", str(refused))
        if advised and not rewritten_choice(choice, advised).rewrites.resolve(spec):
            checker.error(_key_value(node, "advised") or node, f"{where}.advised",
                          f"no rewrite applies to {spec.name} ({spec.model_source} {spec.model_type}, "
                          f"{spec.task}): there is no advised program to run beside it")  # fmt: skip
    for backend in found.get("backends", ()):
        if backend not in BACKENDS:
            checker.error(_key_value(node, "backends") or node, f"{where}.backends", f"unknown backend {backend!r}")
    for scheme in found.get("quantize", ()):
        if scheme not in SCHEMES:
            checker.error(
                _key_value(node, "quantize") or node,
                f"{where}.quantize",
                f"unknown scheme {scheme!r}; choose from {', '.join(SCHEMES)}",
            )
    # The entry's boards: the union of the boards, groups and tags it names (the inventory default if none).
    picked: dict[str, Board] = {}
    for key, pick in (
        ("boards", lambda value: inventory.select(boards=[value])),
        ("groups", lambda value: inventory.select(group=value)),
        ("tags", lambda value: inventory.select(tag=value)),
    ):
        for value in found.get(key, ()):
            try:
                picked.update((board.name, board) for board in pick(value))
            except EtlabError as exc:
                checker.error(_key_value(node, key) or node, f"{where}.{key}", first_line(exc))
    if len(checker.problems) > before:
        return None
    try:
        selected = list(picked.values()) or inventory.default_selection()
    except EtlabError as exc:
        checker.error(node, where, first_line(exc))
        return None
    params = RunParams(**{**defaults, **{key: found[key] for key in _RUN_FIELDS if key in found}})
    # Quantized programs are XNNPACK programs: each scheme is a cell of its own, named as the CLI names it.
    variants = combine([Variant.parse(name) for name in found["backends"]], parse_schemes(found.get("quantize", ())))
    return MatrixEntry(tuple(models), variants, tuple(selected), params, choice, advised)


def _one_program(
    checker: Checker, entry: MatrixEntry, node: Node, index: int, rewritten: dict[str, tuple[tuple[str, ...], int]]
) -> None:
    """A program is lowered once a night, into its own folder: one name, one set of rewrites (a rewritten program has
    its own name, so a model may run as exported and rewritten; this guards the names against colliding)."""
    for program in entry.programs():
        resolved = program.rewrites.resolve(program.spec)
        earlier = rewritten.setdefault(program.name, (resolved, index))
        if earlier[0] != resolved:
            checker.error(
                _key_value(node, "rewrites") or node,
                f"nightly.matrix[{index}].rewrites",
                f"{program.name} is lowered with rewrites {', '.join(earlier[0]) or 'none'} in matrix[{earlier[1]}], "
                f"{', '.join(resolved) or 'none'} here: one name, one program a night",
            )


def _duplicate_cells(
    checker: Checker, entry: MatrixEntry, node: Node, index: int, seen: dict[tuple[str, str, str], int]
) -> bool:
    for board in entry.boards:
        for program in entry.programs():
            for variant in entry.variants:
                cell = (board.name, program.name, variant.name)
                if cell in seen:
                    checker.error(
                        node, f"nightly.matrix[{index}]", f"cell {' / '.join(cell)} is already in matrix[{seen[cell]}]"
                    )
                    return True
                seen[cell] = index
    return False
