"""`fab lower`: export a spec once, lower it per variant, and write artifacts with sidecars.

Quantized variants (`xnnpack-int8-dynamic`, ...; quantize/) are lowered from the eager model, the others from
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

import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from orchestrator import console
from orchestrator.fsutil import atomic_path, file_lock, read_json, remove_stale_temporaries, sha256_file
from orchestrator.lowering.artifacts import ArtifactPaths, file_record
from orchestrator.lowering.export.cache import cache_key, cached_sidecar
from orchestrator.lowering.export.export_errors import EXPORT, lowering_stage
from orchestrator.lowering.export.parallel import ParallelLowering, VariantTask, with_program
from orchestrator.lowering.export.program import export_module, lower_program, reset_peak_rss
from orchestrator.lowering.export.quantized import check_llm_recipes, quantized_program
from orchestrator.lowering.outputs import eager_outputs, output_records
from orchestrator.lowering.program import KeepFloatRefused
from orchestrator.lowering.quantize.calibration import calibration_from_file, calibration_samples
from orchestrator.lowering.rewrites.registry import NO_REWRITES, RewriteRequest, apply_rewrites
from orchestrator.lowering.sidecar import Sidecar
from orchestrator.lowering.sources.huggingface import HuggingFaceOptions
from orchestrator.lowering.spec import ModelSpec
from orchestrator.lowering.variants import Variant
from orchestrator.lowering.weights import WeightsChoice, resolve_weights

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
    """Lower `spec` to each variant (cached); `jobs` lowerings at once, this process included (default: the
    cores no other work holds, idle_cores).
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
    check_llm_recipes(spec, variants)
    check_mixed_precision(spec, variants)
    keys = {variant: cache_key(spec, variant, choice.mode, etrecord, calibration_sha, rewrites) for variant in variants}

    missing = []
    for variant in variants:
        sidecar = None if force else cached_sidecar(artifact_paths, variant, keys[variant], choice.mode)
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
    with file_lock(artifact_paths.folder.parent / f".{artifact_paths.folder.name}.lowering.lock"):
        for variant in [] if force else list(missing):
            sidecar = cached_sidecar(artifact_paths, variant, keys[variant], choice.mode)
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
    # no model to rebuild, the program in memory). More processes than idle cores only add that overhead.
    if jobs is None:
        cores, load = _usable_cores(), _load_average()
        jobs = idle_cores(cores, load)
        if jobs < min(cores, len(missing)):
            console.detail(
                f"{spec.name}: {jobs} lowering{'s' if jobs > 1 else ''} at once, the machine being busy (load "
                f"{load:.1f} on {cores} cores); --jobs sets how many"
            )
    workers = min(jobs, len(missing)) - 1
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
    from orchestrator.lowering.sources.builders.models import OWN, TOKENS, builder, check_spec

    options = spec.options
    if isinstance(options, HuggingFaceOptions) and options.trust_remote_code:
        console.loud_warning(
            f"--trust-remote-code: the Python files of {options.model_id} will run, with your privileges.\n"
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


# What int8-static is calibrated on without a calibration file, per kind of input (sources/builders/models.py; as the
# warning says).
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


def idle_cores(cores: int, load: float | None) -> int:
    """How many lowerings to run at once when `--jobs` is not given: the cores no other work holds, by the 1-minute
    load average (make -l's measure), at least one. A worker's start (torch imported, the model rebuilt: 5-10 s of
    CPU for a small model) pays only where a core is idle for it; on a busy machine it slows everything there."""
    if load is None:  # no load average on this system: every core
        return cores
    return max(1, min(cores, cores - round(load)))


def _load_average() -> float | None:
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):  # not Unix
        return None


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
    prompt_rows: int | None = None  # text-generation: the most positions one call takes (a dynamic length up to it)
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
        from orchestrator.lowering.sources.builders.models import example_inputs, load_model
        from orchestrator.tensorfile import NamedTensor, describe, write_tensors

        loaded = load_model(spec, weights)
        module, applied = apply_rewrites(loaded.module, spec, rewrites)
        check_keep_float(spec, module)
        if spec.generates:  # the board gets the prompt; the reference is eager greedy generation from it
            from orchestrator.lowering.export import generation

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
        prompt_rows=spec.prompt_capacity if spec.generates else None,
        generation=generation_record,
    )


