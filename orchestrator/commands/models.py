"""`fab models`: the models etlab knows by name, the built-ins and the ones lowered from a spec or a user's file."""

from __future__ import annotations

from pathlib import Path

from orchestrator.commands.render_lowering import print_models
from orchestrator.lowering.builtins import BUILTIN_SPECS
from orchestrator.lowering.lowered import find_lowered, lowered_names


def list_models(root: Path | None = None) -> int:
    lowered = [found for name in lowered_names(root) if (found := find_lowered(name, root)) is not None]
    print_models(list(BUILTIN_SPECS.values()), lowered)
    return 0
