"""The board workdir layout (docs/DESIGN.md, "Board workdir"): one place names every path in it."""

from __future__ import annotations

import re
from pathlib import Path

from .errors import BadInput

RUN_ID_PATTERN = re.compile(r"[A-Za-z0-9._-]+")
TMP_BUNDLE_PREFIX = ".tmp-"


class Workdir:
    def __init__(self, root: Path) -> None:
        self.root = Path(root).expanduser().absolute()

    @property
    def lock(self) -> Path:
        return self.root / "lock"

    @property
    def lock_json(self) -> Path:
        return self.root / "lock.json"

    @property
    def state(self) -> Path:
        return self.root / "state.json"

    @property
    def bundles(self) -> Path:
        return self.root / "bundles"

    @property
    def models(self) -> Path:
        return self.root / "models"

    @property
    def inputs(self) -> Path:
        return self.root / "inputs"

    @property
    def tools(self) -> Path:
        return self.root / "tools"

    def bundle(self, run_id: str) -> Path:
        return self.bundles / run_id

    def tmp_bundle(self, run_id: str) -> Path:
        return self.bundles / f"{TMP_BUNDLE_PREFIX}{run_id}"

    def ensure(self) -> None:
        self.bundles.mkdir(parents=True, exist_ok=True)


def validate_run_id(run_id: str) -> str:
    """A run id names a folder: only [A-Za-z0-9._-], no '..', not hidden."""
    if not RUN_ID_PATTERN.fullmatch(run_id or ""):
        raise BadInput(f"invalid run id {run_id!r}: use only letters, digits, '.', '_' and '-'")
    if ".." in run_id or run_id.startswith("."):
        raise BadInput(f"invalid run id {run_id!r}: it must not contain '..' or start with '.'")
    if len(run_id) > 200:
        raise BadInput(f"invalid run id {run_id[:40]!r}...: longer than 200 characters")
    return run_id
