"""Fuzzing the parsers that read what a board sends: tar streams, bundle manifests, ETLT tensor files, ETDumps.

Random bytes and mutations of valid seeds (bit flips, truncations, inserted and deleted ranges, header fields
overwritten) must end in our own error types, never another exception, a hang, or a file outside the destination.

Runs are reproducible and short: examples are derandomized and no example database is kept. There is no
per-example deadline (a busy CI machine must not make a test flaky); pytest-timeout stops a hung test instead.
"""

from __future__ import annotations

import io
import json
import math
import os
import re
import struct
import tarfile
import tempfile
from collections.abc import Sequence
from pathlib import Path

import flatbuffers
import numpy as np
import pytest
from hypothesis import event, example, given, settings
from hypothesis import strategies as st

from orchestrator.errors import AnalysisError, BundleError
from orchestrator.lowering.variants import VARIANTS
from orchestrator.results.bundle import MANIFEST, verify_bundle
from orchestrator.results.etdump import Etdump, parse_etdump
from orchestrator.tensorfile import DTYPE_CODES, MAGIC, NamedTensor, TensorFileError, read_tensors, write_tensors
from orchestrator.transport.pull import extract_tar_stream
from orchestrator.transport.tarstream import BLOCK, TarFormatError, TarReader
from tests.transport.test_tarstream import Trickle

FUZZ = settings(
    max_examples=200,
    derandomize=True,
    database=None,
    deadline=None,
)
# A hung example fails the test through pytest-timeout (generous: this bounds hangs, it does not time anything).
pytestmark = pytest.mark.timeout(300)

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


# ---------------------------------------------------------------------------------------------------------------
# Tar stream reader and the extraction rules


def _tar(members: Sequence[tarfile.TarInfo | tuple[tarfile.TarInfo, bytes]], tar_format: int) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tar_format) as archive:
        for member in members:
            info, body = member if isinstance(member, tuple) else (member, None)
            archive.addfile(info, io.BytesIO(body) if body is not None else None)
    return buffer.getvalue()


def _file(name: str, body: bytes, **pax: str) -> tuple[tarfile.TarInfo, bytes]:
    info = tarfile.TarInfo(name)
    info.size = len(body)
    info.pax_headers = dict(pax)
    return info, body


