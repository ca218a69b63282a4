"""The workstation's results folder: results/<board>/<model>/<backend>/<run-id>/, one pulled bundle each.

Run ids are unique across boards, so a run can be found by its id alone.
"""

from __future__ import annotations

import datetime as dt
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from orchestrator import paths
from orchestrator.errors import BundleError, UsageError
from orchestrator.names import is_valid_name

MANIFEST = "result_manifest.json"


def new_run_id() -> str:
    """Sortable by time, unique across workstations: 20261130T021530Z-3f9a1c. The suffix starts with the
    millisecond (3 hex digits, 000-3e7), so runs made within one second (a warm run takes less) still sort by
    time, `--latest` among them; 3 random hex digits follow."""
    now = dt.datetime.now(dt.timezone.utc)
    return f"{now:%Y%m%dT%H%M%SZ}-{now.microsecond // 1000:03x}{secrets.token_hex(2)[:3]}"


@dataclass(frozen=True)
class LocalRun:
    """A pulled bundle on the workstation."""

    path: Path
    board: str
    model: str
    backend: str
    run_id: str


def bundle_dest(board: str, model: str, backend: str, run_id: str, root: Path | None = None) -> Path:
    return (root or paths.results_dir()) / board / model / backend / run_id


def list_runs(root: Path | None = None) -> list[LocalRun]:
    """Every pulled bundle, oldest first (run ids sort by time)."""
    base = root or paths.results_dir()
    found = [
        LocalRun(manifest.parent, *manifest.parent.relative_to(base).parts)
        for manifest in base.glob(f"*/*/*/*/{MANIFEST}")
        if not manifest.parent.name.startswith(".")
    ]
    return sorted(found, key=lambda run: run.run_id)


def find_run(
    run_id: str | None = None,
    *,
    latest: bool = False,
    model: str | None = None,
    backend: str | None = None,
    board: str | None = None,
    root: Path | None = None,
) -> LocalRun:
    """One pulled run: by id (or a unique prefix of it), or the latest one matching the filters."""
    runs = [
        run
        for run in list_runs(root)
        if (model is None or run.model == model)
        and (backend is None or run.backend == backend)
        and (board is None or run.board == board)
    ]
    if run_id:
        matches = [run for run in runs if run.run_id == run_id] or [
            run for run in runs if run.run_id.startswith(run_id)
        ]
        if len(matches) == 1:
            return matches[0]
        if not matches:
            raise UsageError(f"no pulled run {run_id!r} under {root or paths.results_dir()}", hint="see: fab pull")
        raise UsageError(f"run id prefix {run_id!r} is ambiguous: {', '.join(r.run_id for r in matches[:5])}")
    if not runs:
        where = ", ".join(f"{k}={v}" for k, v in (("model", model), ("backend", backend), ("board", board)) if v)
        raise UsageError(f"no pulled runs{' with ' + where if where else ''} yet", hint="run: fab deploy-and-profile")
    if not latest:
        raise UsageError("give a run id, or ask for the latest run")
    return runs[-1]


def pull_destination(board: str, entry: dict[str, Any], root: Path | None = None) -> Path:
    """Where a bundle the board lists lands: results/<board>/<model>/<backend>/<run-id>/, from names the board
    sent, so each must pass the spec name rule and the folder must stay under results/."""
    labels = entry.get("labels") or {}
    fields = {
        "run_id": entry.get("run_id"),
        "labels.model": labels.get("model", "unknown-model"),
        "labels.backend": labels.get("backend", "unknown-backend"),
    }
    for field, value in fields.items():
        if not is_valid_name(value):
            raise BundleError(
                f"{board}: bundle {str(entry.get('run_id'))[:80]!r} refused: its {field} {str(value)[:80]!r} is not "
                "a valid name (letters, digits, '.', '_', '-'); the raw bundle stays on the board"
            )
    base = root or paths.results_dir()
    dest = bundle_dest(board, fields["labels.model"], fields["labels.backend"], fields["run_id"], base)
    if not dest.resolve().is_relative_to(base.resolve()):
        raise BundleError(f"{board}: bundle {fields['run_id']!r} refused: {dest} is outside {base}")
    return dest
