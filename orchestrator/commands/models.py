"""`fab models`: the models etlab knows by name, the built-ins and the ones lowered from a spec or a user's file.

A static list, so it loads nothing: the built-ins' inputs are their specs' or recorded (builtins.FAMILY_INPUTS),
and a lowered model is known by its sidecars (read and checked against their files' size and time, as a cache hit
does), never by its program. No torch, no transformers.
"""

from __future__ import annotations

from pathlib import Path

from orchestrator.commands.render_models import print_models
from orchestrator.lowering.artifacts import ArtifactPaths, valid_sidecar
from orchestrator.lowering.builtins import BUILTIN_SPECS, listed_inputs
from orchestrator.lowering.lowered import find_lowered, lowered_names
from orchestrator.lowering.variants import VARIANTS


def list_models(root: Path | None = None, *, long: bool = False) -> int:
    """One line per model; `long`: the built-ins' source, output and description, and where each lowered one is
    from, in two tables as before."""
    lowered = [found for name in lowered_names(root) if (found := find_lowered(name, root)) is not None]
    builtins = list(BUILTIN_SPECS.values())
    inputs = {spec.name: listed_inputs(spec) for spec in builtins}
    names = [*(spec.name for spec in builtins), *(model.name for model in lowered)]
    print_models(builtins, lowered, inputs, {name: lowered_backends(name, root) for name in names}, long=long)
    return 0


def lowered_backends(name: str, root: Path | None = None) -> list[str]:
    """The variants of model `name` whose artifacts are complete and intact (whatever etlab lowered them with: a
    lowering checks its cache key again)."""
    artifact_paths = ArtifactPaths.for_model(name, root)
    if not artifact_paths.folder.is_dir():
        return []
    found = []
    for variant in VARIANTS.values():
        sidecar, _ = valid_sidecar(artifact_paths, variant)
        if sidecar is not None and sidecar.model == name:
            found.append(variant.name)
    return found
