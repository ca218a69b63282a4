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

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from orchestrator import console
from orchestrator.errors import ArtifactError, UsageError
from orchestrator.fsutil import atomic_path, read_json, sha256_file
from orchestrator.lowering.artifacts import Artifact
from orchestrator.lowering.export.parallel import VariantTask
from orchestrator.lowering.export.quantized import quantized_program
from orchestrator.lowering.export.source_map import module_stack, user_location
from orchestrator.lowering.lowered import spec_from_record
from orchestrator.records import Count, Dimension, RecordError, Sha256, from_data, to_data

NUMERICS_SCHEMA = 1
# Bumped whenever the tap rule or the record changes: a numerics program made by another rule is made again.
TAP_RULE = "taps-3"

# Operators whose output holds its input's values, moved: their error is their input's.
_DATA_MOVEMENT = frozenset(
    {
        "aten.view", "aten.reshape", "aten._unsafe_view", "aten.permute", "aten.transpose", "aten.t", "aten.expand",
        "aten.clone", "aten.contiguous", "aten.flatten", "aten.unsqueeze", "aten.squeeze", "aten.slice",
        "aten.select", "aten.alias", "aten.detach", "aten._to_copy", "aten.to", "aten.unflatten", "aten.split",
        "aten.split_with_sizes", "aten.chunk", "aten.cat", "aten.stack", "aten.index_select", "aten.narrow",
        "aten.dropout", "aten.native_dropout", "aten.feature_dropout", "aten.lift_fresh_copy",
    }
)  # fmt: skip
_QUANTIZATION = ("quantize_per", "dequantize_per", "choose_qparams", "quantize_affine", "dequantize_affine")
_FUSED_ACTIVATIONS = ("aten.relu", "aten.relu_", "aten.hardtanh", "aten.hardtanh_", "aten.clamp")
# XNNPACK folds a batch norm into the convolution before it: the convolution's own output never exists.
_CONVOLUTIONS = ("aten.conv1d", "aten.conv2d", "aten.convolution")
_BATCH_NORMS = ("aten.batch_norm", "aten._native_batch_norm_legit_no_training")


class NumericsRefused(UsageError):
    """A program the numerics pass cannot measure (exit 64), with what it takes instead."""


class NumericsUnavailable(ArtifactError):
    """A program whose numerics program cannot be made (ExecuTorch's lowering refuses the tapped program): the
    numerics pass is skipped, the run is not."""


class CalibrationNeeded(NumericsRefused):
    """An int8-static program calibrated on a file: its numerics program needs the same file (exit 64)."""


@dataclass(frozen=True)
class Tap:
    """One measured value: output `index` of the numerics program."""

    index: Count
    node: str  # the fp32 graph's node it measures (the .pt2's node name)
    op: str  # "aten.linear"
    shape: tuple[Dimension, ...]
    dtype: Literal["float32", "int8"]  # as the board outputs it: int8 with `qparams`
    module: str | None = None  # the innermost module of the user's model, as its own code names it
    module_type: str | None = None
    file: str | None = None
    line: Count | None = None
    function: str | None = None
    reads: tuple[Count, ...] = ()  # the taps whose values this operator read (none: the program's inputs)
    qparams: tuple[float, int] | None = None  # int8 taps: (scale, zero point)
    fused: tuple[str, ...] = ()  # operators measured with it (conv before its relu)

    @property
    def source(self) -> str | None:
        return f"{self.file}:{self.line}" if self.file and self.line else None


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


def numerics_paths(artifact: Artifact) -> tuple[Path, Path, Path]:
    """The numerics program, its reference values and its record, beside the timed `.pte`."""
    return numerics_files(artifact.pte)


