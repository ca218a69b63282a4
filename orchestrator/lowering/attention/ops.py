"""etlab's attention and KV-cache operators, the export side: schemas, PyTorch reference kernels and fake kernels.

The native runner registers the same operators (board/runner/src/kernels/: `etlab::update_cache.out`,
`etlab::attend.out`), so a program that calls them runs there; this module is what torch.export traces and what
tests check the runner's kernels against.

    update_cache(value [B, H, S, D], cache(a!) [B, H, C, D], positions int64 [S]) -> Tensor [1]
        cache[:, :, positions[i], :] = value[:, :, i, :], in place: only the new rows are written. The result is a
        token (one zero), so the functional form aliases nothing; a position outside [0, C) is an error.
    attend(query [B, Hq, S, D], key_cache [B, Hkv, C, D], value_cache [B, Hkv, C, D], positions int64 [S],
           scale float) -> [B, Hq, S, D]
        Causal attention by position: query row i attends to cache rows 0..positions[i] (the filled ones), never
        past them, so no mask tensor exists. Query head h reads KV head h // (Hq // Hkv): heads are shared by
        index, never copied.
    rope(x [B, S, H, D], cos [B, S, D], sin [B, S, D]) -> [B, H, S, D]
        Rotary position embedding as Llama computes it, x * cos + rotate_half(x) * sin (rotate_half: the row's two
        halves swapped, the new first half negated), read in the layout the projections write and written in the
        one attention reads: the transpose between them is folded in (the `rope` rewrite, rewrites/rope.py).
    rms_norm(x [..., D], weight [D], eps float) -> [..., D]
        Llama's RMSNorm, weight * (x * rsqrt(mean(x^2) + eps)) over each row of D, in one call instead of a portable
        `mean` and five XNNPACK operators (the `fused-rms-norm` rewrite, rewrites/layers.py).

Causality comes from `positions`, so a prompt of P tokens at positions 0..P-1 and one token at position P are the
same call. Both are registered once, at import; importing this module is what makes `torch.ops.etlab.*` exist.
"""

from __future__ import annotations

import torch

NAMESPACE = "etlab"

_LIBRARY = torch.library.Library(NAMESPACE, "DEF")
_LIBRARY.define("update_cache(Tensor value, Tensor(a!) cache, Tensor positions) -> Tensor")
_LIBRARY.define("update_cache.out(Tensor value, Tensor(a!) cache, Tensor positions, *, Tensor(b!) out) -> Tensor(b!)")
_LIBRARY.define("attend(Tensor query, Tensor key_cache, Tensor value_cache, Tensor positions, float scale) -> Tensor")
_LIBRARY.define(
    "attend.out(Tensor query, Tensor key_cache, Tensor value_cache, Tensor positions, float scale, *, "
    "Tensor(a!) out) -> Tensor(a!)"
)

_LIBRARY.define("rope(Tensor x, Tensor cos, Tensor sin) -> Tensor")
_LIBRARY.define("rope.out(Tensor x, Tensor cos, Tensor sin, *, Tensor(a!) out) -> Tensor(a!)")
_LIBRARY.define("rms_norm(Tensor x, Tensor weight, float eps) -> Tensor")
_LIBRARY.define("rms_norm.out(Tensor x, Tensor weight, float eps, *, Tensor(a!) out) -> Tensor(a!)")


def _check_update(value: torch.Tensor, cache: torch.Tensor, positions: torch.Tensor) -> None:
    torch._check(value.dim() == 4 and cache.dim() == 4, lambda: "update_cache: value and cache must be 4-D")
    torch._check(positions.dim() == 1, lambda: "update_cache: positions must be 1-D")
    torch._check(value.size(2) == positions.size(0), lambda: "update_cache: one position per new row")
    torch._check(value.size(0) == cache.size(0), lambda: "update_cache: batch sizes differ")
    torch._check(value.size(1) == cache.size(1), lambda: "update_cache: head counts differ")
    torch._check(value.size(3) == cache.size(3), lambda: "update_cache: head dims differ")
    torch._check(value.dtype == cache.dtype, lambda: "update_cache: value and cache dtypes differ")


