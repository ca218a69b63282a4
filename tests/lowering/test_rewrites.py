"""The named rewrites (lowering/rewrites/): the registry, `--rewrites` values, when each applies, and that each
finds its pattern where it should and computes the same function as the model it rewrites, on two families or more.

The lowering with rewrites (shapes, sidecar, cache) is in test_rewrites_lowering.py.
"""

from __future__ import annotations

import copy
from typing import Any

import numpy as np
import pytest
import torch

from orchestrator.lowering.builtins import BUILTIN_SPECS
from orchestrator.lowering.rewrites.huggingface import (
    eager_attention,
    has_all_positions_head,
    has_gelu_new,
    has_sdpa_attention,
    head_at_position,
    tanh_gelu,
)
from orchestrator.lowering.rewrites.registry import (
    GELU_NEW_FAMILIES,
    NO_REWRITES,
    REWRITES,
    RewriteNotFound,
    RewriteRequest,
    UnknownRewrite,
    apply_rewrites,
    check_request,
    parse_rewrites,
)
from orchestrator.lowering.sources.builders.huggingface_inputs import reference_inputs
from orchestrator.lowering.sources.builders.models import example_inputs, load_model
from orchestrator.lowering.sources.huggingface import HuggingFaceOptions
from orchestrator.lowering.spec import ModelSpec

_SMALL = {"vocab_size": 1000, "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2,
          "intermediate_size": 128}  # fmt: skip
ROBERTA_TINY = ModelSpec(
    name="roberta-tiny",
    model_type="roberta",
    task="fill-mask",
    options=HuggingFaceOptions(config=_SMALL, mask_token_id=4),
)
GPT_NEO_TINY = ModelSpec(
    name="gpt-neo-tiny",
    model_type="gpt_neo",
    task="causal-lm",
    options=HuggingFaceOptions(
        config={
            "vocab_size": 1000,
            "hidden_size": 64,
            "num_layers": 2,
            "num_heads": 2,
            "attention_types": [[["global", "local"], 1]],
            "max_position_embeddings": 128,
        }
    ),
)
SPECS = {
    "distilbert-tiny": BUILTIN_SPECS["distilbert-tiny"],
    "bert-base-tiny": BUILTIN_SPECS["bert-base-tiny"],
    "roberta-tiny": ROBERTA_TINY,
    "gpt2-tiny": BUILTIN_SPECS["gpt2-tiny"],
    "gpt-neo-tiny": GPT_NEO_TINY,
}


@pytest.fixture(scope="module")
def loaded() -> dict[str, torch.nn.Module]:
    """Each tiny model as etlab exports it by default (FirstOutput: every position's logits), random weights."""
    return {name: load_model(spec, "random").module for name, spec in SPECS.items()}


def _input_sets(spec: ModelSpec, module: torch.nn.Module) -> list[tuple[torch.Tensor, ...]]:
    """The reference inputs, the same kind drawn from another seed, and token ids drawn anywhere in the vocabulary
    (a [MASK] where fill-mask needs one) with a full mask."""
    reference = example_inputs(spec, module)
    hf_model: Any = module.model  # a HuggingFace model: its config's fields differ per family
    vocab = hf_model.config.vocab_size
    other = reference_inputs(spec, vocab, seed=12345)
    generator = torch.Generator().manual_seed(7)
    ids = torch.randint(0, vocab, (1, spec.seq_len), generator=generator)
    mask_token_id = spec.options_of(HuggingFaceOptions).mask_token_id
    if mask_token_id is not None:
        ids[ids == mask_token_id] = mask_token_id + 1
        ids[0, 40] = mask_token_id
    full = (ids, torch.ones_like(ids))
    return [tuple(torch.from_numpy(t.array) for t in made) for made in (reference, other)] + [full]


# ---------------------------------------------------------------------------------------------------------------
# The registry and `--rewrites` values


def test_every_rewrite_is_described_and_its_functions_exist() -> None:
    import importlib

    assert list(REWRITES) == [
        "tanh-gelu", "eager-attention", "bmm-attention", "fold-weight-norm", "conv1d-as-2d", "fused-rms-norm",
        "rms-norm", "rope", "head-at-position",
    ]  # fmt: skip
    for rewrite in REWRITES.values():
        assert rewrite.description.strip() and "\n" not in rewrite.description
        for path in (rewrite.present, rewrite.apply):
            module, _, function = path.partition(":")
            assert callable(getattr(importlib.import_module(module), function)), path


