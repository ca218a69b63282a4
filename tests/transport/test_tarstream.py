"""The streaming tar reader against archives written by GNU tar and by Python, and against broken ones."""

from __future__ import annotations

import io
import os
import subprocess
import tarfile
from pathlib import Path

import pytest

from orchestrator.transport.tarstream import BLOCK, Member, TarFormatError, TarReader, _number

LONG_FOLDER = "f" * 120 + "/" + "g" * 120  # needs the ustar prefix or a long-name extension
LONG_NAME = "n" * 150 + ".bin"  # longer than ustar's 100-byte name field even with a prefix


class Trickle(io.RawIOBase):
    """A stream that returns at most `step` bytes per read, as a slow socket does."""

    def __init__(self, data: bytes, step: int) -> None:
        self._data, self._position, self._step = data, 0, step

    def readable(self) -> bool:
        return True

    def read(self, size: int = -1) -> bytes:
        size = self._step if size < 0 else min(size, self._step)
        chunk = self._data[self._position : self._position + size]
        self._position += len(chunk)
        return chunk


def read_all(stream: io.RawIOBase | io.BytesIO) -> list[tuple[Member, bytes]]:
    reader = TarReader(stream)  # type: ignore[arg-type]
    return [(member, b"".join(reader.chunks())) for member in reader]


def make_tree(root: Path) -> dict[str, bytes]:
    files = {
        "small.txt": b"hello\n",
        "empty.bin": b"",
        "exact.bin": os.urandom(BLOCK * 3),
        f"{LONG_FOLDER}/deep.bin": os.urandom(70_001),
        f"sub/{LONG_NAME}": os.urandom(1234),
        "utf8-é.txt": "é".encode(),
    }
    for name, data in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(data)
    return files


@pytest.mark.parametrize("tar_format", ["gnu", "posix", "oldgnu"])
def test_gnu_tar_archives_round_trip(tmp_path: Path, tar_format: str) -> None:
    tree = tmp_path / "tree"
    tree.mkdir()
    files = make_tree(tree)
    data = subprocess.run(
        ["tar", f"--format={tar_format}", "-C", str(tree), "-cf", "-", "."], check=True, capture_output=True
    ).stdout
    for stream in (io.BytesIO(data), Trickle(data, 7)):
        members = read_all(stream)
        found = {m.name.removeprefix("./"): body for m, body in members if m.kind == "file"}
        assert found == files
        folders = {m.name.removeprefix("./").rstrip("/") for m, _ in members if m.kind == "dir"}
        assert {"sub", "f" * 120, LONG_FOLDER} <= folders
        assert all(m.size == len(body) for m, body in members)


@pytest.mark.parametrize("tar_format", [tarfile.USTAR_FORMAT, tarfile.GNU_FORMAT, tarfile.PAX_FORMAT])
def test_python_tarfile_archives_round_trip(tar_format: int) -> None:
    names = ["a.txt", f"{'p' * 130}/b.bin"]  # ustar stores this as a prefix and a name
    names += [] if tar_format == tarfile.USTAR_FORMAT else [f"{LONG_FOLDER}/b.bin", LONG_NAME]
    contents = {name: os.urandom(n * 333) for n, name in enumerate(names, 1)}
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tar_format) as archive:
        for name, body in contents.items():
            info = tarfile.TarInfo(name)
            info.size = len(body)
            archive.addfile(info, io.BytesIO(body))
        link = tarfile.TarInfo("link")
        link.type = tarfile.SYMTYPE
        link.linkname = "/etc/" + "x" * 120 if tar_format != tarfile.USTAR_FORMAT else "/etc"
        archive.addfile(link)
    members = read_all(io.BytesIO(buffer.getvalue()))
    assert {m.name: body for m, body in members if m.kind == "file"} == contents
    assert [(m.kind, m.linkname) for m, _ in members if m.name == "link"] == [("symlink", link.linkname)]


def test_pax_global_headers_apply_to_later_members() -> None:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT, pax_headers={"comment": "hi"}) as archive:
        info = tarfile.TarInfo("a.txt")
        info.size = 2
        archive.addfile(info, io.BytesIO(b"ok"))
    assert [(m.name, body) for m, body in read_all(io.BytesIO(buffer.getvalue()))] == [("a.txt", b"ok")]


def test_unread_data_is_skipped(tmp_path: Path) -> None:
    tree = tmp_path / "tree"
    tree.mkdir()
    files = make_tree(tree)
    data = subprocess.run(["tar", "-C", str(tree), "-cf", "-", "."], check=True, capture_output=True).stdout
    names = {m.name.removeprefix("./") for m in TarReader(io.BytesIO(data)) if m.kind == "file"}
    assert names == set(files)


def one_file_archive(body: bytes = b"x" * 1000) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.GNU_FORMAT) as archive:
        info = tarfile.TarInfo("f.bin")
        info.size = len(body)
        archive.addfile(info, io.BytesIO(body))
    return buffer.getvalue()


@pytest.mark.parametrize(
    "cut",
    [100, BLOCK, BLOCK + 500, 3 * BLOCK - 10, 3 * BLOCK],  # in the header, in the data, in the padding, no end block
    ids=["header", "data start", "data", "padding", "end block"],
)
def test_truncated_archives_are_refused(cut: int) -> None:
    with pytest.raises(TarFormatError, match="ends"):
        read_all(io.BytesIO(one_file_archive()[:cut]))


def test_a_corrupt_header_fails_its_checksum() -> None:
    data = bytearray(one_file_archive())
    data[10] ^= 0x01  # a bit of the name
    with pytest.raises(TarFormatError, match="checksum"):
        read_all(io.BytesIO(bytes(data)))
    with pytest.raises(TarFormatError, match="checksum"):
        read_all(io.BytesIO(os.urandom(4 * BLOCK)))


def test_oversized_metadata_is_refused() -> None:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.GNU_FORMAT) as archive:
        info = tarfile.TarInfo("n" * (2 << 20))  # a GNU long name of 2 MiB
        archive.addfile(info, io.BytesIO(b""))
    with pytest.raises(TarFormatError, match="too large"):
        read_all(io.BytesIO(buffer.getvalue()))


def test_numbers_in_octal_and_base_256() -> None:
    assert _number(b"00000001750\0", "size") == 1000
    assert _number(b"     1750 \0\0", "size") == 1000
    assert _number(b"\0" * 12, "size") == 0
    assert _number(bytes([0x80]) + (10**12).to_bytes(11, "big"), "size") == 10**12
    with pytest.raises(TarFormatError, match="negative size"):
        _number(b"\xff" * 12, "size")
    with pytest.raises(TarFormatError, match="invalid size"):
        _number(b"12x4\0", "size")
