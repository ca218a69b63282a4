"""The one place that says which ExecuTorch the boards must run.

The pin lives in pyproject.toml; everything else reads the installed version back, so the
board runtime can never drift from the workstation's exporter.
"""

from __future__ import annotations

import functools
import importlib.metadata


@functools.cache
def installed(package: str) -> str:
    """The installed version of `package`, or "missing"."""
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "missing"


def executorch_version() -> str:
    """The release the boards must run, without a local label ("1.5.1", not "1.5.1+cpu")."""
    return installed("executorch").split("+", 1)[0]


def toolchain_versions() -> dict[str, str]:
    """Versions that change what lowering produces; recorded in sidecars and cache keys."""
    return {name: installed(name) for name in ("torch", "executorch", "transformers")}
