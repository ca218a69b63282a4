"""The rewrites of HuggingFace models (registry.py names them and decides when they apply): each `has_*` finds its
pattern in the loaded module, each rewrite returns the module computing the same function.

The loaded module is the huggingface builder's `FirstOutput` (sources/builders/huggingface.py: the model as exported)
around the transformers model (`.model`); the head rewrite replaces that wrapper, the others change the model inside
it in place.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

import torch

from orchestrator.lowering.sources.builders.huggingface import FirstOutput, PositionLogits
from orchestrator.lowering.sources.huggingface import HuggingFaceOptions
from orchestrator.lowering.spec import ModelSpec

if TYPE_CHECKING:
    from transformers import PreTrainedModel


def _model(module: torch.nn.Module) -> Any:
    return getattr(module, "model", module)


# ---------------------------------------------------------------------------------------------------------------
# tanh-gelu


def has_gelu_new(module: torch.nn.Module) -> bool:
    from transformers.activations import NewGELUActivation

    return any(isinstance(child, NewGELUActivation) for child in module.modules())


def tanh_gelu(module: torch.nn.Module, _spec: ModelSpec) -> torch.nn.Module:
    """Every `gelu_new` becomes `gelu_pytorch_tanh`: the same tanh approximation, without `pow(x, 3)`."""
    from transformers.activations import NewGELUActivation, get_activation

    for parent in list(module.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, NewGELUActivation):
                setattr(parent, name, get_activation("gelu_pytorch_tanh"))
    return module


# ---------------------------------------------------------------------------------------------------------------
# eager-attention


def has_sdpa_attention(module: torch.nn.Module) -> bool:
    """The model attends through an implementation other than eager (SDPA, transformers' default where supported);
    etlab's attention (a text-generation program's, attention/interface.py) is no SDPA to replace."""
    config = getattr(_model(module), "config", None)
    return getattr(config, "_attn_implementation", "eager") not in (None, "eager", "etlab", BMM_ATTENTION)


def eager_attention(module: torch.nn.Module, _spec: ModelSpec) -> torch.nn.Module:
    _model(module).set_attn_implementation("eager")
    return module


# ---------------------------------------------------------------------------------------------------------------
# bmm-attention

BMM_ATTENTION = "etlab-bmm"  # the attention implementation's name in transformers' interfaces
_MATMUL_ATTENTION = ("eager", "sdpa")  # the implementations whose matmuls bmm-attention computes the same


def has_matmul_attention(module: torch.nn.Module) -> bool:
    """The model attends through transformers' attention interface with eager or SDPA attention (whose 4-D matmuls
    export as expand_copy + bmm); GPT-2's reordered-and-upcast attention bypasses the interface."""
    model = _model(module)
    config = getattr(model, "config", None)
    if getattr(config, "_attn_implementation", None) not in _MATMUL_ATTENTION:
        return False
    if getattr(config, "reorder_and_upcast_attn", False):
        return False
    modeling = {sys.modules.get(type(child).__module__) for child in model.modules()}
    return any(hasattr(module_, "ALL_ATTENTION_FUNCTIONS") for module_ in modeling if module_ is not None)


