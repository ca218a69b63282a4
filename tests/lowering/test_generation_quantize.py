"""A language model quantized as ExecuTorch ships its LLM recipe (lowering/quantize/methods.py `llm_8da4w`): linears
whose widths the 4-bit group does not divide padded, not left in float; 4-bit embedding tables the runner gathers
from; what a tied head costs. The recipe's first test (8da4w-g128 and int8-dynamic on widths the groups divide) is in
test_generation.py, beside the text-generation program it quantizes.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from orchestrator.commands.render_lowering import _quantized_cell
from orchestrator.lowering.export import lower as lowerer
from orchestrator.lowering.quantize.methods import pad_linears, padded_layers, quantize_embeddings
from orchestrator.lowering.spec import load_spec_file
from orchestrator.lowering.variants import Variant
from orchestrator.programs.outside import read_outside_delegates
from tests.lowering.test_generation import LLAMA_TINY, _generated_by_the_runner, generation_spec
from tests.lowering.test_huggingface_specs import write

# Widths no multiple of 32: hidden 48 (q k v o, gate up, the head take 48 features), intermediate 96 (down takes 96).
LLAMA_48 = {**LLAMA_TINY, "hidden_size": 48, "intermediate_size": 96}


def test_a_padded_linear_computes_what_the_linear_did() -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(48, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4, bias=False))
    x = torch.randn(3, 5, 48)
    expected = model(x)
    assert pad_linears(model, 32) == ["0"]  # 64 features divide into groups of 32: left alone
    assert padded_layers(model) == ["0"]
    assert model[0].in_features == 64 and model[0].padded_from == 48
    torch.testing.assert_close(model(x), expected, rtol=0, atol=1e-6)


def test_embedding_tables_take_only_what_the_runner_gathers_from() -> None:
    model = torch.nn.Sequential(torch.nn.Embedding(10, 64))
    with pytest.raises(ValueError, match="embedding tables of 2 bits"):
        quantize_embeddings(model, 2, 32)
    quantize_embeddings(model, 4, 32)
    assert type(model[0].weight) is not torch.nn.Parameter  # torchao's quantized tensor


def test_8da4w_pads_linears_its_group_does_not_divide_and_4_bit_embeddings_run(
    runner_binary: Path, tmp_path: Path
) -> None:
    """8da4w (groups of 32) on widths 48 and 96: all 8 linears 4-bit (7 of them padded to 64 features, listed), none
    left in float as before; and the same recipe with 4-bit embedding tables (one scale per 32 of a row, or per row
    where 32 does not divide it: `--quantize 8da4w-e4`), gathered by the runner's quantized_decomposed::embedding_4bit:
    both generate."""
    spec = load_spec_file(write(tmp_path, generation_spec(config=LLAMA_48)))
    variants = [Variant.parse("xnnpack-8da4w"), Variant.parse("xnnpack-8da4w-e4")]  # the registry's rows
    result = lowerer.lower(spec, variants=variants, weights="random", root=tmp_path / "artifacts", jobs=1)
    for variant, gather in zip(variants, ("embedding_byte", "embedding_4bit"), strict=True):
        lowered = result.variants[variant]
        quantization = lowered.sidecar.quantization
        assert quantization is not None and quantization.float_linears == ()
        assert quantization.quantized_linears == quantization.linear_layers == 8
        assert quantization.fully_connected == {"qdint8 x qbint4": 8}
        assert len(quantization.padded_linears) == 7
        assert "; 7 linears padded to the group" in (_quantized_cell(lowered.sidecar) or "")  # `fab lower`'s table
        assert not any("down_proj" in name for name in quantization.padded_linears)  # 96 = 3 groups of 32
        assert (quantization.embeddings, quantization.quantized_embeddings) == (1, 1)
        assert quantization.shared_heads == ()  # an untied head (LLAMA_TINY): its own 4-bit linear, as before
        kernels = read_outside_delegates(lowered.pte).kernels
        assert f"quantized_decomposed::{gather}.out" in kernels, kernels
        tables = "int4, PerGroup(32)" if gather == "embedding_4bit" else "int8, PerAxis(0)"
        assert f"IntxWeightOnlyConfig({tables}) embeddings" in (quantization.method or ""), quantization.method
        ids = _generated_by_the_runner(runner_binary, lowered.pte, result.paths.reference_inputs, 8, 32, tmp_path)
        assert all(0 <= i < 256 for i in ids)
