"""The `rope` rewrite (registry.py names it and decides when it applies): Llama's rotary position embedding as one
operator, `etlab::rope` (attention/ops.py), instead of about a dozen small ones.

transformers' `apply_rotary_pos_emb` computes q * cos + rotate_half(q) * sin with two slices, a negation, a
concatenation, two products and a sum per tensor. In an ExecuTorch program the slices stay in portable kernels and
split the delegates, so each decoder layer pays a delegate call, the transposes of q and k, 4 slice kernels and
about 12 XNNPACK operators: in SmolLM2-135M's 4-bit decode step, the fixed costs that keep it under its bandwidth
roofline (bench/README.md). `etlab::rope` reads q and k as the projections write them ([B, S, H, D]) and writes them
as attention reads them ([B, H, S, D]), one call per tensor.

The attention layers' code is kept: each layer whose forward calls a module-level `apply_rotary_pos_emb` that is
Llama's, byte for byte (Qwen2, Mistral, SmolLM3 and others copy it), gets a copy of that forward whose
`apply_rotary_pos_emb` is `fused_rope`. Nothing global changes: other models in the process keep transformers' RoPE.
`fold_rope_transposes` then cancels, in the exported graph, the transpose the layer applies before RoPE against the
one `fused_rope` applies to hand the operator the projection's layout.
"""

from __future__ import annotations

import functools
import sys
import types
from collections.abc import Callable
from typing import Any

import torch

from orchestrator.lowering.attention import ops
from orchestrator.lowering.rewrites.layers import same_code
from orchestrator.lowering.spec import ModelSpec

ROPE_FUNCTION = "apply_rotary_pos_emb"


def plain_function(value: Any) -> Any:
    """The Python function behind `value`: transformers wraps `apply_rotary_pos_emb` in a hub-kernel module (`Func`,
    when the `kernels` package is installed) whose forward closes over it; decorators keep it in `__wrapped__`."""
    forward = getattr(type(value), "forward", None)
    if isinstance(value, torch.nn.Module) and forward is not None and "func" in forward.__code__.co_freevars:
        value = forward.__closure__[forward.__code__.co_freevars.index("func")].cell_contents
    while hasattr(value, "__wrapped__"):
        value = value.__wrapped__
    return value


def _llama_rope() -> tuple[Any, Any]:
    from transformers.models.llama import modeling_llama

    return plain_function(modeling_llama.apply_rotary_pos_emb), plain_function(modeling_llama.rotate_half)


def _calls_llama_rope(layer: torch.nn.Module) -> bool:
    """The layer's forward calls a module-level `apply_rotary_pos_emb` that is Llama's (and its rotate_half too)."""
    forward = plain_function(getattr(type(layer), "forward", None))
    code = getattr(forward, "__code__", None)
    if code is None or ROPE_FUNCTION not in code.co_names:
        return False
    rope = plain_function(forward.__globals__.get(ROPE_FUNCTION))
    apply, rotate = _llama_rope()
    return same_code(rope, apply) and same_code(plain_function(rope.__globals__.get("rotate_half")), rotate)


def has_llama_rope(module: torch.nn.Module) -> bool:
    return any(_calls_llama_rope(layer) for layer in module.modules())


