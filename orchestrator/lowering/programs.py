"""Baseline programs kept on the workstation, content-addressed: `.etlab/programs/<sha256>.pte`.

The interleaved A/B re-test needs the baseline's exact .pte long after `artifacts/` was re-lowered, so every
nightly cell's program is kept here while it is the baseline of some cell. `fab gc` protects these on boards too.

Several nightlies (histories) may share this folder: each names the programs it still needs in its own holder
file (`holders/<id>.json`), and a program goes only when no holder names it. A holder not renewed for
`HOLDER_EXPIRY_DAYS` (a history nobody runs any more) stops protecting its programs.
"""

from __future__ import annotations

import re
import shutil
import time
from collections.abc import Iterable
from pathlib import Path

from orchestrator import paths
from orchestrator.errors import ArtifactError
from orchestrator.fsutil import atomic_path, atomic_write_json, read_json, sha256_file

_SHA256 = re.compile(r"[0-9a-f]{64}")
_HOLDER = re.compile(r"[0-9a-f]{16}")
HOLDER_EXPIRY_DAYS = 90


def store_dir() -> Path:
    return paths.state_dir() / "programs"


def program_path(sha256: str) -> Path:
    if not _SHA256.fullmatch(sha256):
        raise ArtifactError(f"not a sha256: {sha256!r}")
    return store_dir() / f"{sha256}.pte"


def keep(pte: Path, sha256: str, holder: str | None = None) -> Path:
    """Copy `pte` into the store (once), verified against `sha256` before it lands; `holder` now needs it."""
    final = program_path(sha256)
    if holder is not None:
        _hold(holder, sha256)
    if final.is_file():
        return final
    with atomic_path(final) as tmp:
        shutil.copyfile(pte, tmp)
        found = sha256_file(tmp)
        if found != sha256:
            raise ArtifactError(f"{pte} changed while it was kept: sha256 {found[:12]}, expected {sha256[:12]}")
    return final


def find(sha256: str | None) -> Path | None:
    """The kept program with this sha256, if any (verified: a damaged copy is not a baseline)."""
    if not sha256:
        return None
    path = program_path(sha256)
    return path if path.is_file() and sha256_file(path) == sha256 else None


def kept() -> set[str]:
    """The sha256 of every kept program."""
    folder = store_dir()
    return {p.stem for p in folder.glob("*.pte") if _SHA256.fullmatch(p.stem)} if folder.is_dir() else set()


def holder_id(name: str) -> str:
    """A holder file's id for a history (its URL): stable, and safe as a file name."""
    import hashlib

    return hashlib.sha256(name.encode()).hexdigest()[:16]


def _holder_file(holder: str) -> Path:
    if not _HOLDER.fullmatch(holder):
        raise ArtifactError(f"not a holder id: {holder!r}")
    return store_dir() / "holders" / f"{holder}.json"


def _held(path: Path) -> set[str]:
    try:
        listed = read_json(path)
    except (OSError, ValueError):
        return set()
    return (
        {sha for sha in listed if isinstance(sha, str) and _SHA256.fullmatch(sha)}
        if isinstance(listed, list)
        else set()
    )


def _hold(holder: str, sha256: str) -> None:
    path = _holder_file(holder)
    atomic_write_json(path, sorted(_held(path) | {sha256}))


def _held_by_others(me: str) -> set[str]:
    """The programs the other, still active holders need (an unreadable holder file protects nothing)."""
    folder = store_dir() / "holders"
    held: set[str] = set()
    expiry = time.time() - HOLDER_EXPIRY_DAYS * 86400
    for path in folder.glob("*.json") if folder.is_dir() else []:
        if path.stem != me and _HOLDER.fullmatch(path.stem) and path.stat().st_mtime >= expiry:
            held |= _held(path)
    return held


def prune(baselines: Iterable[str], holder: str) -> list[str]:
    """Record what `holder` needs, then remove kept programs no holder needs; returns the sha256s removed."""
    wanted = {sha for sha in baselines if _SHA256.fullmatch(sha)}
    atomic_write_json(_holder_file(holder), sorted(wanted))
    wanted |= _held_by_others(holder)
    removed = []
    for sha in sorted(kept() - wanted):
        program_path(sha).unlink(missing_ok=True)
        removed.append(sha)
    return removed
