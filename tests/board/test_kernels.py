"""etlab's attention and KV-cache kernels in the native runner (board/runner/src/kernels/), run by the real
`etlab_kernel_check` (built beside the runner, calling them through ExecuTorch's kernel registry) and compared
with the PyTorch reference that defines them (orchestrator/lowering/attention/ops.py) over random shapes.

Each hypothesis example is one launch holding many cases. A program calling the kernels through the runner:
test_runner_kernels.py; the aarch64 build: tests/deploy/test_crossbuild.py.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator.lowering.attention import ops
from orchestrator.tensorfile import NamedTensor, read_tensors, write_tensors
from tests.plugins.runner import KERNEL_CHECK_NAME

INVALID_ARGUMENT = 0x12  # ExecuTorch's Error::InvalidArgument, what a refused call fails with
KERNELS = settings(max_examples=25, derandomize=True, database=None, deadline=None)


@pytest.fixture(scope="module")
def kernel_check(runner_binary: Path) -> Path:
    return runner_binary.parent / KERNEL_CHECK_NAME


@dataclass(frozen=True)
class AttendCase:
    query: np.ndarray  # [1, Hq, S, D]
    key_cache: np.ndarray  # [1, Hkv, C, D]
    value_cache: np.ndarray
    positions: np.ndarray  # int64 [S]
    scale: float

    def tensors(self, prefix: str) -> list[NamedTensor]:
        return [
            NamedTensor(f"{prefix}.query", self.query),
            NamedTensor(f"{prefix}.key_cache", self.key_cache),
            NamedTensor(f"{prefix}.value_cache", self.value_cache),
            NamedTensor(f"{prefix}.positions", self.positions),
            NamedTensor(f"{prefix}.scale", np.array(self.scale, dtype=np.float64)),
        ]

    def reference(self) -> np.ndarray:
        query, key_cache, value_cache, positions = (
            torch.from_numpy(a) for a in (self.query, self.key_cache, self.value_cache, self.positions)
        )
        return ops.attend_reference(query, key_cache, value_cache, positions, self.scale).numpy()


@dataclass(frozen=True)
class UpdateCase:
    value: np.ndarray  # [1, H, S, D]
    cache: np.ndarray  # [1, H, C, D]
    positions: np.ndarray

    def tensors(self, prefix: str) -> list[NamedTensor]:
        return [
            NamedTensor(f"{prefix}.value", self.value),
            NamedTensor(f"{prefix}.cache", self.cache),
            NamedTensor(f"{prefix}.positions", self.positions),
        ]

    def reference(self) -> np.ndarray:
        cache = torch.from_numpy(self.cache.copy())
        ops.update_cache_reference(torch.from_numpy(self.value), cache, torch.from_numpy(self.positions))
        return cache.numpy()


@dataclass(frozen=True)
class RopeCase:
    x: np.ndarray  # [B, S, H, D]
    cos: np.ndarray  # [B, S, D]
    sin: np.ndarray

    def tensors(self, prefix: str) -> list[NamedTensor]:
        return [
            NamedTensor(f"{prefix}.x", self.x),
            NamedTensor(f"{prefix}.cos", self.cos),
            NamedTensor(f"{prefix}.sin", self.sin),
        ]

    def reference(self) -> np.ndarray:
        return ops.rope_reference(*(torch.from_numpy(a) for a in (self.x, self.cos, self.sin))).numpy()


@dataclass(frozen=True)
class RmsNormCase:
    x: np.ndarray  # [..., D]
    weight: np.ndarray  # [D]
    eps: float

    def tensors(self, prefix: str) -> list[NamedTensor]:
        return [
            NamedTensor(f"{prefix}.x", self.x),
            NamedTensor(f"{prefix}.weight", self.weight),
            NamedTensor(f"{prefix}.eps", np.array(self.eps, dtype=np.float64)),
        ]

    def reference(self) -> np.ndarray:
        return ops.rms_norm_reference(torch.from_numpy(self.x), torch.from_numpy(self.weight), self.eps).numpy()


class KernelCase(Protocol):
    """A case the kernel check runs (AttendCase, UpdateCase, test_shared_head_kernel.py's HeadCase)."""

    def tensors(self, prefix: str) -> list[NamedTensor]: ...


def run_check(
    binary: Path, folder: Path, cases: Mapping[str, KernelCase], *options: str
) -> tuple[dict[str, np.ndarray], dict]:
    """One launch over all `cases` (named "attend.<n>" / "update_cache.<n>"): its outputs and its JSON line."""
    inputs, outputs = folder / "kernel-inputs.etlt", folder / "kernel-outputs.etlt"
    write_tensors(inputs, [tensor for name, case in cases.items() for tensor in case.tensors(name)])
    done = subprocess.run(
        [str(binary), *options, str(inputs), str(outputs)], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    return {t.name: t.array for t in read_tensors(outputs)}, json.loads(done.stdout.strip().splitlines()[-1])


HEAD_DIMS = [1, 3, 8, 17, 33, 64]


@st.composite
def positions_for(draw: st.DrawFn, capacity: int) -> np.ndarray:
    """A prompt of 1 (anywhere up to the last slot), the full context, a run of rows, or rows anywhere in any order."""
    kind = draw(st.sampled_from(["one", "full", "run", "scattered"]))
    if kind == "one":
        return np.array([draw(st.sampled_from([0, capacity - 1, draw(st.integers(0, capacity - 1))]))])
    if kind == "full":
        return np.arange(capacity)
    if kind == "run":
        start = draw(st.integers(0, capacity - 1))
        return np.arange(start, draw(st.integers(start + 1, capacity)))
    count = draw(st.integers(1, capacity))
    return np.random.default_rng(draw(st.integers(0, 2**32))).permutation(capacity)[:count]


@st.composite
def attend_cases(draw: st.DrawFn) -> AttendCase:
    kv_heads, group = draw(st.integers(1, 3)), draw(st.sampled_from([1, 2, 3, 4, 8]))
    dim, capacity = draw(st.sampled_from(HEAD_DIMS)), draw(st.integers(1, 150))  # > 64: more than one block of rows
    positions = draw(positions_for(capacity)).astype(np.int64)
    rng = np.random.default_rng(draw(st.integers(0, 2**32)))
    # Large queries make scores far beyond exp's float range (88): only a softmax that subtracts the maximum survives.
    magnitude = draw(st.sampled_from([1.0, 1.0, 30.0]))
    query = (rng.standard_normal((1, kv_heads * group, len(positions), dim)) * magnitude).astype(np.float32)
    key_cache, value_cache = rng.standard_normal((2, 1, kv_heads, capacity, dim)).astype(np.float32)
    return AttendCase(query, key_cache, value_cache, positions, draw(st.sampled_from([dim**-0.5, 1.0, 0.1])))


@st.composite
def update_cases(draw: st.DrawFn) -> UpdateCase:
    heads, dim, capacity = draw(st.integers(1, 4)), draw(st.sampled_from(HEAD_DIMS)), draw(st.integers(1, 80))
    positions = draw(positions_for(capacity)).astype(np.int64)
    rng = np.random.default_rng(draw(st.integers(0, 2**32)))
    value = rng.standard_normal((1, heads, len(positions), dim)).astype(np.float32)
    return UpdateCase(value, rng.standard_normal((1, heads, capacity, dim)).astype(np.float32), positions)


def assert_attention_close(got: np.ndarray, case: AttendCase) -> None:
    reference = case.reference()
    # fp32 both sides. A score's rounding error grows with sum |q_d k_d| (the dot product's condition), and the
    # weights inherit it as a relative error: the absolute part scales with the largest such sum.
    group = case.query.shape[1] // case.key_cache.shape[1]
    keys = np.abs(np.repeat(case.key_cache, group, axis=1))
    condition = float((np.abs(case.query) @ keys.transpose(0, 1, 3, 2)).max()) * case.scale
    np.testing.assert_allclose(got, reference, rtol=1e-5, atol=1e-6 * max(1.0, condition))


@KERNELS
@given(attends=st.lists(attend_cases(), min_size=1, max_size=8), updates=st.lists(update_cases(), max_size=8))
def test_kernels_equal_the_reference(
    kernel_check: Path, tmp_path_factory: pytest.TempPathFactory, attends: list[AttendCase], updates: list[UpdateCase]
) -> None:
    cases: dict[str, AttendCase | UpdateCase] = {f"attend.{n}": case for n, case in enumerate(attends)}
    cases.update({f"update_cache.{n}": case for n, case in enumerate(updates)})
    outputs, _ = run_check(kernel_check, tmp_path_factory.mktemp("kernels"), cases)
    for name, case in cases.items():
        assert outputs[f"{name}.status"] == 0, name
        if isinstance(case, AttendCase):
            assert_attention_close(outputs[f"{name}.out"], case)
        else:
            np.testing.assert_array_equal(outputs[f"{name}.cache"], case.reference())
            np.testing.assert_array_equal(outputs[f"{name}.out"], np.zeros(1, np.float32))


def test_the_portable_loops_equal_the_reference_too(kernel_check: Path, tmp_path: Path) -> None:
    """The fallback for CPUs without AVX2 (and builds for neither x86-64 nor aarch64), forced on this one."""
    rng = np.random.default_rng(5)
    cases: dict[str, AttendCase | UpdateCase] = {}
    for n, (heads, group, dim, capacity) in enumerate([(1, 1, 1, 1), (2, 4, 17, 70), (3, 3, 64, 130), (1, 8, 8, 9)]):
        positions = rng.permutation(capacity)[: rng.integers(1, capacity + 1)].astype(np.int64)
        query = rng.standard_normal((1, heads * group, len(positions), dim)).astype(np.float32)
        key_cache, value_cache = rng.standard_normal((2, 1, heads, capacity, dim)).astype(np.float32)
        cases[f"attend.{n}"] = AttendCase(query, key_cache, value_cache, positions, dim**-0.5)
    outputs, line = run_check(kernel_check, tmp_path, cases, "--isa", "portable")
    assert line["isa"] == "portable"
    for name, case in cases.items():
        assert isinstance(case, AttendCase)
        assert_attention_close(outputs[f"{name}.out"], case)


def test_heads_run_on_more_than_one_thread(kernel_check: Path, tmp_path: Path) -> None:
    """attend hands its heads to ExecuTorch's pool: with 2 threads, 2 distinct threads ran its tasks (calls big
    enough that the caller cannot finish all the work before the other thread wakes)."""
    rng = np.random.default_rng(7)
    cases: dict[str, AttendCase | UpdateCase] = {}
    for n in range(4):
        query = rng.standard_normal((1, 8, 128, 64)).astype(np.float32)
        key_cache, value_cache = rng.standard_normal((2, 1, 2, 1024, 64)).astype(np.float32)
        cases[f"attend.{n}"] = AttendCase(query, key_cache, value_cache, np.arange(896, 1024), 0.125)
    outputs, line = run_check(kernel_check, tmp_path, cases, "--threads", "2")
    assert line["pool_threads"] == 2
    assert line["attend_threads"] == 2, line
    first = cases["attend.0"]
    assert isinstance(first, AttendCase)
    assert_attention_close(outputs["attend.0.out"], first)  # still right when split


@pytest.mark.parametrize("bad_position", [-1, 16, 1 << 40], ids=["negative", "one-past-the-last-slot", "far-past"])
def test_a_position_outside_the_cache_fails_and_writes_nothing(
    kernel_check: Path, tmp_path: Path, bad_position: int
) -> None:
    """Every position is checked before the first row is written: the valid rows before the bad one are not written
    either, and attend refuses the position too instead of reading past the cache."""
    rng = np.random.default_rng(3)
    cache = rng.standard_normal((1, 2, 16, 8)).astype(np.float32)
    positions = np.array([0, 5, bad_position, 7], dtype=np.int64)
    value = rng.standard_normal((1, 2, 4, 8)).astype(np.float32)
    query = rng.standard_normal((1, 4, 4, 8)).astype(np.float32)
    cases: dict[str, AttendCase | UpdateCase] = {
        "update_cache.0": UpdateCase(value, cache, positions),
        "attend.0": AttendCase(query, cache, cache, positions, 0.3),
    }
    outputs, _ = run_check(kernel_check, tmp_path, cases)
    assert outputs["update_cache.0.status"] == INVALID_ARGUMENT
    np.testing.assert_array_equal(outputs["update_cache.0.cache"], cache)
    assert outputs["attend.0.status"] == INVALID_ARGUMENT


def test_mismatched_shapes_and_dtypes_fail(kernel_check: Path, tmp_path: Path) -> None:
    cache = np.zeros((1, 2, 16, 8), np.float32)
    positions = np.array([1], dtype=np.int64)
    query = np.zeros((1, 3, 1, 8), np.float32)  # 3 query heads over 2 KV heads
    cases: dict[str, AttendCase | UpdateCase] = {
        "update_cache.dim": UpdateCase(np.zeros((1, 2, 1, 4), np.float32), cache, positions),
        "update_cache.dtype": UpdateCase(np.zeros((1, 2, 1, 8), np.float64), cache, positions),
        "update_cache.count": UpdateCase(np.zeros((1, 2, 2, 8), np.float32), cache, positions),
        "attend.heads": AttendCase(query, cache, cache, positions, 1.0),
        "attend.positions": AttendCase(np.zeros((1, 2, 2, 8), np.float32), cache, cache, positions, 1.0),
    }
    outputs, _ = run_check(kernel_check, tmp_path, cases)
    for name in cases:
        assert outputs[f"{name}.status"] == INVALID_ARGUMENT, name
    for name in ("update_cache.dim", "update_cache.dtype", "update_cache.count"):
        np.testing.assert_array_equal(outputs[f"{name}.cache"], cache)


ROPE_WIDTHS = [2, 6, 8, 32, 64, 128]


@st.composite
def rope_cases(draw: st.DrawFn) -> RopeCase:
    batch, positions, heads = draw(st.integers(1, 2)), draw(st.integers(1, 9)), draw(st.integers(1, 9))
    width = draw(st.sampled_from(ROPE_WIDTHS))
    rng = np.random.default_rng(draw(st.integers(0, 2**32)))
    x = (rng.standard_normal((batch, positions, heads, width)) * draw(st.sampled_from([1.0, 50.0]))).astype(np.float32)
    angles = rng.uniform(-100, 100, (batch, positions, width)).astype(np.float32)  # any position's angles
    return RopeCase(x, np.cos(angles), np.sin(angles))


@KERNELS
@given(ropes=st.lists(rope_cases(), min_size=1, max_size=8))
def test_rope_equals_the_reference(
    kernel_check: Path, tmp_path_factory: pytest.TempPathFactory, ropes: list[RopeCase]
) -> None:
    """etlab::rope against transformers' RoPE computed the same way (ops.rope_reference): [B, S, H, D] in,
    [B, H, S, D] out, within an ulp of each product."""
    cases = {f"rope.{n}": case for n, case in enumerate(ropes)}
    outputs, _ = run_check(kernel_check, tmp_path_factory.mktemp("rope"), cases)
    for name, case in cases.items():
        assert outputs[f"{name}.status"] == 0, name
        reference = case.reference()
        assert outputs[f"{name}.out"].shape == reference.shape == (case.x.shape[0], case.x.shape[2],
                                                                   case.x.shape[1], case.x.shape[3])  # fmt: skip
        np.testing.assert_allclose(outputs[f"{name}.out"], reference, rtol=1e-6, atol=1e-6 * np.abs(case.x).max())


def test_rope_is_the_rotation_transformers_applies() -> None:
    """The reference itself against transformers' Llama `apply_rotary_pos_emb` on the transposed input, bit for bit
    (the rewrite's eager outputs are then the model's own)."""
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    generator = torch.Generator().manual_seed(2)
    x, k = torch.randn(2, 2, 5, 3, 16, generator=generator)  # [B, S, H, D]
    angles = torch.randn(2, 5, 16, generator=generator) * 10
    q_embed, k_embed = apply_rotary_pos_emb(x.transpose(1, 2), k.transpose(1, 2), angles.cos(), angles.sin())
    assert torch.equal(ops.rope_reference(x, angles.cos(), angles.sin()), q_embed)
    assert torch.equal(ops.rope_reference(k, angles.cos(), angles.sin()), k_embed)


def test_rope_refuses_what_it_does_not_compute(kernel_check: Path, tmp_path: Path) -> None:
    x = np.ones((1, 3, 2, 8), np.float32)
    table = np.ones((1, 3, 8), np.float32)
    cases = {
        "rope.odd": RopeCase(np.ones((1, 3, 2, 7), np.float32), np.ones((1, 3, 7), np.float32),
                             np.ones((1, 3, 7), np.float32)),
        "rope.positions": RopeCase(x, np.ones((1, 2, 8), np.float32), np.ones((1, 2, 8), np.float32)),
        "rope.width": RopeCase(x, np.ones((1, 3, 4), np.float32), np.ones((1, 3, 4), np.float32)),
        "rope.dtype": RopeCase(x.astype(np.float64), table, table),
        "rope.rank": RopeCase(np.ones((3, 2, 8), np.float32), table, table),
    }  # fmt: skip
    outputs, _ = run_check(kernel_check, tmp_path, cases)
    for name in cases:
        assert outputs[f"{name}.status"] == INVALID_ARGUMENT, name


RMS_NORM_WIDTHS = [1, 7, 16, 33, 64, 576, 1000]


@st.composite
def rms_norm_cases(draw: st.DrawFn) -> RmsNormCase:
    leading = draw(st.lists(st.integers(1, 5), min_size=0, max_size=3))
    width = draw(st.sampled_from(RMS_NORM_WIDTHS))
    rng = np.random.default_rng(draw(st.integers(0, 2**32)))
    x = (rng.standard_normal((*leading, width)) * draw(st.sampled_from([1e-3, 1.0, 50.0]))).astype(np.float32)
    weight = rng.standard_normal(width).astype(np.float32)
    return RmsNormCase(x, weight, draw(st.sampled_from([1e-6, 1e-5, 0.0, 0.5])))


@KERNELS
@given(norms=st.lists(rms_norm_cases(), min_size=1, max_size=8))
def test_rms_norm_equals_the_reference(
    kernel_check: Path, tmp_path_factory: pytest.TempPathFactory, norms: list[RmsNormCase]
) -> None:
    """etlab::rms_norm against LlamaRMSNorm computed the same way (ops.rms_norm_reference), any leading dims: the
    sum of squares is the kernel's own order, so within a few ulps of the row's scale."""
    cases = {f"rms_norm.{n}": case for n, case in enumerate(norms)}
    outputs, _ = run_check(kernel_check, tmp_path_factory.mktemp("rms_norm"), cases)
    for name, case in cases.items():
        assert outputs[f"{name}.status"] == 0, name
        reference = case.reference()
        assert outputs[f"{name}.out"].shape == reference.shape == case.x.shape
        np.testing.assert_allclose(outputs[f"{name}.out"], reference, rtol=1e-5,
                                   atol=1e-5 * np.abs(case.weight).max())  # fmt: skip


def test_rms_norm_is_the_norm_transformers_applies() -> None:
    """The reference against transformers' LlamaRMSNorm, bit for bit (the rewrite's eager outputs are its own)."""
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    norm = LlamaRMSNorm(48, eps=1e-5)
    generator = torch.Generator().manual_seed(3)
    with torch.no_grad():
        norm.weight.copy_(torch.randn(48, generator=generator))
    x = torch.randn(2, 5, 48, generator=generator) * 30
    assert torch.equal(ops.rms_norm_reference(x, norm.weight, 1e-5), norm(x))


def test_rms_norm_refuses_what_it_does_not_compute(kernel_check: Path, tmp_path: Path) -> None:
    x = np.ones((2, 8), np.float32)
    weight = np.ones(8, np.float32)
    cases = {
        "rms_norm.width": RmsNormCase(x, np.ones(7, np.float32), 1e-5),
        "rms_norm.dtype": RmsNormCase(x.astype(np.float64), weight.astype(np.float64), 1e-5),
        "rms_norm.weight_rank": RmsNormCase(x, np.ones((1, 8), np.float32), 1e-5),
        "rms_norm.empty_rows": RmsNormCase(np.ones((2, 0), np.float32), np.ones(0, np.float32), 1e-5),
        "rms_norm.eps": RmsNormCase(x, weight, float("nan")),
        "rms_norm.negative_eps": RmsNormCase(x, weight, -1.0),
    }
    outputs, _ = run_check(kernel_check, tmp_path, cases)
    for name in cases:
        assert outputs[f"{name}.status"] == INVALID_ARGUMENT, name
