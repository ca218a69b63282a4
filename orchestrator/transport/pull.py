"""Pulls: a bundle folder streamed as tar over one exec channel, checked against its manifest as it arrives.

The board sends `result_manifest.json` first; a file it does not list is refused, no file is written past its
declared size, and nothing lands outside the destination (files and folders only, never links). The manifest may
list only the files a board writes (results/bundle.py BOARD_FILES), all at the top of the bundle: a pulled bundle
holds no folder, so never an analysis/ or model_explorer/ of the board's making.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from pathlib import Path, PurePosixPath
from typing import IO

from orchestrator.errors import BundleError, EtlabError
from orchestrator.fsutil import TMP_PREFIX
from orchestrator.results.bundle import (
    MANIFEST,
    MANIFEST_MAX_BYTES,
    FileDigest,
    file_digest,
    is_bundle_path,
    parse_manifest,
    verify_manifest,
)
from orchestrator.transport.base import BoardConnection, quote
from orchestrator.transport.tarstream import Member, TarFormatError, TarReader
from orchestrator.transport.transfer import DEFAULT_RETRY, RetryPolicy, with_retries


def pull_bundle(
    conn: BoardConnection, remote_bundle_dir: str, dest: Path, *, retry: RetryPolicy = DEFAULT_RETRY
) -> Path:
    """Copy a bundle folder from the board to `dest` (which must not exist), verified against its manifest."""
    dest = Path(dest)
    if dest.exists() or dest.is_symlink():
        raise EtlabError(f"{dest} already exists; a pulled bundle never overwrites anything")
    dest.parent.mkdir(parents=True, exist_ok=True)

    def attempt() -> Path:
        remote = conn.resolve_path(remote_bundle_dir)
        temp = Path(tempfile.mkdtemp(prefix=f"{TMP_PREFIX}{dest.name}.", dir=dest.parent))
        try:
            digests = _unpack_remote_folder(conn, remote, temp)
            verify_manifest(temp, digests, origin=f"{conn.board.name}:{remote}")
            try:
                os.rename(temp, dest)
            except OSError as exc:
                raise EtlabError(f"{dest} already exists; a pulled bundle never overwrites anything") from exc
        except BaseException:
            shutil.rmtree(temp, ignore_errors=True)
            raise
        return dest

    return with_retries(conn, f"pull of {remote_bundle_dir}", attempt, retry)


def _tar_script(remote: str, bulk_from: int | None) -> str:
    """sh that streams the folder `remote` as tar, result_manifest.json first, so the workstation knows every
    file's declared size before its data arrives. With `bulk_from`, it first prints "bulk" (and stops) when the
    folder holds at least that many bytes, else "tar" before the archive."""
    lines = [
        f"d={quote(remote)}",
        'if ! cd "$d" 2>/dev/null; then '
        '[ -e "$d" ] && echo "$d: cannot enter" >&2 || echo "$d: No such file or directory" >&2; exit 1; fi',
    ]
    if bulk_from is not None:
        # du's figure only picks the transport; what is accepted is bounded by the manifest on the workstation.
        lines += [
            "set -- $(du -sk . 2>/dev/null)",
            'case "$1" in ""|*[!0-9]*) set -- 0 ;; esac',
            f'if [ "$1" -ge {bulk_from >> 10} ]; then echo bulk; exit 0; fi',
            "echo tar",
        ]
    # A missing manifest must not fail tar (a failed command hides the reason): the reader reports it instead.
    lines += [
        "set --",
        'for f in * .[!.]* ..?*; do { [ -e "$f" ] || [ -L "$f" ]; } && '
        f'[ "$f" != {MANIFEST} ] && set -- "$@" "./$f"; done',
        f'if [ -f {MANIFEST} ] && [ ! -L {MANIFEST} ]; then set -- ./{MANIFEST} "$@"; fi',
        "[ $# -gt 0 ] || set -- .",
        'exec tar -cf - "$@"',
    ]
    return "\n".join(lines)


def _unpack_remote_folder(conn: BoardConnection, remote: str, dest: Path) -> dict[str, FileDigest]:
    """Stream the board folder `remote` as tar into `dest`; large folders through the bulk path."""
    origin = f"{conn.board.name}:{remote}"
    threshold = conn.bulk_threshold()
    if threshold:
        # Ask the board how large the folder is, and start the tar right away on this channel when it is small:
        # no second handshake and no extra round trip for the usual few-MB bundle.
        with conn.open_read_stream(["sh", "-c", _tar_script(remote, threshold)]) as stream:
            answer = _read_line(stream)
            if answer == "tar":
                return extract_tar_stream(stream, dest, manifest_first=True, origin=origin)
            if answer != "bulk":
                raise BundleError(f"{conn.board.name}: unexpected answer {answer!r} when asked the size of {remote}")
    with conn.open_read_stream(["sh", "-c", _tar_script(remote, None)], bulk=threshold is not None) as stream:
        return extract_tar_stream(stream, dest, manifest_first=True, origin=origin)


def _read_line(stream: IO[bytes], limit: int = 64) -> str:
    line = bytearray()
    while len(line) < limit and (byte := stream.read(1)) and byte != b"\n":
        line += byte
    return line.decode("ascii", errors="replace")


def _member_path(name: str) -> tuple[str, ...]:
    """The safe relative parts of an archive member name; refuses absolute paths and `..`."""
    if "\0" in name:
        raise BundleError(f"archive entry {name!r} has a NUL byte")
    if name.startswith("/"):
        raise BundleError(f"archive entry {name!r} is an absolute path")
    parts = tuple(part for part in PurePosixPath(name).parts if part != ".")
    if ".." in parts:
        raise BundleError(f"archive entry {name!r} points outside the bundle ('..')")
    return parts


def extract_tar_stream(
    stream: IO[bytes], dest: Path, *, manifest_first: bool = False, origin: str = ""
) -> dict[str, FileDigest]:
    """Unpack a tar stream into the existing empty folder `dest`; returns each file's sha256 and size.

    Only regular files and folders are accepted: links (symbolic or hard), devices and FIFOs, absolute
    paths, `..` and duplicate entries raise BundleError, and nothing is ever written outside `dest`.
    With `manifest_first` (pulls), the first member must be result_manifest.json: every later file must be
    listed in it (only files a board writes: no folder) and is cut off as soon as it exceeds its declared size, so a
    board cannot fill this disk.
    """
    digests: dict[str, FileDigest] = {}
    declared: dict[str, FileDigest] | None = None
    where = f"bundle {origin or dest}"
    try:
        archive = TarReader(stream)
        for member in archive:
            if manifest_first and declared is None:
                declared = _read_manifest_member(archive, member, dest, where)
                digests[MANIFEST] = file_digest(dest / MANIFEST)
                continue
            parts = _member_path(member.name)
            if not parts:
                if member.kind == "dir":
                    continue
                raise BundleError(f"archive entry {member.name!r} has no name")
            relative = "/".join(parts)
            if member.kind in ("symlink", "hardlink"):
                raise BundleError(
                    f"archive entry {relative!r} is a {'symbolic' if member.kind == 'symlink' else 'hard'} link "
                    f"(to {member.linkname!r}); bundles hold only files and folders"
                )
            if declared is not None and not is_bundle_path(relative):
                raise BundleError(f"{where}: archive entry {relative!r} is not a valid name")
            limit = None
            if declared is not None and member.kind == "file":
                if relative not in declared:
                    raise BundleError(f"{where}: {relative}: not listed in the manifest")
                limit = declared[relative].size
                if member.size > limit:
                    raise BundleError(f"{where}: {relative}: size {member.size}, the manifest says {limit}")
            if member.kind == "dir":
                if declared is not None:
                    raise BundleError(f"{where}: archive entry {relative!r} is a folder; a board's bundle has none")
                _make_folder(dest, parts)
            elif member.kind == "file":
                _make_folder(dest, parts[:-1])
                digests[relative] = _write_member(archive, dest.joinpath(*parts), relative, limit)
            else:
                raise BundleError(f"archive entry {relative!r} is a device, FIFO or other special file")
    except TarFormatError as exc:
        raise BundleError(f"the bundle archive is corrupt or truncated: {exc}") from exc
    return digests


def _make_folder(dest: Path, parts: tuple[str, ...]) -> None:
    current = dest
    for part in parts:
        current = current / part
        try:
            current.mkdir(mode=0o755)
        except FileExistsError:
            if current.is_symlink() or not current.is_dir():
                raise BundleError(f"archive entry {'/'.join(parts)!r} collides with a file") from None
        except OSError as exc:  # e.g. a name too long for the file system
            raise BundleError(f"cannot create folder {'/'.join(parts)!r} of the bundle: {exc.strerror}") from None


def _read_manifest_member(archive: TarReader, member: Member, dest: Path, where: str) -> dict[str, FileDigest]:
    """The first member of a pulled bundle: its manifest, size-capped, written and parsed before anything else."""
    if member.kind != "file" or "/".join(_member_path(member.name)) != MANIFEST:
        raise BundleError(f"{where} has no {MANIFEST}: it is incomplete (the agent writes the manifest last)")
    if member.size > MANIFEST_MAX_BYTES:
        raise BundleError(f"{where}: {MANIFEST} is larger than {MANIFEST_MAX_BYTES} bytes")
    _write_member(archive, dest / MANIFEST, MANIFEST, MANIFEST_MAX_BYTES)
    _, declared = parse_manifest((dest / MANIFEST).read_bytes(), where)
    total = sum(entry.size for entry in declared.values())
    free = shutil.disk_usage(dest).free
    if total > free:
        raise BundleError(f"{where} declares {total} bytes of files; only {free} bytes are free in {dest.parent}")
    return declared


def _write_member(archive: TarReader, target: Path, relative: str, limit: int | None = None) -> FileDigest:
    """Write one file member, hashing it on the way (hashlib and os.write release the GIL, so paramiko's
    transport thread decrypts the next packets meanwhile); never more than `limit` bytes."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        fd = os.open(target, flags, 0o644)
    except FileExistsError:
        raise BundleError(f"archive entry {relative!r} appears twice") from None
    except OSError as exc:  # e.g. a name too long for the file system
        raise BundleError(f"cannot create {relative!r} of the bundle: {exc.strerror}") from None
    digest, size = hashlib.sha256(), 0
    try:
        for chunk in archive.chunks():
            digest.update(chunk)
            size += len(chunk)
            if limit is not None and size > limit:
                raise BundleError(f"archive entry {relative!r} is larger than the {limit} bytes declared for it")
            view = memoryview(chunk)
            while view:
                view = view[os.write(fd, view) :]
    except OSError as exc:
        raise BundleError(f"cannot write {relative!r} of the bundle: {exc.strerror or exc}") from exc
    finally:
        # Not fsynced (scp does not either): a bundle can be pulled again, and analysis re-checks the manifest.
        os.close(fd)
    return FileDigest(digest.hexdigest(), size)
