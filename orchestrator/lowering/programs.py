"""Baseline programs kept on the workstation, content-addressed: `.etlab/programs/<sha256>.pte`.

The interleaved A/B re-test needs the baseline's exact .pte long after `artifacts/` was re-lowered, so every
nightly cell's program is kept here while it is the baseline of some cell. `fab gc` protects these on boards too.
"""

from __future__ import annotations

import re
import shutil
from collections.abc import Iterable
from pathlib import Path

from orchestrator import paths
from orchestrator.errors import ArtifactError
from orchestrator.fsutil import atomic_path, sha256_file

_SHA256 = re.compile(r"[0-9a-f]{64}")


def store_dir() -> Path:
    return paths.state_dir() / "programs"


def program_path(sha256: str) -> Path:
    if not _SHA256.fullmatch(sha256):
        raise ArtifactError(f"not a sha256: {sha256!r}")
    return store_dir() / f"{sha256}.pte"


def keep(pte: Path, sha256: str) -> Path:
    """Copy `pte` into the store (once); the copy is verified against `sha256` before it lands."""
    final = program_path(sha256)
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


def prune(baselines: Iterable[str]) -> list[str]:
    """Remove kept programs that are no longer anyone's baseline; returns the sha256s removed."""
    wanted = set(baselines)
    removed = []
    for sha in sorted(kept() - wanted):
        program_path(sha).unlink(missing_ok=True)
        removed.append(sha)
    return removed
