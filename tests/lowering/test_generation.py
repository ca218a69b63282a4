"""`task: text-generation` (orchestrator/lowering/generation.py): the spec's rules, refused with file:line:field before
anything loads, and the program itself: one method for prefill and decode with the KV cache inside, whose greedy ids,
run step by step in ExecuTorch's own runtime, equal eager HuggingFace greedy generation.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from orchestrator.errors import SpecError
from orchestrator.lowering import lower as lowerer
from orchestrator.lowering.spec import BUILTIN_SPECS, GENERATION_TASK, load_spec_file
from orchestrator.lowering.variants import Variant
from orchestrator.tensorfile import read_tensors
from tests.lowering.spec_helpers import GPT2_TINY, checked
from tests.lowering.test_huggingface_specs import write

LLAMA_TINY = {"vocab_size": 256, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1,
              "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 64}  # fmt: skip


def generation_spec(**changes: Any) -> dict[str, Any]:
    data = {"name": "chat", "model_type": "llama", "task": GENERATION_TASK, "config": dict(LLAMA_TINY),
            "seq_len": 8, "new_tokens": 8, "context": 32}  # fmt: skip
    return {**data, **changes}


@pytest.mark.parametrize(
    ("changes", "field", "words"),
    [
        ({"seq_len": 30, "new_tokens": 8}, "context", "need 38 positions, more than the KV cache's context 32"),
        ({"batch_size": 2}, "batch_size", "generates one sequence"),
        ({"inputs": [{"name": "input_ids", "dtype": "int64", "shape": [1, 8]}]}, "inputs", "give seq_len instead"),
        ({"context": 128}, "context", "beyond the model's 64 position embeddings"),
        ({"context": 1}, "context", "expected an integer 2-32768, got 1"),
    ],
)
def test_a_generation_spec_beyond_its_cache_is_refused_naming_the_line(
    tmp_path: Path, changes: dict[str, Any], field: str, words: str
) -> None:
    path = write(tmp_path, generation_spec(**changes))
    with pytest.raises(SpecError) as raised:
        checked(path)
    message = str(raised.value)
    assert raised.value.exit_code == 64
    assert words in message
    line = next(i for i, text in enumerate(path.read_text().splitlines(), 1) if text.strip().startswith(f'"{field}"'))
    assert re.search(rf"spec\.json:{line}: field '{field}'", message), message


def test_cache_fields_on_another_task_are_refused(tmp_path: Path) -> None:
    data = {"name": "lm", "model_type": "gpt2", "task": "causal-lm", "config": GPT2_TINY, "context": 64}
    path = write(tmp_path, data)
    with pytest.raises(SpecError, match="'context': is for task 'text-generation' only"):
        checked(path)


def test_a_generation_spec_checks_and_declares_the_prompt_and_its_positions(tmp_path: Path) -> None:
    path = write(tmp_path, generation_spec())
    assert checked(path).parameters > 0
    spec = load_spec_file(path)
    assert spec.generates and spec.cache_capacity == 32
    assert [(item.name, item.shape) for item in spec.inputs] == [("input_ids", (1, 8)), ("cache_position", (8,))]


def _greedy_in_executorch(pte: Path, prompt: np.ndarray, new_tokens: int) -> list[int]:
    """Prefill, then one token at a time at positions P, P+1, ...: what the board's runner does, in Python."""
    import torch
    from executorch.runtime import Runtime

    method = Runtime.get().load_program(pte.read_bytes()).load_method("forward")
    length = prompt.shape[1]
    logits = method.execute([torch.from_numpy(prompt), torch.arange(length)])[0]
    ids = [int(logits[0, -1].argmax())]
    for step in range(new_tokens - 1):
        logits = method.execute([torch.tensor([[ids[-1]]]), torch.tensor([length + step])])[0]
        ids.append(int(logits[0, -1].argmax()))
    return ids


@pytest.mark.parametrize("name", ["smollm2-gen-tiny", "gpt2-gen-tiny"])
def test_the_program_generates_what_eager_greedy_generation_does(tmp_path: Path, name: str) -> None:
    spec = BUILTIN_SPECS[name]
    result = lowerer.lower(spec, variants=[Variant("xnnpack")], weights="random", root=tmp_path, jobs=1)
    lowered = result.variants[Variant("xnnpack")]
    generation = lowered.sidecar.generation
    assert generation is not None
    assert (generation.context, generation.prompt_len, generation.new_tokens) == (64, 8, 8)
    assert generation.max_prompt_len == 63
    # Two layers' keys and values: [1, kv heads, 64 positions, head dim] float32 each.
    assert generation.kv_cache_bytes > 0 and generation.kv_cache_bytes % (2 * 2 * 64 * 4) == 0
    (prompt,) = read_tensors(result.paths.reference_inputs)
    (reference,) = read_tensors(result.paths.reference_outputs)
    assert prompt.array.shape == (1, 8) and reference.array.shape == (1, 8)
    assert reference.array.dtype == np.int64
    assert len(set(reference.array.reshape(-1).tolist())) > 1  # a random model that repeats one id proves little
    assert _greedy_in_executorch(lowered.pte, prompt.array, 8) == reference.array.reshape(-1).tolist()
    assert [item["name"] for item in lowered.sidecar.inputs] == ["input_ids", "cache_position"]
