"""Fuzzing the tar stream reader and the extraction rules (transport/tarstream.py, transport/pull.py): random bytes,
mutated archives and hostile members end in TarFormatError or BundleError, never a file outside the destination.

Settings and mutations: tests/plugins/fuzz.py.
"""

from __future__ import annotations

import io
import os
import tarfile
import tempfile
from collections.abc import Sequence
from pathlib import Path

import pytest
from hypothesis import event, example, given
from hypothesis import strategies as st

from orchestrator.errors import BundleError
from orchestrator.transport.pull import extract_tar_stream
from orchestrator.transport.tarstream import BLOCK, TarFormatError, TarReader
from tests.plugins.fuzz import FUZZ, FUZZ_TIMEOUT, mutate, mutations
from tests.transport.test_tarstream import Trickle

pytestmark = FUZZ_TIMEOUT


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
    members: list[tarfile.TarInfo | tuple[tarfile.TarInfo, bytes]] = [
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
