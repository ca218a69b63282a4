"""Turn a ModelSpec into an exportable torch module, its reference inputs, and its weights story.

The wrappers select the one output a deployment needs inside the graph (the [MASK] logits, or the
last real token's logits), before the LM head, so the board computes and returns [1, vocab] instead of
[1, seq, vocab].
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from orchestrator import console
from orchestrator.errors import SpecError
from orchestrator.lowering.spec import ModelSpec

# Deciding the weights needs no torch, so it lives in weights.py.
from orchestrator.lowering.weights import RANDOM_SEED, WeightsChoice, resolve_weights
from orchestrator.tensorfile import NamedTensor


@dataclass
class LoadedModel:
    module: torch.nn.Module
    weights: str  # "pretrained" or "random"
    weights_note: str
    parameters: int


def _logits_at(
    model: torch.nn.Module, position: torch.Tensor, input_ids: torch.Tensor, attention_mask: torch.Tensor
) -> torch.Tensor:
    """The model's logits at `position` only: [1, 1, vocab].

    The base model's last hidden state is cut to that one position before the head runs, so the head (the
    largest matmul, hidden x vocab: a fifth of GPT-2's time) runs on one row instead of seq_len. A forward hook
    on `base_model` does this for any HF head model, whose head reads the base model's first output.
    """

    def keep_position(_module: torch.nn.Module, _args: Any, output: Any) -> Any:
        selected = torch.index_select(output[0], 1, position)
        if isinstance(output, tuple):
            return (selected, *output[1:])
        output["last_hidden_state"] = selected
        return output

    handle = model.base_model.register_forward_hook(keep_position)
    try:
        return model(input_ids=input_ids, attention_mask=attention_mask).logits
    finally:
        handle.remove()


class FillMaskLogits(torch.nn.Module):
    """Masked-LM logits at the first [MASK] position: [1, vocab]."""

    def __init__(self, model: torch.nn.Module, mask_token_id: int) -> None:
        super().__init__()
        self.model = model
        self.mask_token_id = mask_token_id

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        position = (input_ids == self.mask_token_id).to(torch.int32).argmax(dim=1)
        return _logits_at(self.model, position, input_ids, attention_mask)[0]


class LastTokenLogits(torch.nn.Module):
    """Causal-LM logits of the last unmasked token: [1, vocab]."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        last = attention_mask.sum(dim=1) - 1
        return _logits_at(self.model, last, input_ids, attention_mask)[0]


def _auto_class(spec: ModelSpec) -> Any:
    import transformers

    return transformers.AutoModelForMaskedLM if spec.task == "fill-mask" else transformers.AutoModelForCausalLM


def _config(spec: ModelSpec) -> Any:
    from transformers import CONFIG_MAPPING

    try:
        return CONFIG_MAPPING[spec.model_type](**spec.config)
    except (TypeError, ValueError) as exc:
        raise SpecError(f"spec {spec.name!r} ({spec.source}): field 'config' is invalid: {exc}") from exc


def build_random(spec: ModelSpec) -> torch.nn.Module:
    """The architecture from its config with seeded random weights: no hub needed."""
    torch.manual_seed(RANDOM_SEED)
    model = _auto_class(spec).from_config(_config(spec))
    return model.eval()


def build_pretrained(spec: ModelSpec) -> torch.nn.Module:
    """`from_pretrained` from the HF cache, a local folder, or the hub."""
    if not spec.model_id:
        raise SpecError(f"model {spec.name!r} has no model_id, so it has no pretrained weights; use --weights random")
    overrides = dict(spec.config)
    model = _auto_class(spec).from_pretrained(spec.model_id, **overrides)
    return model.eval()


def load_model(spec: ModelSpec, weights: str | WeightsChoice) -> LoadedModel:
    """The wrapped module with the weights `weights` asks for (a mode, or a choice already resolved)."""
    choice = weights if isinstance(weights, WeightsChoice) else resolve_weights(spec, weights)
    if choice.mode == "pretrained":
        try:
            module = build_pretrained(spec)
        except SpecError:
            raise
        except Exception as exc:  # transformers raises OSError, ValueError, HTTP errors...
            raise SpecError(
                f"cannot load pretrained weights for {spec.model_id!r}: {exc.__class__.__name__}: {str(exc)[:300]}",
                hint="use --weights random to build the architecture from its config",
            ) from exc
        return _wrap(spec, module, "pretrained", f"from_pretrained({spec.model_id!r})")
    if choice.fallback:
        console.loud_warning(
            f"pretrained weights for {spec.model_id!r} are unavailable ({choice.reason}).\n"
            f"Falling back to RANDOM weights (seed {RANDOM_SEED}): timings are representative, outputs are not."
        )
    note = f"random (seed {RANDOM_SEED})"
    if choice.requested == "auto":
        note += f"; pretrained unavailable: {choice.reason}"
    return _wrap(spec, build_random(spec), "random", note)


def delegable(model: torch.nn.Module) -> torch.nn.Module:
    """The same function, written so XNNPACK can take all of it; in place.

    - Eager attention: the SDPA decomposition leaves per-layer boolean-mask ops (where, eq, any, logical_not)
      in portable kernels; eager attention adds one float mask inside the delegate.
    - `gelu_new` becomes `gelu_pytorch_tanh`, the same tanh approximation: XNNPACK takes GELU but not `pow(x, 3)`,
      which cost GPT-2 a portable `pow` per block (36 ms of 255 here).
    """
    from transformers.activations import NewGELUActivation, get_activation

    model.set_attn_implementation("eager")
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, NewGELUActivation):
                setattr(parent, name, get_activation("gelu_pytorch_tanh"))
    return model


def _wrap(spec: ModelSpec, model: torch.nn.Module, weights: str, note: str) -> LoadedModel:
    model = delegable(model)
    if spec.task == "fill-mask":
        assert spec.mask_token_id is not None
        wrapped: torch.nn.Module = FillMaskLogits(model, spec.mask_token_id)
    else:
        wrapped = LastTokenLogits(model)
    parameters = sum(p.numel() for p in model.parameters())
    return LoadedModel(wrapped.eval(), weights, note, parameters)


def reference_inputs(spec: ModelSpec, vocab_size: int) -> list[NamedTensor]:
    """Deterministic inputs: a padded sequence (3/4 real tokens) with a [MASK] for fill-mask models."""
    rng = np.random.default_rng(RANDOM_SEED)
    seq_len = spec.seq_len
    real = max(1, (seq_len * 3) // 4)
    low = min(1000, vocab_size // 2)
    input_ids = np.zeros((1, seq_len), dtype=np.int64)
    input_ids[0, :real] = rng.integers(low, vocab_size, size=real)
    if spec.task == "fill-mask":
        assert spec.mask_token_id is not None
        input_ids[0, min(real - 1, max(1, real // 3))] = spec.mask_token_id
    attention_mask = np.zeros((1, seq_len), dtype=np.int64)
    attention_mask[0, :real] = 1
    return [NamedTensor("input_ids", input_ids), NamedTensor("attention_mask", attention_mask)]


def vocab_size_of(module: torch.nn.Module) -> int:
    inner = getattr(module, "model", module)
    return int(inner.config.vocab_size)
