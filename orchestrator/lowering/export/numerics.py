"""The numerics program of a lowered variant: the same program with the values of its operators made outputs.

A pass of its own (docs/DESIGN.md, "Numerics"): the timed `.pte` is never touched. ExecuTorch's intermediate-output
tap (`devtools/intermediate_output_tap`) marks a value with a placeholder the partitioner does not take, so the
delegate keeps its partitions and emits the value as one more output; the placeholder is stripped before
`to_executorch`. Which values are tapped (`tap_points`) is what keeps the program the same:

- a float operator's own output, except pure data movement (a view's error is its input's);
- in a statically quantized graph the *quantize* node after an operator (the int8 values the next operator reads,
  dequantized by the runner with the recorded scale and zero point): tapping the float value there, or its
  dequantize, breaks XNNPACK's dq -> op -> q patterns (a convolution left in float, a dequantize without a kernel)
  or its layout pass (a 4-D quantized partition output), as measured on ExecuTorch 1.5.1;
- an operator fused with the activation after it (conv -> relu -> q) is measured at the activation, and a
  convolution at the batch norm XNNPACK folds into it: tapping their own output would keep them apart, and a
  convolution computed apart from its batch norm rounds differently (MobileNetV2's output moved by 0.2 dB at 123 dB).

Each tap's reference is the fp32 program's value at the same node (the saved `.pt2` run in eager), so a quantized
variant's error is against float, as the user's model computes it. The record (`<name>_<variant>.numerics.json`)
names every tap's node, operator, module, source line, the taps it reads (for the error it introduced) and, for an
int8 tap, its scale and zero point; it is written last and ties the numerics program to the timed one's sha256.
"""

from __future__ import annotations

import dataclasses
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

from orchestrator import console
from orchestrator.errors import ArtifactError, UsageError
from orchestrator.fsutil import atomic_path, read_json, sha256_file
from orchestrator.lowering.artifacts import Artifact
from orchestrator.lowering.export.numerics_taps import Tap, TapPoint, fp32_names, op_name, tap_points, tap_program
from orchestrator.lowering.export.parallel import VariantTask
from orchestrator.lowering.export.quantized import quantized_program
from orchestrator.lowering.lowered import spec_from_record
from orchestrator.records import Count, RecordError, Sha256, from_data, to_data

NUMERICS_SCHEMA = 1
# Bumped whenever the tap rule or the record changes: a numerics program made by another rule is made again.
TAP_RULE = "taps-4"


class NumericsRefused(UsageError):
    """A program the numerics pass cannot measure (exit 64), with what it takes instead."""


class NumericsUnavailable(ArtifactError):
    """A program whose numerics program cannot be made (ExecuTorch's lowering refuses the tapped program): the
    numerics pass is skipped, the run is not."""


class CalibrationNeeded(NumericsRefused):
    """An int8-static program calibrated on a file: its numerics program needs the same file (exit 64)."""


@dataclass(frozen=True)
class NumericsRecord:
    """`<name>_<variant>.numerics.json`: the numerics program of one timed program, and what each output is."""

    schema: int
    tap_rule: str
    pte: str
    sha256: Sha256
    reference: str
    reference_sha256: Sha256
    timing_sha256: Sha256  # the timed program it measures
    outputs: Count  # the model's own outputs come first, then the taps
    taps: tuple[Tap, ...]
    unmatched: tuple[str, ...] = ()  # tapped nodes the fp32 program has no counterpart for
    # The program's own inputs, when they are not the timed run's: a text-generation program's numerics pass is one
    # prefill call (the prompt's first chunk and its positions), where its timed run is the generate loop.
    inputs: str | None = None
    inputs_sha256: Sha256 | None = None


@dataclass(frozen=True)
class NumericsProgram:
    """A variant's numerics program on disk."""

    folder: Path
    record: NumericsRecord

    @property
    def pte(self) -> Path:
        return self.folder / self.record.pte

    @property
    def reference(self) -> Path:
        return self.folder / self.record.reference

    @property
    def inputs(self) -> Path | None:
        """The program's own inputs; None: it runs on the timed run's."""
        return self.folder / self.record.inputs if self.record.inputs else None


class NumericsFiles(NamedTuple):
    """A numerics program's files beside the timed `.pte`."""

    pte: Path
    reference: Path
    inputs: Path  # written for a program whose inputs are not the timed run's
    record: Path


def numerics_paths(artifact: Artifact) -> NumericsFiles:
    """The numerics program, its reference values, its inputs and its record, beside the timed `.pte`."""
    return numerics_files(artifact.pte)


