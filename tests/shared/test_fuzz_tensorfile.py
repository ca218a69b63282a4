"""Fuzzing the ETLT tensor file reader (tensorfile.py): random bytes, mutations and lying header fields end in a
TensorFileError, never another exception or a huge allocation.

Settings and mutations: tests/plugins/fuzz.py.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest
from hypothesis import event, example, given
from hypothesis import strategies as st

from orchestrator.tensorfile import DTYPE_CODES, MAGIC, NamedTensor, TensorFileError, read_tensors, write_tensors
from tests.plugins.fuzz import FUZZ, FUZZ_TIMEOUT, mutate, mutations

pytestmark = FUZZ_TIMEOUT


def etlt_seed(folder: Path) -> bytes:
    tensors = [
        NamedTensor("input_ids", np.arange(8, dtype=np.int64).reshape(1, 8)),
        NamedTensor("mask", np.ones((1, 8), dtype=np.bool_)),
        NamedTensor("logits", np.linspace(-1, 1, 12, dtype=np.float32).reshape(2, 3, 2)),
        NamedTensor("half", np.zeros((2, 2), dtype=np.float16)),
        NamedTensor("scalar", np.array(3.5, dtype=np.float64)),
        NamedTensor("empty-é", np.zeros((0, 4), dtype=np.uint8)),
    ]
    path = folder / "seed.etlt"
    write_tensors(path, tensors)
    return path.read_bytes()


@pytest.fixture(scope="module")
def etlt_folder(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, bytes]:
    folder = tmp_path_factory.mktemp("etlt")
    seed = etlt_seed(folder)
    assert [t.shape for t in read_tensors(folder / "seed.etlt")][2] == [2, 3, 2]
    return folder, seed


def check_etlt(folder: Path, data: bytes) -> None:
    """read_tensors gives consistent tensors or TensorFileError; what it accepts survives a write and re-read."""
    path = folder / "fuzz.etlt"
    path.write_bytes(data)
    try:
        tensors = read_tensors(path)
    except TensorFileError:
        event("etlt: refused")
        return
    event("etlt: accepted")
    for tensor in tensors:
        assert all(dim >= 0 for dim in tensor.shape)
        assert tensor.array.size == math.prod(tensor.shape)
    write_tensors(path, tensors)
    again = read_tensors(path)
    assert [(t.shape, t.dtype) for t in again] == [(t.shape, t.dtype) for t in tensors]


def etlt_bytes(tensors: Sequence[tuple[bytes, int, Sequence[int], int, bytes]], count: int | None = None) -> bytes:
    """An ETLT file written field by field, so every field can lie: (name, dtype code, dims, nbytes, data)."""
    out = bytearray(MAGIC + struct.pack("<I", len(tensors) if count is None else count))
    for name, code, dims, nbytes, data in tensors:
        out += struct.pack("<H", len(name)) + name + struct.pack("<BB", code, len(dims))
        out += struct.pack(f"<{len(dims)}q", *dims) + struct.pack("<Q", nbytes) + data
    return bytes(out)


INT64 = st.one_of(st.integers(-(1 << 63), (1 << 63) - 1), st.sampled_from([-1, -2, 0, 1, 2, 3, 1 << 32, 1 << 62]))
etlt_tensor = st.tuples(
    st.binary(max_size=8),
    st.sampled_from([*DTYPE_CODES.values(), 8, 255]),
    st.lists(INT64, max_size=4) | st.lists(st.just(1), min_size=60, max_size=70),
    st.one_of(st.integers(0, 64), st.sampled_from([(1 << 64) - 1, 1 << 63])),
    st.binary(max_size=64),
)

# Regressions: negative dims made numpy read "the rest of the buffer" or fail with ValueError; a huge dim product
# asked numpy for more than the file holds; more than 64 dims failed in reshape.
NEGATIVE_DIMS = etlt_bytes([(b"t", DTYPE_CODES["float32"], [-2], 8, bytes(8))])
MINUS_ONE_DIM = etlt_bytes([(b"t", DTYPE_CODES["float32"], [-1], 8, bytes(8))])
HUGE_DIMS = etlt_bytes([(b"t", DTYPE_CODES["uint8"], [1 << 40], 4, bytes(4))])
OVERFLOW_DIMS = etlt_bytes([(b"t", DTYPE_CODES["uint8"], [1 << 62, 8], 0, b"")])
ZERO_AND_HUGE = etlt_bytes([(b"t", DTYPE_CODES["uint8"], [0, 1 << 62, 1 << 62], 0, b"")])
TOO_MANY_DIMS = etlt_bytes([(b"t", DTYPE_CODES["uint8"], [1] * 70, 1, b"\0")])


@FUZZ
@given(data=st.binary(max_size=256))
@example(data=NEGATIVE_DIMS)
@example(data=MINUS_ONE_DIM)
@example(data=HUGE_DIMS)
@example(data=OVERFLOW_DIMS)
@example(data=ZERO_AND_HUGE)
@example(data=TOO_MANY_DIMS)
def test_etlt_from_random_bytes(etlt_folder: tuple[Path, bytes], data: bytes) -> None:
    check_etlt(etlt_folder[0], data)
    check_etlt(etlt_folder[0], MAGIC + data)


@FUZZ
@given(operations=mutations)
def test_etlt_mutated(etlt_folder: tuple[Path, bytes], operations: list[tuple]) -> None:
    folder, seed = etlt_folder
    check_etlt(folder, mutate(seed, operations))


@FUZZ
@given(tensors=st.lists(etlt_tensor, max_size=3), count=st.none() | st.sampled_from([0, 5, 0xFFFFFFFF]))
def test_etlt_with_lying_fields(
    etlt_folder: tuple[Path, bytes], tensors: list[tuple[bytes, int, list[int], int, bytes]], count: int | None
) -> None:
    check_etlt(etlt_folder[0], etlt_bytes(tensors, count))


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (NEGATIVE_DIMS, "negative"),
        (MINUS_ONE_DIM, "negative"),
        (HUGE_DIMS, "bytes for shape"),
        (OVERFLOW_DIMS, "bytes for shape"),
        (ZERO_AND_HUGE, "impossible shape"),
        (TOO_MANY_DIMS, "impossible shape"),
    ],
    ids=["negative", "minus-one", "huge", "overflow", "zero-and-huge", "too-many-dims"],
)
def test_the_etlt_regressions_give_clear_errors(tmp_path: Path, data: bytes, message: str) -> None:
    path = tmp_path / "bad.etlt"
    path.write_bytes(data)
    with pytest.raises(TensorFileError, match=message):
        read_tensors(path)
