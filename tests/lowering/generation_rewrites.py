"""What the tests of the rewrites that only text-generation programs take (`rope`, `fused-rms-norm`) share: two tiny
Llama-like models, the eager check that a rewritten model generates as its original does, and a real lowering run of
the model as exported and rewritten on the real runner."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from orchestrator.lowering.builtins import BUILTIN_SPECS
from orchestrator.lowering.sources.huggingface import HuggingFaceOptions
from orchestrator.lowering.spec import GENERATION_OUTPUT, GENERATION_TASK, ModelSpec
from orchestrator.tensorfile import read_tensors
from tests.board.test_runner import run_runner

QWEN2_GEN_TINY = ModelSpec(
    name="qwen2-gen-tiny",
    model_type="qwen2",
    task=GENERATION_TASK,
    output=GENERATION_OUTPUT,
    options=HuggingFaceOptions(config={"vocab_size": 500, "hidden_size": 64, "num_hidden_layers": 2,
                                       "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 128,
                                       "max_position_embeddings": 128, "initializer_range": 0.2}),
    seq_len=8,
    new_tokens=8,
    context=64,
)  # fmt: skip
SPECS = {"smollm2-gen-tiny": BUILTIN_SPECS["smollm2-gen-tiny"], "qwen2-gen-tiny": QWEN2_GEN_TINY}
LAYERS = 2  # both tiny models'


def assert_generates_the_same(original: torch.nn.Module, rewritten: torch.nn.Module, seed: int) -> None:
    """Logits over a prompt and greedy generation with transformers' own cache: equal, not close."""
    from orchestrator.lowering.export.generation import GenerationModule, eager_attention, greedy_ids

    assert isinstance(original, GenerationModule) and isinstance(rewritten, GenerationModule)
    ids = torch.randint(0, 500, (1, 12), generator=torch.Generator().manual_seed(seed))
    logits = []
    for module in (original, rewritten):
        with torch.no_grad(), eager_attention(module):
            model: Any = module.model  # a transformers causal LM
            logits.append(model(ids).logits)
    assert torch.equal(logits[0], logits[1])
    generated = [greedy_ids(module, ids.numpy(), 10) for module in (original, rewritten)]
    np.testing.assert_array_equal(generated[0], generated[1])
    assert len(set(generated[0].ravel().tolist())) > 2  # ids that depend on the context


@dataclass(frozen=True)
class LoweredRun:
    delegation: Any  # the sidecar's DelegationReport
    pte: Path
    token_ids: list[int]


def lower_and_generate(runner: Path, root: Path, names: tuple[str, ...]) -> LoweredRun:
    """SmolLM2's tiny architecture lowered for XNNPACK with the rewrites `names`, then one generation on the real
    runner from the reference prompt, whose ids must be the reference's."""
    from orchestrator.lowering.export import lower as lowering
    from orchestrator.lowering.program import with_
    from orchestrator.lowering.rewrites.registry import RewriteRequest
    from orchestrator.lowering.variants import VARIANTS

    variant = VARIANTS["xnnpack"]
    request = RewriteRequest(names=names)
    result = lowering.lower(with_(SPECS["smollm2-gen-tiny"], rewrites=request), variants=[variant], weights="random",
                            root=root, rewrites=request)  # fmt: skip
    lowered = result.variants[variant]
    assert lowered.sidecar.applied_rewrites == names
    timings = root / f"timings-{'-'.join(names) or 'none'}.json"
    done = run_runner(
        runner, "--model", lowered.pte, "--generate", "--inputs", result.paths.reference_inputs,
        "--new-tokens", 8, "--warmup", "0", "--iterations", "1", "--timings", timings, "--threads", "2",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    (run,) = json.loads(timings.read_text())["generation"]["runs"]
    assert run["token_ids"] == read_tensors(result.paths.reference_outputs)[0].array.ravel().tolist(), lowered.pte
    return LoweredRun(lowered.sidecar.delegation, lowered.pte, run["token_ids"])
