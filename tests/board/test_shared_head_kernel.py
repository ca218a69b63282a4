"""etlab's tied-head kernel in the native runner (board/runner/src/kernels/shared_head.cpp), run by the real
`etlab_kernel_check` through ExecuTorch's kernel registry and compared with the PyTorch reference that defines it
(orchestrator/lowering/quantize/shared_head.py) over random shapes: rows 1..N (odd ones too), features a multiple
of the group, 8-bit rows and embedding_4bit's packed ones. The aarch64 build: tests/deploy/test_crossbuild_kernels.py.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator.lowering.quantize import shared_head
from orchestrator.tensorfile import NamedTensor
from tests.board.test_kernels import INVALID_ARGUMENT, run_check
from tests.plugins.runner import KERNEL_CHECK_NAME

KERNELS = settings(max_examples=25, derandomize=True, database=None, deadline=None)


@pytest.fixture(scope="module")
def kernel_check(runner_binary: Path) -> Path:
    return runner_binary.parent / KERNEL_CHECK_NAME


@dataclass(frozen=True)
class HeadCase:
    input: np.ndarray  # float32 [..., K]
    table: np.ndarray  # int8 [N, K] or packed uint8 [N, K / 2]
    scales: np.ndarray  # float32 [N] or [N, G]
    bits: int

    def tensors(self, prefix: str) -> list[NamedTensor]:
        return [
            NamedTensor(f"{prefix}.input", self.input),
            NamedTensor(f"{prefix}.table", self.table),
            NamedTensor(f"{prefix}.scales", self.scales),
            NamedTensor(f"{prefix}.bits", np.array(self.bits, dtype=np.int64)),
        ]

    def reference(self) -> np.ndarray:
        x, table, scales = (torch.from_numpy(a) for a in (self.input, self.table, self.scales))
        return shared_head.shared_head_reference(x, table, scales, self.bits).numpy()


def head_case(
    rng: np.random.Generator, leading: tuple[int, ...], rows: int, features: int, groups: int, bits: int
) -> HeadCase:
    """A table of `rows` x `features` values in the bits' range, `groups` scales a row (a 1-D scales for one)."""
    low, high = (-128, 128) if bits == 8 else (-8, 8)
    values = rng.integers(low, high, size=(rows, features), dtype=np.int64).astype(np.int8)
    table = values if bits == 8 else shared_head.pack_4bit(torch.from_numpy(values)).numpy()
    scales = (rng.random((rows, groups)) * 0.1 + 1e-3).astype(np.float32)
    scales = scales[:, 0].copy() if groups == 1 and rng.random() < 0.5 else scales
    x = rng.standard_normal((*leading, features)).astype(np.float32)
    return HeadCase(x, np.ascontiguousarray(table), scales, bits)


def assert_head_close(got: np.ndarray, case: HeadCase) -> None:
    reference = case.reference()
    # The integer dot products are exact on both sides; the groups' float32 sums are not, in different orders (the
    # kernel's 4-bit loops sum the stored values 0..15 and take the offset 8 apart): the error scales with
    # sum |x_k| (|w_nk| + 8 scale).
    table, scales = torch.from_numpy(case.table), torch.from_numpy(case.scales)
    weights = shared_head.dequantize(table, scales, case.bits).abs()
    if case.bits == 4:
        weights += shared_head.dequantize(torch.zeros_like(table), scales, 4).abs()  # stored 0: -8, 8 scale
    condition = float((np.abs(case.input) @ weights.numpy().T).max(initial=1.0))
    np.testing.assert_allclose(got, reference, rtol=1e-5, atol=2e-6 * condition)


