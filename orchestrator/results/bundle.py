"""Result bundles on the workstation: the manifest every file is checked against.

The board agent writes `result_manifest.json` last, with the sha256 and size of every other file; a pull
verifies the files as they arrive, and analysis verifies them again on disk before trusting them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from orchestrator.errors import BundleError
from orchestrator.fsutil import sha256_and_size

MANIFEST = "result_manifest.json"


@dataclass(frozen=True)
class FileDigest:
    sha256: str
    size: int


def file_digest(path: Path) -> FileDigest:
    return FileDigest(*sha256_and_size(path))


def verify_bundle(folder: Path) -> dict[str, Any]:
    """Re-check the files of a bundle on disk against its manifest (a torn or edited file is refused)."""
    folder = Path(folder)
    digests = {
        str(path.relative_to(folder)): file_digest(path)
        for path in sorted(folder.rglob("*"))
        if path.is_file() and path.relative_to(folder).parts[0] not in DERIVED_FOLDERS
    }
    return verify_manifest(folder, digests)


# What analysis adds to a pulled bundle: not part of what the board wrote.
DERIVED_FOLDERS = ("analysis", "model_explorer")


def verify_manifest(folder: Path, digests: dict[str, FileDigest], *, origin: str = "") -> dict[str, Any]:
    """Check the unpacked files against result_manifest.json: same names, sizes and sha256. Returns the manifest."""
    where = f"bundle {origin or folder}"
    if MANIFEST not in digests:
        raise BundleError(f"{where} has no {MANIFEST}: it is incomplete (the agent writes the manifest last)")
    try:
        manifest = json.loads((folder / MANIFEST).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise BundleError(f"{where}: {MANIFEST} is not valid JSON: {exc}") from None
    except (ValueError, RecursionError) as exc:  # an integer of thousands of digits; nesting deeper than the stack
        raise BundleError(f"{where}: {MANIFEST} is not valid JSON: {str(exc)[:200]}") from None
    files = manifest.get("files") if isinstance(manifest, dict) else None
    if not isinstance(files, dict):
        raise BundleError(f"{where}: {MANIFEST} has no 'files' mapping")
    if manifest.get("schema", 1) != 1:
        raise BundleError(f"{where}: {MANIFEST} has schema {manifest.get('schema')!r}; this etlab reads schema 1")
    problems = []
    for name, entry in files.items():
        if not isinstance(entry, dict) or not isinstance(entry.get("sha256"), str) or "size" not in entry:
            problems.append(f"{name}: manifest entry lacks sha256 or size")
        elif name not in digests:
            problems.append(f"{name}: listed in the manifest but missing")
        elif digests[name].size != entry["size"]:
            problems.append(f"{name}: size {digests[name].size}, the manifest says {entry['size']}")
        elif digests[name].sha256 != entry["sha256"]:
            problems.append(f"{name}: sha256 {digests[name].sha256}, the manifest says {entry['sha256']}")
    for name in sorted(set(digests) - set(files) - {MANIFEST}):
        problems.append(f"{name}: not listed in the manifest")
    if problems:
        shown = "\n  ".join(problems[:10]) + (f"\n  ... and {len(problems) - 10} more" if len(problems) > 10 else "")
        raise BundleError(f"{where} does not match its manifest:\n  {shown}")
    return manifest
