"""Hostile archives from a board (transport/pull.py): members that escape, links, truncation are refused and nothing
lands outside the destination; a clean archive is unpacked with its digests."""

from __future__ import annotations

import io
import os
import tarfile
from pathlib import Path

import pytest

from orchestrator.errors import BundleError
from orchestrator.transport.pull import extract_tar_stream
from tests.transport.transfer_helpers import sha

# ---------------------------------------------------------------- hostile archives


def tar_bytes(*members: tuple[tarfile.TarInfo, bytes | None]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as archive:
        for info, data in members:
            if data is not None:
                info.size = len(data)
            archive.addfile(info, io.BytesIO(data) if data is not None else None)
    return buffer.getvalue()


def entry(name: str, kind: bytes = tarfile.REGTYPE, linkname: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.linkname = linkname
    info.mode = 0o644
    return info


# each: the members (data None: no content) and what the refusal says
HOSTILE: dict[str, tuple[list[tuple[tarfile.TarInfo, bytes | None]], str]] = {
    "dot-dot": ([(entry("../escaped.txt"), b"pwned")], "points outside the bundle"),
    "dot-dot inside": ([(entry("ok/../../escaped.txt"), b"pwned")], "points outside the bundle"),
    "absolute": ([(entry("{outside}/escaped.txt"), b"pwned")], "is an absolute path"),
    "symlink out": ([(entry("link", tarfile.SYMTYPE, "{outside}"), None)], "is a symbolic link"),
    "symlink then write through it": (
        [(entry("d", tarfile.SYMTYPE, "{outside}"), None), (entry("d/escaped.txt"), b"pwned")],
        "is a symbolic link",
    ),
    "hardlink out": ([(entry("hard", tarfile.LNKTYPE, "../../escaped.txt"), None)], "is a hard link"),
    "char device": ([(entry("null", tarfile.CHRTYPE), None)], "device, FIFO or other special file"),
    "fifo": ([(entry("pipe", tarfile.FIFOTYPE), None)], "device, FIFO or other special file"),
    "duplicate": ([(entry("a.txt"), b"one"), (entry("a.txt"), b"two")], "appears twice"),
    "file over folder": ([(entry("x"), b"file"), (entry("x/y"), b"below")], "collides with a file"),
}


@pytest.mark.parametrize("case", list(HOSTILE), ids=list(HOSTILE))
def test_hostile_archives_are_refused_and_nothing_lands_outside(tmp_path: Path, case: str) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    dest = tmp_path / "deep" / "dest"
    dest.mkdir(parents=True)
    members, message = HOSTILE[case]
    built = []
    for info, data in members:
        info.name = info.name.replace("{outside}", str(outside))
        info.linkname = info.linkname.replace("{outside}", str(outside))
        built.append((info, data))
    with pytest.raises(BundleError, match=message):
        extract_tar_stream(io.BytesIO(tar_bytes(*built)), dest)
    assert list(outside.iterdir()) == []
    assert not (tmp_path / "escaped.txt").exists() and not (tmp_path / "deep" / "escaped.txt").exists()
    assert all(not p.is_symlink() for p in dest.rglob("*"))


def test_a_truncated_archive_is_a_bundle_error(tmp_path: Path) -> None:
    data = tar_bytes((entry("big.bin"), os.urandom(100_000)))
    with pytest.raises(BundleError, match="corrupt or truncated"):
        extract_tar_stream(io.BytesIO(data[:50_000]), tmp_path)


def test_a_clean_archive_is_unpacked_with_digests(tmp_path: Path) -> None:
    payload = os.urandom(70_000)
    data = tar_bytes((entry("./a/b.bin"), payload), (entry("c.txt"), b"c"))
    digests = extract_tar_stream(io.BytesIO(data), tmp_path)
    assert digests["a/b.bin"].sha256 == sha(payload) and digests["a/b.bin"].size == 70_000
    assert digests["c.txt"].sha256 == sha(b"c")
    assert (tmp_path / "a" / "b.bin").read_bytes() == payload