@st.composite
def head_cases(draw: st.DrawFn) -> HeadCase:
    bits = draw(st.sampled_from([4, 8]))
    group = draw(st.sampled_from([2, 16, 32, 34, 64]))  # 34: a group the 16-value loops do not divide
    features = group * draw(st.integers(1, 5))
    rows = draw(st.integers(1, 300)) | draw(st.sampled_from([0, 1]))  # odd row counts too
    leading = draw(st.sampled_from([(1, 1), (1, 3), (2,), (1, 1, 5)]))
    rng = np.random.default_rng(draw(st.integers(0, 2**32)))
    return head_case(rng, leading, rows, features, features // group, bits)


@KERNELS
@given(cases=st.lists(head_cases(), min_size=1, max_size=8))
def test_the_head_equals_the_reference(
    kernel_check: Path, tmp_path_factory: pytest.TempPathFactory, cases: list[HeadCase]
) -> None:
    named = {f"shared_head.{n}": case for n, case in enumerate(cases)}
    outputs, _ = run_check(kernel_check, tmp_path_factory.mktemp("head"), named)
    for name, case in named.items():
        assert outputs[f"{name}.status"] == 0, name
        assert outputs[f"{name}.out"].shape == case.reference().shape
        assert_head_close(outputs[f"{name}.out"], case)


def test_a_smollm2_sized_head_split_over_threads_and_the_portable_loops_agree(kernel_check: Path, tmp_path: Path):
    """SmolLM2-135M's head (49152 x 576, groups of 32 and 8-bit rows) on 2 threads, one decode row and a few
    prompt rows; and the AVX2 and plain C++ loops (CPUs without AVX-512 VNNI or AVX2, builds for neither x86-64 nor
    aarch64) forced."""
    rng = np.random.default_rng(3)
    cases = {
        "shared_head.4bit": head_case(rng, (1, 1), 49152, 576, 18, 4),
        "shared_head.8bit": head_case(rng, (1, 1), 49152, 576, 1, 8),
        "shared_head.prompt": head_case(rng, (1, 3), 4097, 576, 18, 4),
    }
    outputs, line = run_check(kernel_check, tmp_path, cases, "--threads", "2")
    assert line["pool_threads"] == 2
    for name, case in cases.items():
        assert outputs[f"{name}.status"] == 0, name
        assert_head_close(outputs[f"{name}.out"], case)
    small = {
        "shared_head.0": head_case(rng, (1, 2), 33, 96, 3, 4),
        "shared_head.1": head_case(rng, (3,), 7, 68, 2, 8),
        "shared_head.2": head_case(rng, (1, 1), 65, 128, 2, 4),  # groups of 64: AVX-512's other loop
        "shared_head.3": head_case(rng, (1, 1), 65, 128, 1, 8),
    }
    for isa in ("portable", "avx2"):  # the best one (AVX-512 VNNI where the CPU has it) ran above
        if isa == "avx2" and line["shared_head_isa"] not in ("avx2", "avx512vnni"):
            continue
        outputs, forced = run_check(kernel_check, tmp_path, small, "--isa", isa)
        assert forced["shared_head_isa"] == isa
        for name, case in small.items():
            assert_head_close(outputs[f"{name}.out"], case)


def test_mismatched_tables_fail() -> None:
    """The reference refuses what the kernel refuses (below): a 4-bit table that is not uint8, features that
    differ, groups that do not divide a row."""
    x = torch.zeros(1, 8)
    with pytest.raises(RuntimeError, match="4-bit table"):
        shared_head.shared_head_reference(x, torch.zeros(3, 4, dtype=torch.int8), torch.ones(3), 4)
    with pytest.raises(RuntimeError, match="features differ"):
        shared_head.shared_head_reference(x, torch.zeros(3, 6, dtype=torch.int8), torch.ones(3), 8)
    with pytest.raises(RuntimeError, match="groups must divide"):
        shared_head.shared_head_reference(x, torch.zeros(3, 8, dtype=torch.int8), torch.ones(3, 3), 8)


def test_mismatched_tables_fail_in_the_kernel_too(kernel_check: Path, tmp_path: Path) -> None:
    x = np.zeros((1, 8), np.float32)
    cases = {
        "shared_head.dtype": HeadCase(x, np.zeros((3, 4), np.int8), np.ones(3, np.float32), 4),
        "shared_head.features": HeadCase(x, np.zeros((3, 6), np.int8), np.ones(3, np.float32), 8),
        "shared_head.groups": HeadCase(x, np.zeros((3, 8), np.int8), np.ones((3, 3), np.float32), 8),
        "shared_head.bits": HeadCase(x, np.zeros((3, 8), np.int8), np.ones(3, np.float32), 2),
        "shared_head.scales": HeadCase(x, np.zeros((3, 8), np.int8), np.ones(4, np.float32), 8),
    }
    outputs, _ = run_check(kernel_check, tmp_path, cases)
    for name in cases:
        assert outputs[f"{name}.status"] == INVALID_ARGUMENT, name
