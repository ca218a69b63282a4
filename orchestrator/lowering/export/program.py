"""One program made: a module exported (`export_module`), an exported program lowered to a variant's backend
(`lower_exported`), and written with its sidecar (`lower_program`: the .pte, the delegation and memory it holds,
what a quantized one really quantized, the sidecar last).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import re
import resource
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from orchestrator import console
from orchestrator.fsutil import atomic_path
from orchestrator.lowering.artifacts import SOURCES_ROLE, ArtifactPaths, file_record
from orchestrator.lowering.export.delegation import delegation_report, outside_delegates
from orchestrator.lowering.export.export_errors import EXPORT, TO_EDGE, TO_EXECUTORCH, lowering_stage
from orchestrator.lowering.export.parallel import VariantTask
from orchestrator.lowering.export.source_map import write_source_map
from orchestrator.lowering.program import ProgramName
from orchestrator.lowering.quantize.xnn_types import node_report
from orchestrator.lowering.sidecar import (
    Delegation,
    FileRecord,
    Generation,
    LoweringCost,
    Memory,
    OutputRecord,
    Quantization,
    Sidecar,
    section,
    write_sidecar,
)
from orchestrator.lowering.sources.huggingface import HuggingFaceOptions
from orchestrator.lowering.spec import is_user_program
from orchestrator.lowering.variants import Variant
from orchestrator.programs.memory import read_program_memory
from orchestrator.versions import toolchain_versions

_ID_KEY = re.compile(r"\d+(?:@(\d+))?")  # an nn_module_stack key made of the module's id()


def export_module(module: Any, example_args: tuple, *, model: str) -> Any:
    """`module` exported with `example_args` as etlab exports every model (strict=False, the inputs' fixed shapes).

    The entry point for anything that brings a module: a spec's source, a user's factory. A model that cannot be
    exported is an ExportError (exit 65) naming `model`, the line of its code torch stopped at, and a hint.
    """
    import torch

    with lowering_stage(EXPORT, model):
        program = torch.export.export(module, example_args, strict=False)
    deterministic_metadata(program)
    return program


def deterministic_metadata(program: Any) -> None:
    """Key each node's module stack by the module's path, not by its `id()`, and drop the trace's provenance records
    (`from_node`, which name graphs by their `id()`): with them every export of the same model would save a
    different .pt2, and lowering one more variant later would invalidate the variants the earlier .pt2 vouches for
    (the cache keeps an identical file, never a different one)."""
    for node in program.graph.nodes:
        node.meta.pop("from_node", None)
        stack = node.meta.get("nn_module_stack")
        if stack:
            node.meta["nn_module_stack"] = {_stable_key(key, entry): entry for key, entry in stack.items()}


def _stable_key(key: Any, entry: Any) -> Any:
    """`<id>` (transformers 5.24) or `<id>@<call>` (5.25: a module called again) keyed by the module's path."""
    found = _ID_KEY.fullmatch(str(key))
    if found is None:
        return key
    return f"module:{entry[0]}" + (f"@{found.group(1)}" if found.group(1) else "")


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

    from orchestrator.lowering.rewrites.rope import fold_rope_transposes

    fold_rope_transposes(exported)  # a `rope` rewrite's program: etlab::rope reads the projection's layout
    timer = timer or console.StageTimer(prefix=f"{model}: ")
    with timer.stage(f"{variant}: to_edge/partition", quiet=quiet), lowering_stage(TO_EDGE, model, exported):
        if variant.backend == "xnnpack":
            from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner

            edge = to_edge_transform_and_lower(exported, partitioner=[XnnpackPartitioner()], generate_etrecord=etrecord)
        else:
            edge = to_edge(exported, generate_etrecord=etrecord)
    with timer.stage(f"{variant}: to_executorch", quiet=quiet), lowering_stage(TO_EXECUTORCH, model, exported):
        return to_executorch(edge, fuse_quantized)


def to_executorch(edge: Any, fuse_quantized: bool) -> Any:
    """The edge program's ExecuTorch program; `fuse_quantized`: see lower_exported."""
    if fuse_quantized:
        from executorch.exir import ExecutorchBackendConfig

        return edge.to_executorch(ExecutorchBackendConfig(do_quant_fusion_and_const_prop=True))
    return edge.to_executorch()


def fuses_quantized(generates: bool, variant: Variant) -> bool:
    """Quantized embeddings become quantized_decomposed::embedding_byte/4bit (the runner links those kernels): a
    quantized text-generation program's."""
    return generates and variant.quantized


def reset_peak_rss() -> None:
    """Start the process's VmHWM afresh (Linux), so a variant lowered in-process reports its own peak."""
    with contextlib.suppress(OSError):
        Path("/proc/self/clear_refs").write_text("5")


def peak_rss_bytes() -> int:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def seq_len(inputs: Sequence[dict[str, Any]]) -> int | None:
    """The token ids' length where the program takes them: an image's or an audio model's inputs have none."""
    return next((int(item["shape"][-1]) for item in inputs if item["name"] == "input_ids" and item["shape"]), None)


def recorded_program(name: str, model_source: str, applied: tuple[str, ...]) -> ProgramName:
    """What the sidecar records the program as: a user's own program is its name, whole (dots and all); etlab's
    its name taken apart, with the rewrites applied named even where the name has their short form."""
    if is_user_program(model_source):
        return ProgramName(name)
    named = ProgramName.parse(name)
    return replace(named, rewrites=applied, rewrites_digest=None) if named.rewrites_digest is not None else named


def lower_program(
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
    fuse = fuses_quantized(spec.generates, variant)
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
        # Which module and line of the model each instruction and delegated node came from (analysis reads it).
        try:
            # Lowered from the saved .pt2 itself (fp32: a quantized program is exported again): rows name its nodes.
            from_pt2 = "exported_program" in task.files and not variant.quantized
            source = (artifact_paths.exported_program.name, exported) if from_pt2 else None
            files[SOURCES_ROLE] = file_record(write_source_map(program, pte_path, exported=source))
        except Exception as exc:  # a map that cannot be built costs the map, never the program
            console.warn(f"{spec.name}: {variant}: no source map ({type(exc).__name__}: {exc})")
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

    sidecar = Sidecar(
        model=spec.name,
        model_id=spec.options.model_id if isinstance(spec.options, HuggingFaceOptions) else None,
        task=spec.task,
        backend=variant.name,
        method="forward",
        exported_program=artifact_paths.exported_program.name,
        pte=pte_path.name,
        pte_size_mb=round(files["pte"]["size"] / 1e6, 3),
        seq_len=seq_len(task.inputs),
        weights=task.weights,
        weights_note=task.weights_note,
        parameters=task.parameters,
        sha256=files["pte"]["sha256"],
        versions=toolchain_versions(),
        inputs=list(task.inputs),
        outputs=section(tuple[OutputRecord, ...], task.outputs, "outputs"),
        reference_inputs=artifact_paths.reference_inputs.name,
        reference_outputs=artifact_paths.reference_outputs.name,
        etrecord=artifact_paths.etrecord(variant).name if etrecord else None,
        delegation=section(Delegation, delegation, "delegation"),
        memory=section(Memory, memory, "memory"),
        # Real kernels apart from bookkeeping nodes, and constants stored twice: what `fallback_ops` does not say.
        outside_delegates=outside_delegates(pte_path, delegation["fallback_histogram"]),
        quantization=section(Quantization, quantization, "quantization") if quantization is not None else None,
        lowering=LoweringCost(round(time.perf_counter() - started, 2), peak_rss_bytes()),
        spec=spec.to_dict(),
        rewrites=tuple(task.rewrites),
        generation=section(Generation, task.generation, "generation") if task.generation is not None else None,
        program=recorded_program(spec.name, spec.model_source, tuple(task.rewrites)),
        cache_key=task.key,
        files=section(dict[str, FileRecord], files, "files"),
        created=dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
    )
    for note in sidecar.quantization.float_notes() if sidecar.quantization else ():
        console.warn(f"{spec.name}: {variant}: {note}")
    # The sidecar is the commit point: it is written last, once it reads back.
    return write_sidecar(artifact_paths.sidecar(variant), sidecar)