def numerics_files(pte: Path) -> tuple[Path, Path, Path]:
    """numerics_paths of the timed program `pte`."""
    stem = pte.with_suffix("")
    return (
        stem.with_name(f"{stem.name}.numerics.pte"),
        stem.with_name(f"{stem.name}.numerics-reference.etlt"),
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
    _, _, record_path = numerics_paths(artifact)
    try:
        record = read_numerics_record(read_json(record_path), str(record_path))
    except (OSError, ValueError):
        return None
    program = NumericsProgram(record_path.parent, record)
    if record.tap_rule != TAP_RULE or record.timing_sha256 != artifact.sha256:
        return None
    if not program.pte.is_file() or not program.reference.is_file():
        return None
    if sha256_file(program.pte) != record.sha256 or sha256_file(program.reference) != record.reference_sha256:
        return None
    return program


def check_measurable(artifact: Artifact) -> None:
    """Refuse (64) a program the numerics pass cannot take, saying which it takes."""
    why = None
    if artifact.sidecar.generation is not None:
        why = "a text-generation program (its KV cache and generate loop) is not measured yet"
    elif artifact.sidecar.spec.get("model_source") == "pte":
        why = "a .pte brought as it is has no exported program to tap"
    if why:
        raise NumericsRefused(
            f"the numerics pass: {artifact.model} ({artifact.variant}): {why}; it takes a model etlab lowered, fp32 or "
            "quantized (int8-dynamic, int8-static, 8da4w), portable or XNNPACK"
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
    inputs = tuple(torch.from_numpy(t.array) for t in read_tensors(paths.reference_inputs))
    program = _quantized(spec, artifact, calibration) if artifact.variant.quantized else copy.deepcopy(fp32)
    # A quantized program is exported again after quantizing: its nodes are not named as the fp32 .pt2's (an extra
    # getitem shifts every later `add_<n>`). Each point is named by the fp32 node at the same place (node_places).
    names = _fp32_names(program, fp32)
    points, skipped = tap_points(program, names)
    values, outputs = _fp32_values(fp32, inputs, {point.label for point in points})
    matched = [point for point in points if _matches(point, values)]
    unmatched = tuple(point.label for point in points if point not in matched)
    if not matched:
        raise NumericsRefused(
            f"the numerics pass: {artifact.model} ({artifact.variant}): no operator of the program has an fp32 "
            "counterpart to compare with"
        )
    pte_path, reference_path, record_path = numerics_paths(artifact)
    matched, taps, not_tapped = _tap_and_lower(program, matched, names, len(outputs), artifact, pte_path)
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
    )
    with atomic_path(record_path) as tmp:  # the commit point: written last
        tmp.write_text(json.dumps(to_data(record), indent=1, sort_keys=True) + "\n", encoding="utf-8")
    if skipped:
        console.detail(f"  {artifact.model}: {skipped} operator(s) measured with the activation they are fused with")
    return NumericsProgram(record_path.parent, record)


@dataclass(frozen=True, eq=False)
class _Point:
    """A value chosen in the program: `value` is the node made an output, `label` the operator it measures."""

    value: Any
    operator: Any
    label: str
    qparams: tuple[float, int] | None
    fused: tuple[str, ...]
    head: Any = None  # the first operator fused into it (its node in this program), which names its module


def _op_name(node: Any) -> str:
    """aten.linear.default -> aten.linear"""
    text = str(node.target)
    for prefix in ("aten.", "quantized_decomposed."):
        if prefix in text:
            text = text[text.index(prefix) :]
    return text.rsplit(".", 1)[0] if text.count(".") >= 2 else text


def _is_quantization(node: Any) -> bool:
    return any(part in str(node.target) for part in _QUANTIZATION)


def _is_float_tensor(node: Any) -> bool:
    value = node.meta.get("val")
    dtype = getattr(value, "dtype", None)
    return dtype is not None and dtype.is_floating_point


def _reads_static_int8(node: Any, live: set[Any]) -> bool:
    """Whether `node` reads an activation through a static dequantize (a scale fixed at calibration): the head of an
    int8 dq -> op -> activation -> q pattern. A dynamic one (its scale a tensor) leaves the operator's output float."""
    return any(
        "dequantize_per_tensor" in str(arg.target) and len(arg.args) > 1 and isinstance(arg.args[1], float)
        for arg in node.all_input_nodes
        if arg in live
    )


def node_places(program: Any) -> dict[Any, tuple[Any, ...]]:
    """Each ATen operator's place in `program`: its innermost module, its operator and how many of that operator came
    before it in that module; an element of its result (getitem) at its place and index. The same model exported
    before and after quantizing puts its operators at the same places (quantization operators and the getitems the
    export adds elsewhere are not counted), whatever their node names."""
    import operator

    counts: dict[tuple[str, str], int] = {}
    places: dict[Any, tuple[Any, ...]] = {}
    for node in program.graph.nodes:
        op = _op_name(node) if node.op == "call_function" else ""
        if node.op == "call_function" and node.target is operator.getitem and node.args[0] in places:
            places[node] = (*places[node.args[0]], "getitem", node.args[1])
            continue
        if not op.startswith("aten.") or _is_quantization(node):
            continue
        stack = module_stack(node)
        key = (stack[-1][0] if stack else "", op)
        places[node] = (*key, counts.get(key, 0))
        counts[key] = counts.get(key, 0) + 1
    return places


def _fp32_names(program: Any, fp32: Any) -> dict[str, str]:
    """`program`'s node names → the fp32 program's at the same place (node_places), where one is."""
    by_place = {place: node.name for node, place in node_places(fp32).items()}
    return {node.name: by_place[place] for node, place in node_places(program).items() if place in by_place}


def tap_points(program: Any, names: dict[str, str] | None = None) -> tuple[list[_Point], int]:
    """The values to tap in an exported program (fp32 or quantized), in graph order; and how many operators were
    folded into the activation after them. `names`: each node's label, the fp32 node at its place (_fp32_names);
    else its own name."""
    names = names or {}
    graph = program.graph
    user_inputs = set(program.graph_signature.user_inputs)
    live = {node for node in graph.nodes if node.op == "placeholder" and node.name in user_inputs}
    points: list[_Point] = []
    pending_fused: dict[Any, tuple[str, ...]] = {}
    heads: dict[Any, Any] = {}
    skipped = 0
    for node in graph.nodes:
        if node.op != "call_function" or not any(arg in live for arg in node.all_input_nodes):
            continue
        live.add(node)
        if _is_quantization(node) or not _is_float_tensor(node) or _op_name(node) in _DATA_MOVEMENT:
            continue
        users = list(node.users)
        fused_into_next = len(users) == 1 and (
            (_reads_static_int8(node, live) and _op_name(users[0]) in _FUSED_ACTIVATIONS)
            or (_op_name(node) in _CONVOLUTIONS and _op_name(users[0]) in _BATCH_NORMS)
        )
        if fused_into_next:
            pending_fused[users[0]] = (*pending_fused.get(node, ()), node.name)
            heads[users[0]] = heads.get(node, node)
            skipped += 1
            continue
        quantize = next(
            (
                user
                for user in users
                if "quantize_per_tensor" in str(user.target)
                and "dequantize" not in str(user.target)
                and isinstance(user.args[1], float)
            ),
            None,
        )
        label = names.get(node.name, node.name)
        fused = tuple(names.get(name, name) for name in pending_fused.get(node, ()))
        if quantize is not None:
            qparams = (float(quantize.args[1]), int(quantize.args[2]))
            points.append(_Point(quantize, node, label, qparams, fused, heads.get(node)))
        else:
            points.append(_Point(node, node, label, None, fused, heads.get(node)))
    return points, skipped


def _fp32_values(program: Any, inputs: tuple, labels: set[str]) -> tuple[dict[str, Any], list[Any]]:
    """The fp32 program run in eager: the values of the nodes named `labels`, and its outputs."""
    import torch

    values: dict[str, Any] = {}

    class Recorder(torch.fx.Interpreter):
        def run_node(self, node: Any) -> Any:
            result = super().run_node(node)
            if node.name in labels and isinstance(result, torch.Tensor):
                values[node.name] = (result.detach().clone(), _op_name(node))
            return result

    module = program.module()
    with torch.no_grad():
        outputs = Recorder(module).run(*inputs)
    flat = [value for value in torch.utils._pytree.tree_leaves(outputs) if isinstance(value, torch.Tensor)]
    return values, flat


def _matches(point: _Point, values: dict[str, Any]) -> bool:
    """The fp32 node of the same name computes the same operator with the same shape."""
    found = values.get(point.label)
    if found is None:
        return False
    value, op = found
    return op == _op_name(point.operator) and tuple(value.shape) == tuple(point.operator.meta["val"].shape)


def _tap(program: Any, points: list[_Point], first: int) -> list[Tap]:
    """Make each point's value an output of `program` (in place); the taps, numbered from `first`."""
    from executorch.devtools.intermediate_output_tap import FULL_TENSOR, tap_intermediate_outputs_

    chosen = {point.value: point for point in points}
    labelled = {point.operator: position for position, point in enumerate(points)}
    values = {point.value: position for position, point in enumerate(points)}
    taps = []
    for position, point in enumerate(points):
        # a fused pair is the operator's loss (conv, linear) more than its activation's: named by the operator
        origin = point.head if point.head is not None else point.operator
        stack = module_stack(origin)
        module = stack[-1] if stack else (None, None)
        location = user_location(origin.meta.get("stack_trace"))
        taps.append(
            Tap(
                index=first + position,
                node=point.label,
                op=_op_name(point.operator),
                shape=tuple(int(d) for d in point.operator.meta["val"].shape),
                dtype="int8" if point.qparams else "float32",
                module=_model_path(module[0]),
                module_type=module[1],
                file=location.get("file"),
                line=location.get("line"),
                function=location.get("function"),
                reads=tuple(first + i for i in _reads(point.operator, labelled, values)),
                qparams=point.qparams,
                fused=point.fused,
            )
        )
    _, specs = tap_intermediate_outputs_(program, rules=[(lambda node: node in chosen, FULL_TENSOR)])
    if [spec.node_name for spec in specs] != [point.value.name for point in points]:
        raise ArtifactError("the tapped outputs are not in the order they were chosen")
    for node in program.graph.nodes:  # the tap keeps no value record; XNNPACK's layout pass reads one
        if "executorch_devtools.tap" in str(node.target) and "val" not in node.meta:
            node.meta["val"] = node.args[0].meta["val"]
    return taps


def _reads(operator: Any, labelled: dict[Any, int], values: dict[Any, int]) -> list[int]:
    """The taps nearest upstream of `operator`, walked through untapped nodes (views, quantize pairs)."""
    found: list[int] = []
    seen: set[Any] = set()
    pending = list(operator.all_input_nodes)
    while pending:
        node = pending.pop()
        if node in seen or node.op != "call_function":
            continue
        seen.add(node)
        position = labelled.get(node, values.get(node))
        if position is not None:
            if position not in found:
                found.append(position)
            continue
        pending.extend(node.all_input_nodes)
    return sorted(found)


def _model_path(path: str | None) -> str | None:
    """etlab's wrappers hold the user's model as `model`: its paths as the model names them."""
    if path is None:
        return None
    return path[len("model.") :] if path.startswith("model.") else path


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
    program: Any, points: list[_Point], names: dict[str, str], first: int, artifact: Artifact, pte: Path
) -> tuple[list[_Point], list[Tap], tuple[str, ...]]:
    """Tap `points` and lower; a tap XNNPACK refuses as a pass-through is left out and the rest lowered again. The
    points and taps kept, and the labels left out. NumericsUnavailable when the tapped program cannot be lowered."""
    import copy

    untapped = copy.deepcopy(program)  # to tap again without a refused tap: tapping changes the program in place
    dropped: list[str] = []
    fresh = program
    while True:
        labels = {point.label for point in points} - set(dropped)
        chosen = [point for point in tap_points(fresh, names)[0] if point.label in labels]
        taps = _tap(fresh, chosen, first)
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

    if artifact.variant.backend == "xnnpack":
        from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner

        edge = to_edge_transform_and_lower(program, partitioner=[XnnpackPartitioner()])
    else:
        edge = to_edge(program)
    strip_taps_(edge)
    lowered = edge.to_executorch()
    with atomic_path(pte) as tmp, open(tmp, "wb") as handle:
        lowered.write_to_file(handle)
