"""The rewrites of single layers (lowering/rewrites/layers.py, and bmm-attention's attention function in
rewrites/huggingface.py): fold-weight-norm, conv1d-as-2d, rms-norm and bmm-attention each find their pattern in two
families or more and not where it is not, compute the same function as the model they rewrite (on the reference
inputs and on random ones), and leave no kernel of theirs outside the XNNPACK delegates (conv1d-as-2d: let
int8-dynamic quantize the convolutions it left fp32).

The registry and the other rewrites are in test_rewrites.py.
"""

from __future__ import annotations

import copy
import importlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from orchestrator.lowering.builtins import BUILTIN_SPECS
from orchestrator.lowering.program import with_
from orchestrator.lowering.rewrites.huggingface import bmm_attention, has_matmul_attention
from orchestrator.lowering.rewrites.layers import (
    averaging,
    conv1d_as_2d,
    fold_weight_norm,
    has_conv1d,
    has_llama_rms_norm,
    has_weight_norm,
    last_dim_mean,
    mean_rms_norm,
)
from orchestrator.lowering.rewrites.registry import (
    CONV1D_FAMILIES,
    LLAMA_RMS_NORM_FAMILIES,
    REWRITES,
    WEIGHT_NORM_FAMILIES,
)
from orchestrator.lowering.sources.builders.models import example_inputs, load_model
from orchestrator.lowering.sources.huggingface import HuggingFaceOptions
from orchestrator.lowering.spec import ModelSpec

_WAV2VEC2_TINY = BUILTIN_SPECS["wav2vec2-tiny"]
HUBERT_TINY = ModelSpec(name="hubert-tiny", model_type="hubert", task="speech-encoder", options=_WAV2VEC2_TINY.options)
QWEN2_TINY = ModelSpec(
    name="qwen2-tiny",
    model_type="qwen2",
    task="causal-lm",
    options=HuggingFaceOptions(config={"vocab_size": 1000, "hidden_size": 64, "num_hidden_layers": 2,
                                       "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 128,
                                       "max_position_embeddings": 128}),
)  # fmt: skip
_GPT2_TINY = BUILTIN_SPECS["gpt2-tiny"]
assert isinstance(_GPT2_TINY.options, HuggingFaceOptions)
# GPT-2's reordered-and-upcast attention is its own code, not transformers' attention interface
GPT2_REORDERED = ModelSpec(
    name="gpt2-reordered-tiny",
    model_type="gpt2",
    task=_GPT2_TINY.task,
    output=_GPT2_TINY.output,
    options=HuggingFaceOptions(config={**_GPT2_TINY.options.config, "reorder_and_upcast_attn": True}),
)
SPECS = {
    name: BUILTIN_SPECS[name]
    for name in ("distilbert-tiny", "gpt2-tiny", "wav2vec2-tiny", "smollm2-tiny", "whisper-tiny-encoder-tiny",
                 "vit-tiny")
} | {"hubert-tiny": HUBERT_TINY, "qwen2-tiny": QWEN2_TINY, "gpt2-reordered-tiny": GPT2_REORDERED}  # fmt: skip
Rewrite = Callable[[torch.nn.Module, ModelSpec], torch.nn.Module]
# each rewrite: its pattern check, the function, the models that have the pattern, and a model that has not
CASES: dict[str, tuple[Callable[[torch.nn.Module], bool], Rewrite, tuple[str, ...], str]] = {
    "fold-weight-norm": (has_weight_norm, fold_weight_norm, ("wav2vec2-tiny", "hubert-tiny"), "distilbert-tiny"),
    "rms-norm": (has_llama_rms_norm, mean_rms_norm, ("smollm2-tiny", "qwen2-tiny"), "gpt2-tiny"),
    # GPT-2's transformers `Conv1D` is a linear layer, not a convolution
    "conv1d-as-2d": (has_conv1d, conv1d_as_2d, ("wav2vec2-tiny", "whisper-tiny-encoder-tiny", "hubert-tiny"),
                     "gpt2-tiny"),
    # an encoder with audio input, a text encoder, a vision encoder, a causal model with shared key-value heads
    "bmm-attention": (has_matmul_attention, bmm_attention,
                      ("whisper-tiny-encoder-tiny", "distilbert-tiny", "vit-tiny", "qwen2-tiny", "gpt2-tiny"),
                      "gpt2-reordered-tiny"),
}  # fmt: skip


