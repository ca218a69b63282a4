"""A program calling etlab's operators (torch.ops.etlab.update_cache / attend on mutable cache buffers), lowered
with real ExecuTorch (XNNPACK partitioner) and run by the real native runner: its kernels (board/runner/src/kernels/)
give what the module gives eagerly, for one call and for a whole greedy generation (prefill, then decode steps at
growing positions). The kernels alone against the reference over random shapes: test_kernels.py."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from orchestrator.lowering.attention import ops
from orchestrator.programs.plan import read_program_plan
from orchestrator.tensorfile import NamedTensor, read_tensors, write_tensors
from tests.board.test_runner import error_line, run_runner

pytestmark = pytest.mark.slow

VOCAB, WIDTH, QUERY_HEADS, KV_HEADS, HEAD_DIM, CONTEXT = 64, 32, 4, 2, 8, 32


class TinyCachedLM(torch.nn.Module):
    """One attention layer over a static KV cache held in buffers, in the runner's generate-mode signature:
    forward(input_ids [1, S], cache_position [S]) -> logits [1, S, vocab]."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(VOCAB, WIDTH)
        self.query = torch.nn.Linear(WIDTH, QUERY_HEADS * HEAD_DIM)
        self.key = torch.nn.Linear(WIDTH, KV_HEADS * HEAD_DIM)
        self.value = torch.nn.Linear(WIDTH, KV_HEADS * HEAD_DIM)
        self.head = torch.nn.Linear(QUERY_HEADS * HEAD_DIM, VOCAB)
        self.register_buffer("key_cache", torch.zeros(1, KV_HEADS, CONTEXT, HEAD_DIM))
        self.register_buffer("value_cache", torch.zeros(1, KV_HEADS, CONTEXT, HEAD_DIM))

    def forward(self, input_ids: torch.Tensor, cache_position: torch.Tensor) -> torch.Tensor:
        rows = input_ids.shape[1]
        hidden = self.embed(input_ids)
        query = self.query(hidden).view(1, rows, QUERY_HEADS, HEAD_DIM).transpose(1, 2)
        key = self.key(hidden).view(1, rows, KV_HEADS, HEAD_DIM).transpose(1, 2)
        value = self.value(hidden).view(1, rows, KV_HEADS, HEAD_DIM).transpose(1, 2)
        torch.ops.etlab.update_cache(key, self.key_cache, cache_position)
        torch.ops.etlab.update_cache(value, self.value_cache, cache_position)
        attended = torch.ops.etlab.attend(query, self.key_cache, self.value_cache, cache_position, HEAD_DIM**-0.5)
        return self.head(attended.transpose(1, 2).reshape(1, rows, QUERY_HEADS * HEAD_DIM))


def fresh_model() -> TinyCachedLM:
    torch.manual_seed(0)
    model = TinyCachedLM().eval()
    with torch.no_grad():  # larger than the default init, so the ids depend on what attention returns
        for parameter in model.parameters():
            parameter.mul_(3.0)
    return model


