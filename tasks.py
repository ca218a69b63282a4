"""Fabric tasks. Each one only parses options and calls one library function (see docs/DESIGN.md)."""

from __future__ import annotations

from fabric import task

from orchestrator.cli import handle_errors


@task(
    help={
        "model": "built-in model name (distilbert, gpt2, distilbert-tiny, gpt2-tiny)",
        "spec": "path to your own model_spec.json (instead of --model)",
        "backend": "comma-separated backends: portable,xnnpack (default both)",
        "weights": "auto (default: pretrained, else random with a warning), pretrained, or random",
        "etrecord": "also write an ETRecord (about twice the size of the .pt2)",
        "force": "re-lower even when the cache is valid",
    }
)
@handle_errors
def lower(c, model=None, spec=None, backend="portable,xnnpack", weights="auto", etrecord=False, force=False):
    """Export a model and lower it to portable and/or XNNPACK .pte files under artifacts/<name>/."""
    from orchestrator import lowering
    from orchestrator.artifacts import parse_backends
    from orchestrator.spec import resolve_spec

    result = lowering.lower(
        resolve_spec(model, spec), backends=parse_backends(backend), weights=weights, etrecord=etrecord, force=force
    )
    lowering.print_summary(result)