@pytest.fixture(scope="module")
def loaded() -> dict[str, torch.nn.Module]:
    """Each tiny model as etlab exports it by default, random weights."""
    return {name: load_model(spec, "random").module for name, spec in SPECS.items()}


def _input_sets(spec: ModelSpec, module: torch.nn.Module) -> list[tuple[torch.Tensor, ...]]:
    """The reference inputs, and inputs of the same shapes drawn at random: token ids anywhere in the vocabulary
    (a full attention mask), values from a normal distribution."""
    reference = tuple(torch.from_numpy(t.array) for t in example_inputs(spec, module))
    generator = torch.Generator().manual_seed(11)
    drawn = []
    for tensor in reference:
        if tensor.is_floating_point():
            drawn.append(torch.randn(tensor.shape, generator=generator, dtype=tensor.dtype) * 2)
        elif tensor.max() <= 1:  # an attention mask
            drawn.append(torch.ones_like(tensor))
        else:
            hf_model: Any = module.model  # a HuggingFace model: its config's fields differ per family
            vocab = hf_model.config.vocab_size
            drawn.append(torch.randint(0, vocab, tensor.shape, generator=generator, dtype=tensor.dtype))
    return [reference, tuple(drawn)]


def _outputs(module: torch.nn.Module, inputs: tuple[torch.Tensor, ...]) -> np.ndarray:
    with torch.no_grad():
        return module(*inputs).numpy()


def test_the_rewrites_are_registered_with_their_functions() -> None:
    for name, (present, rewrite, _, _) in CASES.items():
        assert REWRITES[name].present.endswith(f":{present.__name__}")
        assert REWRITES[name].apply.endswith(f":{rewrite.__name__}")
    assert list(REWRITES)[-1] == "head-at-position"  # it wraps the model: last


def test_the_families_are_transformers_own() -> None:
    from transformers import CONFIG_MAPPING
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    for family in WEIGHT_NORM_FAMILIES:
        source = importlib.import_module(CONFIG_MAPPING[family].__module__.replace("configuration_", "modeling_"))
        assert source.__file__ is not None
        assert "weight_norm(self.conv" in Path(source.__file__).read_text(), family  # the positional convolution
    for family in CONV1D_FAMILIES:
        source = importlib.import_module(CONFIG_MAPPING[family].__module__.replace("configuration_", "modeling_"))
        assert source.__file__ is not None
        assert "nn.Conv1d(" in Path(source.__file__).read_text(), family
    llama = LlamaRMSNorm.forward.__code__
    for family in LLAMA_RMS_NORM_FAMILIES:
        source = importlib.import_module(CONFIG_MAPPING[family].__module__.replace("configuration_", "modeling_"))
        norms = [
            value
            for name, value in vars(source).items()
            if name.endswith("RMSNorm") and isinstance(value, type) and issubclass(value, torch.nn.Module)
        ]
        assert norms, family
        assert any(norm.forward.__code__.co_code == llama.co_code for norm in norms), family


@pytest.mark.parametrize("rewrite_name", list(CASES))
def test_each_pattern_is_found_where_it_is_and_gone_once_rewritten(
    loaded: dict[str, torch.nn.Module], rewrite_name: str
) -> None:
    present, rewrite, having, lacking = CASES[rewrite_name]
    for name in having:
        assert present(loaded[name]), name
        assert REWRITES[rewrite_name].applies(SPECS[name]), name
        assert not present(rewrite(copy.deepcopy(loaded[name]), SPECS[name])), name
        assert present(loaded[name]), name  # a copy rewritten leaves the original as it was (classes are shared)
    assert not present(loaded[lacking])


