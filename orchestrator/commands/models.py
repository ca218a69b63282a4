"""`fab models`: the models etlab knows by name, the built-ins and the ones lowered from a spec or a user's file."""

from __future__ import annotations

from pathlib import Path

from orchestrator.commands.render_lowering import print_models
from orchestrator.lowering.builtins import BUILTIN_SPECS
from orchestrator.lowering.lowered import find_lowered, lowered_names
from orchestrator.lowering.spec import InputSpec, ModelSpec


def list_models(root: Path | None = None) -> int:
    lowered = [found for name in lowered_names(root) if (found := find_lowered(name, root)) is not None]
    builtins = list(BUILTIN_SPECS.values())
    print_models(builtins, lowered, {spec.name: family_inputs(spec) for spec in builtins if not spec.inputs})
    return 0


def family_inputs(spec: ModelSpec) -> tuple[InputSpec, ...]:
    """The inputs a spec leaves to its family (a speech encoder's input_values or input_features, their sizes from
    the config): what its builder would give the program, from the config alone (no weights, no download)."""
    # here, not at the top: the builders import torch and transformers, which only these few specs need
    from orchestrator.lowering.sources.builders.models import builder, check_spec

    return builder(spec.model_source).known_inputs(spec, check_spec(spec, "random").config)
