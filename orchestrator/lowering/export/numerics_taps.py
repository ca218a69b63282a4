"""Which values of an exported program the numerics pass taps, and the record of each tap (docs/DESIGN.md,
"Numerics"): an operator's own output, or where XNNPACK fuses or quantizes it, the value the program keeps
(numerics.py's docstring has the rule). Pure graph work on a `torch.export` program: no lowering here."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from orchestrator.errors import ArtifactError
from orchestrator.lowering.export.source_map import module_stack, user_location
from orchestrator.records import Count, Dimension

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


@dataclass(frozen=True, eq=False)
class TapPoint:
    """A value chosen in the program: `value` is the node made an output, `label` the operator it measures."""

    value: Any
    operator: Any
    label: str
    qparams: tuple[float, int] | None
    fused: tuple[str, ...]
    head: Any = None  # the first operator fused into it (its node in this program), which names its module


def op_name(node: Any) -> str:
    """aten.linear.default -> aten.linear"""
    text = str(node.target)
    for prefix in ("aten.", "quantized_decomposed."):
        if prefix in text:
            text = text[text.index(prefix) :]
    return text.rsplit(".", 1)[0] if text.count(".") >= 2 else text


def _is_quantization(node: Any) -> bool:
    """A quantization operator, or an element of its result (choose_qparams' scale)."""
    import operator

    if node.target is operator.getitem and hasattr(node.args[0], "target"):
        node = node.args[0]
    return any(part in str(node.target) for part in _QUANTIZATION)


def _is_float_tensor(node: Any) -> bool:
    value = node.meta.get("val")
    dtype = getattr(value, "dtype", None)
    return dtype is not None and dtype.is_floating_point


def _written(node: Any) -> list[Any]:
    """The arguments `node` writes in place (a KV cache `etlab::update_cache` fills): per its schema."""
    schema = getattr(node.target, "_schema", None)
    if node.op != "call_function" or schema is None:
        return []
    return [
        arg
        for arg, argument in zip(node.args, schema.arguments, strict=False)
        if argument.alias_info is not None and argument.alias_info.is_write
    ]


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
        op = op_name(node) if node.op == "call_function" else ""
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


def fp32_names(program: Any, fp32: Any) -> dict[str, str]:
    """`program`'s node names → the fp32 program's at the same place (node_places), where one is."""
    by_place = {place: node.name for node, place in node_places(fp32).items()}
    return {node.name: by_place[place] for node, place in node_places(program).items() if place in by_place}


def tap_points(program: Any, names: dict[str, str] | None = None) -> tuple[list[TapPoint], int]:
    """The values to tap in an exported program (fp32 or quantized), in graph order; and how many operators were
    folded into the activation after them. `names`: each node's label, the fp32 node at its place (fp32_names);
    else its own name."""
    names = names or {}
    graph = program.graph
    user_inputs = set(program.graph_signature.user_inputs)
    live = {node for node in graph.nodes if node.op == "placeholder" and node.name in user_inputs}
    points: list[TapPoint] = []
    pending_fused: dict[Any, tuple[str, ...]] = {}
    heads: dict[Any, Any] = {}
    skipped = 0
    for node in graph.nodes:
        if node.op != "call_function" or not any(arg in live for arg in node.all_input_nodes):
            continue
        live.add(node)
        if _is_quantization(node) or not _is_float_tensor(node) or op_name(node) in _DATA_MOVEMENT:
            continue
        if _written(node):  # its values are the state it writes (a KV cache), read by the operators after it
            continue
        users = list(node.users)
        fused_into_next = len(users) == 1 and (
            (_reads_static_int8(node, live) and op_name(users[0]) in _FUSED_ACTIVATIONS)
            or (op_name(node) in _CONVOLUTIONS and op_name(users[0]) in _BATCH_NORMS)
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
            points.append(TapPoint(quantize, node, label, qparams, fused, heads.get(node)))
        else:
            points.append(TapPoint(node, node, label, None, fused, heads.get(node)))
    return points, skipped


def tap_program(program: Any, points: list[TapPoint], first: int) -> list[Tap]:
    """Make each point's value an output of `program` (in place); the taps, numbered from `first`."""
    from executorch.devtools.intermediate_output_tap import FULL_TENSOR, tap_intermediate_outputs_

    chosen = {point.value: point for point in points}
    labelled = {point.operator: position for position, point in enumerate(points)}
    values = {point.value: position for position, point in enumerate(points)}
    order = {node: position for position, node in enumerate(program.graph.nodes)}  # once, not per tap
    writers: dict[Any, list[Any]] = {}  # state (a KV cache buffer) -> the nodes that write it, in graph order
    for node in order:
        for state in _written(node):
            writers.setdefault(state, []).append(node)
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
                op=op_name(point.operator),
                shape=tuple(int(d) for d in point.operator.meta["val"].shape),
                dtype="int8" if point.qparams else "float32",
                module=_model_path(module[0]),
                module_type=module[1],
                file=location.get("file"),
                line=location.get("line"),
                function=location.get("function"),
                reads=tuple(first + i for i in _reads(point.operator, labelled, values, writers, order)),
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


def _reads(
    operator: Any,
    labelled: dict[Any, int],
    values: dict[Any, int],
    writers: dict[Any, list[Any]],
    order: dict[Any, int],
) -> list[int]:
    """The taps nearest upstream of `operator`, walked through untapped nodes (views, quantize pairs) and through
    state: a KV cache it reads holds what the writes before it (by graph `order`) put there (`writers`)."""
    found: list[int] = []
    seen: set[Any] = set()
    pending = list(operator.all_input_nodes)
    while pending:
        node = pending.pop()
        if node in seen:
            continue
        seen.add(node)
        if node.op != "call_function":
            pending.extend(w for w in writers.get(node, ()) if order[w] < order[operator])
            continue
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
