"""`fab lower`: export a model once and lower it to the requested backends and quantized variants (cached)."""

from __future__ import annotations

from orchestrator.commands.common import (
    attention_spec,
    context_specs,
    lowering_options,
    model_spec,
    naming_calibration,
    naming_rewrites,
    rewrite_request,
    variants,
)
from orchestrator.commands.programs import lower_exported_task
from orchestrator.commands.render_lowering import print_lowering
from orchestrator.lowering.export import lower as lowering
from orchestrator.lowering.program_name import with_


def lower(
    model: str | None,
    spec: str | None,
    backend: str,
    weights: str,
    *,
    etrecord: bool,
    force: bool,
    quantize: str = "none",
    calibration: str | None = None,
    jobs: int | str | None = None,
    trust_remote_code: bool = False,
    trust_code: bool = False,
    exported: str | None = None,
    name: str | None = None,
    rewrites: str = "none",
    context: str | None = None,
    attention: str | None = None,
) -> int:
    if exported is not None or name is not None:  # the user's own ExportedProgram
        return lower_exported_task(
            exported, name, model, spec, backend, quantize, etrecord=etrecord, force=force,
            others={"--calibration": calibration, "--trust-remote-code": trust_remote_code or None,
                    "--trust-code": trust_code or None, "--weights": None if weights == "auto" else weights,
                    "--jobs": jobs, "--rewrites": None if rewrites == "none" else rewrites, "--context": context,
                    "--attention": attention},
        )  # fmt: skip
    # Every option before the cache is looked at: a bad value must not invalidate it.
    checked = lowering_options(weights, jobs, calibration)
    chosen = variants(backend, quantize)
    target = attention_spec(
        attention, model_spec(model, spec, trust_remote_code=trust_remote_code, trust_code=trust_code)
    )
    request = rewrite_request(rewrites, target)
    for each in context_specs(context, target):  # one program per KV cache size (`--context`)
        with naming_calibration(), naming_rewrites(rewrites):
            result = lowering.lower(
                with_(each, rewrites=request),  # a rewritten program under its own name, beside the model as exported
                variants=chosen,
                weights=checked.weights,
                etrecord=etrecord,
                force=force,
                calibration=checked.calibration,
                jobs=checked.jobs,
                rewrites=request,
            )
        print_lowering(result)
    return 0
