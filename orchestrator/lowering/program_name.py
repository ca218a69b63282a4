"""A program's identity: which model, attending how, with which KV cache, with which rewrites; the one rule that
names it and the one parse that reads a name back. Torch-free: the command line, the nightly matrix and the advisor
read it.

A program is the model of a spec as exported, or that model changed by lowering choices, each another program
under its own name, beside the model as exported (artifacts/, results/, the nightly history):

    <base>[.<attention>][.ctx<N>][.<rewrite>...| .rw-<8 hex>]

- attention (attention/choice.py `ATTENTIONS`): a text-generation program attending otherwise than its spec says
  (`smollm2-gen-tiny.sdpa`);
- `ctx<N>`: a text-generation program with a KV cache of N positions, not the spec's own (`smollm2-135m-gen.ctx1024`);
- rewrites (rewrites/registry.py `REWRITES`), in the registry's order (`gpt2-tiny.tanh-gelu.head-at-position`), or
  past the name rule's 64 characters a short stable form (`<name[:48]>.rw-<8 hex of their sha256>`).

`with_` makes a spec's program (the name and the spec's fields together); `ProgramName.parse` reads a name back,
peeling the suffixes it knows from the right, so a base name with dots of its own is kept whole. Nothing else in
etlab builds or splits a program's name (tests/lowering/test_program_name.py scans for it).
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, replace

from orchestrator.lowering.attention.choice import ATTENTIONS, DEFAULT_ATTENTION, attention_of
from orchestrator.lowering.rewrites.registry import NO_REWRITES, REWRITES, RewriteRequest
from orchestrator.lowering.spec import ModelSpec
from orchestrator.names import is_valid_name

_CONTEXT = re.compile(r"ctx([1-9][0-9]*)")
_SHORT_REWRITES = re.compile(r"rw-([0-9a-f]{8})")
SHORT_BASE = 48  # characters of the base kept in the short form


def _digest(rewrites: tuple[str, ...]) -> str:
    return hashlib.sha256(",".join(rewrites).encode()).hexdigest()[:8]


@dataclass(frozen=True)
class ProgramName:
    """A program's name taken apart: `base` (the spec's own name) and the choices that make it another program."""

    base: str
    attention: str | None = None
    context: int | None = None
    rewrites: tuple[str, ...] = ()
    rewrites_digest: str | None = None  # a name in the short form: the rewrites' digest, their names unknown

    def __str__(self) -> str:
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
        digest = None
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
        return cls(".".join(parts), attention, context, tuple(rewrites), digest)


def with_(
    spec: ModelSpec,
    *,
    attention: str | None = None,
    context: int | None = None,
    rewrites: RewriteRequest = NO_REWRITES,
) -> ModelSpec:
    """The program of `spec` with these choices, under its own name: each choice that is the spec's own (its
    attention, its context, no rewrite that applies) leaves the spec as it is. The caller checked that the spec
    generates where attention or context is given."""
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
    name = str(named)
    return spec if name == spec.name else replace(spec, name=name)


def program_name(spec: ModelSpec, rewrites: RewriteRequest) -> str:
    """The name `spec`'s program with `rewrites` lives under (its own name when none resolves for it)."""
    return with_(spec, rewrites=rewrites).name
