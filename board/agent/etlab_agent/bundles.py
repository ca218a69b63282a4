"""`bundles` (list result bundles) and `gc` (free space: old bundles, leftovers, unused models and inputs)."""

from __future__ import annotations

import contextlib
import shutil
import time
from pathlib import Path
from typing import Any

from .errors import BadInput
from .files import log, parse_time, read_json_or_none, tree_size
from .lock import BoardLock, describe_holder
from .workdir import TMP_BUNDLE_PREFIX, Workdir

TMP_MAX_AGE_SECONDS = 3600.0
DAY_SECONDS = 86400.0


def _created(folder: Path, manifest: Any, run: Any) -> tuple[float, str | None]:
    for doc, key in ((manifest, "created_at"), (run, "ended_at"), (run, "started_at")):
        if isinstance(doc, dict):
            stamp = parse_time(doc.get(key))
            if stamp is not None:
                return stamp, doc[key]
    with contextlib.suppress(OSError):
        return folder.stat().st_mtime, None
    return 0.0, None


def list_bundles(workdir: Workdir) -> list[dict[str, Any]]:
    """Every complete bundle folder, newest first (`.tmp-*` folders are runs in progress or leftovers)."""
    try:
        folders = [p for p in workdir.bundles.iterdir() if p.is_dir() and not p.name.startswith(".")]
    except OSError:
        return []
    found = []
    for folder in folders:
        manifest = read_json_or_none(folder / "result_manifest.json")
        run = read_json_or_none(folder / "run.json")
        stamp, created = _created(folder, manifest, run)
        labels = run.get("labels") if isinstance(run, dict) and isinstance(run.get("labels"), dict) else {}
        model_path = run.get("model") if isinstance(run, dict) else None
        found.append(
            {
                "run_id": folder.name,
                "status": manifest.get("status") if isinstance(manifest, dict) else "incomplete",
                "created": created,
                "model": labels.get("model") or (Path(str(model_path)).name if model_path else None),
                "labels": labels,
                "size": tree_size(folder),
                "_stamp": stamp,
            }
        )
    found.sort(key=lambda entry: (entry["_stamp"], entry["run_id"]), reverse=True)
    for entry in found:
        del entry["_stamp"]
    return found


def _remove(path: Path, dry_run: bool) -> int:
    """Delete a file or folder; returns the bytes it held."""
    size = tree_size(path) if path.is_dir() and not path.is_symlink() else path.lstat().st_size
    if not dry_run:
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(str(path))
        else:
            path.unlink()
    return size


def _referenced(workdir: Workdir, kept: list[dict[str, Any]]) -> tuple[set[str], set[str]]:
    """Resolved paths and sha256s of the models and inputs the kept bundles used."""
    paths: set[str] = set()
    hashes: set[str] = set()
    for entry in kept:
        run = read_json_or_none(workdir.bundle(entry["run_id"]) / "run.json")
        if not isinstance(run, dict):
            continue
        for path_key, hash_key in (("model", "model_sha256"), ("inputs", "inputs_sha256")):
            if run.get(path_key):
                with contextlib.suppress(OSError, RuntimeError):
                    paths.add(str(Path(str(run[path_key])).resolve()))
            if run.get(hash_key):
                hashes.add(str(run[hash_key]))
    return paths, hashes


def _content_files(folder: Path, pattern: str) -> list[Path]:
    try:
        return sorted(p for p in folder.glob(pattern) if p.is_file() and not p.name.endswith(".sha256"))
    except OSError:
        return []


def collect_garbage(
    workdir: Workdir,
    keep: int,
    model_days: float,
    lock_timeout: float,
    dry_run: bool = False,
    protect: set[str] | None = None,
) -> dict[str, Any]:
    """Keep the newest `keep` bundles; drop old `.tmp-*` leftovers and models/inputs nobody kept needs."""
    if keep < 0:
        raise BadInput(f"--keep must be 0 or more, got {keep}")
    if model_days < 0:
        raise BadInput(f"--model-days must be 0 or more, got {model_days:g}")
    removed: dict[str, list[str]] = {"bundles": [], "temporaries": [], "models": [], "inputs": []}
    freed = 0
    workdir.ensure()
    lock = BoardLock(workdir)
    # Holding the lock means no profile is writing a bundle or reading a model while we delete.
    with lock.acquired(describe_holder("gc", None), lock_timeout):
        bundles = list_bundles(workdir)
        kept, old = bundles[:keep], bundles[keep:]
        for entry in old:
            freed += _remove(workdir.bundle(entry["run_id"]), dry_run)
            removed["bundles"].append(entry["run_id"])

        now = time.time()
        for leftover in sorted(workdir.bundles.glob(f"{TMP_BUNDLE_PREFIX}*")):
            with contextlib.suppress(OSError):
                if now - leftover.stat().st_mtime > TMP_MAX_AGE_SECONDS:
                    freed += _remove(leftover, dry_run)
                    removed["temporaries"].append(leftover.name)

        ref_paths, ref_hashes = _referenced(workdir, kept)
        ref_hashes |= protect or set()  # the workstation's nightly baselines: the A/B re-test needs them
        cutoff = now - model_days * DAY_SECONDS
        for kind, folder, pattern in (("models", workdir.models, "*.pte"), ("inputs", workdir.inputs, "*")):
            for path in _content_files(folder, pattern):
                stem = path.name.split(".", 1)[0]
                if str(path.resolve()) in ref_paths or stem in ref_hashes:
                    continue
                try:
                    if path.stat().st_mtime >= cutoff:
                        continue
                    freed += _remove(path, dry_run)
                except OSError:
                    continue
                removed[kind].append(path.name)
                sidecar = Path(f"{path}.sha256")
                if sidecar.is_file():
                    freed += _remove(sidecar, dry_run)
    if not dry_run and any(removed.values()):
        log(f"gc freed {freed} bytes: " + ", ".join(f"{len(v)} {k}" for k, v in removed.items()))
    return {
        "dry_run": dry_run,
        "kept": [entry["run_id"] for entry in kept],
        "removed": removed,
        "bytes_freed": freed,
    }
