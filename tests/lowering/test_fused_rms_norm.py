"""The `fused-rms-norm` rewrite (lowering/rewrites/layers.py): it applies to text-generation programs of the families
whose RMSNorm is Llama's, its eager model computes what the model computes bit for bit, the float32 path goes
through `etlab::rms_norm` and any other through Llama's code, and its program calls the operator instead of the
portable `mean` and XNNPACK's norm operators and generates the reference's ids on the real runner. The operator's
kernel against its reference: tests/board/test_kernels.py.
"""

from __future__ import annotations

import copy
import json
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from orchestrator.lowering.builtins import BUILTIN_SPECS
from orchestrator.lowering.rewrites.layers import FusedRMSNorm, fused_rms_norm, has_llama_rms_norm
from orchestrator.lowering.rewrites.registry import REWRITES, RewriteRequest
from orchestrator.lowering.sources.builders.models import load_model
from orchestrator.tensorfile import read_tensors
from tests.board.test_runner import run_runner
from tests.lowering.test_rope_rewrite import LAYERS, SPECS


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
    from orchestrator.lowering.export.generation import GenerationModule, eager_attention, greedy_ids

    original = loaded[name]
    rewritten = fused_rms_norm(copy.deepcopy(original), SPECS[name])
    assert isinstance(original, GenerationModule) and isinstance(rewritten, GenerationModule)
    assert has_llama_rms_norm(original) and not has_llama_rms_norm(rewritten)
    norms = [layer for layer in rewritten.modules() if isinstance(layer, FusedRMSNorm)]
    assert len(norms) == 2 * LAYERS + 1  # two a layer and the final one
    ids = torch.randint(0, 500, (1, 12), generator=torch.Generator().manual_seed(5))
    logits = []
    for module in (original, rewritten):
        with torch.no_grad(), eager_attention(module):
            model: Any = module.model  # a transformers causal LM
            logits.append(model(ids).logits)
    assert torch.equal(logits[0], logits[1])
    generated = [greedy_ids(module, ids.numpy(), 10) for module in (original, rewritten)]
    np.testing.assert_array_equal(generated[0], generated[1])


def test_the_operator_is_called_for_float32_only(loaded: dict[str, torch.nn.Module]) -> None:
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
    from orchestrator.lowering.export import lower as lowering
    from orchestrator.lowering.program import with_
    from orchestrator.lowering.variants import VARIANTS
    from orchestrator.programs.plan import read_program_plan
    from orchestrator.programs.xnn import read_xnn_nodes

    variant = VARIANTS["xnnpack"]
    delegation, ids, xnnpack = {}, {}, {}
    for names in ((), ("fused-rms-norm",)):
        request = RewriteRequest(names=names)
        result = lowering.lower(with_(SPECS["smollm2-gen-tiny"], rewrites=request), variants=[variant],
                                weights="random", root=tmp_path, rewrites=request)  # fmt: skip
        lowered = result.variants[variant]
        assert lowered.sidecar.applied_rewrites == names
        delegation[names] = lowered.sidecar.delegation
        plan = read_program_plan(lowered.pte)
        xnnpack[names] = Counter(
            node.type
            for call in plan.delegates()
            if call.delegate
            for node in read_xnn_nodes(call.delegate, lowered.pte)
        )
        timings = tmp_path / f"timings-{len(names)}.json"
        done = run_runner(
            runner_binary, "--model", lowered.pte, "--generate", "--inputs", result.paths.reference_inputs,
            "--new-tokens", 8, "--warmup", "0", "--iterations", "1", "--timings", timings, "--threads", "2",
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        (run,) = json.loads(timings.read_text())["generation"]["runs"]
        assert run["token_ids"] == read_tensors(result.paths.reference_outputs)[0].array.ravel().tolist()
        ids[names] = run["token_ids"]
    before, after = delegation[()], delegation[("fused-rms-norm",)]
    norms = 2 * LAYERS + 1
    assert before.fallback_histogram.get("aten.mean.out") == norms
    assert "aten.mean.out" not in after.fallback_histogram
    assert after.fallback_histogram.get("etlab.rms_norm.out") == norms
    assert after.delegate_call_sites <= before.delegate_call_sites, (before, after)  # the mean split them already
    # the norms' squares and reciprocal square roots left XNNPACK with them (one each a norm before)
    for kind in ("XNNSquare", "XNNReciprocalSquareRoot"):
        assert xnnpack[()][kind] == norms and xnnpack[("fused-rms-norm",)][kind] == 0, kind
    assert sum(xnnpack[("fused-rms-norm",)].values()) <= sum(xnnpack[()].values()) - 4 * norms
    assert ids[()] == ids[("fused-rms-norm",)]
