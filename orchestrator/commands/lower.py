"""`fab lower`: export a model once and lower it to the requested backends and quantized variants (cached)."""

from __future__ import annotations

from pathlib import Path

from orchestrator import options
from orchestrator.commands.render import print_lowering


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
) -> int:
    from orchestrator.lowering import lower as lowering
    from orchestrator.lowering.artifacts import parse_backends
    from orchestrator.lowering.spec import resolve_spec

    # Every option before the cache is looked at: a bad value must not invalidate it.
    mode = options.weights(weights)
    backends = parse_backends(backend, quantize=quantize)
    workers = None if jobs is None else options.count("--jobs", jobs, minimum=1, maximum=options.MAX_THREADS)
    calibration_file = Path(calibration) if calibration else None
    if calibration_file is not None and not calibration_file.is_file():
        raise options.UsageError(f"--calibration {calibration}: no such file")
    result = lowering.lower(
        resolve_spec(model, spec, trust_remote_code=trust_remote_code),
        backends=backends,
        weights=mode,
        etrecord=etrecord,
        force=force,
        calibration=calibration_file,
        jobs=workers,
    )
    print_lowering(result)
    return 0
