"""A program as one value: which model, attending how, with which KV cache, with which rewrites; the one place
those choices are combined and refused, the one rule that names the result and the one parse that reads a name
back. Torch-free: the command line, the nightly matrix and the advisor read it.

`ProgramChoice` is what a user asks of a spec's model (`--attention`, `--context`, `--rewrites`, or the matrix
entry's `attention:`, `context:`, `rewrites:`), one config value per choice as ExecuTorch's `ExportRecipe` has
them; `programs(spec, choice)` combines it with the spec into `Program`s, or raises `ProgramRefused` naming the
choice that cannot apply (the command line names its option, the matrix its file, line and key).

A program is the model of a spec as exported, or that model changed by lowering choices, each another program
under its own name, beside the model as exported (artifacts/, results/, the nightly history):

    <base>[.<attention>][.ctx<N>][.<rewrite>...| .rw-<8 hex>][.kf-<8 hex>]

- attention (attention/choice.py `ATTENTIONS`): a text-generation program attending otherwise than its spec says
  (`smollm2-gen-tiny.sdpa`);
- `ctx<N>`: a text-generation program with a KV cache of N positions, not the spec's own (`smollm2-135m-gen.ctx1024`);
- rewrites (rewrites/registry.py `REWRITES`), in the registry's order (`gpt2-tiny.tanh-gelu.head-at-position`), or
  past the name rule's 64 characters a short stable form (`<name[:48]>.rw-<8 hex of their sha256>`).
- `kf-<8 hex>`: a quantized program that keeps some layers in float (mixed precision, `--keep-float`), the hex
  the sha256 of their sorted names; the names themselves are the spec's `keep_float` (its sidecar records them).

`with_` makes a spec's program (the name and the spec's fields together); `ProgramName.parse` reads a name back,
peeling the suffixes it knows from the right, so a base name with dots of its own is kept whole. Nothing else in
etlab builds or splits a program's name (tests/lowering/test_program.py scans for it).
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, replace

from orchestrator.errors import UsageError
from orchestrator.lowering.attention.choice import ATTENTIONS, DEFAULT_ATTENTION, attention_of
from orchestrator.lowering.rewrites.registry import NO_REWRITES, REWRITES, RewriteRequest, not_applying
from orchestrator.lowering.spec import MAX_CONTEXT, MIN_CONTEXT, ModelSpec
from orchestrator.names import is_valid_name

_CONTEXT = re.compile(r"ctx([1-9][0-9]*)")
_SHORT_REWRITES = re.compile(r"rw-([0-9a-f]{8})")
_KEEP_FLOAT = re.compile(r"kf-([0-9a-f]{8})")
_LAYER_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z0-9_]+)*")  # a module path: `encoder.layer.0.ffn.lin2`
MAX_KEPT_LAYERS = 512
SHORT_BASE = 48  # characters of the base kept in the short form


def _digest(names: tuple[str, ...]) -> str:
    return hashlib.sha256(",".join(names).encode()).hexdigest()[:8]


@dataclass(frozen=True)
class ProgramName:
    """A program's name taken apart: `base` (the spec's own name) and the choices that make it another program."""

    base: str
    attention: str | None = None
    context: int | None = None
    rewrites: tuple[str, ...] = ()
    rewrites_digest: str | None = None  # a name in the short form: the rewrites' digest, their names unknown
    keep_float_digest: str | None = None  # a mixed-precision program: the digest of the layers it keeps in float

    def __str__(self) -> str:
        head = self._choices()
        if self.keep_float_digest is None:
            return head
        kept = f"{head}.kf-{self.keep_float_digest}"
        return kept if is_valid_name(kept) else f"{head[:SHORT_BASE]}.kf-{self.keep_float_digest}"

    def _choices(self) -> str:
        head = self.base + (f".{self.attention}" if self.attention else "")
        head += f".ctx{self.context}" if self.context is not None else ""
        if self.rewrites_digest is not None:
            return f"{head}.rw-{self.rewrites_digest}"
        if not self.rewrites:
            return head
        joined = f"{head}.{'.'.join(self.rewrites)}"
        return joined if is_valid_name(joined) else f"{head[:SHORT_BASE]}.rw-{_digest(self.rewrites)}"

    @property
    def as_exported(self) -> bool:
        """Whether the name is the model as exported, no rewrite applied (attention and context are its spec's)."""
        return not self.rewrites and self.rewrites_digest is None

    @classmethod
    def parse(cls, name: str) -> ProgramName:
        """The parts of `name`, peeled from the right: rewrites (names, or the short form), then an attention, then
        a context; what is left is the base. A name with none of them is its own base."""
        parts = name.split(".")
        rewrites: list[str] = []
        digest = kept = None
        if len(parts) > 1 and (float_kept := _KEEP_FLOAT.fullmatch(parts[-1])):
            kept = float_kept.group(1)
            parts.pop()
        if len(parts) > 1 and (short := _SHORT_REWRITES.fullmatch(parts[-1])):
            digest = short.group(1)
            parts.pop()
        else:
            while len(parts) > 1 and parts[-1] in REWRITES:
                rewrites.insert(0, parts.pop())
        attention = context = None
        if len(parts) > 1 and (found := _CONTEXT.fullmatch(parts[-1])):
            context = int(found.group(1))
            parts.pop()
        if len(parts) > 1 and parts[-1] in ATTENTIONS:
            attention = parts.pop()
        return cls(".".join(parts), attention, context, tuple(rewrites), digest, kept)


def with_(
    spec: ModelSpec,
    *,
    attention: str | None = None,
    context: int | None = None,
    rewrites: RewriteRequest = NO_REWRITES,
    keep_float: tuple[str, ...] = (),
) -> ModelSpec:
    """The program of `spec` with these choices, under its own name: each choice that is the spec's own (its
    attention, its context, no rewrite that applies, no layer kept in float) leaves the spec as it is. The caller
    checked that the spec generates where attention or context is given, and that the layers exist."""
    named = ProgramName.parse(spec.name)
    if attention is not None and attention != attention_of(spec):
        if named.attention is not None and attention == DEFAULT_ATTENTION:
            # a program named after its attention (`x.sdpa`): its twin with the default is the base, the default
            # left implicit as the built-in spec has it (the same cached program)
            spec, named = spec.with_options(attention=None), replace(named, attention=None)
        else:
            spec, named = spec.with_options(attention=attention), replace(named, attention=attention)
    if context is not None and context != spec.cache_capacity:
        spec = replace(spec, context=context)
        named = replace(named, context=context)
    resolved = rewrites.resolve(spec)
    if resolved and named.as_exported:  # a rewritten program found by its artifacts is not renamed twice
        named = replace(named, rewrites=resolved)
    kept = tuple(sorted(set(keep_float)))
    if kept and named.keep_float_digest is None:  # a mixed-precision program found by its artifacts: named already
        spec = replace(spec, keep_float=kept)
        named = replace(named, keep_float_digest=_digest(kept))
    name = str(named)
    return spec if name == spec.name else replace(spec, name=name)


def program_name(spec: ModelSpec, rewrites: RewriteRequest) -> str:
    """The name `spec`'s program with `rewrites` lives under (its own name when none resolves for it)."""
    return with_(spec, rewrites=rewrites).name


@dataclass(frozen=True)
class ProgramChoice:
    """What a user asks of a spec's model, each choice one value: how it attends (None: its spec's), its KV cache
    sizes (one program each; empty: its spec's), the rewrites applied before export (none: as exported) and the
    layers its quantized variants keep in float (none: every layer the scheme takes)."""

    attention: str | None = None
    contexts: tuple[int, ...] = ()
    rewrites: RewriteRequest = NO_REWRITES
    keep_float: tuple[str, ...] = ()


AS_SPECIFIED = ProgramChoice()

# A choice's name, as refusals name it: the command line adds `--`, the nightly matrix uses it as its key
ATTENTION, CONTEXT, REWRITES_CHOICE, KEEP_FLOAT = "attention", "context", "rewrites", "keep-float"


class ProgramRefused(UsageError):
    """A choice that cannot apply to a spec's model (exit 64): `choice` says which (ATTENTION, CONTEXT,
    REWRITES_CHOICE) and `value` which of its values, if one, so the edge that parsed it names its option or key."""

    def __init__(self, choice: str, reason: str, value: object = None) -> None:
        super().__init__(reason if value is None else f"{value}: {reason}")
        self.choice = choice
        self.reason = reason
        self.value = value


class KeepFloatRefused(UsageError):
    """Layers kept in float that cannot be, found when the program is lowered (exit 64): the command layer names its
    option (`fix`: what it takes)."""

    def __init__(self, message: str, fix: str) -> None:
        super().__init__(message)
        self.fix = fix


@dataclass(frozen=True)
class Program:
    """A program etlab lowers and runs: `spec` under the program's own name (its attention and context in its fields,
    every choice in its name) and the rewrites its lowering applies."""

    spec: ModelSpec
    rewrites: RewriteRequest = NO_REWRITES

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def parts(self) -> ProgramName:
        return ProgramName.parse(self.spec.name)


def refusals(spec: ModelSpec, choice: ProgramChoice, new_tokens: int | None = None) -> list[ProgramRefused]:
    """Every choice of `choice` that cannot apply to `spec`'s model (a generation of `new_tokens`, else the spec's),
    each refused with its reason: the one place a combination is checked."""
    found = []
    no_cache = f"{spec.name} is not a text-generation model (it has no KV cache)"
    if choice.attention is not None:
        if choice.attention not in ATTENTIONS:
            found.append(ProgramRefused(ATTENTION, f"choose from {', '.join(ATTENTIONS)}", choice.attention))
        elif not spec.generates or not hasattr(spec.options, "attention"):
            found.append(ProgramRefused(ATTENTION, no_cache))
    if choice.contexts and not spec.generates:
        found.append(ProgramRefused(CONTEXT, no_cache))
    for context in choice.contexts if spec.generates else ():
        if not MIN_CONTEXT <= context <= MAX_CONTEXT:
            found.append(ProgramRefused(CONTEXT, f"a KV cache holds {MIN_CONTEXT}-{MAX_CONTEXT} positions", context))
        elif spec.positions(new_tokens) > context:
            need = spec.positions(new_tokens)
            found.append(ProgramRefused(CONTEXT, f"{spec.name}'s prompt of {spec.seq_len} tokens and "
                                                 f"{new_tokens or spec.new_tokens} new ones need {need} positions",
                                        context))  # fmt: skip
    found += [ProgramRefused(REWRITES_CHOICE, problem) for problem in not_applying(choice.rewrites, spec)]
    if choice.keep_float and spec.generates:
        found.append(ProgramRefused(KEEP_FLOAT, f"{spec.name} is a text-generation model: its schemes quantize with "
                                                "the LLM recipe, which keeps no layer in float"))  # fmt: skip
    malformed = [name for name in choice.keep_float if not _LAYER_NAME.fullmatch(name)]
    if malformed:
        found.append(ProgramRefused(KEEP_FLOAT, "a layer is a module path such as encoder.layer.0.ffn.lin2",
                                    ", ".join(malformed)))  # fmt: skip
    if len(choice.keep_float) > MAX_KEPT_LAYERS:
        found.append(ProgramRefused(KEEP_FLOAT, f"at most {MAX_KEPT_LAYERS} layers"))
    return found


def programs(spec: ModelSpec, choice: ProgramChoice = AS_SPECIFIED, new_tokens: int | None = None) -> list[Program]:
    """The programs `choice` makes of `spec`'s model, one per context, each under its own name; the first refusal
    (`refusals`) raised when a choice cannot apply."""
    problems = refusals(spec, choice, new_tokens)
    if problems:
        raise problems[0]
    base = with_(spec, attention=choice.attention)
    chosen = [with_(base, context=context) for context in dict.fromkeys(choice.contexts)] or [base]
    return [
        Program(with_(each, rewrites=choice.rewrites, keep_float=choice.keep_float), choice.rewrites) for each in chosen
    ]