def _check_attend(query: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor, positions: torch.Tensor):
    torch._check(query.dim() == 4 and key_cache.dim() == 4, lambda: "attend: query and caches must be 4-D")
    torch._check(key_cache.shape == value_cache.shape, lambda: "attend: key and value caches differ in shape")
    torch._check(query.size(0) == key_cache.size(0), lambda: "attend: batch sizes differ")
    torch._check(query.size(1) % key_cache.size(1) == 0, lambda: "attend: query heads must be a multiple of KV heads")
    torch._check(query.size(3) == key_cache.size(3), lambda: "attend: head dims differ")
    torch._check(positions.dim() == 1 and positions.size(0) == query.size(2), lambda: "attend: one position per row")


def _check_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> None:
    torch._check(x.dim() == 4 and cos.dim() == 3, lambda: "rope: x must be 4-D, cos and sin 3-D")
    torch._check(cos.shape == sin.shape, lambda: "rope: cos and sin differ in shape")
    torch._check(cos.size(0) == x.size(0), lambda: "rope: batch sizes differ")
    torch._check(cos.size(1) == x.size(1), lambda: "rope: one cos and sin row per position")
    torch._check(cos.size(2) == x.size(3), lambda: "rope: cos and sin rows must be as wide as a head")
    torch._check(x.size(3) % 2 == 0, lambda: "rope: the head dim must be even")
    torch._check(x.dtype == cos.dtype == sin.dtype, lambda: "rope: x, cos and sin dtypes differ")


def _check_rms_norm(x: torch.Tensor, weight: torch.Tensor) -> None:
    torch._check(x.dim() >= 1 and weight.dim() == 1, lambda: "rms_norm: x must have a dim, weight must be 1-D")
    torch._check(x.size(-1) == weight.size(0), lambda: "rms_norm: weight must be as wide as x's rows")
    torch._check(x.dtype == weight.dtype, lambda: "rms_norm: x and weight dtypes differ")