def test_parse_rewrites() -> None:
    assert parse_rewrites("none") == NO_REWRITES == parse_rewrites("")
    assert parse_rewrites("auto") == RewriteRequest(auto=True)
    assert parse_rewrites("head-at-position, tanh-gelu,tanh-gelu").names == ("head-at-position", "tanh-gelu")
    assert parse_rewrites(["eager-attention"]).names == ("eager-attention",)
    with pytest.raises(UnknownRewrite, match="did you mean 'tanh-gelu'") as caught:
        parse_rewrites("tanh-gleu")
    assert caught.value.exit_code == 64
    with pytest.raises(UnknownRewrite, match="stand alone"):
        parse_rewrites("auto,tanh-gelu")


def test_which_rewrites_apply_by_spec() -> None:
    auto = RewriteRequest(auto=True)
    attention = ("bmm-attention",)  # it supersedes eager-attention, which applies too
    assert REWRITES["eager-attention"].applies(BUILTIN_SPECS["vit-tiny"])
    assert auto.resolve(BUILTIN_SPECS["gpt2-tiny"]) == ("tanh-gelu", *attention, "head-at-position")
    assert auto.resolve(BUILTIN_SPECS["distilbert-tiny"]) == (*attention, "head-at-position")
    assert auto.resolve(BUILTIN_SPECS["vit-tiny"]) == attention  # no single read position
    assert auto.resolve(BUILTIN_SPECS["smollm2-tiny"]) == (*attention, "rms-norm", "head-at-position")
    assert auto.resolve(BUILTIN_SPECS["wav2vec2-tiny"]) == (*attention, "fold-weight-norm")
    # a trade-off (the int8 program faster, the fp32 one slower) is never in auto, only asked for by name
    assert REWRITES["conv1d-as-2d"].applies(BUILTIN_SPECS["wav2vec2-tiny"]) and not REWRITES["conv1d-as-2d"].in_auto
    assert RewriteRequest(names=("conv1d-as-2d",)).resolve(BUILTIN_SPECS["wav2vec2-tiny"]) == ("conv1d-as-2d",)
    # a program that generates attends over its KV cache: etlab's attention is its option, not this rewrite
    assert not REWRITES["bmm-attention"].applies(BUILTIN_SPECS["smollm2-gen-tiny"])
    # RoPE's slices are portable only where the sequence length is dynamic: a program that generates
    # (eager-attention applies by spec; its pattern, SDPA, is absent from etlab's attention, so auto skips it)
    # (and its norms are one etlab operator: fused-rms-norm supersedes rms-norm there, which applies by spec)
    assert auto.resolve(BUILTIN_SPECS["smollm2-gen-tiny"]) == ("eager-attention", "fused-rms-norm", "rope")
    assert REWRITES["rms-norm"].applies(BUILTIN_SPECS["smollm2-gen-tiny"])
    assert not REWRITES["rope"].applies(BUILTIN_SPECS["smollm2-tiny"])
    assert not REWRITES["fused-rms-norm"].applies(BUILTIN_SPECS["smollm2-tiny"])
    assert auto.resolve(BUILTIN_SPECS["mobilenet-v2-tiny"]) == ()  # torchvision: nothing etlab rewrites
    asked = BUILTIN_SPECS["bert-base-tiny"].with_options(config={"hidden_act": "gelu_new"})
    assert REWRITES["tanh-gelu"].applies(asked)  # a family that does not use gelu_new, configured to
    assert NO_REWRITES.resolve(BUILTIN_SPECS["gpt2-tiny"]) == ()
    with pytest.raises(UnknownRewrite, match="tanh-gelu does not apply to distilbert-tiny"):
        check_request(parse_rewrites("tanh-gelu"), BUILTIN_SPECS["distilbert-tiny"])
    with pytest.raises(UnknownRewrite, match=r"head-at-position does not apply to vit-tiny.*tasks fill-mask"):
        check_request(parse_rewrites("head-at-position"), BUILTIN_SPECS["vit-tiny"])


def test_gelu_new_families_are_transformers_own() -> None:
    from transformers import CONFIG_MAPPING

    for family in GELU_NEW_FAMILIES:
        assert "gelu_new" in CONFIG_MAPPING[family]().to_dict().values(), family
    for family in ("bert", "distilbert", "roberta", "llama", "vit"):
        assert "gelu_new" not in CONFIG_MAPPING[family]().to_dict().values(), family


# ---------------------------------------------------------------------------------------------------------------
# Each pattern found where it is, not where it is not