def numerics_files(pte: Path) -> NumericsFiles:
    """numerics_paths of the timed program `pte`."""
    stem = pte.with_suffix("")
    return NumericsFiles(
        stem.with_name(f"{stem.name}.numerics.pte"),
        stem.with_name(f"{stem.name}.numerics-reference.etlt"),
        stem.with_name(f"{stem.name}.numerics-inputs.etlt"),
        stem.with_name(f"{stem.name}.numerics.json"),
    )


def read_numerics_record(data: Any, where: str) -> NumericsRecord:
    """A numerics record checked field by field (RecordError, 65, naming the field), its taps numbered in order."""
    record = from_data(data, NumericsRecord, where=where)
    if record.schema != NUMERICS_SCHEMA:
        raise RecordError(where, "schema", f"expected {NUMERICS_SCHEMA}, got {record.schema}")
    for position, tap in enumerate(record.taps):
        if tap.index != record.outputs + position:
            raise RecordError(where, f"taps[{position}].index", f"expected {record.outputs + position}")
        if (tap.dtype == "int8") != (tap.qparams is not None):
            raise RecordError(where, f"taps[{position}].qparams", "an int8 tap needs qparams, a float32 one has none")
    return record


def cached_numerics(artifact: Artifact) -> NumericsProgram | None:
    """The variant's numerics program when its record is this rule's, for this timed program, and its files match."""
    record_path = numerics_paths(artifact).record
    try:
        record = read_numerics_record(read_json(record_path), str(record_path))
    except (OSError, ValueError):
        return None
    program = NumericsProgram(record_path.parent, record)
    if record.tap_rule != TAP_RULE or record.timing_sha256 != artifact.sha256:
        return None
    files = [(program.pte, record.sha256), (program.reference, record.reference_sha256)]
    if program.inputs is not None:
        files.append((program.inputs, record.inputs_sha256 or ""))
    if not all(path.is_file() and sha256_file(path) == sha256 for path, sha256 in files):
        return None
    return program


def check_measurable(artifact: Artifact) -> None:
    """Refuse (64) a program the numerics pass cannot take, saying which it takes."""
    if artifact.sidecar.spec.get("model_source") == "pte":
        raise NumericsRefused(
            f"the numerics pass: {artifact.model} ({artifact.variant}): a .pte brought as it is has no exported "
            "program to tap; it takes a model etlab lowered, fp32 or quantized (int8-dynamic, int8-static, 8da4w), "
            "portable or XNNPACK, text generation included (its prefill)"
        )


def make_numerics(artifact: Artifact, *, spec: Any = None, calibration: Path | None = None) -> NumericsProgram:
    """The variant's numerics program: cached, or made now (imports torch; seconds to a minute). `spec`: the
    command line's (with its permission to run a factory's code), else the sidecar's."""
    check_measurable(artifact)
    cached = cached_numerics(artifact)
    if cached is not None:
        return cached
    spec = spec or spec_from_record(artifact.sidecar.spec, str(artifact.paths.sidecar(artifact.variant)))
    timer = console.StageTimer(prefix=f"{artifact.model}: ")
    with timer.stage(f"{artifact.variant}: numerics program"):
        return _make(spec, artifact, calibration)


