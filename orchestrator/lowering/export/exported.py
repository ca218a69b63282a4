"""`fab lower --exported model.pt2`: lower an ExportedProgram the user made (`torch.export.save`) like a model.

Loading a .pt2 can run code (pickles, shape expressions sympy evals, guards torch execs, compiled code). So the
archive is read into memory, read the way torch reads it and checked, and its program rebuilt from the checked
entries (exported_archive.checked_archive); anything else is refused (exit 65) before torch sees it. torch loads
the rebuilt archive, and artifacts/<name>/ keeps it.

The reference inputs are the program's own example inputs (random ones of the declared shapes when it has none),
the reference outputs the program run eagerly on them. The program is lowered as the user exported it.
"""

from __future__ import annotations

import hashlib
import io
import json
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from orchestrator import console
from orchestrator.fsutil import atomic_path, sha256_bytes
from orchestrator.lowering.artifacts import ArtifactPaths, file_record, valid_sidecar
from orchestrator.lowering.export.cache import code_revision
from orchestrator.lowering.export.exported_archive import checked_archive
from orchestrator.lowering.export.lower import LoweredVariant, LoweringResult
from orchestrator.lowering.export.parallel import VariantTask
from orchestrator.lowering.export.program import lower_program
from orchestrator.lowering.export.user_programs import UserProgramError, check_folder
from orchestrator.lowering.sources.exported import exported_spec
from orchestrator.lowering.variants import Variant
from orchestrator.versions import toolchain_versions


def _load(data: bytes, where: Path) -> Any:
    import torch

    try:
        return torch.export.load(io.BytesIO(data))
    except Exception as exc:  # any failure of a user's file is theirs to fix: say which file and why
        raise UserProgramError(f"{where}: torch.export.load failed: {type(exc).__name__}: {exc}") from None


def _example_args(program: Any, where: Path) -> tuple[Any, ...]:
    """The program's example inputs, flattened as the lowered program takes them; random ones when it has none."""
    import torch
    from torch.utils import _pytree

    if program.example_inputs is not None:
        args, kwargs = program.example_inputs
        leaves = _pytree.tree_leaves((args, kwargs))
    else:
        generator = torch.Generator().manual_seed(0)
        values = {node.name: node.meta.get("val") for node in program.graph.nodes if node.op == "placeholder"}
        leaves = []
        for name in program.graph_signature.user_inputs:
            value = values.get(name)
            if not isinstance(value, torch.Tensor) or not all(isinstance(size, int) for size in value.shape):
                raise UserProgramError(f"{where}: input {name!r} has no example and no fixed shape to make one")
            if value.dtype.is_floating_point:
                leaves.append(torch.randn(tuple(value.shape), generator=generator, dtype=value.dtype))
            else:
                leaves.append(torch.zeros(tuple(value.shape), dtype=value.dtype))
    for index, leaf in enumerate(leaves):
        if not isinstance(leaf, torch.Tensor):
            raise UserProgramError(f"{where}: example input {index} is a {type(leaf).__name__}: etlab feeds tensors")
    return tuple(leaves)


def _reference(program: Any, example_args: tuple[Any, ...], where: Path) -> tuple[list[Any], list[Any]]:
    """Reference inputs and eager outputs as NamedTensors."""
    import torch
    from torch.utils import _pytree

    # here, not at the top: numpy comes with it, which a cache hit never needs
    from orchestrator.tensorfile import DTYPE_CODES, NamedTensor

    if program.example_inputs is not None:
        args, kwargs = program.example_inputs
    else:
        args, kwargs = example_args, {}
    try:
        with torch.no_grad():
            eager = program.module()(*args, **kwargs)
    except Exception as exc:  # the user's program failed on its own example inputs
        raise UserProgramError(f"{where}: running the program on its example inputs failed: {exc}") from None
    names = list(program.graph_signature.user_inputs)
    inputs = [
        NamedTensor(names[i] if i < len(names) else f"input_{i}", t.detach().contiguous().numpy())
        for i, t in enumerate(example_args)
    ]
    outputs = []
    for index, value in enumerate(_pytree.tree_leaves(eager)):
        if not isinstance(value, torch.Tensor):
            raise UserProgramError(f"{where}: output {index} is a {type(value).__name__}, not a tensor")
        outputs.append(NamedTensor(f"output_{index}", value.detach().contiguous().numpy()))
    for tensor in (*inputs, *outputs):
        if tensor.dtype not in DTYPE_CODES:
            raise UserProgramError(f"{where}: {tensor.name} is {tensor.dtype}, which ETLT files cannot hold")
    return inputs, outputs


def _key(sha256: str, variant: Variant, etrecord: bool) -> str:
    material = {
        "exported": sha256,
        "backend": variant.name,
        "etrecord": etrecord,
        "versions": toolchain_versions(),
        "code": code_revision() + sha256_bytes(Path(__file__).read_bytes())[:16],
    }
    return hashlib.sha256(json.dumps(material, sort_keys=True).encode()).hexdigest()


