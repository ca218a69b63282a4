"""A tiny Llama lowered as a text-generation program (static KV cache inside, dynamic sequence length), for the
runner's generate mode, and Hugging Face's eager greedy generation to compare it with.

The program is what the workstation's `task: text-generation` lowering produces: method `forward(input_ids [1, S],
cache_position [S])` -> logits [1, S, vocab], S in 1..CONTEXT-1, the cache kept as mutable buffers.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

VOCAB_SIZE = 256
CONTEXT = 64  # the static cache's length
MAX_PROMPT_LEN = CONTEXT - 1  # the upper bound of the exported sequence dimension
EXPORT_PROMPT_LEN = 8


def generated_prompt(length: int) -> np.ndarray:
    """The runner's prompt without --inputs: (i * 7 + 3) % 100 (board/runner/README.md, "Generate mode")."""
    return (np.arange(length, dtype=np.int64) * 7 + 3) % 100


@dataclass(frozen=True)
class GenerateModels:
    """The tiny Llama lowered for XNNPACK and for the portable kernels, and its eager model for references."""

    portable_pte: Path
    xnnpack_pte: Path
    model: Any  # LlamaForCausalLM, eval mode

    def pte(self, backend: str) -> Path:
        return {"portable": self.portable_pte, "xnnpack": self.xnnpack_pte}[backend]

    def greedy(self, prompt: np.ndarray, new_tokens: int) -> list[int]:
        """Hugging Face's eager greedy generation: the `new_tokens` ids after `prompt`."""
        import torch
        from transformers import GenerationConfig

        ids = torch.from_numpy(np.asarray(prompt, dtype=np.int64)).reshape(1, -1)
        config = GenerationConfig(
            do_sample=False, max_new_tokens=new_tokens, min_new_tokens=new_tokens, eos_token_id=None, pad_token_id=0
        )
        with torch.no_grad():
            out = self.model.generate(ids, attention_mask=torch.ones_like(ids), generation_config=config)
        return out[0, ids.shape[1] :].tolist()


def make_generate_models(folder: Path) -> GenerateModels:
    """Export the tiny Llama once (strict export: non-strict fails later in to_edge) and lower it twice."""
    from orchestrator.lowering.sources.builders.torchvision import declare_torchvision_ops

    declare_torchvision_ops()  # before transformers: the CUDA torchvision wheel sits next to CPU torch
    import torch
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.exir import to_edge, to_edge_transform_and_lower
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM
    from transformers.integrations.executorch import TorchExportableModuleWithStaticCache

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=VOCAB_SIZE,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        # Larger than the default 0.02: with tiny weights the greedy ids barely depend on positions, so a runner
        # feeding a wrong cache_position would still match (measured: 0 of 16 ids changed at 0.02, 15 at 0.3).
        initializer_range=0.3,
    )
    model = LlamaForCausalLM(config).eval()
    model.generation_config = GenerationConfig(
        use_cache=True, cache_implementation="static", cache_config={"batch_size": 1, "max_cache_len": CONTEXT}
    )
    wrapped = TorchExportableModuleWithStaticCache(model, 1, CONTEXT)
    ids = torch.from_numpy(generated_prompt(EXPORT_PROMPT_LEN)).unsqueeze(0)
    positions = torch.arange(EXPORT_PROMPT_LEN)
    seq = torch.export.Dim("seq", min=1, max=MAX_PROMPT_LEN)
    with torch.no_grad():
        exported = torch.export.export(
            wrapped,
            args=(),
            kwargs={"input_ids": ids, "cache_position": positions},
            dynamic_shapes={"input_ids": {1: seq}, "cache_position": {0: seq}},
            strict=True,
        )
    folder.mkdir(parents=True, exist_ok=True)
    xnnpack = folder / "llama-tiny-xnnpack.pte"
    xnnpack.write_bytes(
        to_edge_transform_and_lower(exported, partitioner=[XnnpackPartitioner()]).to_executorch().buffer
    )
    portable = folder / "llama-tiny-portable.pte"
    portable.write_bytes(to_edge(exported).to_executorch().buffer)
    return GenerateModels(portable, xnnpack, model)
