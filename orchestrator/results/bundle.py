"""Result bundles on the workstation: the manifest every file is checked against, and the files a bundle may hold.

The board agent writes `result_manifest.json` last, with the sha256 and size of every other file; a pull
verifies the files as they arrive, and analysis verifies them again on disk before trusting them. A manifest may
list only the files a board writes (BOARD_FILES): what etlab derives from them (analysis/, model_explorer/) never
comes from a board, so a board cannot hand the workstation its own verdicts.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from orchestrator import strictjson
from orchestrator.errors import BundleError
from orchestrator.fsutil import sha256_and_size
from orchestrator.names import is_valid_name

MANIFEST = "result_manifest.json"
# The counters pass's files (board/agent/etlab_agent/counters.py), and the numerics pass's (numerics.py).
COUNTERS_FILES = frozenset({"counters.json", "counters_etdump.etdp", "counters_timings.json", "counters_runner.log"})
NUMERICS_FILES = frozenset({"numerics.json", "numerics_tensors.etlt", "numerics_timings.json", "numerics_runner.log"})
ENERGY_FILES = frozenset({"energy.json"})  # a board with a PMIC (a Raspberry Pi 5) only
# Every file a board writes into a bundle, and nothing else: the agent's (board/agent/etlab_agent/profile.py: run.json,
# board_info_before/after.json, runner.log, the manifest; both passes' files) and the runner's (--timings, --etdump,
# --outputs). A manifest listing any other name is refused whole (exit 65). tests/results/test_counters.py checks it
# against what a real run with a counters pass leaves, tests/e2e/test_numerics_e2e.py with a numerics pass.
BOARD_FILES = frozenset(
    {
        MANIFEST,
        "run.json",
        "timings.json",
        "etdump.etdp",
        "outputs.etlt",
        "runner.log",
        "board_info_before.json",
        "board_info_after.json",
        *ENERGY_FILES,
        *COUNTERS_FILES,
        *NUMERICS_FILES,
    }
)
# What analysis adds to a pulled bundle: not part of what the board wrote.
DERIVED_FOLDERS = ("analysis", "model_explorer")
MANIFEST_MAX_BYTES = 1 << 20  # a manifest lists a few files; anything larger is not one
_SHA256 = re.compile(r"[0-9a-f]{64}")


@dataclass(frozen=True)
class FileDigest:
    sha256: str
    size: int


def file_digest(path: Path) -> FileDigest:
    return FileDigest(*sha256_and_size(path))


def verify_bundle(folder: Path) -> dict[str, Any]:
    """Re-check the files of a bundle on disk against its manifest (a torn or edited file is refused)."""
    folder = Path(folder)
    members = [path for path in sorted(folder.rglob("*")) if path.relative_to(folder).parts[0] not in DERIVED_FOLDERS]
    # A pull never creates links; one found later was put there, and would make analysis read outside the bundle.
    links = [str(path.relative_to(folder)) for path in members if path.is_symlink()]
    if links:
        raise BundleError(f"bundle {folder} holds symbolic links ({', '.join(links[:5])}); refused")
    digests = {str(path.relative_to(folder)): file_digest(path) for path in members if path.is_file()}
    return verify_manifest(folder, digests)


def board_supplied(folder: Path) -> list[str]:
    """The files of analysis/ or model_explorer/ that the bundle's manifest lists: a board wrote those (a bundle
    pulled before pulls refused them), so whatever is there is not etlab's analysis. Readers of analysis results
    refuse such a run. A folder without a manifest was never pulled: nothing in it came from a board. An unreadable
    manifest is a BundleError: who wrote the analysis cannot be told then."""
    path = Path(folder) / MANIFEST
    try:
        manifest = strictjson.read(path, max_bytes=MANIFEST_MAX_BYTES)
    except FileNotFoundError:
        return []
    except (OSError, ValueError) as exc:
        raise BundleError(f"{path} is unreadable ({exc}); the run's analysis cannot be told from a board's") from None
    files = manifest.get("files") if isinstance(manifest, dict) else None
    listed = files if isinstance(files, dict) else {}
    return sorted(name for name in listed if isinstance(name, str) and name.split("/", 1)[0] in DERIVED_FOLDERS)


def is_bundle_path(name: object) -> bool:
    """A file path inside a bundle: `/`-separated parts, each passing the spec name rule (so no `..`, no `/x`)."""
    return isinstance(name, str) and all(is_valid_name(part) for part in name.split("/"))


def parse_manifest(data: bytes, where: str) -> tuple[dict[str, Any], dict[str, FileDigest]]:
    """Parse and validate result_manifest.json as untrusted input; returns it and the files it declares."""
    if len(data) > MANIFEST_MAX_BYTES:
        raise BundleError(f"{where}: {MANIFEST} is larger than {MANIFEST_MAX_BYTES} bytes")
    try:
        manifest = strictjson.loads(data, where=f"{where}: {MANIFEST}")
    except ValueError as exc:
        raise BundleError(str(exc)[:400]) from None
    files = manifest.get("files") if isinstance(manifest, dict) else None
    if not isinstance(files, dict):
        raise BundleError(f"{where}: {MANIFEST} has no 'files' mapping")
    if manifest.get("schema", 1) != 1:
        raise BundleError(f"{where}: {MANIFEST} has schema {manifest.get('schema')!r}; this etlab reads schema 1")
    declared: dict[str, FileDigest] = {}
    problems = []
    for name, entry in files.items():
        sha, size = (entry.get("sha256"), entry.get("size")) if isinstance(entry, dict) else (None, None)
        if not is_bundle_path(name) or name == MANIFEST:
            problems.append(f"{name!r}: not a valid file name (letters, digits, '.', '_', '-')")
        elif name.split("/", 1)[0] in DERIVED_FOLDERS:
            problems.append(f"{name}: analysis results are etlab's own, never a board's")
        elif name not in BOARD_FILES:
            problems.append(f"{name}: not a file a board writes")
        elif not isinstance(sha, str) or not _SHA256.fullmatch(sha):
            problems.append(f"{name}: manifest entry lacks a sha256 (64 lowercase hex digits)")
        elif isinstance(size, bool) or not isinstance(size, int) or size < 0:
            problems.append(f"{name}: manifest entry lacks a size (a non-negative integer)")
        else:
            declared[name] = FileDigest(sha, size)
    if problems:
        raise BundleError(f"{where}: {MANIFEST} is malformed:\n  " + "\n  ".join(problems[:10]))
    return manifest, declared


def verify_manifest(folder: Path, digests: dict[str, FileDigest], *, origin: str = "") -> dict[str, Any]:
    """Check the unpacked files against result_manifest.json: same names, sizes and sha256. Returns the manifest."""
    where = f"bundle {origin or folder}"
    if MANIFEST not in digests:
        raise BundleError(f"{where} has no {MANIFEST}: it is incomplete (the agent writes the manifest last)")
    try:
        data = (folder / MANIFEST).read_bytes()
    except OSError as exc:
        raise BundleError(f"{where}: {MANIFEST} is unreadable: {exc}") from None
    manifest, files = parse_manifest(data, where)
    problems = []
    for name, entry in files.items():
        if name not in digests:
            problems.append(f"{name}: listed in the manifest but missing")
        elif digests[name].size != entry.size:
            problems.append(f"{name}: size {digests[name].size}, the manifest says {entry.size}")
        elif digests[name].sha256 != entry.sha256:
            problems.append(f"{name}: sha256 {digests[name].sha256}, the manifest says {entry.sha256}")
    for name in sorted(set(digests) - set(files) - {MANIFEST}):
        problems.append(f"{name}: not listed in the manifest")
    if problems:
        shown = "\n  ".join(problems[:10]) + (f"\n  ... and {len(problems) - 10} more" if len(problems) > 10 else "")
        raise BundleError(f"{where} does not match its manifest:\n  {shown}")
    return manifest
