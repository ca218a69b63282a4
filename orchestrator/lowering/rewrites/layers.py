"""Rewrites of single layers (registry.py names them and decides when they apply): each `has_*` finds layers XNNPACK
leaves to portable kernels, each rewrite replaces them, in place, by layers computing the same function from
operators XNNPACK takes.

- A weight-normalized convolution (wav2vec 2.0's positional convolution) computes its weight on every run, and
  XNNPACK takes a convolution only with a constant weight: the weight is computed once, here.
- XNNPACK takes a mean only over the two inner dimensions of a 4-D tensor (global average pooling): Llama's RMSNorm
  (`mean` over the last dimension) stays outside it and splits the delegates around every norm. Its mean is written
  as a product with a constant averaging vector, a fully connected layer XNNPACK takes without moving the data (the
  pooling needs the rows transposed first).
- In a text-generation program etlab's own operators split the delegates at every layer anyway, and a norm in
  XNNPACK is five small operators beside the portable `mean`: the whole norm becomes one `etlab::rms_norm` call
  (attention/ops.py), a native kernel.

- ExecuTorch's XNNPACK quantizer quantizes a convolution dynamically (int8-dynamic) only when it is 2-D: a 1-D
  convolution (wav2vec 2.0's feature encoder, Whisper's two) stays fp32 in an int8-dynamic program. The same
  convolution as a 2-D one over a height of 1 is quantized like the rest.

A layer norm written the same way (`native_layer_norm` into the delegate) was measured no faster: DistilBERT 2.3%
slower, Whisper-tiny's encoder 1.2% faster, both within noise (interleaved A/B); it is not offered.
"""

from __future__ import annotations

from typing import Any

import torch

from orchestrator.lowering.attention import ops
from orchestrator.lowering.spec import ModelSpec

# ---------------------------------------------------------------------------------------------------------------
# fold-weight-norm


def _weight_normed(layer: torch.nn.Module) -> bool:
    from torch.nn.utils import parametrize
    from torch.nn.utils.parametrizations import _WeightNorm
    from torch.nn.utils.weight_norm import WeightNorm

    if parametrize.is_parametrized(layer, "weight"):
        return all(isinstance(p, _WeightNorm) for p in layer.parametrizations.weight)  # type: ignore[union-attr]
    return any(isinstance(hook, WeightNorm) and hook.name == "weight" for hook in layer._forward_pre_hooks.values())


def has_weight_norm(module: torch.nn.Module) -> bool:
    """A layer's weight is weight-normalized (computed from a direction and a norm on every run)."""
    return any(_weight_normed(layer) for layer in module.modules())


def fold_weight_norm(module: torch.nn.Module, _spec: ModelSpec) -> torch.nn.Module:
    """Every weight-normalized weight becomes the constant it computes to (what inference uses anyway)."""
    from torch.nn.utils import parametrize

    with torch.no_grad():
        for layer in list(module.modules()):
            if not _weight_normed(layer):
                continue
            if parametrize.is_parametrized(layer, "weight"):
                # The parametrized class is shared by every copy of the layer (a deep copy keeps classes) and
                # removing the parametrization edits it: give this layer a class of its own first.
                shared = type(layer)
                own = {key: value for key, value in vars(shared).items() if key not in ("__dict__", "__weakref__")}
                layer.__class__ = type(shared.__name__, shared.__bases__, own)
                parametrize.remove_parametrizations(layer, "weight", leave_parametrized=True)
            else:
                torch.nn.utils.remove_weight_norm(layer)
    return module


# ---------------------------------------------------------------------------------------------------------------
# rms-norm: the mean as a fully connected layer


