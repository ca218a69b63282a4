"""The `rope` rewrite (lowering/rewrites/rope.py): it finds Llama's RoPE in the families that copy it and nowhere
else, computes what the model computes bit for bit, changes nothing global, and its program calls `etlab::rope`
instead of RoPE's portable slices and its delegate, with the transposes folded in, and generates the same ids on the
real runner. The operator's kernel against its reference: tests/board/test_kernels.py.
"""

from __future__ import annotations

import copy
import functools
import importlib
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from orchestrator.lowering.builtins import BUILTIN_SPECS
from orchestrator.lowering.rewrites.layers import same_code
from orchestrator.lowering.rewrites.registry import LLAMA_ROPE_FAMILIES, REWRITES
from orchestrator.lowering.rewrites.rope import (
    fold_rope_transposes,
    fuse_rope,
    fused_rope,
    has_llama_rope,
    plain_function,
    with_global,
)
from orchestrator.lowering.sources.builders.models import load_model
from tests.lowering.generation_rewrites import LAYERS, SPECS, assert_generates_the_same, lower_and_generate


def _modeling(family: str) -> Any:
    from transformers import CONFIG_MAPPING

    return importlib.import_module(CONFIG_MAPPING[family].__module__.replace("configuration_", "modeling_"))


@pytest.fixture(scope="module")
def loaded() -> dict[str, torch.nn.Module]:
    return {name: load_model(spec, "random").module for name, spec in SPECS.items()} | {
        "gpt2-gen-tiny": load_model(BUILTIN_SPECS["gpt2-gen-tiny"], "random").module
    }


def test_the_families_are_the_ones_that_copy_llamas_rope() -> None:
    llama = _modeling("llama")
    apply, rotate = plain_function(llama.apply_rotary_pos_emb), plain_function(llama.rotate_half)
    for family in LLAMA_ROPE_FAMILIES:
        module = _modeling(family)
        assert same_code(plain_function(module.apply_rotary_pos_emb), apply), family
        assert same_code(plain_function(module.rotate_half), rotate), family
    # RoPE of their own code (partial rotation inside the function): not rewritten, whatever the family list says
    for family in ("phi3", "gpt_neox"):
        assert not same_code(plain_function(_modeling(family).apply_rotary_pos_emb), apply), family


def test_found_where_it_is_and_gone_once_rewritten(loaded: dict[str, torch.nn.Module]) -> None:
    for name, spec in SPECS.items():
        assert has_llama_rope(loaded[name]) and REWRITES["rope"].applies(spec), name
        rewritten = fuse_rope(copy.deepcopy(loaded[name]), spec)
        assert not has_llama_rope(rewritten), name
        assert has_llama_rope(loaded[name]), name  # the original's classes are untouched
    assert not has_llama_rope(loaded["gpt2-gen-tiny"])  # learned positions, no RoPE


@pytest.mark.parametrize("name", list(SPECS))
def test_the_rewritten_model_computes_the_same_bit_for_bit(loaded: dict[str, torch.nn.Module], name: str) -> None:
    """Logits over a prompt and greedy generation with transformers' own cache (the wrapper around the layers'
    forward, which renames `past_key_values`, is kept): equal, not close."""
    original = loaded[name]
    assert_generates_the_same(original, fuse_rope(copy.deepcopy(original), SPECS[name]), seed=4)


def _double(value: int) -> int:
    return 2 * value


def _tagged(function: Any) -> Any:
    @functools.wraps(function)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        return ("wrapped", function(*args, **kwargs))

    return wrapper


@_tagged
def _computed(value: int) -> int:
    return _double(value) + 1


def test_the_copy_changes_one_global_and_keeps_the_wrapper() -> None:
    copied = with_global(_computed, "_double", lambda value: 10 * value)
    assert copied(3) == ("wrapped", 31)
    assert _computed(3) == ("wrapped", 7) and _double(3) == 6  # this module is as it was
    inner = copied.__wrapped__  # the function itself, its globals a module of their own
    assert inner.__module__ != __name__ and sys.modules[inner.__module__]._double(3) == 30
    assert with_global(_computed, "_double", lambda value: -value)(3) == ("wrapped", -2)  # another value, its own


def test_the_transposes_around_the_operator_are_folded(loaded: dict[str, torch.nn.Module]) -> None:
    """Exported, each etlab::rope reads the transpose of the transpose of the projection; folded, the projection
    itself, and the two transposes are gone (a second fold finds nothing)."""
    from orchestrator.lowering.export import generation

    spec = SPECS["smollm2-gen-tiny"]
    module = fuse_rope(copy.deepcopy(loaded["smollm2-gen-tiny"]), spec)
    example = (torch.arange(8).reshape(1, 8), torch.arange(8))
    exported = generation.export(module, example, spec.prompt_capacity)
    ropes = [n for n in exported.graph_module.graph.nodes if n.target == torch.ops.etlab.rope.default]
    assert len(ropes) == 2 * LAYERS
    transposes = len([n for n in exported.graph_module.graph.nodes if n.target == torch.ops.aten.transpose.int])
    assert fold_rope_transposes(exported) == 2 * LAYERS
    left = [n for n in exported.graph_module.graph.nodes if n.target == torch.ops.aten.transpose.int]
    assert len(left) == transposes - 4 * LAYERS
    assert all(rope.args[0].target != torch.ops.aten.transpose.int for rope in ropes)
    assert fold_rope_transposes(exported) == 0


@pytest.mark.slow
def test_the_program_calls_the_operator_and_generates_the_same_ids(runner_binary: Path, tmp_path: Path) -> None:
    """SmolLM2's architecture lowered for XNNPACK as exported and with the rewrite: the rewritten program calls
    etlab::rope twice a layer, RoPE's slices are gone from the portable kernels with a delegate call a layer, and
    the real runner generates the reference's ids from both."""
    before, after = (lower_and_generate(runner_binary, tmp_path, names) for names in ((), ("rope",)))
    assert after.delegation.fallback_histogram.get("etlab.rope.out") == 2 * LAYERS
    slices = before.delegation.fallback_histogram.get("aten.slice_copy.Tensor_out", 0)
    assert after.delegation.fallback_histogram.get("aten.slice_copy.Tensor_out", 0) == slices - 4 * LAYERS
    assert after.delegation.delegate_call_sites == before.delegation.delegate_call_sites - LAYERS
    assert before.token_ids == after.token_ids


def test_what_the_operator_does_not_compute_goes_to_the_models_own_rope() -> None:
    """Another layout (unsqueeze_dim=2: q [B, S, H, D]), float64, a batch of cos rows that broadcasts: the model's
    function computes them, so the result is its own; the usual call goes through etlab::rope, the same values."""
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    original = plain_function(apply_rotary_pos_emb)
    fused = fused_rope(original)
    generator = torch.Generator().manual_seed(9)
    q, k = torch.randn(2, 2, 3, 5, 8, generator=generator)  # [B, H, S, D]
    angles = torch.randn(2, 5, 8, generator=generator)
    cases = [
        (q.transpose(1, 2), k.transpose(1, 2), angles.cos(), angles.sin(), 2),  # [B, S, H, D]
        (q.double(), k.double(), angles.cos().double(), angles.sin().double(), 1),
        (q, k, angles.cos()[:1], angles.sin()[:1], 1),  # one row of cos for both batch entries: broadcast
        (q, k, angles.cos(), angles.sin(), 1),
    ]
    for case in cases:
        got, expected = fused(*case), original(*case)
        assert torch.equal(got[0], expected[0]) and torch.equal(got[1], expected[1])
