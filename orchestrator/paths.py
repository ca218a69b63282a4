"""Where etlab keeps things on the workstation. Every path is under the project root unless overridden."""

from __future__ import annotations

import os
from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parent.parent
BOARD_SOURCE_DIR = PROJECT_ROOT / "board"


def _root_from_env(var: str, default: Path) -> Path:
    value = os.environ.get(var)
    return Path(value).expanduser().resolve() if value else default


def artifacts_dir() -> Path:
    """Lowered models: artifacts/<name>/..."""
    return _root_from_env("ETLAB_ARTIFACTS", PROJECT_ROOT / "artifacts")


def results_dir() -> Path:
    """Pulled bundles: results/<board>/<model>/<backend>/<run-id>/"""
    return _root_from_env("ETLAB_RESULTS", PROJECT_ROOT / "results")


def state_dir() -> Path:
    """Workstation state: known_hosts, wheel cache, history database."""
    return _root_from_env("ETLAB_STATE", PROJECT_ROOT / ".etlab")


def cache_dir() -> Path:
    """Programs etlab makes for itself, the same on every state of this machine and named by the versions that make
    them (the verification program, the compute probe's GEMMs): shared, so a lab worker's fresh state lowers none."""
    home_cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return _root_from_env("ETLAB_CACHE", home_cache / "etlab")


def default_inventory() -> Path:
    return _root_from_env("ETLAB_INVENTORY", PROJECT_ROOT / "inventory.yaml")