def averaging(width: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The [1, width] weight whose product with a row is the row's mean."""
    return torch.full((1, width), 1.0 / width, dtype=dtype)


def last_dim_mean(values: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """`values.mean(-1, keepdim=True)` as a fully connected layer with `averaging`'s weight (a constant buffer of the
    module, so that XNNPACK sees a static weight)."""
    return torch.nn.functional.linear(values, weight)


def _replace(module: torch.nn.Module, wanted: Any, replacement: Any) -> torch.nn.Module:
    for parent in list(module.modules()):
        for name, child in list(parent.named_children()):
            if wanted(child):
                setattr(parent, name, replacement(child))
    return module


class MeanRMSNorm(torch.nn.Module):
    """Llama's RMSNorm, its mean of squares a fully connected layer."""

    averaging: torch.Tensor  # a buffer

    def __init__(self, norm: torch.nn.Module) -> None:
        super().__init__()
        self.weight = norm.get_parameter("weight")
        self.variance_epsilon: float = vars(norm)["variance_epsilon"]  # a plain float attribute, not a tensor
        self.register_buffer("averaging", averaging(self.weight.shape[-1]), persistent=False)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        input_dtype = hidden_states.dtype
        hidden_states = hidden_states.to(torch.float32)
        variance = last_dim_mean(hidden_states.pow(2), self.averaging)
        hidden_states = hidden_states * torch.rsqrt(variance + self.variance_epsilon)
        return self.weight * hidden_states.to(input_dtype)


def _llama_rms_norm(layer: torch.nn.Module) -> bool:
    """A norm whose forward is LlamaRMSNorm's, byte for byte (transformers copies it into most decoder families:
    Qwen2RMSNorm, MistralRMSNorm, ...); Gemma's (1 + weight) and T5's norms are other code and stay."""
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    return same_code(getattr(type(layer), "forward", None), LlamaRMSNorm.forward)


def same_code(one: Any, other: Any) -> bool:
    """Two functions with the same bytecode, constants and names (transformers' copies of one function)."""
    a, b = getattr(one, "__code__", None), getattr(other, "__code__", None)
    return (
        a is not None and b is not None and (a.co_code, a.co_consts, a.co_names) == (b.co_code, b.co_consts, b.co_names)
    )


def has_llama_rms_norm(module: torch.nn.Module) -> bool:
    return any(_llama_rms_norm(layer) for layer in module.modules())


def mean_rms_norm(module: torch.nn.Module, _spec: ModelSpec) -> torch.nn.Module:
    return _replace(module, _llama_rms_norm, MeanRMSNorm)


# ---------------------------------------------------------------------------------------------------------------
# fused-rms-norm: the whole norm as one etlab operator


class FusedRMSNorm(torch.nn.Module):
    """Llama's RMSNorm as one `etlab::rms_norm` call; the model's own forward where the operator does not fit (an
    input or weight other than float32)."""

    def __init__(self, norm: torch.nn.Module) -> None:
        super().__init__()
        self.weight = norm.get_parameter("weight")
        self.variance_epsilon: float = vars(norm)["variance_epsilon"]  # a plain float attribute, not a tensor
        self._own_forward = type(norm).forward  # LlamaRMSNorm's code (_llama_rms_norm), reading the same two fields

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        if hidden_states.dtype == self.weight.dtype == torch.float32:
            return ops.rms_norm(hidden_states, self.weight, self.variance_epsilon)
        return self._own_forward(self, hidden_states)


def fused_rms_norm(module: torch.nn.Module, _spec: ModelSpec) -> torch.nn.Module:
    return _replace(module, _llama_rms_norm, FusedRMSNorm)


# ---------------------------------------------------------------------------------------------------------------
# conv1d-as-2d: a 1-D convolution as a 2-D one over a height of 1


class Conv1dAs2d(torch.nn.Conv2d):
    """A `Conv1d`'s function as a 2-D convolution with a (1, k) kernel over [N, C, 1, L]: [N, C, L] in, [N, C', L']
    out, the same weights. A `Conv2d` (a convolution, as the lowering's quantization report counts them) under the
    same name, keeping the 1-D layer's `stride`, `padding`, `dilation` and `kernel_size` for the model that reads
    them (Whisper checks its input length with `conv1.stride[0]`)."""

    def __init__(self, conv: torch.nn.Conv1d) -> None:
        super().__init__(conv.in_channels, conv.out_channels, (1, conv.kernel_size[0]), groups=conv.groups,
                         bias=conv.bias is not None, device=conv.weight.device, dtype=conv.weight.dtype)  # fmt: skip
        with torch.no_grad():
            self.weight.copy_(conv.weight.unsqueeze(2))
            if conv.bias is not None and self.bias is not None:
                self.bias.copy_(conv.bias)
        self.stride, self.dilation, self.kernel_size = conv.stride, conv.dilation, conv.kernel_size
        self.padding = conv.padding
        self.padding_2d: str | tuple[int, int] = conv.padding if isinstance(conv.padding, str) else (0, conv.padding[0])

    def forward(self, values: torch.Tensor) -> torch.Tensor:
        # In as unsqueeze, which stays outside the delegate (a copy): as a view, ExecuTorch 1.5.1's
        # ChannelsLastTaggedReshapePass follows a dynamically quantized input up past it to the 3-D tensor and fails
        # (bench/README.md "AMX is the int8 edge"). Out as a view: XNNPACK takes it (a static reshape).
        out = torch.nn.functional.conv2d(values.unsqueeze(-2), self.weight, self.bias, (1, self.stride[0]),
                                         self.padding_2d, (1, self.dilation[0]), self.groups)  # fmt: skip
        return out.reshape(*out.shape[:-2], out.shape[-1])


def _plain_conv1d(layer: torch.nn.Module) -> bool:
    """A `Conv1d` the quantizer would quantize as 2-D: zero padding, not depthwise (it skips those at 2-D too), its
    weight a plain parameter (a weight-normalized one is fold-weight-norm's first)."""
    from torch.nn.utils import parametrize

    return (
        type(layer) is torch.nn.Conv1d
        and layer.padding_mode == "zeros"
        and not (layer.groups > 1 and layer.groups == layer.in_channels)
        and not parametrize.is_parametrized(layer, "weight")
        and not _weight_normed(layer)
    )


def has_conv1d(module: torch.nn.Module) -> bool:
    return any(_plain_conv1d(layer) for layer in module.modules())


def conv1d_as_2d(module: torch.nn.Module, _spec: ModelSpec) -> torch.nn.Module:
    return _replace(module, _plain_conv1d, Conv1dAs2d)