@functools.cache  # one per model's function: a model rewritten again gets the same copy of its modules
def fused_rope(original: Callable[..., Any]) -> Callable[..., Any]:
    """`apply_rotary_pos_emb` through etlab::rope; `original` (the model's own) where the operator does not fit: q
    and k other than [B, H, S, D] float32, cos and sin other than [B, S, D]."""

    def apply_rotary_pos_emb(
        q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, unsqueeze_dim: int = 1
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if not _fits(q, k, cos, sin, unsqueeze_dim):
            return original(q, k, cos, sin, unsqueeze_dim)
        return ops.rope(q.transpose(1, 2), cos, sin), ops.rope(k.transpose(1, 2), cos, sin)

    return apply_rotary_pos_emb


def _fits(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, unsqueeze_dim: int) -> bool:
    """q and k [B, H, S, D] float32 (D even), cos and sin [B, S, D]: what etlab::rope computes."""
    if unsqueeze_dim != 1 or q.dim() != 4 or k.dim() != 4 or cos.dim() != 3 or cos.shape != sin.shape:
        return False
    batch, _, positions, width = q.shape
    return (
        q.dtype == k.dtype == cos.dtype == sin.dtype == torch.float32
        and k.shape[0] == batch
        and k.shape[2] == positions
        and k.shape[3] == width
        and tuple(cos.shape) == (batch, positions, width)
        and width % 2 == 0
    )


def with_global(function: Any, name: str, value: Any) -> Any:
    """A copy of `function` whose global `name` is `value`. A decorator's wrapper (functools.wraps: `__wrapped__`,
    held in its closure) is copied around the copy, so the wrapper's own work (a renamed keyword) is kept.

    The copy's globals are a module of their own, a copy of the function's module registered in sys.modules:
    torch.export's tracer guards on a global through the module its globals name, so they must name one that
    holds `value`."""
    wrapped = getattr(function, "__wrapped__", None)
    closure = function.__closure__
    scope = function.__globals__
    if wrapped is not None:
        inner = with_global(wrapped, name, value)
        if not any(_holds(cell, wrapped) for cell in closure or ()):
            raise LookupError(f"{function.__qualname__} wraps {wrapped.__qualname__} but does not hold it")
        closure = tuple(types.CellType(inner) if _holds(cell, wrapped) else cell for cell in closure or ())
    else:
        scope = _module_with(scope, name, value).__dict__
    copy = types.FunctionType(function.__code__, scope, function.__name__, function.__defaults__, closure)
    copy.__kwdefaults__ = function.__kwdefaults__
    copy.__qualname__, copy.__doc__, copy.__module__ = function.__qualname__, function.__doc__, scope["__name__"]
    if wrapped is not None:
        copy.__wrapped__ = inner  # type: ignore[attr-defined]  # what functools.wraps sets
    return copy


def _module_with(scope: dict[str, Any], name: str, value: Any) -> types.ModuleType:
    """The module `scope` belongs to, copied under a name of its own, its `name` set to `value` (one per module,
    name and value: the module holds the value, so its id names it for as long as the module exists)."""
    copied = f"{__name__}.fused.{scope['__name__']}.{name}.{id(value):x}"
    module = sys.modules.get(copied)
    if module is None:
        module = types.ModuleType(copied)
        module.__dict__.update({key: item for key, item in scope.items() if key not in ("__name__", "__spec__")})
        module.__dict__[name] = value
        sys.modules[copied] = module
    return module


def _holds(cell: types.CellType, value: Any) -> bool:
    try:
        return cell.cell_contents is value
    except ValueError:  # an empty cell
        return False


def fuse_rope(module: torch.nn.Module, _spec: ModelSpec) -> torch.nn.Module:
    """Every layer calling Llama's RoPE gets a class of its own whose forward calls `fused_rope` instead."""
    classes: dict[type, type] = {}
    for layer in module.modules():
        if not _calls_llama_rope(layer):
            continue
        kind = type(layer)
        if kind not in classes:
            forward = kind.forward
            # the function itself, not transformers' hub-kernel module around it, which torch.export cannot trace
            original = plain_function(plain_function(forward).__globals__[ROPE_FUNCTION])
            fused = with_global(forward, ROPE_FUNCTION, fused_rope(original))
            classes[kind] = type(kind.__name__, (kind,), {"forward": fused, "__module__": kind.__module__})
        layer.__class__ = classes[kind]
    return module


# ---------------------------------------------------------------------------------------------------------------
# the exported graph: the two transposes around etlab::rope's input cancelled

_SWAP_HEADS = (0, 2, 1, 3)


def _swaps_heads(node: Any) -> bool:
    """A node transposing dims 1 and 2 of a 4-D tensor (transpose.int, or permute [0, 2, 1, 3])."""
    if getattr(node, "op", None) != "call_function":
        return False
    if node.target == torch.ops.aten.transpose.int:
        return sorted(d % 4 for d in node.args[1:3]) == [1, 2] and len(node.meta["val"].shape) == 4
    if node.target == torch.ops.aten.permute.default:
        return tuple(d % 4 for d in node.args[1]) == _SWAP_HEADS
    return False


def fold_rope_transposes(exported: Any) -> int:
    """In `exported` (an ExportedProgram, in place): each etlab::rope whose input is the heads' transpose of the
    heads' transpose reads the tensor before both instead; the transposes left unused are removed. Returns how
    many inputs were folded."""
    graph = exported.graph_module.graph
    folded = 0
    for node in list(graph.nodes):
        if node.op != "call_function" or node.target != torch.ops.etlab.rope.default:
            continue
        outer = node.args[0]
        if not (_swaps_heads(outer) and _swaps_heads(outer.args[0])):
            continue
        inner = outer.args[0]
        node.args = (inner.args[0], *node.args[1:])
        folded += 1
        for transpose in (outer, inner):  # only what nothing else reads
            if not transpose.users:
                graph.erase_node(transpose)
    if folded:
        exported.graph_module.recompile()
    return folded
