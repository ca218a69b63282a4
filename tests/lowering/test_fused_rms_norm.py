"""The `fused-rms-norm` rewrite (lowering/rewrites/layers.py): it applies to text-generation programs of the families
whose RMSNorm is Llama's, its eager model computes what the model computes bit for bit, the float32 path goes
through `etlab::rms_norm` and any other through Llama's code, and its program calls the operator instead of the
portable `mean` and XNNPACK's norm operators and generates the reference's ids on the real runner. The operator's
kernel against its reference: tests/board/test_kernels.py.
"""

from __future__ import annotations

import copy
from collections import Counter
from pathlib import Path

import pytest
import torch

from orchestrator.lowering.builtins import BUILTIN_SPECS
from orchestrator.lowering.rewrites.layers import FusedRMSNorm, fused_rms_norm, has_llama_rms_norm
from orchestrator.lowering.rewrites.registry import REWRITES, RewriteRequest
from orchestrator.lowering.sources.builders.models import load_model
from orchestrator.programs.plan import read_program_plan
from orchestrator.programs.xnn import read_xnn_nodes
from tests.lowering.generation_rewrites import LAYERS, SPECS, assert_generates_the_same, lower_and_generate


@pytest.fixture(scope="module")
def loaded() -> dict[str, torch.nn.Module]:
    return {name: load_model(spec, "random").module for name, spec in SPECS.items()}


def test_it_applies_to_generation_programs_and_supersedes_the_mean_rewrite() -> None:
    rewrite = REWRITES["fused-rms-norm"]
    assert all(rewrite.applies(spec) for spec in SPECS.values())
    assert not rewrite.applies(BUILTIN_SPECS["smollm2-tiny"])  # a whole-sequence program: rms-norm keeps it in XNNPACK
    assert not rewrite.applies(BUILTIN_SPECS["gpt2-gen-tiny"])  # LayerNorm
    assert RewriteRequest(auto=True).resolve(SPECS["smollm2-gen-tiny"]).count("rms-norm") == 0


@pytest.mark.parametrize("name", list(SPECS))
def test_the_rewritten_model_computes_the_same_bit_for_bit(loaded: dict[str, torch.nn.Module], name: str) -> None:
    original = loaded[name]
    rewritten = fused_rms_norm(copy.deepcopy(original), SPECS[name])
    assert has_llama_rms_norm(original) and not has_llama_rms_norm(rewritten)
    norms = [layer for layer in rewritten.modules() if isinstance(layer, FusedRMSNorm)]
    assert len(norms) == 2 * LAYERS + 1  # two a layer and the final one
    assert_generates_the_same(original, rewritten, seed=5)


def test_the_operator_is_called_for_float32_only() -> None:
    """float32 through etlab::rms_norm (one node in the traced graph); bfloat16 through Llama's code, the same values
    as the model's own norm."""
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    norm = LlamaRMSNorm(16, eps=1e-5)
    with torch.no_grad():
        norm.weight.normal_(generator=torch.Generator().manual_seed(1))
    fused = FusedRMSNorm(norm)
    x = torch.randn(3, 16, generator=torch.Generator().manual_seed(2))
    graph = torch.export.export(fused, (x,)).graph_module.graph
    assert [n.target for n in graph.nodes if n.op == "call_function"] == [torch.ops.etlab.rms_norm.default]
    assert torch.equal(fused(x), norm(x))
    half = x.to(torch.bfloat16)
    assert fused(half).dtype == norm(half).dtype and torch.equal(fused(half), norm(half))
    assert fused.weight is norm.weight  # the model's parameter, not a copy


@pytest.mark.slow
def test_the_program_calls_the_operator_and_generates_the_same_ids(runner_binary: Path, tmp_path: Path) -> None:
    """SmolLM2's architecture lowered for XNNPACK as exported and with the rewrite: the rewritten program calls
    etlab::rms_norm at every norm instead of the portable mean, and the real runner generates the reference's ids
    from both."""
    before, after = (lower_and_generate(runner_binary, tmp_path, names) for names in ((), ("fused-rms-norm",)))
    norms = 2 * LAYERS + 1
    assert before.delegation.fallback_histogram.get("aten.mean.out") == norms
    assert "aten.mean.out" not in after.delegation.fallback_histogram
    assert after.delegation.fallback_histogram.get("etlab.rms_norm.out") == norms
    # the mean split the delegates at every norm already
    assert after.delegation.delegate_call_sites <= before.delegation.delegate_call_sites
    xnnpack = [_xnnpack_operators(run.pte) for run in (before, after)]
    for kind in ("XNNSquare", "XNNReciprocalSquareRoot"):  # one each a norm, gone with it
        assert xnnpack[0][kind] == norms and xnnpack[1][kind] == 0, kind
    assert sum(xnnpack[1].values()) <= sum(xnnpack[0].values()) - 4 * norms
    assert before.token_ids == after.token_ids


def _xnnpack_operators(pte: Path) -> Counter[str]:
    plan = read_program_plan(pte)
    return Counter(
        node.type for call in plan.delegates() if call.delegate for node in read_xnn_nodes(call.delegate, pte)
    )