def _entry(name: str, kind: bytes, linkname: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.linkname = kind, linkname
    return info


def tar_seeds() -> list[bytes]:
    """Valid archives by Python's tarfile: folders, files, long names (GNU `L` and pax), a pax size and comment."""
    members = [
        _entry("./", tarfile.DIRTYPE),
        _file("./result_manifest.json", b'{"schema": 1, "files": {}}\n'),
        _file("./timings.json", b"{}" * 300),
        _entry("./sub", tarfile.DIRTYPE),
        _file("./sub/" + "n" * 150 + ".bin", bytes(range(256)) * 3),
        _file("./" + "d" * 120 + "/" + "e" * 90, b"deep"),
        _file("./utf8-é.txt", "é".encode(), comment="pax comment"),
        _file("./empty", b""),
    ]
    return [
        _tar(members, tarfile.PAX_FORMAT),
        _tar(members, tarfile.GNU_FORMAT),
        _tar(members[:4], tarfile.USTAR_FORMAT),
    ]


TAR_SEEDS = tar_seeds()


def fix_checksums(data: bytes) -> bytes:
    """Recompute the checksum of every header-looking block, so mutations get past the checksum check."""
    out = bytearray(data)
    for at in range(0, len(out) - BLOCK + 1, BLOCK):
        if out[at + 257 : at + 262] == b"ustar":
            out[at + 148 : at + 156] = b" " * 8
            out[at + 148 : at + 156] = b"%06o\0 " % sum(out[at : at + BLOCK])
    return bytes(out)


# (offset, width) of the ustar header fields a hostile board would play with
TAR_FIELDS = {
    "name": (0, 100),
    "mode": (100, 8),
    "size": (124, 12),
    "checksum": (148, 8),
    "type": (156, 1),
    "linkname": (157, 100),
    "magic": (257, 8),
    "prefix": (345, 155),
}
TAR_VALUES = st.one_of(
    st.binary(max_size=12),
    st.sampled_from(
        [
            b"-1",
            b"-0000001000",
            b"77777777777",
            b"0o17",
            b"1_0",
            b"+12",
            b" 12 ",
            b"99",
            b"\x80" + bytes(10) + b"\x01",
            b"\x80" + b"\xff" * 11,
            b"\xff" * 12,
            b"\xfe" + b"\xff" * 11,
            b"0",
            b"1",
            b"2",
            b"3",
            b"4",
            b"5",
            b"6",
            b"7",
            b"L",
            b"K",
            b"x",
            b"g",
            b"V",
            b"\0",
            b"../../escape",
            b"/etc/passwd",
            b"a/../../b",
            b"..",
            b".",
            b"",
            b"ustar\x0000",
            b"ustar  \0",
        ]
    ),
)
tar_field_edit = st.tuples(st.integers(0, 1 << 16), st.sampled_from(sorted(TAR_FIELDS)), TAR_VALUES)

PAX_VALUES = st.sampled_from(
    ["-1", "-4096", "1e9", "0x10", "99999999999999999999", "1" * 5000, "", " 7", "../up", "/abs", "a\0b", "é" * 200]
)
# Names built from these parts cover traversal, absolute paths, NUL, very long components and odd bytes.
NAME_PARTS = st.sampled_from(["a", "b", ".", "..", "", "x" * 300, "é", "\udcff", "a\0b", "/", "c" * 100])
member_spec = st.tuples(
    st.lists(NAME_PARTS, min_size=1, max_size=4).map("/".join),
    st.sampled_from(
        [tarfile.REGTYPE, tarfile.DIRTYPE, tarfile.SYMTYPE, tarfile.LNKTYPE, tarfile.CHRTYPE, tarfile.FIFOTYPE]
    ),
    st.binary(max_size=600),
    st.dictionaries(st.sampled_from(["path", "linkpath", "size", "comment"]), PAX_VALUES, max_size=2),
)


def built_tar(specs: Sequence[tuple[str, bytes, bytes, dict[str, str]]], tar_format: int) -> bytes | None:
    """An archive tarfile writes from hostile member descriptions, or None when tarfile itself refuses them."""
    members: list[tarfile.TarInfo | tuple[tarfile.TarInfo, bytes]] = []
    for name, kind, body, pax in specs:
        info = tarfile.TarInfo(name)
        info.type = kind
        info.linkname = "../target" if kind in (tarfile.SYMTYPE, tarfile.LNKTYPE) else ""
        info.pax_headers = dict(pax) if tar_format == tarfile.PAX_FORMAT else {}
        if kind == tarfile.REGTYPE:
            info.size = len(body)
            members.append((info, body))
        else:
            members.append(info)
    try:
        return _tar(members, tar_format)
    except (ValueError, UnicodeError):
        return None


def negative_size_tar() -> bytes:
    """A file member whose octal size is "-1": the reader once asked the stream for read(-1), i.e. everything."""
    data = bytearray(TAR_SEEDS[2])
    data[BLOCK + 124 : BLOCK + 136] = b"-1".ljust(12, b"\0")  # the second member: result_manifest.json
    return fix_checksums(bytes(data))


def negative_pax_size_tar() -> bytes:
    return _tar([_file("f.bin", b"abc", size="-1")], tarfile.PAX_FORMAT)


def long_component_tar() -> bytes:
    """A member name with a 300-byte component: the file system refuses it (ENAMETOOLONG), which escaped as OSError."""
    return _tar([_file("x" * 300, b"data")], tarfile.PAX_FORMAT)


def long_folder_tar() -> bytes:
    return _tar([_entry("y" * 300, tarfile.DIRTYPE)], tarfile.GNU_FORMAT)


def read_whole(data: bytes, step: int | None) -> None:
    """Read every member and its data with TarReader: TarFormatError is the only acceptable failure."""
    stream = io.BytesIO(data) if step is None else Trickle(data, step)
    reader = TarReader(stream)  # type: ignore[arg-type]
    try:
        for member in reader:
            assert member.size >= 0
            got = sum(len(chunk) for chunk in reader.chunks())
            assert got == member.size or member.kind != "file"
    except TarFormatError:
        event("tar: refused")
        return
    event("tar: read")


def extract_and_check(data: bytes) -> None:
    """Unpack into a fresh destination; only BundleError may come out, and nothing may appear outside it."""
    with tempfile.TemporaryDirectory(prefix="etlab-fuzz-") as tmp:
        root = Path(tmp)
        dest, sentinel = root / "outer" / "dest", root / "sentinel"
        dest.mkdir(parents=True)
        sentinel.mkdir()
        digests = None
        try:
            digests = extract_tar_stream(io.BytesIO(data), dest)
            event("extraction: unpacked")
        except BundleError:
            event("extraction: refused")
        assert list(sentinel.iterdir()) == []
        for folder, dirs, files in os.walk(root):
            for entry in (Path(folder) / name for name in (*dirs, *files)):
                assert not entry.is_symlink(), f"a symlink was created: {entry}"
                assert entry in (root / "outer", dest, sentinel) or dest in entry.parents, f"written outside: {entry}"
                assert entry.is_dir() or entry.is_file(), f"special file created: {entry}"
        if digests is not None:
            for name, digest in digests.items():
                assert (dest / name).is_file() and (dest / name).stat().st_size == digest.size


@FUZZ
@given(data=st.binary(max_size=3 * BLOCK), step=st.sampled_from([None, 1, 100]))
@example(data=negative_size_tar(), step=None)
@example(data=negative_pax_size_tar(), step=None)
def test_tar_reader_on_random_bytes(data: bytes, step: int | None) -> None:
    read_whole(data, step)
    read_whole(fix_checksums(data), step)


@FUZZ
@given(
    seed=st.sampled_from(range(len(TAR_SEEDS))),
    operations=mutations,
    edits=st.lists(tar_field_edit, max_size=3),
    checksums=st.booleans(),
    step=st.sampled_from([None, 7, 512]),
)
def test_tar_reader_on_mutated_archives(
    seed: int, operations: list[tuple], edits: list[tuple], checksums: bool, step: int | None
) -> None:
    data = mutate(TAR_SEEDS[seed], operations)
    data = overwrite_tar_fields(data, edits)
    read_whole(fix_checksums(data) if checksums else data, step)


def overwrite_tar_fields(data: bytes, edits: Sequence[tuple[int, str, bytes]]) -> bytes:
    headers = [at for at in range(0, len(data) - BLOCK + 1, BLOCK) if data[at + 257 : at + 262] == b"ustar"]
    out = bytearray(data)
    for index, field, value in edits:
        if headers:
            offset, width = TAR_FIELDS[field]
            at = headers[index % len(headers)] + offset
            out[at : at + width] = value[:width].ljust(width, b"\0")
    return bytes(out)


@FUZZ
@given(
    seed=st.sampled_from(range(len(TAR_SEEDS))),
    operations=mutations,
    edits=st.lists(tar_field_edit, max_size=3),
    checksums=st.booleans(),
)
@example(seed=0, operations=[("insert", 0, b"")], edits=[], checksums=False)  # the pristine seed unpacks
@example(seed=2, operations=[], edits=[(0, "name", b"../../escape")], checksums=True)
@example(seed=2, operations=[], edits=[(1, "type", b"2"), (1, "linkname", b"/etc")], checksums=True)
def test_extraction_of_mutated_archives_stays_inside(
    seed: int, operations: list[tuple], edits: list[tuple], checksums: bool
) -> None:
    data = overwrite_tar_fields(mutate(TAR_SEEDS[seed], operations), edits)
    extract_and_check(fix_checksums(data) if checksums else data)


@FUZZ
@given(
    specs=st.lists(member_spec, min_size=1, max_size=5),
    tar_format=st.sampled_from([tarfile.PAX_FORMAT, tarfile.GNU_FORMAT]),
)
def test_extraction_of_hostile_members_stays_inside(
    specs: list[tuple[str, bytes, bytes, dict[str, str]]], tar_format: int
) -> None:
    data = built_tar(specs, tar_format)
    if data is not None:
        extract_and_check(data)


@FUZZ
@given(data=st.binary(max_size=4 * BLOCK))
@example(data=long_component_tar())
@example(data=long_folder_tar())
@example(data=negative_size_tar())
def test_extraction_of_random_bytes_stays_inside(data: bytes) -> None:
    extract_and_check(data)
    extract_and_check(fix_checksums(data))


def test_the_tar_regressions_give_clear_errors() -> None:
    """Each bug fuzzing found, with the message a user now sees."""
    for data in (negative_size_tar(), negative_pax_size_tar()):
        with pytest.raises(TarFormatError, match=r"invalid (pax )?size"):
            read_whole_strict(data)
    for data in (long_component_tar(), long_folder_tar()):
        with tempfile.TemporaryDirectory() as tmp, pytest.raises(BundleError, match="cannot"):
            extract_tar_stream(io.BytesIO(data), Path(tmp))
    with tempfile.TemporaryDirectory() as tmp:
        digests = extract_tar_stream(io.BytesIO(TAR_SEEDS[0]), Path(tmp))
        assert {"result_manifest.json", "timings.json", "empty", "utf8-é.txt"} <= set(digests)


def read_whole_strict(data: bytes) -> None:
    reader = TarReader(io.BytesIO(data))
    for _member in reader:
        for _chunk in reader.chunks():
            pass


# ---------------------------------------------------------------------------------------------------------------
# Bundle manifest


def manifest_folder(root: Path) -> tuple[Path, bytes]:
    """A bundle folder with real files and the manifest the agent writes for them; returns it and the manifest."""
    folder = root / "bundle"
    folder.mkdir()
    (folder / "timings.json").write_text(json.dumps({"iterations_ms": [1.5, 2.5]}))
    (folder / "runner.log").write_text("ok\n")
    write_tensors(folder / "outputs.etlt", [NamedTensor("output_0", np.arange(6, dtype=np.float32))])
    from orchestrator.results.bundle import file_digest

    files = {}
    for path in sorted(folder.iterdir()):
        digest = file_digest(path)
        files[path.name] = {"sha256": digest.sha256, "size": digest.size}
    manifest = {
        "schema": 1,
        "run_id": "20260101-000000-abcdef",
        "status": "ok",
        "error": None,
        "runner_exit_code": 0,
        "model_sha256": "0" * 64,
        "agent_version": "test",
        "created_at": "2026-01-01T00:00:00Z",
        "files": files,
    }
    text = json.dumps(manifest, indent=2).encode()
    (folder / MANIFEST).write_bytes(text)
    return folder, text


@pytest.fixture(scope="module")
def manifest_seed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, bytes]:
    folder, text = manifest_folder(tmp_path_factory.mktemp("manifest"))
    assert verify_bundle(folder)["status"] == "ok"  # the seed is valid
    return folder, text


