"""How a text-generation program attends: a lowering choice, like delegation (no torch here: the command line and
the cache key read it).

    etlab  etlab's operators (ops.py): the new rows written in place, attention over the filled rows by position,
           KV heads shared by index, no mask tensor (the default for `task: text-generation`)
    sdpa   transformers' static-cache recipe with standard operators (repeat_kv's copy of the whole cache,
           index_put, a causal mask over it): the program etlab lowered before its own operators

A spec says it in its `attention` field (huggingface source, text-generation only); `--attention` on `fab lower`
and `fab deploy` lowers the other one beside it, under its own name (`smollm2-gen-tiny.sdpa`).
"""

from __future__ import annotations

from dataclasses import replace

from orchestrator.lowering.spec import ModelSpec

ETLAB = "etlab"
SDPA = "sdpa"
ATTENTIONS = (ETLAB, SDPA)
DEFAULT_ATTENTION = ETLAB


def attention_of(spec: ModelSpec) -> str | None:
    """The spec's attention: its own field, else the default; None for a program that does not generate."""
    if not spec.generates:
        return None
    return getattr(spec.options, "attention", None) or DEFAULT_ATTENTION


def with_attention(spec: ModelSpec, attention: str) -> ModelSpec:
    """The same model attending with `attention`: another program, under its own name (`<name>.sdpa`) unless it is
    the spec's own attention (the caller checked that the spec generates and has the field)."""
    if attention == attention_of(spec):
        return spec
    return replace(spec.with_options(attention=attention), name=f"{spec.name}.{attention}")
