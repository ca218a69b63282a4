"""Crash-safe file writes and hashing.

Everything a later step trusts (a .pte, a sidecar, a bundle file) is written to a temporary name in the
same folder, fsynced, and renamed into place, so an interrupted write never leaves a valid-looking file.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import shutil
import tempfile
from collections.abc import Collection, Iterator
from pathlib import Path
from typing import Any

from orchestrator import strictjson

CHUNK = 1 << 20
TMP_PREFIX = ".etlab-tmp-"


@contextlib.contextmanager
def file_lock(lock_file: Path, *, shared: bool = False) -> Iterator[None]:
    """`lock_file` (created if missing) held with a flock for the block, exclusive unless `shared`: other processes
    wait. Per open file, so threads exclude each other too; the kernel drops it with its process, so a killed holder
    never leaves it locked."""
    lock_file.parent.mkdir(parents=True, exist_ok=True)
    with open(lock_file, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_SH if shared else fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


@contextlib.contextmanager
def atomic_path(final: Path, *, keep_identical: bool = False) -> Iterator[Path]:
    """Yield a temporary path for `final`; move it over `final` only if the block succeeds.

    The temporary file has `final`'s own name, inside a private folder next to it: writers that embed the
    file name (torch.export.save names its archive root after it) then produce identical bytes for identical
    content. With keep_identical, an existing `final` with the same content is left untouched (its mtime
    too), so records that vouch for it by mtime stay valid.
    """
    final = Path(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    folder = Path(tempfile.mkdtemp(prefix=f"{TMP_PREFIX}{final.name}.", dir=final.parent))
    tmp = folder / final.name
    try:
        tmp.touch(mode=0o666 & ~_umask())
        yield tmp
        if keep_identical and _same_content(tmp, final):
            return
        with open(tmp, "rb+") as handle:
            os.fsync(handle.fileno())
        os.replace(tmp, final)
        _fsync_dir(final.parent)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _same_content(a: Path, b: Path) -> bool:
    try:
        if a.stat().st_size != b.stat().st_size:
            return False
    except FileNotFoundError:
        return False
    return sha256_file(a) == sha256_file(b)


def _umask() -> int:
    current = os.umask(0)
    os.umask(current)
    return current


def _fsync_dir(folder: Path) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def atomic_write_bytes(final: Path, data: bytes, *, durable: bool = True) -> None:
    """`data` as `final`, all or nothing. Bytes need no private folder (see atomic_path): one temporary file
    beside `final` is cheaper, which counts when an analysis writes eight documents on the warm path.

    `durable=False` skips the fsyncs, for files etlab derives again from what it keeps durably (an analysis from
    its raw bundle): a power cut may then leave such a file empty or old, never half-written under its name."""
    final = Path(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(prefix=f"{TMP_PREFIX}{final.name}.", dir=final.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            if durable:
                handle.flush()
                os.fsync(handle.fileno())
        os.chmod(name, 0o666 & ~_umask())  # as open() would have made it, not mkstemp's 0600
        os.replace(name, final)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(name)
        raise
    if durable:
        _fsync_dir(final.parent)


def atomic_write_text(final: Path, text: str, *, durable: bool = True) -> None:
    atomic_write_bytes(final, text.encode(), durable=durable)


def atomic_write_json(final: Path, obj: Any, *, durable: bool = True, indent: int | None = 2) -> None:
    """`indent=None` for large documents only programs read (overlays, ops.json): json's C encoder then writes
    them, several times faster than the indenting pure-Python one."""
    text = strictjson.dumps(obj, indent=indent, sort_keys=False)
    atomic_write_text(final, text + "\n", durable=durable)


def sha256_and_size(path: Path) -> tuple[str, int]:
    """A file's sha256 (hex) and size, read once."""
    digest = hashlib.sha256()
    size = 0
    with open(path, "rb") as handle:
        while chunk := handle.read(CHUNK):
            digest.update(chunk)
            size += len(chunk)
    return digest.hexdigest(), size


def sha256_file(path: Path) -> str:
    return sha256_and_size(path)[0]


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def remove_stale_temporaries(folder: Path) -> int:
    """Delete temporaries left by a killed writer. Returns how many were removed."""
    removed = 0
    if folder.is_dir():
        for leftover in folder.glob(f"{TMP_PREFIX}*"):
            with contextlib.suppress(OSError):
                if leftover.is_dir() and not leftover.is_symlink():
                    shutil.rmtree(leftover)
                else:
                    leftover.unlink()
                removed += 1
    return removed


def unreadable(path: Path, exc: Exception) -> str:
    """Why a JSON file could not be read: the strict reader's message names the file and field itself."""
    return str(exc) if isinstance(exc, strictjson.JsonDataError) else f"{path} is unreadable: {exc}"


def read_json(path: Path, *, nonfinite: Collection[str] = (), max_magnitude: float = strictjson.MAX_MAGNITUDE) -> Any:
    """Every JSON file etlab reads back goes through the strict reader (strictjson: limits, ranges, the field named)."""
    return strictjson.read(path, nonfinite=nonfinite, max_magnitude=max_magnitude)
