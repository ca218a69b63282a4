"""Crash-safe writes, hashing, timestamps and stderr logging (stdlib only).

Mirrors orchestrator/fsutil.py on purpose: board/ is shipped alone and must not import the workstation package.
"""

from __future__ import annotations

import contextlib
import datetime
import hashlib
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any, Iterator

CHUNK = 1 << 20
TMP_PREFIX = ".etlab-tmp-"


def log(message: str) -> None:
    """Progress for humans goes to stderr; stdout carries exactly one JSON document."""
    with contextlib.suppress(OSError):  # stderr went away with the ssh session; the work goes on
        print(f"etlab-agent: {message}", file=sys.stderr, flush=True)


def utc_now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="microseconds")


def parse_time(text: Any) -> float | None:
    """Seconds since the epoch for an ISO-8601 time written by utc_now(), or None."""
    if not isinstance(text, str):
        return None
    try:
        return datetime.datetime.fromisoformat(text).timestamp()
    except ValueError:
        return None


def fsync_path(path: Path) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(str(path), os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _umask() -> int:
    current = os.umask(0o022)
    os.umask(current)
    return current


@contextlib.contextmanager
def atomic_path(final: Path) -> Iterator[Path]:
    """Yield a temporary path next to `final`; rename it over `final` only if the block succeeds."""
    final = Path(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f"{TMP_PREFIX}{final.name}.", dir=str(final.parent))
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        os.chmod(str(tmp), 0o666 & ~_umask())  # mkstemp creates 0600; results are meant to be readable
        yield tmp
        fsync_path(tmp)
        os.replace(str(tmp), str(final))
        fsync_path(final.parent)
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()


def atomic_write_text(final: Path, text: str) -> None:
    with atomic_path(final) as tmp:
        tmp.write_text(text, encoding="utf-8")


def atomic_write_json(final: Path, obj: Any) -> None:
    atomic_write_text(final, json.dumps(obj, indent=2) + "\n")


def read_json(path: Path) -> Any:
    with open(str(path), encoding="utf-8") as handle:
        return json.load(handle)


def read_json_or_none(path: Path) -> Any:
    """The JSON in `path`, or None when it is missing or unreadable (best-effort readers)."""
    try:
        return read_json(path)
    except (OSError, ValueError):
        return None


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    buffer = bytearray(CHUNK)
    view = memoryview(buffer)
    with open(str(path), "rb", buffering=0) as handle:  # into one buffer: no copy per chunk (a 361 MB model)
        while True:
            count = handle.readinto(buffer)
            if not count:
                break
            digest.update(view[:count])
    return digest.hexdigest()


def tree_size(folder: Path) -> int:
    total = 0
    for root, _dirs, names in os.walk(str(folder)):
        for name in names:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(root, name)).st_size
    return total
