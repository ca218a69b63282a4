"""Fuzzing the parsers that read what a board sends (tests/*/test_fuzz_*.py): the settings and the byte mutations they
share.

Random bytes and mutations of valid seeds (bit flips, truncations, inserted and deleted ranges, header fields
overwritten) must end in our own error types, never another exception, a hang, or a file outside the destination.

Runs are reproducible and short: examples are derandomized and no example database is kept. There is no
per-example deadline (a busy CI machine must not make a test flaky); pytest-timeout stops a hung test instead.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence

import pytest
from hypothesis import settings
from hypothesis import strategies as st

FUZZ = settings(
    max_examples=200,
    derandomize=True,
    database=None,
    deadline=None,
)
# A hung example fails the test through pytest-timeout (generous: this bounds hangs, it does not time anything).
# Each fuzz module sets `pytestmark = FUZZ_TIMEOUT`.
FUZZ_TIMEOUT = pytest.mark.timeout(300)

# ---------------------------------------------------------------------------------------------------------------
# Mutations, described independently of the seed so hypothesis can shrink them; positions wrap around its length.

INTERESTING_U32 = [0, 1, 2, 3, 4, 7, 8, 0x7F, 0x80, 0xFF, 0xFFFF, 0x7FFFFFFF, 0x80000000, 0xFFFFFFFC, 0xFFFFFFFF]

mutation = st.one_of(
    st.tuples(st.just("flip"), st.integers(0, 1 << 24), st.integers(0, 7)),
    st.tuples(st.just("truncate"), st.integers(0, 1 << 24)),
    st.tuples(st.just("insert"), st.integers(0, 1 << 24), st.binary(min_size=1, max_size=64)),
    st.tuples(st.just("delete"), st.integers(0, 1 << 24), st.integers(1, 2048)),
    st.tuples(st.just("overwrite"), st.integers(0, 1 << 24), st.binary(min_size=1, max_size=16)),
    st.tuples(st.just("word"), st.integers(0, 1 << 24), st.sampled_from(INTERESTING_U32)),
)
mutations = st.lists(mutation, min_size=1, max_size=4)


def mutate(seed: bytes, operations: Sequence[tuple]) -> bytes:
    data = bytearray(seed)
    for kind, position, *args in operations:
        at = position % (len(data) + 1)
        if kind == "flip" and at < len(data):
            data[at] ^= 1 << args[0]
        elif kind == "truncate":
            del data[at:]
        elif kind == "insert":
            data[at:at] = args[0]
        elif kind == "delete":
            del data[at : at + args[0]]
        elif kind == "overwrite":
            data[at : at + len(args[0])] = args[0]
        elif kind == "word":
            at -= at % 4  # flatbuffer offsets and counts are 4-aligned in an honest file
            data[at : at + 4] = struct.pack("<I", args[0])
    return bytes(data)