def test_patterns_are_found_in_the_modules(loaded: dict[str, torch.nn.Module]) -> None:
    assert has_gelu_new(loaded["gpt2-tiny"]) and has_gelu_new(loaded["gpt-neo-tiny"])
    assert not has_gelu_new(loaded["bert-base-tiny"]) and not has_gelu_new(loaded["distilbert-tiny"])
    for name in SPECS:
        # SDPA is transformers' default where the family supports it; GPT-Neo's attention is eager already
        assert has_sdpa_attention(loaded[name]) == (name != "gpt-neo-tiny"), name
        assert has_all_positions_head(loaded[name]), name
    _, applied = apply_rewrites(copy.deepcopy(loaded["gpt-neo-tiny"]), GPT_NEO_TINY, RewriteRequest(auto=True))
    assert applied == ("tanh-gelu", "head-at-position")
    rewritten = eager_attention(copy.deepcopy(loaded["bert-base-tiny"]), SPECS["bert-base-tiny"])
    assert not has_sdpa_attention(rewritten)
    headed = head_at_position(loaded["distilbert-tiny"], SPECS["distilbert-tiny"])
    assert not has_all_positions_head(headed)
    assert not has_gelu_new(tanh_gelu(copy.deepcopy(loaded["gpt2-tiny"]), SPECS["gpt2-tiny"]))


def test_auto_skips_a_missing_pattern_and_a_named_one_is_refused(loaded: dict[str, torch.nn.Module]) -> None:
    spec = BUILTIN_SPECS["distilbert-tiny"].with_options(config={"activation": "gelu_new"})
    module = copy.deepcopy(loaded["distilbert-tiny"])  # built with gelu: the spec says gelu_new, the module has none
    _, applied = apply_rewrites(module, spec, RewriteRequest(auto=True))
    assert applied == ("bmm-attention", "head-at-position")
    with pytest.raises(RewriteNotFound, match="tanh-gelu: distilbert-tiny has nothing to rewrite") as caught:
        apply_rewrites(copy.deepcopy(loaded["distilbert-tiny"]), spec, parse_rewrites("tanh-gelu"))
    assert caught.value.exit_code == 64


# ---------------------------------------------------------------------------------------------------------------
# The same function


def _outputs(module: torch.nn.Module, inputs: tuple[torch.Tensor, ...]) -> np.ndarray:
    with torch.no_grad():
        return module(*inputs).numpy()


@pytest.mark.parametrize("name", ["distilbert-tiny", "bert-base-tiny", "roberta-tiny", "gpt2-tiny"])
def test_head_at_position_is_the_logits_at_that_position(loaded: dict[str, torch.nn.Module], name: str) -> None:
    spec, original = SPECS[name], loaded[name]
    rewritten = head_at_position(original, spec)
    for inputs in _input_sets(spec, original):
        ids, mask = inputs[0], inputs[1]
        everywhere = _outputs(original, inputs)
        assert everywhere.shape == (1, spec.seq_len, 1000)
        if spec.task == "fill-mask":
            mask_token_id = spec.options_of(HuggingFaceOptions).mask_token_id
            assert mask_token_id is not None
            position = int((ids[0] == mask_token_id).nonzero()[0])
        else:
            position = int(mask[0].sum()) - 1
        at_position = _outputs(rewritten, inputs[:2])
        assert at_position.shape == (1, 1000)
        np.testing.assert_allclose(at_position[0], everywhere[0, position], atol=1e-5, rtol=1e-4)
        assert not np.allclose(at_position[0], everywhere[0, position - 1], atol=1e-3)  # not any position


@pytest.mark.parametrize("name", ["distilbert-tiny", "bert-base-tiny", "roberta-tiny", "gpt2-tiny"])
def test_eager_attention_computes_the_same(loaded: dict[str, torch.nn.Module], name: str) -> None:
    spec, original = SPECS[name], loaded[name]
    rewritten = eager_attention(copy.deepcopy(original), spec)
    for inputs in _input_sets(spec, original):
        mask = inputs[1].numpy().astype(bool)[0]
        expected, got = _outputs(original, inputs), _outputs(rewritten, inputs)
        # every real position (a padded one attends as the implementation likes: no one reads it)
        np.testing.assert_allclose(got[0, mask], expected[0, mask], atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("name", ["gpt2-tiny", "gpt-neo-tiny"])
def test_tanh_gelu_computes_the_same(loaded: dict[str, torch.nn.Module], name: str) -> None:
    spec, original = SPECS[name], loaded[name]
    rewritten = tanh_gelu(copy.deepcopy(original), spec)
    assert rewritten is not original
    for inputs in _input_sets(spec, original):
        np.testing.assert_allclose(_outputs(rewritten, inputs), _outputs(original, inputs), atol=1e-5, rtol=1e-4)
    values = torch.linspace(-8, 8, 1001)
    from transformers.activations import NewGELUActivation, get_activation

    torch.testing.assert_close(get_activation("gelu_pytorch_tanh")(values), NewGELUActivation()(values))