def _make(spec: Any, artifact: Artifact, calibration: Path | None) -> NumericsProgram:
    import copy

    import torch

    import orchestrator.lowering.attention.ops  # noqa: F401  # etlab's operators, for programs that call them
    from orchestrator.tensorfile import NamedTensor, read_tensors, write_tensors

    paths = artifact.paths
    fp32 = torch.export.load(str(paths.exported_program))
    program_inputs = _program_inputs(artifact, read_tensors(paths.reference_inputs))
    inputs = tuple(torch.from_numpy(t.array) for t in program_inputs)
    program = _quantized(spec, artifact, calibration) if artifact.variant.quantized else copy.deepcopy(fp32)
    # A quantized program is exported again after quantizing: its nodes are not named as the fp32 .pt2's (an extra
    # getitem shifts every later `add_<n>`). Each point is named by the fp32 node at the same place (node_places).
    names = fp32_names(program, fp32)
    points, skipped = tap_points(program, names)
    values, outputs = _fp32_values(fp32, inputs, {point.label for point in points})
    matched = [point for point in points if _matches(point, values)]
    unmatched = tuple(point.label for point in points if point not in matched)
    if not matched:
        raise NumericsRefused(
            f"the numerics pass: {artifact.model} ({artifact.variant}): no operator of the program has an fp32 "
            "counterpart to compare with"
        )
    files = numerics_paths(artifact)
    pte_path, reference_path, record_path = files.pte, files.reference, files.record
    matched, taps, not_tapped = _tap_and_lower(program, matched, names, len(outputs), artifact, pte_path)
    # a tap's shape is its value's at these inputs (the program's may be symbolic: a generation's sequence length)
    taps = [dataclasses.replace(tap, shape=tuple(values[tap.node][0].shape)) for tap in taps]
    unmatched = (*unmatched, *not_tapped)
    reference = [NamedTensor(f"output_{i}", value.detach().float().numpy()) for i, value in enumerate(outputs)]
    for tap, point in zip(taps, matched, strict=True):
        reference.append(NamedTensor(f"output_{tap.index}", values[point.label][0].float().contiguous().numpy()))
        if tap.qparams is not None:
            import numpy as np

            reference.append(
                NamedTensor(f"output_{tap.index}.qparams", np.array([tap.qparams[0], tap.qparams[1]], dtype=np.float64))
            )
    write_tensors(reference_path, reference)
    own_inputs = None
    if artifact.sidecar.generation is not None:
        write_tensors(files.inputs, program_inputs)
        own_inputs = files.inputs
    record = NumericsRecord(
        schema=NUMERICS_SCHEMA,
        tap_rule=TAP_RULE,
        pte=pte_path.name,
        sha256=sha256_file(pte_path),
        reference=reference_path.name,
        reference_sha256=sha256_file(reference_path),
        timing_sha256=artifact.sha256,
        outputs=len(outputs),
        taps=tuple(taps),
        unmatched=unmatched,
        inputs=own_inputs.name if own_inputs else None,
        inputs_sha256=sha256_file(own_inputs) if own_inputs else None,
    )
    with atomic_path(record_path) as tmp:  # the commit point: written last
        tmp.write_text(json.dumps(to_data(record), indent=1, sort_keys=True) + "\n", encoding="utf-8")
    if skipped:
        console.detail(f"  {artifact.model}: {skipped} operator(s) measured with the activation they are fused with")
    return NumericsProgram(record_path.parent, record)


def _program_inputs(artifact: Artifact, reference: list[Any]) -> list[Any]:
    """The inputs the numerics program runs on: the timed run's; a text-generation program's one prefill call (the
    prompt's first chunk, as its lowering exported it, and positions 0..rows-1) from an empty cache."""
    generation = artifact.sidecar.generation
    if generation is None:
        return reference
    import numpy as np

    # here: both import numpy, generation.py torch; a warm deploy imports this module without them
    from orchestrator.lowering.export.generation import POSITION_INPUT, PROMPT_INPUT
    from orchestrator.tensorfile import NamedTensor

    prompt = reference[0].array
    rows = min(int(prompt.shape[-1]), generation.max_prompt_len)
    return [
        NamedTensor(PROMPT_INPUT, np.ascontiguousarray(prompt[..., :rows])),
        NamedTensor(POSITION_INPUT, np.arange(rows, dtype=np.int64)),
    ]


def _fp32_values(program: Any, inputs: tuple, labels: set[str]) -> tuple[dict[str, Any], list[Any]]:
    """The fp32 program run in eager: the values of the nodes named `labels`, and its outputs."""
    import torch

    values: dict[str, Any] = {}

    class Recorder(torch.fx.Interpreter):
        def run_node(self, node: Any) -> Any:
            result = super().run_node(node)
            if node.name in labels and isinstance(result, torch.Tensor):
                values[node.name] = (result.detach().clone(), op_name(node))
            return result

    module = program.module()
    with torch.no_grad():
        outputs = Recorder(module).run(*inputs)
    flat = [value for value in torch.utils._pytree.tree_leaves(outputs) if isinstance(value, torch.Tensor)]
    return values, flat


def _matches(point: TapPoint, values: dict[str, Any]) -> bool:
    """The fp32 node of the same name computes the same operator with the same shape."""
    found = values.get(point.label)
    if found is None:
        return False
    value, op = found
    return op == op_name(point.operator) and tuple(value.shape) == tuple(point.operator.meta["val"].shape)


