"""etlab's attention as transformers' attention interface: `config._attn_implementation = "etlab"`.

transformers calls it with the query [B, Hq, S, D], the key and value the cache's `update` returned (etlab's cache:
the whole buffers [B, Hkv, C, D]) and the model's keyword arguments, `position_ids` [1, S] among them in every family
etlab lowers (Llama, Qwen2, Phi-3, GPT-NeoX, GPT-2 all pass it on to their attention). It calls `etlab::attend`,
which attends row i to cache rows 0..positions[i] and shares KV heads by index, and returns [B, S, Hq, D] with no
weights, as transformers expects. "etlab" has no mask function in transformers' mask interface, so the model builds
no mask tensor at all (masking_utils returns None for an implementation it does not know).
"""

from __future__ import annotations

from typing import Any

import torch
from transformers.modeling_utils import AttentionInterface

from orchestrator.lowering.attention import ops

ETLAB_ATTENTION = "etlab"


class UnsupportedAttention(ValueError):
    """A model whose attention etlab's operator does not compute (a sliding window shorter than the cache,
    logit soft-capping, attention sinks): lowered with `attention: sdpa` instead."""


def etlab_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    positions = kwargs.get("position_ids")
    if positions is None:
        raise UnsupportedAttention(f"{type(module).__name__} does not pass position_ids to its attention")
    window = kwargs.get("sliding_window")
    if window is not None and int(window) < key.size(2):
        raise UnsupportedAttention(f"a sliding window of {window} positions is shorter than the cache's {key.size(2)}")
    for name in ("softcap", "s_aux"):
        if kwargs.get(name) is not None:
            raise UnsupportedAttention(f"{type(module).__name__}'s attention uses {name}")
    scale = float(query.size(-1) ** -0.5 if scaling is None else scaling)
    out = torch.ops.etlab.attend(query, key, value, positions.reshape(-1), scale)
    return out.transpose(1, 2), None


def register() -> str:
    """Make "etlab" an attention implementation transformers accepts (idempotent); its name."""
    AttentionInterface.register(ETLAB_ATTENTION, etlab_attention)
    return ETLAB_ATTENTION


__all__ = ["ETLAB_ATTENTION", "UnsupportedAttention", "etlab_attention", "ops", "register"]
