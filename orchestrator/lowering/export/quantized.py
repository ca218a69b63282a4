"""A quantized variant's program: lowered from the eager model (this process's, or reloaded in a worker), calibrated
on a file, on generated token ids or on the samples its source makes; a text-generation program with its scheme's
LLM recipe, which a scheme without one does not get (exit 64).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from orchestrator.errors import SpecError
from orchestrator.fsutil import sha256_file
from orchestrator.lowering.artifacts import ArtifactPaths
from orchestrator.lowering.export.export_errors import EXPORT, lowering_stage
from orchestrator.lowering.export.parallel import VariantTask
from orchestrator.lowering.quantize.calibration import (
    calibration_from_file,
    calibration_samples,
    generated_calibration,
    shaped_like,
)
from orchestrator.lowering.quantize.quantized import quantize
from orchestrator.lowering.quantize.schemes import LLM_SCHEMES
from orchestrator.lowering.rewrites.registry import RewriteRequest, apply_rewrites
from orchestrator.lowering.spec import ModelSpec
from orchestrator.lowering.variants import Variant

_CALIBRATION_IMAGES = 8  # generated calibration samples of an image model (int8-static)


def quantized_program(
    task: VariantTask, artifact_paths: ArtifactPaths, module: Any | None
) -> tuple[Any, dict[str, Any]]:
    """`module`: the eager model this process loaded (rewrites applied), else None: loaded again here."""
    import torch

    # here, not at the top: it imports torch (seconds), which a cache hit never needs; numpy with tensorfile
    from orchestrator.lowering.sources.builders.models import TOKENS, builder, load_model, vocab_size_of
    from orchestrator.tensorfile import read_tensors

    if module is None:
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
        from orchestrator.lowering.export import generation

        apply = generation.quantizer(scheme, task.spec.prompt_capacity)
    with lowering_stage(f"{EXPORT} (quantizing to {scheme.name})", task.spec.name):
        quantized = quantize(
            module,
            example_args,
            scheme,
            calibration=calibration,
            calibration_source=source,
            apply=apply,
            keep_float=task.spec.keep_float,
        )
    if task.spec.generates and scheme.llm is not None:  # the recipe that quantized it
        quantized.report["method"] = scheme.llm.method
    return quantized.program, quantized.report


def check_llm_recipes(spec: ModelSpec, variants: Sequence[Variant]) -> None:
    """A text-generation program takes only the schemes that carry an LLM recipe, and a scheme for language models
    only takes nothing else: either is refused (exit 64), never given another scheme's recipe."""
    only = [variant.scheme.name for variant in variants if variant.scheme.text_generation_only]
    if only and not spec.generates:
        others = " or ".join(s.name for s in LLM_SCHEMES if not s.text_generation_only)
        raise SpecError(
            f"{spec.name}: {', '.join(only)} is a recipe for text-generation programs only (its embedding tables "
            f"in 4 bits); {spec.name} is a {spec.task} model: quantize it with {others}, or int8-static"
        )
    refused = [variant.scheme.name for variant in variants if variant.quantized and variant.scheme.llm is None]
    if spec.generates and refused:
        raise SpecError(
            f"{spec.name}: {', '.join(refused)} has no recipe for a text-generation program (a text-generation "
            "program takes a prompt, then one token at a time): quantize it with "
            + " or ".join(scheme.name for scheme in LLM_SCHEMES)
        )