def update_cache_reference(value: torch.Tensor, cache: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    _check_update(value, cache, positions)
    if positions.numel():
        torch._check(
            bool((positions >= 0).all()) and bool((positions < cache.size(2)).all()),
            lambda: f"update_cache: a position is outside the cache's {cache.size(2)} rows",
        )
    cache.index_copy_(2, positions, value)
    return value.new_zeros(1)


def attend_reference(
    query: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor, positions: torch.Tensor, scale: float
) -> torch.Tensor:
    """Eager attention in float64 accumulations' place: repeat the KV heads, mask by position, softmax."""
    _check_attend(query, key_cache, value_cache, positions)
    group = query.size(1) // key_cache.size(1)
    keys = key_cache.repeat_interleave(group, dim=1)
    values = value_cache.repeat_interleave(group, dim=1)
    scores = torch.matmul(query, keys.transpose(2, 3)) * scale
    rows = torch.arange(key_cache.size(2), device=query.device)
    allowed = rows[None, :] <= positions[:, None]  # [S, C]
    scores = scores.masked_fill(~allowed, float("-inf"))
    return torch.matmul(torch.softmax(scores, dim=-1), values).to(query.dtype)


def rope_reference(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """transformers' Llama RoPE, operator for operator (so a rewritten model's eager outputs are its own), on x's
    transpose: [B, S, H, D] in, [B, H, S, D] out, contiguous."""
    _check_rope(x, cos, sin)
    heads_first = x.transpose(1, 2)
    half = x.size(-1) // 2
    rotated = torch.cat((-heads_first[..., half:], heads_first[..., :half]), dim=-1)
    return ((heads_first * cos.unsqueeze(1)) + (rotated * sin.unsqueeze(1))).contiguous()


def rms_norm_reference(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """transformers' LlamaRMSNorm on float32, operator for operator (a rewritten model's eager outputs are its own)."""
    _check_rms_norm(x, weight)
    variance = x.pow(2).mean(-1, keepdim=True)
    return weight * (x * torch.rsqrt(variance + eps))


def _update_cache_fake(value: torch.Tensor, cache: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    _check_update(value, cache, positions)
    return value.new_empty(1)


def _attend_fake(
    query: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor, positions: torch.Tensor, scale: float
) -> torch.Tensor:
    _check_attend(query, key_cache, value_cache, positions)
    return torch.empty_like(query)


def _rope_fake(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    _check_rope(x, cos, sin)
    return x.new_empty((x.size(0), x.size(2), x.size(1), x.size(3)))


def _rope_out(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, *, out: torch.Tensor) -> torch.Tensor:
    out.copy_(rope_reference(x, cos, sin))
    return out


def _rope_out_fake(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, *, out: torch.Tensor) -> torch.Tensor:
    _check_rope(x, cos, sin)
    return out


def _rms_norm_fake(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    _check_rms_norm(x, weight)
    return torch.empty_like(x)


def _rms_norm_out(x: torch.Tensor, weight: torch.Tensor, eps: float, *, out: torch.Tensor) -> torch.Tensor:
    out.copy_(rms_norm_reference(x, weight, eps))
    return out


def _rms_norm_out_fake(x: torch.Tensor, weight: torch.Tensor, eps: float, *, out: torch.Tensor) -> torch.Tensor:
    _check_rms_norm(x, weight)
    return out


def _update_cache_out(
    value: torch.Tensor, cache: torch.Tensor, positions: torch.Tensor, *, out: torch.Tensor
) -> torch.Tensor:
    out.copy_(update_cache_reference(value, cache, positions))
    return out


def _attend_out(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    positions: torch.Tensor,
    scale: float,
    *,
    out: torch.Tensor,
) -> torch.Tensor:
    out.copy_(attend_reference(query, key_cache, value_cache, positions, scale))
    return out


def _update_cache_out_fake(
    value: torch.Tensor, cache: torch.Tensor, positions: torch.Tensor, *, out: torch.Tensor
) -> torch.Tensor:
    _check_update(value, cache, positions)
    return out


def _attend_out_fake(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    positions: torch.Tensor,
    scale: float,
    *,
    out: torch.Tensor,
) -> torch.Tensor:
    _check_attend(query, key_cache, value_cache, positions)
    return out


_LIBRARY.impl("update_cache", update_cache_reference, "CompositeExplicitAutograd")
_LIBRARY.impl("update_cache", _update_cache_fake, "Meta")
_LIBRARY.impl("update_cache.out", _update_cache_out, "CompositeExplicitAutograd")
_LIBRARY.impl("update_cache.out", _update_cache_out_fake, "Meta")
_LIBRARY.impl("attend", attend_reference, "CompositeExplicitAutograd")
_LIBRARY.impl("attend", _attend_fake, "Meta")
_LIBRARY.impl("attend.out", _attend_out, "CompositeExplicitAutograd")
_LIBRARY.impl("attend.out", _attend_out_fake, "Meta")
_LIBRARY.impl("rope", rope_reference, "CompositeExplicitAutograd")
_LIBRARY.impl("rope", _rope_fake, "Meta")
_LIBRARY.impl("rope.out", _rope_out, "CompositeExplicitAutograd")
_LIBRARY.impl("rope.out", _rope_out_fake, "Meta")
_LIBRARY.impl("rms_norm", rms_norm_reference, "CompositeExplicitAutograd")
_LIBRARY.impl("rms_norm", _rms_norm_fake, "Meta")
_LIBRARY.impl("rms_norm.out", _rms_norm_out, "CompositeExplicitAutograd")
_LIBRARY.impl("rms_norm.out", _rms_norm_out_fake, "Meta")

update_cache = torch.ops.etlab.update_cache.default
attend = torch.ops.etlab.attend.default
rope = torch.ops.etlab.rope.default
rms_norm = torch.ops.etlab.rms_norm.default