@pytest.mark.parametrize(
    ("rewrite_name", "name"), [(rewrite, name) for rewrite, case in CASES.items() for name in case[2]]
)
def test_each_rewrite_computes_the_same(loaded: dict[str, torch.nn.Module], rewrite_name: str, name: str) -> None:
    _, rewrite, _, _ = CASES[rewrite_name]
    spec, original = SPECS[name], loaded[name]
    rewritten = rewrite(copy.deepcopy(original), spec)
    for inputs in _input_sets(spec, original):
        expected = _outputs(original, inputs)
        got = _outputs(rewritten, inputs)
        assert got.shape == expected.shape
        np.testing.assert_allclose(got, expected, atol=1e-4, rtol=1e-4)


def test_the_mean_is_the_last_dimensions() -> None:
    values = torch.randn(2, 3, 5, 7, generator=torch.Generator().manual_seed(3))
    torch.testing.assert_close(last_dim_mean(values, averaging(7)), values.mean(-1, keepdim=True))


@pytest.mark.slow
@pytest.mark.parametrize(
    ("rewrite_name", "name", "operator", "kept"),
    [
        ("fold-weight-norm", "wav2vec2-tiny", "aten.convolution.out", 0),
        ("rms-norm", "smollm2-tiny", "aten.mean.out", 0),
        ("bmm-attention", "whisper-tiny-encoder-tiny", "aten.expand_copy.out", 0),
        # ViT's class token and its attention mask are broadcast once per run, outside attention: not the pattern
        ("bmm-attention", "vit-tiny", "aten.expand_copy.out", 2),
    ],
)
def test_the_rewritten_layers_run_inside_the_delegates(
    loaded: dict[str, torch.nn.Module], rewrite_name: str, name: str, operator: str, kept: int
) -> None:
    from orchestrator.lowering.export.delegation import delegation_report
    from orchestrator.lowering.export.program import export_module, lower_exported
    from orchestrator.lowering.variants import VARIANTS

    spec, (_, rewrite, _, _) = SPECS[name], CASES[rewrite_name]
    inputs = _input_sets(spec, loaded[name])[0]
    reports = {}
    for label, module in (("original", loaded[name]), ("rewritten", rewrite(copy.deepcopy(loaded[name]), spec))):
        exported = export_module(module, inputs, model=name)
        program = lower_exported(exported, VARIANTS["xnnpack"], model=name, quiet=True)
        reports[label] = delegation_report(program)
    assert reports["original"]["fallback_histogram"].get(operator, 0) > kept
    assert reports["rewritten"]["fallback_histogram"].get(operator, 0) == kept
    # the norms split the delegates; gone, the graph runs in fewer delegate calls
    assert reports["rewritten"]["delegate_call_sites"] <= reports["original"]["delegate_call_sites"]


@pytest.mark.slow
def test_conv1d_as_2d_lets_int8_dynamic_quantize_the_convolutions(tmp_path: Path) -> None:
    """As exported, int8-dynamic leaves wav2vec2's 1-D convolutions fp32; rewritten, the quantizer takes those it
    takes in 2-D (not the first: one input channel, a depthwise shape to it); the serialized XNNPACK graph agrees."""
    from orchestrator.lowering.export import lower as lowering
    from orchestrator.lowering.rewrites.registry import RewriteRequest
    from orchestrator.lowering.variants import VARIANTS

    spec, variant = SPECS["wav2vec2-tiny"], VARIANTS["xnnpack-int8-dynamic"]
    counts = {}
    for names in (("fold-weight-norm",), ("fold-weight-norm", "conv1d-as-2d")):
        request = RewriteRequest(names=names)
        result = lowering.lower(with_(spec, rewrites=request), variants=[variant], weights="random", root=tmp_path,
                                rewrites=request)  # fmt: skip
        sidecar = result.variants[variant].sidecar
        assert sidecar.applied_rewrites == names
        quantization = sidecar.quantization
        assert quantization is not None and quantization.nodes is not None
        assert quantization.nodes.convolution is not None
        float_nodes = sum(n for kind, n in quantization.nodes.convolution.items() if kind.startswith("fp32"))
        assert float_nodes == quantization.convolutions - quantization.quantized_convolutions
        counts[names[-1]] = (quantization.convolutions, quantization.quantized_convolutions)
    assert counts["fold-weight-norm"] == (8, 0)
    total, quantized = counts["conv1d-as-2d"]
    assert total == 8 and quantized == 7