@pytest.fixture(scope="module")
def cached_lm_pte(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.exir import EdgeCompileConfig, to_edge_transform_and_lower

    assert ops.NAMESPACE == "etlab"  # importing ops is what defines torch.ops.etlab.*
    seq = torch.export.Dim("seq", min=1, max=CONTEXT - 1)
    example = (torch.zeros(1, 5, dtype=torch.int64), torch.arange(5))
    exported = torch.export.export(fresh_model(), example, dynamic_shapes=({1: seq}, {0: seq}), strict=True)
    lowered = to_edge_transform_and_lower(
        exported, partitioner=[XnnpackPartitioner()], compile_config=EdgeCompileConfig(_check_ir_validity=False)
    )
    pte = tmp_path_factory.mktemp("cached-lm") / "cached-lm.pte"
    pte.write_bytes(lowered.to_executorch().buffer)
    return pte


def test_the_program_calls_etlabs_kernels_on_the_cache(cached_lm_pte: Path) -> None:
    kernels = [i.op for i in read_program_plan(cached_lm_pte).instructions if i.kind == "KernelCall"]
    assert kernels.count("etlab::update_cache.out") == 2 and kernels.count("etlab::attend.out") == 1, kernels
    assert not any(op and ("index_put" in op or "copy_" in op) for op in kernels), kernels  # no write-back copy


def test_one_call_equals_the_module_run_eagerly(runner_binary: Path, cached_lm_pte: Path, tmp_path: Path) -> None:
    """Rows in any order (positions a permutation), so each query row attends to a different number of rows."""
    rows = CONTEXT - 1  # a dynamic program's inputs come at the upper bound (board/runner/README.md)
    rng = np.random.default_rng(1)
    ids = rng.integers(0, VOCAB, size=(1, rows)).astype(np.int64)
    positions = rng.permutation(rows).astype(np.int64)
    inputs, outputs = tmp_path / "inputs.etlt", tmp_path / "outputs"
    write_tensors(inputs, [NamedTensor("input_ids", ids), NamedTensor("cache_position", positions)])
    outputs.mkdir()
    done = run_runner(
        runner_binary, "--model", cached_lm_pte, "--inputs", inputs, "--warmup", "1", "--iterations", "2",
        "--outputs", outputs / "outputs.etlt", "--threads", "2",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    (logits,) = read_tensors(outputs / "outputs.etlt")
    with torch.no_grad():
        expected = fresh_model()(torch.from_numpy(ids), torch.from_numpy(positions)).numpy()
    np.testing.assert_allclose(logits.array, expected, rtol=1e-4, atol=1e-4)


def eager_greedy(prompt: np.ndarray, new_tokens: int) -> list[int]:
    model, ids, produced = fresh_model(), torch.from_numpy(prompt).reshape(1, -1), []
    position = 0
    with torch.no_grad():
        for _ in range(new_tokens):
            logits = model(ids, torch.arange(position, position + ids.shape[1]))
            position += ids.shape[1]
            produced.append(int(logits[0, -1].argmax()))
            ids = torch.tensor([[produced[-1]]])
    return produced


def test_a_greedy_generation_equals_eager(runner_binary: Path, cached_lm_pte: Path, tmp_path: Path) -> None:
    """Prefill of 7 rows, then decode steps one row at a time up to the cache's last slot."""
    prompt = np.array([5, 60, 17, 33, 2, 48, 9], dtype=np.int64)
    new_tokens = CONTEXT - len(prompt)
    write_tensors(tmp_path / "prompt.etlt", [NamedTensor("prompt", prompt.reshape(1, -1))])
    done = run_runner(
        runner_binary, "--model", cached_lm_pte, "--generate", "--inputs", tmp_path / "prompt.etlt",
        "--new-tokens", new_tokens, "--context", CONTEXT, "--warmup", "0", "--iterations", "1",
        "--timings", tmp_path / "timings.json", "--threads", "2",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    (run,) = json.loads((tmp_path / "timings.json").read_text())["generation"]["runs"]
    expected = eager_greedy(prompt, new_tokens)
    assert len(set(expected)) > 3  # the ids depend on the context, not one token repeated
    assert run["token_ids"] == expected


def test_a_position_past_the_cache_fails_the_execution(
    runner_binary: Path, cached_lm_pte: Path, tmp_path: Path
) -> None:
    """update_cache refuses it before writing anything (InvalidArgument), so the runner's execute fails: exit 7."""
    rows = CONTEXT - 1
    positions = np.arange(rows, dtype=np.int64)
    positions[-1] = CONTEXT  # one past the last slot
    inputs = tmp_path / "inputs.etlt"
    ids = np.zeros((1, rows), dtype=np.int64)
    write_tensors(inputs, [NamedTensor("input_ids", ids), NamedTensor("cache_position", positions)])
    done = run_runner(runner_binary, "--model", cached_lm_pte, "--inputs", inputs, "--warmup", "0", "--iterations", "1")
    assert done.returncode == 7, done.stderr
    assert f"position {CONTEXT} is outside the cache's {CONTEXT} rows" in done.stderr
    assert error_line(done).startswith("etlab_runner: error: ")