def check_manifest(folder: Path, text: bytes) -> None:
    """verify_bundle on a folder whose manifest is `text`: a manifest dict or BundleError, nothing else."""
    (folder / MANIFEST).write_bytes(text)
    try:
        manifest = verify_bundle(folder)
    except BundleError:
        event("manifest: refused")
        return
    event("manifest: accepted")
    assert isinstance(manifest, dict)
    listed = set(manifest["files"])
    assert listed | {MANIFEST} >= {"timings.json", "runner.log", "outputs.etlt"}


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4),
    max_leaves=12,
)
MANIFEST_KEYS = st.sampled_from(["schema", "files", "run_id", "status", "size", "sha256", "timings.json", "x"])


@FUZZ
@given(data=st.binary(max_size=512))
@example(data=b"[" * 100_000)  # RecursionError escaped from json.loads
@example(data=b'{"schema": ' + b"1" * 5000 + b"}")  # ValueError (integer string too long) escaped
@example(data=b'{"files": {"a": {"sha256": "x", "size": ' + b"9" * 5000 + b"}}}")
def test_manifest_from_random_bytes(manifest_seed: tuple[Path, bytes], data: bytes) -> None:
    check_manifest(manifest_seed[0], data)


@FUZZ
@given(operations=mutations)
def test_manifest_mutated_bytes(manifest_seed: tuple[Path, bytes], operations: list[tuple]) -> None:
    folder, seed = manifest_seed
    check_manifest(folder, mutate(seed, operations))


