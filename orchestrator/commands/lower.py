"""`fab lower`: export a model once and lower it to the requested backends (cached)."""

from __future__ import annotations

from orchestrator import options
from orchestrator.commands.render import print_lowering


def lower(model: str | None, spec: str | None, backend: str, weights: str, *, etrecord: bool, force: bool) -> int:
    from orchestrator.lowering import lower as lowering
    from orchestrator.lowering.artifacts import parse_backends
    from orchestrator.lowering.spec import resolve_spec

    mode = options.weights(weights)  # before the cache is looked at: a bad value must not invalidate it
    result = lowering.lower(
        resolve_spec(model, spec), backends=parse_backends(backend), weights=mode, etrecord=etrecord, force=force
    )
    print_lowering(result)
    return 0
