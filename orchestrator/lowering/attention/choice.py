"""How a text-generation program attends: a lowering choice, like delegation (no torch here: the command line and
the cache key read it).

    etlab  etlab's operators (ops.py): the new rows written in place, attention over the filled rows by position,
           KV heads shared by index, no mask tensor (the default for `task: text-generation`)
    sdpa   transformers' static-cache recipe with standard operators (repeat_kv's copy of the whole cache,
           index_put, a causal mask over it): the program etlab lowered before its own operators

A spec says it in its `attention` field (huggingface source, text-generation only); `--attention` on `fab lower`
and `fab deploy` lowers the other one beside it, under its own name (`smollm2-gen-tiny.sdpa`: program.py).
"""

from __future__ import annotations

from typing import Any

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


def sliding_window_problem(config: Any, capacity: int) -> str | None:
    """Why etlab's attention cannot compute this model over a cache of `capacity` positions, or None: it attends to
    every filled row, so a sliding window shorter than the cache (Mistral's, Qwen2's with use_sliding_window, a
    Phi-3 config's) would change what the model attends to."""
    window = getattr(config, "sliding_window", None)
    layer_types = getattr(config, "layer_types", None) or ()
    sliding = window is not None and (not layer_types or "sliding_attention" in layer_types)
    if not sliding or not isinstance(window, int) or window >= capacity:
        return None
    return (
        f"etlab's attention has no sliding window, and the model's {window} positions are fewer than the KV cache's "
        f"{capacity}: give attention: sdpa, or a context of at most {window}"
    )
