"""The tied head stored once (issue 36 item 3): a tied language model lowered in `8da4w-e4-shared` has its head read
the embedding's own 4-bit table through `etlab::shared_head` (lowering/quantize/shared_head.py), so the program holds
the table once; the runner generates with it. The runner's kernel against the reference:
tests/board/test_shared_head_kernel.py.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import torch

from orchestrator.commands.render_lowering import _quantized_cell
from orchestrator.lowering.builtins import BUILTIN_SPECS
from orchestrator.lowering.export import lower as lowerer
from orchestrator.lowering.quantize import shared_head
from orchestrator.lowering.quantize.methods import quantize_embeddings
from orchestrator.lowering.sources.huggingface import HuggingFaceOptions
from orchestrator.lowering.variants import Variant
from orchestrator.programs.outside import read_outside_delegates
from tests.lowering.test_generation import _generated_by_the_runner

# smollm2-gen-tiny (tied, 1000 x 64) at one layer: what is checked is the head, and each layer costs a lowering about
# half a minute per variant on a busy 2-core machine (ExecuTorch's passes over each delegate).
SMOLLM2_GEN_TINY = BUILTIN_SPECS["smollm2-gen-tiny"]
TIED_ONE_LAYER = dataclasses.replace(
    SMOLLM2_GEN_TINY.with_options(
        config={**SMOLLM2_GEN_TINY.options_of(HuggingFaceOptions).config, "num_hidden_layers": 1}
    ),
    name="smollm2-gen-tiny-1-layer",
)
SHARED = Variant.parse("xnnpack-8da4w-e4-shared")  # the registry's row that shares the head
UNSHARED = Variant.parse("xnnpack-8da4w-e4")  # the same tables, the tied head quantized again by XNNPACK (as before)


def test_the_shared_modules_compute_what_the_embedding_and_the_reference_head_do() -> None:
    """After share_tied_head the gather returns torchao's dequantized rows, and the head the reference operator's
    product with the same table: one buffer, held by both modules."""
    torch.manual_seed(0)
    embedding = torch.nn.Embedding(50, 64)
    head = torch.nn.Linear(64, 50, bias=False)
    head.weight = embedding.weight

    class Tied(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed: torch.nn.Module = embedding
            self.head: torch.nn.Module = head

        def get_input_embeddings(self) -> torch.nn.Module:
            return self.embed

        def get_output_embeddings(self) -> torch.nn.Module:
            return self.head

        def set_input_embeddings(self, module: torch.nn.Module) -> None:
            self.embed = module

        def set_output_embeddings(self, module: torch.nn.Module) -> None:
            self.head = module

    model = Tied()
    assert shared_head.is_tied(model)
    quantize_embeddings(model, 4, 32)
    ids = torch.tensor([[3, 7, 49]])
    gathered = model.embed(ids)
    weight = model.embed.weight  # torchao's quantized tensor
    assert isinstance(weight, torch.Tensor)
    table = weight.dequantize()
    shared_head.share_tied_head(model, 4)
    torch.testing.assert_close(model.embed(ids), gathered, rtol=0, atol=0)
    assert model.head.table is model.embed.table and model.head.scales is model.embed.scales
    x = torch.randn(1, 2, 64)
    shared_table, scales = model.embed.table, model.embed.scales
    assert isinstance(shared_table, torch.Tensor) and isinstance(scales, torch.Tensor)
    expected = shared_head.shared_head_reference(x, shared_table, scales, 4)
    torch.testing.assert_close(model.head(x), expected, rtol=0, atol=0)
    # and the reference is the float product up to the activations' int8 rounding: better than 30 dB
    exact = x @ table.t()
    assert float((expected - exact).norm() / exact.norm()) < 10 ** (-30 / 20)


def test_a_tied_model_in_8da4w_e4_shared_holds_its_table_once_and_generates(
    runner_binary: Path, tmp_path: Path
) -> None:
    spec = TIED_ONE_LAYER  # tie_word_embeddings: 1000 x 64
    assert spec.options_of(HuggingFaceOptions).config["tie_word_embeddings"] is True
    result = lowerer.lower(spec, variants=[SHARED, UNSHARED], weights="random", root=tmp_path / "artifacts", jobs=1)
    program, before = result.variants[SHARED], result.variants[UNSHARED]
    quantization, old = program.sidecar.quantization, before.sidecar.quantization
    assert quantization is not None and old is not None
    assert quantization.shared_heads == ("model.lm_head shares model.model.embed_tokens' 4-bit table",)
    assert "etlab::shared_head reads the embedding's own 4-bit table" in (quantization.method or "")
    assert old.shared_heads == ()
    assert "; tied head reads the embedding's table (stored once)" in (_quantized_cell(program.sidecar) or "")
    # The head is no XNNPACK Fully Connected any more: the layer's 7 linears, not 8.
    assert quantization.fully_connected == {"qdint8 x qbint4": 7}
    assert old.fully_connected == {"qdint8 x qbint4": 8}
    kernels = read_outside_delegates(program.pte).kernels
    assert kernels.get("etlab::shared_head.out") == 1 and kernels.get("quantized_decomposed::embedding_4bit.out") == 1
    # Smaller by about the head's 4-bit copy: 1000 x 64 values at half a byte (XNNPACK adds its scales and packing).
    saved = before.pte.stat().st_size - program.pte.stat().st_size
    head_bytes = 1000 * 64 // 2
    assert head_bytes <= saved <= 1.5 * head_bytes, (saved, head_bytes)
    # Both generate on the runner; 4 bits on random weights: agreement is reported, not required.
    ids = {}
    for name, lowered in (("shared", program), ("unshared", before)):
        prompt = result.paths.reference_inputs
        ids[name] = _generated_by_the_runner(runner_binary, lowered.pte, prompt, 8, 64, tmp_path)
        assert all(0 <= i < 1000 for i in ids[name])
    agreement = sum(a == b for a, b in zip(ids["shared"], ids["unshared"], strict=True))
    print(f"shared vs unshared head: {agreement}/8 ids agree; saved {saved} bytes")