def _quantized(spec: Any, artifact: Artifact, calibration: Path | None) -> Any:
    """The variant's quantized exported program, made again as its lowering made it (deterministic calibration)."""

    sidecar = artifact.sidecar
    recorded = sidecar.quantization.calibration if sidecar.quantization else None
    source = recorded.source if recorded is not None else ""
    if source.startswith("file ") and calibration is None:
        raise CalibrationNeeded(
            f"the numerics pass: {artifact.model} ({artifact.variant}) was calibrated on {source}: the same file "
            "is needed again, so the numerics program has the same scales"
        )
    task = VariantTask(
        spec=spec,
        variant=artifact.variant,
        weights=sidecar.weights,
        weights_note=sidecar.weights_note,
        parameters=sidecar.parameters,
        files={},
        inputs=list(sidecar.inputs),
        outputs=[],
        root=artifact.paths.folder.parent,
        etrecord=False,
        key="",
        calibration=str(calibration) if calibration is not None else None,
        peak_bytes=0,
        expected_seconds=0.0,
        rewrites=tuple(sidecar.rewrites or ()),
    )
    program, _ = quantized_program(task, artifact.paths, None)
    return program


# XNNPACK refuses a partition whose output is one of its inputs: a value made in one partition and read by another,
# tapped where the second reads it (a residual around a layer_norm XNNPACK leaves out: Whisper's encoder).
_PASS_THROUGH = re.compile(r"Output node '(\w+)' is already in the inputs")
_MAX_DROPPED = 16


def _tap_and_lower(
    program: Any, points: list[TapPoint], names: dict[str, str], first: int, artifact: Artifact, pte: Path
) -> tuple[list[TapPoint], list[Tap], tuple[str, ...]]:
    """Tap `points` and lower; a tap XNNPACK refuses as a pass-through is left out and the rest lowered again. The
    points and taps kept, and the labels left out. NumericsUnavailable when the tapped program cannot be lowered."""
    import copy

    untapped = copy.deepcopy(program)  # to tap again without a refused tap: tapping changes the program in place
    dropped: list[str] = []
    fresh = program
    while True:
        labels = {point.label for point in points} - set(dropped)
        chosen = [point for point in tap_points(fresh, names)[0] if point.label in labels]
        taps = tap_program(fresh, chosen, first)
        try:
            _lower_tapped(fresh, artifact, pte)
            return chosen, taps, tuple(dropped)
        except Exception as exc:  # ExecuTorch's lowering raises bare RuntimeErrors (and others) by message
            found = _PASS_THROUGH.search(str(exc))
            victim = _edge_node(fresh, found.group(1)) if found else None
            label = next((point.label for point in chosen if point.value is victim), None)
            if label is None or len(dropped) >= _MAX_DROPPED:
                reason = str(exc).strip().splitlines()[-1] if str(exc).strip() else type(exc).__name__
                raise NumericsUnavailable(
                    f"the numerics pass: {artifact.model} ({artifact.variant}): its tapped program cannot be lowered "
                    f"({reason[:300]})"
                ) from None
            dropped.append(label)
            console.detail(f"  {artifact.model}: {label} left out of the numerics (XNNPACK takes no pass-through tap)")
            fresh = copy.deepcopy(untapped)


def _edge_node(program: Any, edge_name: str) -> Any:
    """The node of `program` that the edge program names `edge_name` (`aten_add_tensor_2`: the third call of
    aten.add.Tensor in graph order), or None."""
    match = re.fullmatch(r"(.*?)(?:_(\d+))?", edge_name)
    if match is None:
        return None
    stem, count = match.group(1), int(match.group(2) or 0)
    calls = [node for node in program.graph.nodes
             if node.op == "call_function" and str(node.target).replace(".", "_").lower() == stem]  # fmt: skip
    return calls[count] if count < len(calls) else None


def _lower_tapped(program: Any, artifact: Artifact, pte: Path) -> None:
    """Lower the tapped program as the variant's was, strip the taps' placeholders, write it."""
    from executorch.devtools.intermediate_output_tap import strip_taps_
    from executorch.exir import to_edge, to_edge_transform_and_lower

    from orchestrator.lowering.export.program import fuses_quantized, to_executorch  # here: heavy, lowering only

    if artifact.variant.backend == "xnnpack":
        from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner

        edge = to_edge_transform_and_lower(program, partitioner=[XnnpackPartitioner()])
    else:
        edge = to_edge(program)
    strip_taps_(edge)
    lowered = to_executorch(edge, fuses_quantized(artifact.sidecar.generation is not None, artifact.variant))
    with atomic_path(pte) as tmp, open(tmp, "wb") as handle:
        lowered.write_to_file(handle)