def bmm_attention_forward(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    **_kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Eager attention, its two products written as 3-D batched matmuls over batch x heads.

    `torch.matmul` of 4-D tensors exports as expand_copy (a full copy of each operand, the [B, H, T, T] scores among
    them) + view + bmm, and XNNPACK takes no expand_copy: two portable copies per product and a delegate split at
    each. Flattening batch and heads first leaves views and transposes, which XNNPACK takes. Takes query [B, Hq, T,
    D], key and value [B, Hkv, S, D] (key-value heads shared by index, as `repeat_kv`), a float mask broadcastable
    to [B, Hq, T, S] or none; returns [B, T, Hq, D] and the weights, as transformers' eager attention does."""
    batch, heads, length, depth = query.shape
    if key.size(1) != heads:
        key = key.repeat_interleave(heads // key.size(1), dim=1)
        value = value.repeat_interleave(heads // value.size(1), dim=1)
    keys = key.size(2)
    scale = depth**-0.5 if scaling is None else scaling
    scores = torch.bmm(
        query.reshape(batch * heads, length, depth), key.reshape(batch * heads, keys, depth).transpose(1, 2)
    )
    scores = scores.view(batch, heads, length, keys) * scale
    if attention_mask is not None:
        scores = scores + attention_mask[..., :keys]
    weights = torch.nn.functional.softmax(scores, dim=-1, dtype=torch.float32).to(value.dtype)
    weights = torch.nn.functional.dropout(weights, p=dropout, training=module.training)
    out = torch.bmm(weights.view(batch * heads, length, keys), value.reshape(batch * heads, keys, depth))
    return out.view(batch, heads, length, depth).transpose(1, 2).contiguous(), weights


def register_bmm_attention() -> str:
    """Make BMM_ATTENTION an attention implementation transformers accepts, with eager's float mask (idempotent)."""
    from transformers.masking_utils import AttentionMaskInterface, eager_mask
    from transformers.modeling_utils import AttentionInterface

    AttentionInterface.register(BMM_ATTENTION, bmm_attention_forward)
    AttentionMaskInterface.register(BMM_ATTENTION, eager_mask)
    return BMM_ATTENTION


def bmm_attention(module: torch.nn.Module, _spec: ModelSpec) -> torch.nn.Module:
    _model(module).set_attn_implementation(register_bmm_attention())
    return module


# ---------------------------------------------------------------------------------------------------------------
# head-at-position


def has_all_positions_head(module: torch.nn.Module) -> bool:
    """The model's head runs on every position: a masked or causal LM exported as it is (`output: all`), or a
    program that selects one position's logits after its head (`PositionLogits`: `output: mask` or `last`, the
    course's programs, whose head still projects every position before the index)."""
    return isinstance(module, FirstOutput | PositionLogits) and hasattr(module.model, "base_model")


def head_at_position(module: torch.nn.Module, spec: ModelSpec) -> torch.nn.Module:
    """The logits of one position per row, the position selected before the head. A program of every position's
    logits gets the [MASK] (fill-mask) or the last real token (causal-lm); a program that selected its position
    after the head keeps its own rule and its own inputs, so its outputs are the same [B, vocab] as before."""
    if isinstance(module, PositionLogits):
        return SelectedFirstLogits(module.model, module.input_names, module.mask_token_id).eval()
    model = _model(module)
    if spec.task == "fill-mask":
        mask_token_id = spec.options_of(HuggingFaceOptions).mask_token_id
        assert mask_token_id is not None  # the spec check requires it
        return FillMaskLogits(model, mask_token_id).eval()
    return LastTokenLogits(model).eval()


def _logits_at(model: Any, position: torch.Tensor | None, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
    """A PreTrainedModel's logits at `position` (one per row; None: the final position) only: [B, vocab].

    The base model's last hidden state is cut to that one position before the head runs, so the head (the
    largest matmul, hidden x vocab) runs on one row instead of seq_len. A forward hook on `base_model` does this
    for any HF head model, whose head reads the base model's first output.
    """

    def keep_position(_module: torch.nn.Module, _args: Any, output: Any) -> Any:
        hidden = output[0]
        if position is None:
            selected = hidden[:, -1:]
        elif hidden.shape[0] == 1:  # the shape is static in the program: one row keeps the simpler graph
            selected = torch.index_select(hidden, 1, position)
        else:
            selected = hidden[torch.arange(hidden.shape[0]), position].unsqueeze(1)
        if isinstance(output, tuple):
            return (selected, *output[1:])
        output["last_hidden_state"] = selected
        return output

    handle = model.base_model.register_forward_hook(keep_position)
    try:
        logits = model(**inputs).logits
    finally:
        handle.remove()
    return logits[0] if logits.shape[0] == 1 else logits[:, 0]


class FillMaskLogits(torch.nn.Module):
    """Masked-LM logits at each row's first [MASK] position: [B, vocab]."""

    def __init__(self, model: PreTrainedModel, mask_token_id: int) -> None:
        super().__init__()
        self.model = model
        self.mask_token_id = mask_token_id

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        position = (input_ids == self.mask_token_id).to(torch.int32).argmax(dim=1)
        return _logits_at(self.model, position, {"input_ids": input_ids, "attention_mask": attention_mask})


class LastTokenLogits(torch.nn.Module):
    """Causal-LM logits of each row's last unmasked token: [B, vocab]."""

    def __init__(self, model: PreTrainedModel) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        last = attention_mask.sum(dim=1) - 1
        return _logits_at(self.model, last, {"input_ids": input_ids, "attention_mask": attention_mask})


class SelectedFirstLogits(PositionLogits):
    """`PositionLogits` with the position selected before the head: the same inputs, the same rule (its
    `position`), the same [B, vocab] outputs."""

    def forward(self, *inputs: torch.Tensor) -> torch.Tensor:
        by_name = dict(zip(self.input_names, inputs, strict=True))
        return _logits_at(self.model, self.position(by_name), by_name)
