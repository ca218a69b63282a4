"""`fab lower`: export a spec once, lower it per variant, and write artifacts with sidecars.

Quantized variants (`xnnpack-int8-dynamic`, ...; quantize.py) are lowered from the eager model, the others from
the exported program. When several variants are missing they are lowered in parallel (parallel.py), `--jobs` at
once (default: the usable cores), this process counting as one: spawned workers, one per variant, start on the
quantized variants as soon as the model is loaded and the reference inputs written, while this process exports,
lowers the fp32 variants from the program in memory, then takes what is still waiting; as many run at once as the
available memory allows for each variant's recorded (else estimated) peak. Every variant writes its own sidecar
last, so an interrupted lowering leaves every finished variant valid and no unfinished one. `--jobs 1` lowers
everything in this process, in request order.

The cache check runs before torch is imported (importing torch alone costs seconds), so a lowering with
nothing changed finishes in well under two seconds. It is keyed on the *resolved* weights (weights.py
decides `auto` without torch): `auto` that falls back to random hits the cache of `random`, and back.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import hashlib
import importlib.util
import json
import os
import resource
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from orchestrator import console
from orchestrator.errors import SpecError
from orchestrator.fsutil import atomic_path, exclusive_lock, read_json, remove_stale_temporaries, sha256_file
from orchestrator.lowering.artifacts import SIDECAR_SCHEMA, ArtifactPaths, file_record, valid_sidecar
from orchestrator.lowering.delegation import delegation_report, outside_delegates
from orchestrator.lowering.export_errors import EXPORT, TO_EDGE, TO_EXECUTORCH, lowering_stage
from orchestrator.lowering.outputs import eager_outputs, output_records
from orchestrator.lowering.parallel import ParallelLowering, VariantTask, with_program
from orchestrator.lowering.quantize import (
    LLM_SCHEMES,
    calibration_from_file,
    calibration_samples,
    generated_calibration,
    node_report,
    quantize,
    shaped_like,
)
from orchestrator.lowering.rewrites import NO_REWRITES, RewriteRequest, apply_rewrites
from orchestrator.lowering.sidecar import Sidecar, write_sidecar
from orchestrator.lowering.spec import SOURCES, ModelSpec
from orchestrator.lowering.variants import Variant
from orchestrator.lowering.weights import WeightsChoice, resolve_weights
from orchestrator.programs.memory import read_program_memory
from orchestrator.versions import toolchain_versions

# Every module of this package decides what lowering produces (a rewrite in a new module too): editing any
# invalidates the cache. Hashed by relative path, so a moved module is another revision.
LOWERING_PACKAGE = Path(__file__).resolve().parent
_CALIBRATION_IMAGES = 8  # generated calibration samples of an image model (int8-static)
# Peak RSS of a lowering worker per parameter, when no earlier lowering of the variant measured it: from the
# full-size measurements (DistilBERT 67M parameters: 1.8 GB fp32 XNNPACK, 1.3 GB int8, 1.1 GB 8da4w), rounded up.
_BYTES_PER_PARAMETER = 28
_WORKER_BASE_BYTES = 600 * 1024 * 1024  # torch, executorch and transformers imported
_MEMORY_HEADROOM = 0.85  # of MemAvailable: never swap


@dataclass(frozen=True)
class LoweredVariant:
    variant: Variant
    pte: Path
    sidecar: Sidecar
    cached: bool


@dataclass
class LoweringResult:
    spec: ModelSpec
    paths: ArtifactPaths
    variants: dict[Variant, LoweredVariant] = field(default_factory=dict)  # in the order they were asked for
    stage_seconds: dict[str, float] = field(default_factory=dict)

    @property
    def cached(self) -> bool:
        return all(result.cached for result in self.variants.values())


def code_files(source: str | None = None) -> list[Path]:
    """The code that decides what a lowering produces: every .py of the lowering package (recursively, sorted by
    relative path), then the builder module of model source `source` when it lives outside the package (registered
    by a test or a plugin; found without importing it: a cache hit imports no torch). Only the spec's own source:
    another process may not have registered the others."""
    package = LOWERING_PACKAGE
    files = sorted(package.rglob("*.py"), key=lambda path: path.relative_to(package).as_posix())
    if source is not None and source in SOURCES:
        found = importlib.util.find_spec(SOURCES[source].builder.partition(":")[0])
        if found is not None and found.origin:
            files.append(Path(found.origin).resolve())
    return list(dict.fromkeys(files))


def _code_revision(source: str | None = None) -> str:
    digest = hashlib.sha256()
    for path in code_files(source):
        name = path.relative_to(LOWERING_PACKAGE).as_posix() if path.is_relative_to(LOWERING_PACKAGE) else str(path)
        digest.update(name.encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


def cache_key(
    spec: ModelSpec,
    variant: Variant,
    weights: str,
    etrecord: bool,
    calibration: str | None = None,
    rewrites: RewriteRequest = NO_REWRITES,
) -> str:
    """The key a sidecar must carry to be reused; `weights` is the resolved mode, "pretrained" or "random".

    `calibration` (the calibration file's sha256) matters only for a calibrated scheme (int8-static); `rewrites`
    by the ones it resolves to for this spec (another set of rewrites is another program).
    """
    material = {
        "spec": spec.identity(),
        "rewrites": list(rewrites.resolve(spec)),
        "backend": variant.name,
        "weights": weights,
        "etrecord": etrecord,
        "versions": toolchain_versions(),
        "code": _code_revision(spec.model_source),
    }
    if variant.scheme.calibrated:
        material["calibration"] = calibration or "generated"
    return hashlib.sha256(json.dumps(material, sort_keys=True).encode()).hexdigest()


def _cached(artifact_paths: ArtifactPaths, variant: Variant, key: str, weights: str) -> Sidecar | None:
    sidecar, _ = valid_sidecar(artifact_paths, variant)
    if sidecar is None or sidecar.cache_key != key or sidecar.weights != weights:
        return None
    return sidecar


def lower(
    spec: ModelSpec,
    *,
    variants: Sequence[Variant],
    weights: str = "auto",
    etrecord: bool = False,
    force: bool = False,
    root: Path | None = None,
    calibration: Path | None = None,
    jobs: int | None = None,
    rewrites: RewriteRequest = NO_REWRITES,
) -> LoweringResult:
    """Lower `spec` to each variant (cached); `jobs` lowerings at once, this process included (default: the cores).
    `rewrites`: none by default, the model as its user would export it.

    Every value comes checked from the command layer (or the matrix's checker): a bad one must be refused before
    this runs, as it must not invalidate the cached sidecars below.
    """
    calibration_sha = sha256_file(calibration) if calibration is not None else None
    artifact_paths = ArtifactPaths.for_model(spec.name, root)
    result = LoweringResult(spec, artifact_paths)
    # `auto` that became pretrained since the last (random) lowering gets a new key, so it is redone.
    choice = resolve_weights(spec, weights)
    variants = tuple(dict.fromkeys(variants))
    _check_llm_recipes(spec, variants)
    keys = {variant: cache_key(spec, variant, choice.mode, etrecord, calibration_sha, rewrites) for variant in variants}

    missing = []
    for variant in variants:
        sidecar = None if force else _cached(artifact_paths, variant, keys[variant], choice.mode)
        if sidecar is None:
            missing.append(variant)
        else:
            result.variants[variant] = LoweredVariant(variant, artifact_paths.pte(variant), sidecar, cached=True)
    if not missing:
        names = ", ".join(variant.name for variant in variants)
        console.info(f"[green]✓[/] {spec.name}: using cached artifacts for {names} (nothing changed)")
        return result
    # Everything a spec or calibration file can get wrong is refused now (exit 64): before the model loads, a
    # worker starts or a cached sidecar is invalidated.
    kind = _check_inputs(spec, choice, calibration)
    # Another process lowering this model into the same folder (a second `fab lower`, a parallel test worker) would
    # delete this one's temporaries and invalidate its sidecars: one at a time, and what the other one lowered
    # meanwhile is a cache hit.
    with exclusive_lock(artifact_paths.folder.parent / f".{artifact_paths.folder.name}.lowering.lock"):
        for variant in [] if force else list(missing):
            sidecar = _cached(artifact_paths, variant, keys[variant], choice.mode)
            if sidecar is not None:
                missing.remove(variant)
                result.variants[variant] = LoweredVariant(variant, artifact_paths.pte(variant), sidecar, cached=True)
        if missing:
            _lower_missing(spec, choice, kind, missing, result, etrecord, calibration, calibration_sha, jobs, rewrites)
        else:
            names = ", ".join(variant.name for variant in variants)
            console.info(f"[green]✓[/] {spec.name}: using cached artifacts for {names} (another process lowered them)")
    result.variants = {variant: result.variants[variant] for variant in variants}
    return result


def _lower_missing(
    spec: ModelSpec,
    choice: WeightsChoice,
    kind: str,
    missing: list[Variant],
    result: LoweringResult,
    etrecord: bool,
    calibration: Path | None,
    calibration_sha: str | None,
    jobs: int | None,
    rewrites: RewriteRequest,
) -> None:
    """Lower the variants `missing` from the cache into `result`, under the model folder's lock."""
    artifact_paths = result.paths
    calibrated = [variant.scheme.name for variant in missing if variant.scheme.calibrated]
    if calibrated and calibration is None:
        console.loud_warning(
            f"{spec.name}: {', '.join(calibrated)} is calibrated on {_GENERATED_CALIBRATION[kind]}, deterministic.\n"
            "Scales fitted to them may not suit real inputs: pass --calibration FILE with your own samples."
        )

    timer = console.StageTimer(prefix=f"{spec.name}: ")
    artifact_paths.folder.mkdir(parents=True, exist_ok=True)
    remove_stale_temporaries(artifact_paths.folder)
    measured = {variant: _recorded_lowering(artifact_paths, variant) for variant in missing}
    for variant in missing:
        # Invalidate first: from here until the new sidecar lands, this variant has no valid artifact.
        artifact_paths.sidecar(variant).unlink(missing_ok=True)

    shared = _load(spec, choice, artifact_paths, timer, rewrites)
    if calibration is not None and kind == "own":  # its inputs are known once the module's source ran
        calibration_samples(calibration, _input_triples(shared.inputs), spec.name)
    tasks = [
        VariantTask(
            spec=spec,
            variant=variant,
            weights=shared.weights,
            weights_note=shared.weights_note,
            parameters=shared.parameters,
            # The .pt2 joins the files of the variants lowered from it once it is saved.
            files=dict(shared.files),
            inputs=shared.inputs,
            outputs=shared.outputs,
            root=artifact_paths.folder.parent,
            etrecord=etrecord,
            key=cache_key(spec, variant, shared.weights, etrecord, calibration_sha, rewrites),
            calibration=str(calibration) if calibration is not None else None,
            peak_bytes=measured[variant][0] or _estimated_peak(shared.parameters),
            # Until a lowering of the variant measured it: the longest start first.
            expected_seconds=measured[variant][1] or variant.relative_cost,
            rewrites=shared.rewrites,
            generation=shared.generation,
        )
        for variant in missing
    ]
    # `jobs` lowerings at once, this process counting as one: it exports and lowers too, and cheapest (no import,
    # no model to rebuild, the program in memory). More processes than cores only add that overhead.
    workers = min(jobs or _usable_cores(), len(missing)) - 1
    if workers > 0:
        done = _lower_parallel(tasks, workers, shared, artifact_paths, timer)
    else:  # one process, in request order, every variant from the model and program in memory
        program_record = _export(shared, artifact_paths, timer)
        done = {task.variant: _lower_variant(with_program(task, program_record), shared) for task in tasks}
    for variant, sidecar in done.items():
        result.variants[variant] = LoweredVariant(variant, artifact_paths.pte(variant), sidecar, cached=False)
    result.stage_seconds = dict(timer.durations)


def _check_inputs(spec: ModelSpec, choice: WeightsChoice, calibration: Path | None) -> str:
    """The spec's config built and checked (no weights), and the calibration file read against the model's inputs
    (token ids: against its vocabulary). Returns the kind of the model's inputs (`_GENERATED_CALIBRATION`)."""
    # here, not at the top: it imports torch (seconds), which a cache hit never needs
    from orchestrator.lowering.models import OWN, TOKENS, builder, check_spec

    if spec.trust_remote_code:
        console.loud_warning(
            f"--trust-remote-code: the Python files of {spec.model_id} will run, with your privileges.\n"
            "Only do this for a model whose code you have read."
            if choice.mode == "pretrained"
            else f"--trust-remote-code has no effect: {spec.name} gets random weights from transformers' own classes."
        )
    checked = check_spec(spec, choice, available=available_memory())
    for warning in checked.warnings:
        console.warn(warning)
    source = builder(spec.model_source)
    inputs = [(item.name, item.dtype, tuple(item.shape)) for item in source.known_inputs(spec, checked.config)]
    kind = source.input_kind(spec, [name for name, _, _ in inputs])
    if calibration is not None and kind == TOKENS:
        calibration_from_file(calibration, spec.seq_len, checked.config.vocab_size)
    elif calibration is not None and kind != OWN:  # a module's own inputs: checked once it ran
        calibration_samples(calibration, inputs, spec.name)
    return kind


# What int8-static is calibrated on without a calibration file, per kind of input (models.py; as the warning says).
_GENERATED_CALIBRATION = {
    "tokens": "generated token ids (not real text)",
    "images": "generated images, random and normalised as the model's preprocessing does (not real photos)",
    "audio": "generated audio, a chord and noise made like its reference input (not real speech)",
    "own": "the source's example inputs only (one sample: etlab cannot make more of a module it does not know)",
}


def _input_triples(inputs: Sequence[dict[str, Any]]) -> list[tuple[str, str, tuple[int, ...]]]:
    """Sidecar input records (name, shape, dtype) as (name, dtype, shape)."""
    return [(item["name"], str(item["dtype"]), tuple(item["shape"])) for item in inputs]


def _lower_parallel(
    tasks: list[VariantTask],
    workers: int,
    shared: _Exported,
    artifact_paths: ArtifactPaths,
    timer: console.StageTimer,
) -> dict[Variant, Sidecar]:
    """Workers start on the quantized variants while this process exports, then lowers the fp32 ones."""
    import torch

    budget = available_memory()
    fp32_peaks = [task.peak_bytes for task in tasks if task.needs_program]
    threads = torch.get_num_threads()
    # Several lowerings share the cores: one intra-op thread each, or their OpenMP threads spin against each other.
    torch.set_num_threads(1)
    try:
        with ParallelLowering(
            tasks,
            workers,
            worker=_lower_variant,
            main_peak=max(fp32_peaks, default=_estimated_peak(shared.parameters)),
            budget=int(budget * _MEMORY_HEADROOM) if budget is not None else None,
            timer=timer,
        ) as parallel:
            parallel.program_saved(_export(shared, artifact_paths, timer))
            return parallel.run_main(lambda task: _lower_variant(task, shared, threads=threads))
    finally:
        torch.set_num_threads(threads)


def _usable_cores() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)


def available_memory() -> int | None:
    """MemAvailable from /proc/meminfo in bytes (None where there is no such file)."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def _estimated_peak(parameters: int) -> int:
    return _WORKER_BASE_BYTES + _BYTES_PER_PARAMETER * parameters


def _recorded_lowering(artifact_paths: ArtifactPaths, variant: Variant) -> tuple[int | None, float | None]:
    """Peak RSS and seconds the last lowering of this variant measured (from its sidecar, valid or not)."""
    # Raw JSON, not a Sidecar: a stale or older sidecar that Sidecar.from_dict refuses still says what it cost.
    try:
        record = read_json(artifact_paths.sidecar(variant)).get("lowering", {})
        peak, seconds = record.get("peak_rss_bytes"), record.get("seconds")
    except (OSError, ValueError, AttributeError):
        return None, None
    peak_ok = isinstance(peak, int) and not isinstance(peak, bool) and peak > 0
    seconds_ok = isinstance(seconds, int | float) and not isinstance(seconds, bool) and seconds > 0
    return (peak if peak_ok else None), (float(seconds) if seconds_ok else None)


@dataclass
class _Exported:
    """What the main process shares with the variants it lowers itself: the eager model, then the program."""

    weights: str
    weights_note: str
    parameters: int
    files: dict[str, dict[str, Any]]
    inputs: list[dict[str, Any]]
    outputs: list[dict[str, Any]]
    example_args: tuple
    module: Any  # the eager module, for quantized variants lowered in this process
    rewrites: tuple[str, ...] = ()  # the rewrites applied to it
    program: Any = None  # the exported program, once `_export` ran
    context: int | None = None  # text-generation: the KV cache's positions (a dynamic sequence length up to it)
    generation: dict[str, Any] | None = None  # text-generation: the sidecar's `generation` record


def _load(
    spec: ModelSpec,
    weights: WeightsChoice,
    artifact_paths: ArtifactPaths,
    timer: console.StageTimer,
    rewrites: RewriteRequest = NO_REWRITES,
) -> _Exported:
    """Load the model and write the reference inputs and outputs: all a quantized variant needs."""
    with timer.stage("load"):
        import torch

        # here, not at the top: it imports torch (seconds), which a cache hit never needs; numpy with tensorfile
        from orchestrator.lowering.models import example_inputs, load_model
        from orchestrator.tensorfile import NamedTensor, describe, write_tensors

        loaded = load_model(spec, weights)
        module, applied = apply_rewrites(loaded.module, spec, rewrites)
        if spec.generates:  # the board gets the prompt; the reference is eager greedy generation from it
            from orchestrator.lowering import generation

            made = generation.reference(module, spec)
            inputs, board_inputs, outputs, generation_record = made.inputs, made.board_inputs, made.outputs, made.record
            example_args = tuple(torch.from_numpy(t.array) for t in inputs)
        else:
            inputs = example_inputs(spec, module)
            example_args = tuple(torch.from_numpy(t.array) for t in inputs)
            with torch.no_grad():
                eager = module(*example_args)
            board_inputs, generation_record = inputs, None
            outputs = [NamedTensor(f"output_{i}", array) for i, array in enumerate(eager_outputs(eager))]
        write_tensors(artifact_paths.reference_inputs, board_inputs)
        write_tensors(artifact_paths.reference_outputs, outputs)
        console.info(
            console.escape(f"  {spec.name}: {loaded.parameters / 1e6:.1f}M parameters, weights: {loaded.weights_note}")
        )
        if applied:
            console.info(console.escape(f"  {spec.name}: rewrites applied: {', '.join(applied)}"))
    files = {
        "reference_inputs": file_record(artifact_paths.reference_inputs),
        "reference_outputs": file_record(artifact_paths.reference_outputs),
    }
    return _Exported(
        loaded.weights,
        loaded.weights_note,
        loaded.parameters,
        files,
        describe(inputs),
        output_records(spec.task, describe(outputs)),
        example_args,
        module,
        applied,
        context=spec.cache_capacity if spec.generates else None,
        generation=generation_record,
    )


def export_module(module: Any, example_args: tuple, *, model: str) -> Any:
    """`module` exported with `example_args` as etlab exports every model (strict=False, the inputs' fixed shapes).

    The entry point for anything that brings a module: a spec's source, a user's factory. A model that cannot be
    exported is an ExportError (exit 65) naming `model`, the line of its code torch stopped at, and a hint.
    """
    import torch

    with lowering_stage(EXPORT, model):
        return torch.export.export(module, example_args, strict=False)


def lower_exported(
    exported: Any,
    variant: Variant,
    *,
    model: str,
    etrecord: bool = False,
    timer: console.StageTimer | None = None,
    quiet: bool = False,
    fuse_quantized: bool = False,
) -> Any:
    """An exported program lowered to `variant`'s backend: the ExecuTorch program manager, not yet written.

    `fuse_quantized`: torchao's dequantize + embedding patterns become ExecuTorch's quantized operators (and
    constants are folded), as ExecuTorch's LLM export does; only for programs that need it (quantized embeddings).

    A failure is an ExportError naming `model`, the stage (to_edge, to_executorch) and the operator at fault.
    """
    from executorch.exir import to_edge, to_edge_transform_and_lower

    timer = timer or console.StageTimer(prefix=f"{model}: ")
    with timer.stage(f"{variant}: to_edge/partition", quiet=quiet), lowering_stage(TO_EDGE, model, exported):
        if variant.backend == "xnnpack":
            from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner

            edge = to_edge_transform_and_lower(exported, partitioner=[XnnpackPartitioner()], generate_etrecord=etrecord)
        else:
            edge = to_edge(exported, generate_etrecord=etrecord)
    with timer.stage(f"{variant}: to_executorch", quiet=quiet), lowering_stage(TO_EXECUTORCH, model, exported):
        if fuse_quantized:
            from executorch.exir import ExecutorchBackendConfig

            return edge.to_executorch(ExecutorchBackendConfig(do_quant_fusion_and_const_prop=True))
        return edge.to_executorch()


def _export(shared: _Exported, artifact_paths: ArtifactPaths, timer: console.StageTimer) -> dict[str, Any]:
    """Export the loaded model into `shared.program` and save the .pt2; returns the .pt2's file record."""
    import torch

    with timer.stage("export"):
        if shared.context is not None:
            from orchestrator.lowering import generation

            with lowering_stage(EXPORT, artifact_paths.name):
                shared.program = generation.export(shared.module, shared.example_args, shared.context)
        else:
            shared.program = export_module(shared.module, shared.example_args, model=artifact_paths.name)

    # Identical content keeps the old file, so other variants' sidecars still vouch for it.
    with timer.stage("save .pt2"), atomic_path(artifact_paths.exported_program, keep_identical=True) as tmp:
        torch.export.save(shared.program, str(tmp))
    return file_record(artifact_paths.exported_program)


def _lower_variant(task: VariantTask, shared: _Exported | None = None, *, threads: int | None = None) -> Sidecar:
    """Lower one variant and write its .pte and sidecar; in a worker process `shared` is None and reloaded.

    `threads` (this process's default intra-op threads) is given when other lowerings run at the same time.
    """
    started = time.perf_counter()
    if shared is None:
        console.quiet_third_party()  # a spawned worker starts with default warning filters
    if shared is None or threads is not None:
        _share_cores(task, threads)
    _reset_peak_rss()
    artifact_paths = ArtifactPaths.for_model(task.spec.name, task.root)
    timer = console.StageTimer(prefix=f"{task.spec.name}: ")
    quantization = None
    with timer.stage(f"{task.variant}: prepare", quiet=shared is None):
        if not task.needs_program:
            program, quantization = _quantized_program(task, artifact_paths, shared)
        elif shared is not None and shared.program is not None:
            program = shared.program
        else:
            import torch

            program = torch.export.load(str(artifact_paths.exported_program))
    return _lower_program(program, task, artifact_paths, timer, quantization, started, quiet=shared is None)


def _share_cores(task: VariantTask, threads: int | None) -> None:
    """One intra-op thread per lowering when several run at once, or their OpenMP threads spin against each other.

    A calibrated scheme (int8-static) keeps the default: its calibration's float results, and so its scales,
    depend on the thread count, and they must match a `--jobs 1` lowering's.
    """
    import torch

    default = threads or torch.get_num_threads()
    torch.set_num_threads(default if task.variant.scheme.calibrated else 1)


def _reset_peak_rss() -> None:
    """Start the process's VmHWM afresh (Linux), so a variant lowered in-process reports its own peak."""
    with contextlib.suppress(OSError):
        Path("/proc/self/clear_refs").write_text("5")


def _peak_rss_bytes() -> int:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _seq_len(inputs: Sequence[dict[str, Any]]) -> int | None:
    """The token ids' length where the program takes them: an image's or an audio model's inputs have none."""
    return next((int(item["shape"][-1]) for item in inputs if item["name"] == "input_ids" and item["shape"]), None)


def _quantized_program(
    task: VariantTask, artifact_paths: ArtifactPaths, shared: _Exported | None
) -> tuple[Any, dict[str, Any]]:
    import torch

    # here, not at the top: it imports torch (seconds), which a cache hit never needs; numpy with tensorfile
    from orchestrator.lowering.models import TOKENS, builder, load_model, vocab_size_of
    from orchestrator.tensorfile import read_tensors

    if shared is not None and shared.module is not None:
        module = shared.module
    else:
        module = load_model(task.spec, task.weights).module
        module, _ = apply_rewrites(module, task.spec, RewriteRequest(names=task.rewrites))
    scheme = task.variant.scheme
    reference = read_tensors(artifact_paths.reference_inputs)
    example_args = tuple(torch.from_numpy(t.array) for t in reference)
    if task.spec.generates:  # the board's file holds the prompt; the program takes its positions too
        example_args = (*example_args, torch.arange(example_args[0].shape[1]))
    source_builder = builder(task.spec.model_source)
    kind = source_builder.input_kind(task.spec, [t.name for t in reference])
    calibration, source = None, None
    if scheme.calibrated and task.calibration and kind != TOKENS:  # checked against the inputs before lowering
        path = Path(task.calibration)
        triples = [(t.name, t.dtype, tuple(t.array.shape)) for t in reference]
        calibration = calibration_samples(path, triples, task.spec.name)
        source = f"file {path.name} (sha256 {sha256_file(path)[:12]})"
    elif scheme.calibrated and kind != TOKENS:  # images, audio, a module's own inputs: its source makes them
        calibration, source = source_builder.calibration(task.spec, module, example_args, kind, _CALIBRATION_IMAGES)
    elif scheme.calibrated:
        vocab = vocab_size_of(module)
        if task.calibration:
            samples = calibration_from_file(Path(task.calibration), task.spec.seq_len, vocab)
            calibration = shaped_like(samples, example_args)
            source = f"file {Path(task.calibration).name} (sha256 {sha256_file(Path(task.calibration))[:12]})"
        else:
            calibration = generated_calibration(example_args, vocab)
            source = "generated: deterministic random token ids (not real text)"
    apply = None
    if task.spec.generates:  # as ExecuTorch's LLM recipe: 8-bit embeddings too, exported with the KV cache
        from orchestrator.lowering import generation

        apply = generation.quantizer(scheme, task.spec.cache_capacity)
    with lowering_stage(f"{EXPORT} (quantizing to {scheme.name})", task.spec.name):
        quantized = quantize(
            module, example_args, scheme, calibration=calibration, calibration_source=source, apply=apply
        )
    if task.spec.generates and scheme.llm is not None:  # the recipe that quantized it
        quantized.report["method"] = scheme.llm.method
    return quantized.program, quantized.report


def _check_llm_recipes(spec: ModelSpec, variants: Sequence[Variant]) -> None:
    """A text-generation program takes only the schemes that carry an LLM recipe: any other is refused (exit 64),
    never given another scheme's recipe."""
    refused = [variant.scheme.name for variant in variants if variant.quantized and variant.scheme.llm is None]
    if spec.generates and refused:
        raise SpecError(
            f"{spec.name}: {', '.join(refused)} has no recipe for a text-generation program (a text-generation "
            "program takes a prompt, then one token at a time): quantize it with "
            + " or ".join(scheme.name for scheme in LLM_SCHEMES)
        )


def _lower_program(
    exported: Any,
    task: VariantTask,
    artifact_paths: ArtifactPaths,
    timer: console.StageTimer,
    quantization: dict[str, Any] | None,
    started: float,
    *,
    quiet: bool = False,
) -> Sidecar:
    spec, variant, etrecord = task.spec, task.variant, task.etrecord
    # Quantized embeddings become quantized_decomposed::embedding_byte (the runner links those kernels).
    fuse = spec.generates and variant.quantized
    program = lower_exported(
        exported, variant, model=spec.name, etrecord=etrecord, timer=timer, quiet=quiet, fuse_quantized=fuse
    )
    delegation = delegation_report(program)

    pte_path = artifact_paths.pte(variant)
    with timer.stage(f"{variant}: save", quiet=quiet):
        with atomic_path(pte_path) as tmp, open(tmp, "wb") as handle:
            program.write_to_file(handle)
        files = dict(task.files)
        files["pte"] = file_record(pte_path)
        if etrecord:
            etrecord_path = artifact_paths.etrecord(variant)
            with atomic_path(etrecord_path) as tmp:
                program.get_etrecord().save(str(tmp))
            files["etrecord"] = file_record(etrecord_path)

    # From the written .pte, as the runner will see it: planned arenas, constants, live bytes per instruction.
    memory = read_program_memory(pte_path).to_sidecar()
    if quantization is not None:
        quantization = {
            **quantization,
            "nodes": node_report(pte_path, variant.scheme, delegation["fallback_histogram"]),
        }
        quantization["pte_bytes"] = files["pte"]["size"]

    data = {
        "schema": SIDECAR_SCHEMA,
        "model": spec.name,
        "model_id": spec.model_id,
        "task": spec.task,
        "backend": variant.name,
        "method": "forward",
        "exported_program": artifact_paths.exported_program.name,
        "pte": pte_path.name,
        "pte_size_mb": round(files["pte"]["size"] / 1e6, 3),
        "seq_len": _seq_len(task.inputs),
        "weights": task.weights,
        "weights_note": task.weights_note,
        "parameters": task.parameters,
        "sha256": files["pte"]["sha256"],
        "versions": toolchain_versions(),
        "inputs": task.inputs,
        "outputs": task.outputs,
        "reference_inputs": artifact_paths.reference_inputs.name,
        "reference_outputs": artifact_paths.reference_outputs.name,
        "etrecord": artifact_paths.etrecord(variant).name if etrecord else None,
        "delegation": delegation,
        "memory": memory,
        # Real kernels apart from bookkeeping nodes, and constants stored twice: what `fallback_ops` does not say.
        "outside_delegates": outside_delegates(pte_path, delegation["fallback_histogram"]),
        "quantization": quantization,
        "lowering": {"seconds": round(time.perf_counter() - started, 2), "peak_rss_bytes": _peak_rss_bytes()},
        "spec": spec.to_dict(),
        "rewrites": list(task.rewrites),
        "generation": task.generation,
        "cache_key": task.key,
        "files": files,
        "created": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
    }
    # Checked before it is written: a sidecar this lowering cannot read back must not become a valid artifact.
    sidecar = Sidecar.from_dict(data, artifact_paths.sidecar(variant).name)
    for note in sidecar.quantization.float_notes() if sidecar.quantization else ():
        console.warn(f"{spec.name}: {variant}: {note}")
    # The sidecar is the commit point: it is written last.
    write_sidecar(artifact_paths.sidecar(variant), sidecar)
    return sidecar