def lower_exported_program(
    path: Path,
    name: str,
    *,
    variants: Sequence[Variant],
    etrecord: bool = False,
    force: bool = False,
    root: Path | None = None,
) -> LoweringResult:
    """Lower the user's .pt2 to each variant under artifacts/<name>/ (cached on the file's content)."""
    data = Path(path).read_bytes()
    sha = sha256_bytes(data)
    artifact_paths = ArtifactPaths.for_model(name, root)
    spec = exported_spec(name, Path(path), sha)
    result = LoweringResult(spec, artifact_paths)
    variants = tuple(dict.fromkeys(variants))
    keys = {variant: _key(sha, variant, etrecord) for variant in variants}
    if artifact_paths.folder.is_dir():
        check_folder(artifact_paths, Path(path))
    missing = []
    for variant in variants:
        sidecar, _ = valid_sidecar(artifact_paths, variant)
        if force or sidecar is None or sidecar.cache_key != keys[variant]:
            missing.append(variant)
        else:
            result.variants[variant] = LoweredVariant(variant, artifact_paths.pte(variant), sidecar, cached=True)
    if not missing:
        console.info(f"[green]✓[/] {console.escape(name)}: using cached artifacts (nothing changed)")
        return result
    for variant in missing:
        if variant.scheme.calibrated:
            raise UserProgramError(
                f"{variant}: a calibrated scheme needs calibration samples of the model's inputs, which etlab does "
                "not have for an exported program",
                hint="quantize it yourself before exporting, or use int8-dynamic or 8da4w",
            )

    checked = checked_archive(data, Path(path))
    timer = console.StageTimer(prefix=f"{name}: ")
    with timer.stage("load"):
        # here, not at the top: it imports torch (seconds), which a cache hit never needs
        from orchestrator.tensorfile import describe, write_tensors

        program = _load(checked, Path(path))
        example_args = _example_args(program, Path(path))
        inputs, outputs = _reference(program, example_args, Path(path))
    artifact_paths.folder.mkdir(parents=True, exist_ok=True)
    for variant in missing:
        artifact_paths.sidecar(variant).unlink(missing_ok=True)
    write_tensors(artifact_paths.reference_inputs, inputs)
    write_tensors(artifact_paths.reference_outputs, outputs)
    with atomic_path(artifact_paths.exported_program, keep_identical=True) as tmp:
        tmp.write_bytes(checked)  # what was checked: Model Explorer loads this copy with torch.export.load
    spec = result.spec = exported_spec(name, Path(path), sha, describe(inputs))
    files = {
        "reference_inputs": file_record(artifact_paths.reference_inputs),
        "reference_outputs": file_record(artifact_paths.reference_outputs),
        "exported_program": file_record(artifact_paths.exported_program, sha256_bytes(checked)),
    }
    parameters = sum(int(tensor.numel()) for tensor in program.state_dict.values())
    for variant in missing:
        started = time.perf_counter()
        task = VariantTask(
            spec=spec,
            variant=variant,
            weights="as exported",
            weights_note=f"the weights in {Path(path).name}",
            parameters=parameters,
            files=dict(files),
            inputs=describe(inputs),
            outputs=describe(outputs),
            root=artifact_paths.folder.parent,
            etrecord=etrecord,
            key=keys[variant],
            calibration=None,
            peak_bytes=0,
            expected_seconds=0.0,
        )
        lowered, quantization = program, None
        if variant.quantized:
            lowered, quantization = _quantized(program, example_args, variant, timer)
        sidecar = lower_program(lowered, task, artifact_paths, timer, quantization, started)
        result.variants[variant] = LoweredVariant(variant, artifact_paths.pte(variant), sidecar, cached=False)
    result.variants = {variant: result.variants[variant] for variant in variants}
    result.stage_seconds = dict(timer.durations)
    return result


def _quantized(program: Any, example_args: tuple[Any, ...], variant: Variant, timer: console.StageTimer) -> Any:
    """The scheme applied to the program's module (the graph unlifted from the ExportedProgram)."""
    # here, not at the top: it imports torch (seconds), which a cache hit never needs
    from orchestrator.lowering.quantize.quantized import quantize

    with timer.stage(f"{variant}: quantize"):
        try:
            quantized = quantize(program.module(), example_args, variant.scheme)
        except Exception as exc:  # a scheme that does not apply to this graph: say so, it is no bug of etlab
            raise UserProgramError(
                f"{variant}: quantizing the exported program failed: {type(exc).__name__}: {exc}",
                hint="lower it in fp32, or quantize it yourself before exporting",
            ) from None
    return quantized.program, quantized.report