@FUZZ
@given(
    path=st.lists(st.one_of(MANIFEST_KEYS, st.text(max_size=8)), min_size=0, max_size=3),
    value=json_values,
)
def test_manifest_with_replaced_values(manifest_seed: tuple[Path, bytes], path: list[str], value: object) -> None:
    """Valid JSON with one subtree replaced (the document, a field, a file entry or a nested field of one)."""
    folder, seed = manifest_seed
    document: object = json.loads(seed)
    if not path:
        document = value
    else:
        target = document
        for key in path[:-1]:
            target = target.get(key) if isinstance(target, dict) else None
        if isinstance(target, dict):
            target[path[-1]] = value
    check_manifest(folder, json.dumps(document).encode())


def test_the_manifest_regressions_give_clear_errors(manifest_seed: tuple[Path, bytes]) -> None:
    folder, seed = manifest_seed
    try:
        for text in (b"[" * 100_000, b'{"schema": ' + b"1" * 5000 + b"}"):
            (folder / MANIFEST).write_bytes(text)
            with pytest.raises(BundleError, match="not valid JSON"):
                verify_bundle(folder)
    finally:
        (folder / MANIFEST).write_bytes(seed)


# ---------------------------------------------------------------------------------------------------------------
# ETLT tensor files


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


# ---------------------------------------------------------------------------------------------------------------
# ETDump reader


