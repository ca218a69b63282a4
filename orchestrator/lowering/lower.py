"""`fab lower`: export a spec once, lower it per backend, and write artifacts with sidecars.

The cache check runs before torch is imported (importing torch alone costs seconds), so a lowering with
nothing changed finishes in well under two seconds. It is keyed on the *resolved* weights (weights.py
decides `auto` without torch): `auto` that falls back to random hits the cache of `random`, and back.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from orchestrator import console, options
from orchestrator.fsutil import atomic_path, atomic_write_json, read_json, remove_stale_temporaries
from orchestrator.lowering.artifacts import SIDECAR_SCHEMA, ArtifactPaths, file_record, sidecar_problem
from orchestrator.lowering.spec import ModelSpec
from orchestrator.lowering.weights import WeightsChoice, resolve_weights
from orchestrator.versions import toolchain_versions

# Source files whose content decides what lowering produces; editing them invalidates the cache.
_LOWERING_SOURCES = ("lower.py", "models.py", "delegation.py", "spec.py", "weights.py")


@dataclass
class BackendResult:
    backend: str
    pte: Path
    sidecar: dict[str, Any]
    cached: bool


@dataclass
class LoweringResult:
    spec: ModelSpec
    paths: ArtifactPaths
    backends: dict[str, BackendResult] = field(default_factory=dict)
    stage_seconds: dict[str, float] = field(default_factory=dict)

    @property
    def cached(self) -> bool:
        return all(result.cached for result in self.backends.values())


def _code_revision() -> str:
    digest = hashlib.sha256()
    here = Path(__file__).parent
    for name in _LOWERING_SOURCES:
        digest.update((here / name).read_bytes())
    return digest.hexdigest()[:16]


def cache_key(spec: ModelSpec, backend: str, weights: str, etrecord: bool) -> str:
    """The key a sidecar must carry to be reused; `weights` is the resolved mode, "pretrained" or "random"."""
    material = {
        "spec": spec.identity(),
        "backend": backend,
        "weights": weights,
        "etrecord": etrecord,
        "versions": toolchain_versions(),
        "code": _code_revision(),
    }
    return hashlib.sha256(json.dumps(material, sort_keys=True).encode()).hexdigest()


def _cached(artifact_paths: ArtifactPaths, backend: str, key: str, weights: str) -> dict | None:
    if sidecar_problem(artifact_paths, backend) is not None:
        return None
    sidecar = read_json(artifact_paths.sidecar(backend))
    if sidecar.get("cache_key") != key or sidecar.get("weights") != weights:
        return None
    return sidecar


def lower(
    spec: ModelSpec,
    *,
    backends: list[str],
    weights: str = "auto",
    etrecord: bool = False,
    force: bool = False,
    root: Path | None = None,
) -> LoweringResult:
    weights = options.weights(weights)  # a bad mode must not invalidate the cached sidecars below
    artifact_paths = ArtifactPaths.for_model(spec.name, root)
    result = LoweringResult(spec, artifact_paths)
    # `auto` that became pretrained since the last (random) lowering gets a new key, so it is redone.
    choice = resolve_weights(spec, weights)
    keys = {backend: cache_key(spec, backend, choice.mode, etrecord) for backend in backends}

    missing = []
    for backend in backends:
        sidecar = None if force else _cached(artifact_paths, backend, keys[backend], choice.mode)
        if sidecar is None:
            missing.append(backend)
        else:
            result.backends[backend] = BackendResult(backend, artifact_paths.pte(backend), sidecar, cached=True)
    if not missing:
        console.info(f"[green]✓[/] {spec.name}: using cached artifacts for {', '.join(backends)} (nothing changed)")
        return result

    timer = console.StageTimer(prefix=f"{spec.name}: ")
    artifact_paths.folder.mkdir(parents=True, exist_ok=True)
    remove_stale_temporaries(artifact_paths.folder)
    for backend in missing:
        # Invalidate first: from here until the new sidecar lands, this backend has no valid artifact.
        artifact_paths.sidecar(backend).unlink(missing_ok=True)

    shared = _export(spec, choice, artifact_paths, timer)
    for backend in missing:
        # Keyed on the weights actually loaded, which the sidecar records next to the key.
        key = cache_key(spec, backend, shared.weights, etrecord)
        sidecar = _lower_backend(spec, backend, shared, artifact_paths, timer, etrecord, key)
        result.backends[backend] = BackendResult(backend, artifact_paths.pte(backend), sidecar, cached=False)
    result.stage_seconds = dict(timer.durations)
    result.backends = {backend: result.backends[backend] for backend in backends}
    return result


@dataclass
class _Exported:
    program: Any
    weights: str
    weights_note: str
    parameters: int
    files: dict[str, dict[str, Any]]
    inputs: list[dict[str, Any]]
    outputs: list[dict[str, Any]]
    example_args: tuple


def _export(
    spec: ModelSpec, weights: WeightsChoice, artifact_paths: ArtifactPaths, timer: console.StageTimer
) -> _Exported:
    with timer.stage("load"):
        import torch

        from orchestrator.lowering.models import load_model, reference_inputs, vocab_size_of
        from orchestrator.tensorfile import NamedTensor, describe, write_tensors

        loaded = load_model(spec, weights)
        inputs = reference_inputs(spec, vocab_size_of(loaded.module))
        example_args = tuple(torch.from_numpy(t.array) for t in inputs)
        with torch.no_grad():
            eager = loaded.module(*example_args)
        outputs = [NamedTensor("output_0", eager.detach().numpy())]
        write_tensors(artifact_paths.reference_inputs, inputs)
        write_tensors(artifact_paths.reference_outputs, outputs)
        console.info(
            console.escape(f"  {spec.name}: {loaded.parameters / 1e6:.1f}M parameters, weights: {loaded.weights_note}")
        )

    with timer.stage("export"):
        program = torch.export.export(loaded.module, example_args, strict=False)

    # Identical content keeps the old file, so other backends' sidecars still vouch for it.
    with timer.stage("save .pt2"), atomic_path(artifact_paths.exported_program, keep_identical=True) as tmp:
        torch.export.save(program, str(tmp))

    files = {
        "exported_program": file_record(artifact_paths.exported_program),
        "reference_inputs": file_record(artifact_paths.reference_inputs),
        "reference_outputs": file_record(artifact_paths.reference_outputs),
    }
    return _Exported(
        program,
        loaded.weights,
        loaded.weights_note,
        loaded.parameters,
        files,
        describe(inputs),
        describe(outputs),
        example_args,
    )


def _lower_backend(
    spec: ModelSpec,
    backend: str,
    shared: _Exported,
    artifact_paths: ArtifactPaths,
    timer: console.StageTimer,
    etrecord: bool,
    key: str,
) -> dict[str, Any]:
    from executorch.exir import to_edge, to_edge_transform_and_lower

    from orchestrator.lowering.delegation import delegation_report
    from orchestrator.results.memory import read_program_memory

    with timer.stage(f"{backend}: to_edge/partition"):
        if backend == "xnnpack":
            from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner

            edge = to_edge_transform_and_lower(
                shared.program, partitioner=[XnnpackPartitioner()], generate_etrecord=etrecord
            )
        else:
            edge = to_edge(shared.program, generate_etrecord=etrecord)
    with timer.stage(f"{backend}: to_executorch"):
        program = edge.to_executorch()
        delegation = delegation_report(program)

    pte_path = artifact_paths.pte(backend)
    with timer.stage(f"{backend}: save"):
        with atomic_path(pte_path) as tmp, open(tmp, "wb") as handle:
            program.write_to_file(handle)
        files = dict(shared.files)
        files["pte"] = file_record(pte_path)
        if etrecord:
            etrecord_path = artifact_paths.etrecord(backend)
            with atomic_path(etrecord_path) as tmp:
                program.get_etrecord().save(str(tmp))
            files["etrecord"] = file_record(etrecord_path)

    # From the written .pte, as the runner will see it: planned arenas, constants, live bytes per instruction.
    memory = read_program_memory(pte_path).to_sidecar()
    sidecar = {
        "schema": SIDECAR_SCHEMA,
        "model": spec.name,
        "model_id": spec.model_id,
        "task": spec.task,
        "backend": backend,
        "method": "forward",
        "exported_program": artifact_paths.exported_program.name,
        "pte": pte_path.name,
        "pte_size_mb": round(files["pte"]["size"] / 1e6, 3),
        "seq_len": spec.seq_len,
        "weights": shared.weights,
        "weights_note": shared.weights_note,
        "parameters": shared.parameters,
        "sha256": files["pte"]["sha256"],
        "versions": toolchain_versions(),
        "inputs": shared.inputs,
        "outputs": shared.outputs,
        "reference_inputs": artifact_paths.reference_inputs.name,
        "reference_outputs": artifact_paths.reference_outputs.name,
        "etrecord": artifact_paths.etrecord(backend).name if etrecord else None,
        "delegation": delegation,
        "memory": memory,
        "spec": spec.to_dict(),
        "cache_key": key,
        "files": files,
        "created": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
    }
    # The sidecar is the commit point: it is written last.
    atomic_write_json(artifact_paths.sidecar(backend), sidecar)
    return sidecar