def check_mixed_precision(spec: ModelSpec, variants: Sequence[Variant]) -> None:
    """A mixed-precision program is a quantized one: its fp32 variant would be the model's own (exit 64)."""
    fp32 = [variant.name for variant in variants if not variant.quantized]
    if spec.keep_float and fp32:
        raise KeepFloatRefused(
            f"{spec.name} keeps layers of a quantized program in float; {', '.join(fp32)} is fp32 throughout already",
            "a quantization scheme: the fp32 program is the model's own, lowered without layers kept in float",
        )


def check_keep_float(spec: ModelSpec, module: Any) -> None:
    """The layers a mixed-precision program keeps in float are linears or convolutions of its model (exit 64, with
    the names it takes), checked before any variant is lowered."""
    # here, not at the top: methods imports torch's quantizers on use, which a cache hit never needs
    from orchestrator.lowering.quantize.methods import weighted_layers
    from orchestrator.lowering.quantize.quantized import KeptLayerUnknown, kept_layer_paths  # torch, as above

    try:
        kept_layer_paths(spec.keep_float, weighted_layers(module))
    except KeptLayerUnknown as exc:
        shown = ", ".join(exc.layers[:_LAYERS_SHOWN]) + (f" (and {len(exc.layers) - _LAYERS_SHOWN} more)"
                                                        if len(exc.layers) > _LAYERS_SHOWN else "")  # fmt: skip
        raise KeepFloatRefused(
            f"{spec.name} has no linear or convolution named {', '.join(exc.unknown)}; it has "
            f"{len(exc.layers)}: {shown or 'none'}",
            "module paths as the numerics of a run name them (fab analyze, fab advise)",
        ) from None


_LAYERS_SHOWN = 24


def _export(shared: _Exported, artifact_paths: ArtifactPaths, timer: console.StageTimer) -> dict[str, Any]:
    """Export the loaded model into `shared.program` and save the .pt2; returns the .pt2's file record."""
    import torch

    with timer.stage("export"):
        if shared.prompt_rows is not None:
            from orchestrator.lowering.export import generation

            with lowering_stage(EXPORT, artifact_paths.name):
                shared.program = generation.export(shared.module, shared.example_args, shared.prompt_rows)
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
    reset_peak_rss()
    artifact_paths = ArtifactPaths.for_model(task.spec.name, task.root)
    # lowered beside workers (`threads`): its "done" line says it, its steps only under -v
    timer = console.StageTimer(prefix=f"{task.spec.name}: ", shown=threads is None)
    quantization = None
    with timer.stage(f"{task.variant}: prepare", quiet=shared is None):
        if not task.needs_program:
            program, quantization = quantized_program(task, artifact_paths, shared.module if shared else None)
        elif shared is not None and shared.program is not None:
            program = shared.program
        else:
            import torch

            # a text-generation program calls etlab's operators: a spawned worker knows them only once imported
            import orchestrator.lowering.attention.ops  # noqa: F401

            program = torch.export.load(str(artifact_paths.exported_program))
    return lower_program(program, task, artifact_paths, timer, quantization, started, quiet=shared is None)


def _share_cores(task: VariantTask, threads: int | None) -> None:
    """One intra-op thread per lowering when several run at once, or their OpenMP threads spin against each other.

    A calibrated scheme (int8-static) keeps the default: its calibration's float results, and so its scales,
    depend on the thread count, and they must match a `--jobs 1` lowering's.
    """
    import torch

    default = threads or torch.get_num_threads()
    torch.set_num_threads(default if task.variant.scheme.calibrated else 1)
