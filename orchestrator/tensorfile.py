"""The ETLT tensor file: how reference inputs, eager outputs and board outputs travel.

The native runner reads and writes the same format (board/runner/src/tensor_file.*), so it is kept
trivially simple: little-endian, no alignment, no compression.

    magic     8 bytes  b"ETLTENS1"
    count     u32
    per tensor:
      name_len  u16, name (utf-8)
      dtype     u8   ExecuTorch ScalarType code (see DTYPE_CODES)
      ndim      u8
      dims      i64 * ndim
      nbytes    u64
      data      nbytes, C-contiguous
"""

from __future__ import annotations

import math
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from orchestrator.errors import EtlabError
from orchestrator.fsutil import atomic_path

MAGIC = b"ETLTENS1"

# ExecuTorch ScalarType codes for the dtypes transformers exchange.
DTYPE_CODES: dict[str, int] = {
    "uint8": 0,
    "int8": 1,
    "int16": 2,
    "int32": 3,
    "int64": 4,
    "float16": 5,
    "float32": 6,
    "float64": 7,
    "bool": 11,
}
CODE_DTYPES = {code: name for name, code in DTYPE_CODES.items()}


class TensorFileError(EtlabError):
    """A tensor file is truncated, has a bad magic, or an unknown dtype."""


@dataclass(frozen=True)
class NamedTensor:
    name: str
    array: np.ndarray

    @property
    def dtype(self) -> str:
        return str(self.array.dtype)

    @property
    def shape(self) -> list[int]:
        return list(self.array.shape)


def write_tensors(path: Path, tensors: Sequence[NamedTensor]) -> None:
    """Write atomically: a reader never sees a half-written file. Identical content is left untouched."""
    with atomic_path(Path(path), keep_identical=True) as tmp, open(tmp, "wb") as out:
        out.write(MAGIC)
        out.write(struct.pack("<I", len(tensors)))
        for tensor in tensors:
            array = np.ascontiguousarray(tensor.array)
            dtype = str(array.dtype)
            if dtype not in DTYPE_CODES:
                raise TensorFileError(f"tensor {tensor.name!r}: dtype {dtype} cannot be stored")
            name = tensor.name.encode()
            out.write(struct.pack("<H", len(name)) + name)
            out.write(struct.pack("<BB", DTYPE_CODES[dtype], array.ndim))
            out.write(struct.pack(f"<{array.ndim}q", *array.shape))
            out.write(struct.pack("<Q", array.nbytes))
            out.write(array.tobytes())


def read_tensors(path: Path) -> list[NamedTensor]:
    data = Path(path).read_bytes()
    where = f"tensor file {path}"
    if data[:8] != MAGIC:
        raise TensorFileError(f"{where}: not an ETLT file (bad magic)")
    offset = 8

    def take(fmt: str) -> tuple:
        nonlocal offset
        size = struct.calcsize(fmt)
        if offset + size > len(data):
            raise TensorFileError(f"{where}: truncated at byte {offset}")
        values = struct.unpack_from(fmt, data, offset)
        offset += size
        return values

    (count,) = take("<I")
    tensors = []
    for index in range(count):
        (name_len,) = take("<H")
        name = data[offset : offset + name_len].decode(errors="replace")
        offset += name_len
        code, ndim = take("<BB")
        if code not in CODE_DTYPES:
            raise TensorFileError(f"{where}: tensor {index} has unknown dtype code {code}")
        dims = take(f"<{ndim}q")
        (nbytes,) = take("<Q")
        if any(dim < 0 for dim in dims):
            raise TensorFileError(f"{where}: tensor {name!r} has a negative dimension in shape {list(dims)}")
        if offset + nbytes > len(data):
            raise TensorFileError(f"{where}: tensor {name!r} truncated")
        itemsize = np.dtype(CODE_DTYPES[code]).itemsize
        if math.prod(dims) * itemsize != nbytes:  # Python ints: a product that overflows int64 cannot match
            raise TensorFileError(f"{where}: tensor {name!r} has {nbytes} bytes for shape {list(dims)}")
        array = np.frombuffer(data, dtype=CODE_DTYPES[code], count=nbytes // itemsize, offset=offset)
        try:
            tensors.append(NamedTensor(name, array.reshape(dims).copy()))
        except ValueError as exc:  # more dimensions than numpy holds, or an empty tensor too big to index
            raise TensorFileError(f"{where}: tensor {name!r} has an impossible shape {list(dims)}: {exc}") from None
        offset += nbytes
    return tensors


def describe(tensors: Sequence[NamedTensor]) -> list[dict]:
    """Names, shapes and dtypes, as recorded in sidecars."""
    return [{"name": t.name, "shape": t.shape, "dtype": t.dtype} for t in tensors]