def crafted_etdump(runs: int, events: int) -> bytes:
    """A size-prefixed ETDump whose `runs` run-data entries all share one run with `events` events, all the same
    event: a small file that describes runs * events events."""
    builder = flatbuffers.Builder(1024)
    name = builder.CreateString("OPERATOR_CALL")
    builder.StartObject(8)  # ProfileEvent
    builder.PrependUOffsetTRelativeSlot(0, name, 0)
    builder.PrependInt32Slot(1, 0, 0)
    builder.PrependInt32Slot(2, 1, -1)
    builder.PrependInt64Slot(6, 10, 0)
    builder.PrependInt64Slot(7, 25, 0)
    profile = builder.EndObject()
    builder.StartObject(3)  # Event
    builder.PrependUOffsetTRelativeSlot(0, profile, 0)
    event = builder.EndObject()
    builder.StartVector(4, events, 4)
    for _ in range(events):
        builder.PrependUOffsetTRelative(event)
    event_vector = builder.EndVector()
    run_name = builder.CreateString("Execute")
    builder.StartObject(4)  # RunData
    builder.PrependUOffsetTRelativeSlot(0, run_name, 0)
    builder.PrependUOffsetTRelativeSlot(3, event_vector, 0)
    run = builder.EndObject()
    builder.StartVector(4, runs, 4)
    for _ in range(runs):
        builder.PrependUOffsetTRelative(run)
    run_vector = builder.EndVector()
    builder.StartObject(2)  # ETDump
    builder.PrependUint32Slot(0, 0, 0)
    builder.PrependUOffsetTRelativeSlot(1, run_vector, 0)
    root = builder.EndObject()
    builder.FinishSizePrefixed(root, file_identifier=b"ED00")
    return bytes(builder.Output())


