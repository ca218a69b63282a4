"""Shared test setup. Fixtures live in tests/plugins/<area>.py, one module per area."""

from __future__ import annotations

import importlib.util
from pathlib import Path

_PLUGIN_DIR = Path(__file__).parent / "plugins"

# Each area registers its fixtures in its own plugin module; load every one that exists.
pytest_plugins = sorted(
    f"tests.plugins.{path.stem}"
    for path in _PLUGIN_DIR.glob("*.py")
    if path.stem != "__init__" and importlib.util.find_spec(f"tests.plugins.{path.stem}") is not None
)
