"""etlab's KV cache for a text-generation program: a transformers `Cache` whose layers write the step's new rows
into their buffers in place through `etlab::update_cache` (ops.py), at the step's positions.

Each layer holds one key and one value buffer [1, Hkv, C, D], allocated once; the program module registers them as
its buffers (mutable state of the exported program), so memory planning holds the cache once. `update` returns the
whole buffers: the attention function (interface.py) reads only the filled rows, by position, so no mask over the
cache is ever built. The positions are the program's `cache_position` input, set on the cache before each call
(`at`): GPT-NeoX's attention calls `update` without the model's keyword arguments, so they cannot come from there.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers.cache_utils import Cache, CacheLayerMixin
from transformers.configuration_utils import get_head_shapes

from orchestrator.lowering.attention import ops


class EtlabLayer(CacheLayerMixin):
    """One decoder layer's cache: `keys` and `values` [1, Hkv, C, D], written at the owner's positions."""

    is_compileable = True
    is_sliding = False

    def __init__(self, owner: EtlabCache, heads: int, head_dim: int, capacity: int, dtype: torch.dtype) -> None:
        super().__init__()
        self.owner = owner
        self.capacity = capacity
        self.keys = torch.zeros(1, heads, capacity, head_dim, dtype=dtype)
        self.values = torch.zeros(1, heads, capacity, head_dim, dtype=dtype)
        self.is_initialized = True

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        """Never lazy: the buffers exist from the start (torch.export needs them before the trace)."""

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        positions = self.owner.positions
        torch.ops.etlab.update_cache(key_states, self.keys, positions)
        torch.ops.etlab.update_cache(value_states, self.values, positions)
        return self.keys, self.values

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.capacity, 0  # never asked for by etlab's attention, which builds no mask

    def get_seq_length(self) -> int:
        raise NotImplementedError("etlab's cache knows positions, not a length: pass position_ids")

    def get_max_length(self) -> int:
        return self.capacity


class EtlabCache(Cache):
    """Every decoder layer's EtlabLayer; `positions` (int64 [S]) is where the current call's rows go."""

    def __init__(self, config: Any, capacity: int, dtype: torch.dtype) -> None:
        text = config.get_text_config(decoder=True)
        heads, head_dim = get_head_shapes(text)
        count = int(text.num_hidden_layers)
        heads_of = heads if isinstance(heads, list) else [heads] * count
        dims_of = head_dim if isinstance(head_dim, list) else [head_dim] * count
        self.etlab_layers = [EtlabLayer(self, h, d, capacity, dtype) for h, d in zip(heads_of, dims_of, strict=True)]
        super().__init__(layers=list(self.etlab_layers))
        self.positions = torch.zeros(1, dtype=torch.int64)

    def buffers(self) -> list[tuple[str, torch.Tensor]]:
        """The named buffers the program module registers: `key_cache_<i>` and `value_cache_<i>` per layer."""
        named: list[tuple[str, torch.Tensor]] = []
        for index, layer in enumerate(self.etlab_layers):
            assert layer.keys is not None and layer.values is not None  # allocated in __init__, never dropped
            named += [(f"key_cache_{index}", layer.keys), (f"value_cache_{index}", layer.values)]
        return named


__all__ = ["EtlabCache", "EtlabLayer", "ops"]