# 3000 runs sharing one 3000-event run: 9 million events from a 24 KB file (a hang, or memory exhausted, as the
# counts grow); an honest ETDump has at most one 4-byte vector entry per event.
AMPLIFIED_ETDUMP = crafted_etdump(3000, 3000)


@pytest.fixture(scope="module")
def etdump_seed(tiny_artifacts: dict, tmp_path_factory: pytest.TempPathFactory) -> bytes:
    """A real ETDump: the tiny DistilBERT (XNNPACK, so delegate events too) run once by ExecuTorch's runtime."""
    import torch
    from executorch.runtime import Runtime

    result = tiny_artifacts["distilbert-tiny"]
    inputs = [torch.from_numpy(tensor.array) for tensor in read_tensors(result.paths.reference_inputs)]
    folder = tmp_path_factory.mktemp("etdump")
    program = Runtime.get().load_program(result.paths.pte(VARIANTS["xnnpack"]), enable_etdump=True, debug_buffer_size=0)
    program.load_method("forward").execute(inputs)
    program.write_etdump_result_to_file(str(folder / "etdump.etdp"), str(folder / "debug.bin"))
    data = (folder / "etdump.etdp").read_bytes()
    parsed = parse_etdump(data)
    assert [block.name for block in parsed.blocks] == ["Default", "Execute"]
    assert any(name is not None for name in parsed.blocks[1].delegate_names)
    return data


def check_etdump(data: bytes) -> None:
    """parse_etdump gives a consistent Etdump or AnalysisError, nothing else."""
    try:
        etdump = parse_etdump(data)
    except AnalysisError as exc:
        event(f"etdump: refused ({re.sub(r'[0-9]+', 'N', str(exc).split(': ', 1)[1])[:30]})")
        return
    event("etdump: parsed")
    assert isinstance(etdump, Etdump)
    # every event has its own 4-byte entry in a vector: a file cannot describe more events than that
    assert sum(len(block) for block in etdump.blocks) * 4 <= len(data)
    for block in etdump.blocks:
        columns = (block.chain, block.instruction, block.start, block.end)
        assert all(len(column) == len(block) for column in columns)
        assert len(block.delegate_names) == len(block)
        assert block.debug_events >= 0
        block.durations  # noqa: B018 - computing it must not fail either


@FUZZ
@given(data=st.binary(max_size=512))
@example(data=AMPLIFIED_ETDUMP)
def test_etdump_from_random_bytes(data: bytes) -> None:
    check_etdump(data)
    check_etdump(struct.pack("<I", len(data) + 4) + b"\0\0\0\0ED00" + data)  # past the identifier check
    check_etdump(b"\x08\0\0\0ED00" + data)


@FUZZ
@given(operations=mutations, form=st.sampled_from(["prefixed", "plain", "prefix fixed"]))
def test_etdump_mutated(etdump_seed: bytes, operations: list[tuple], form: str) -> None:
    data = mutate(etdump_seed[4:] if form == "plain" else etdump_seed, operations)
    if form == "prefix fixed" and len(data) >= 4:  # past the size check, into the structure
        data = struct.pack("<I", len(data) - 4) + data[4:]
    check_etdump(data)


def test_the_etdump_regressions_give_clear_errors() -> None:
    honest = parse_etdump(crafted_etdump(2, 3))  # the crafting is sound: small counts parse
    assert [len(block) for block in honest.blocks] == [3, 3]
    with pytest.raises(AnalysisError, match="more events than"):
        parse_etdump(AMPLIFIED_ETDUMP)
