"""Quantizing an eager module with a scheme (`quantize`): a copy, Conv1D swapped, the scheme's flow, exported; and what
it quantized, counted in the exported graph (a linear or convolution is quantized when a dequantize feeds its weight).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

from orchestrator.lowering.quantize.methods import padded_layers, swap_conv1d, weighted_layers
from orchestrator.lowering.quantize.schemes import Apply, Scheme


@dataclass
class Quantized:
    """A quantized program ready for `to_edge_transform_and_lower`, and how it came about."""

    program: Any  # torch.export.ExportedProgram
    report: dict[str, Any]


def quantize(
    module: Any,
    example_args: tuple,
    scheme: Scheme,
    *,
    calibration: list[tuple] | None = None,
    calibration_source: str | None = None,
    quantizer: Any = None,
    apply: Apply | None = None,
    keep_float: tuple[str, ...] = (),
) -> Quantized:
    """Quantize an eager module (a copy; the original is untouched) and export it.

    `calibration` is a list of argument tuples for a calibrated scheme; `quantizer` overrides the PT2E quantizer
    (tests); `apply` the scheme's own way of quantizing and exporting (a text-generation program's, generation.py);
    `keep_float` the layers left fp32 (mixed precision; KeptLayerUnknown if one is no linear or convolution of it).
    The linears and convolutions are counted in the quantized program's graph, so a module without nn.Linear or
    nn.Conv layers (a user's .pt2, unlifted) is counted too.
    """
    if scheme.apply is None:
        raise ValueError(f"not a quantization scheme: {scheme.name!r}")
    model = copy.deepcopy(module).eval()
    swapped = swap_conv1d(model)
    layers = weighted_layers(model)
    kept_paths = kept_layer_paths(keep_float, layers)
    if keep_float:
        program = (apply or scheme.apply)(model, example_args, calibration, quantizer, kept_paths)
    else:
        program = (apply or scheme.apply)(model, example_args, calibration, quantizer)
    operations = graph_operations(program.graph, layers)
    linears = [op for op in operations if op.kind == LINEAR]
    convolutions = [op for op in operations if op.kind == CONVOLUTION]
    report = {
        "scheme": scheme.name,
        "method": scheme.method,
        "conv1d_swapped_to_linear": len(swapped),
        "linear_layers": len(linears),
        "quantized_linears": sum(op.quantized for op in linears),
        "float_linears": _float_names(linears),
        "convolutions": len(convolutions),
        "quantized_convolutions": sum(op.quantized for op in convolutions),
        "float_convolutions": _float_names(convolutions),
        "calibration": _calibration_record(scheme, calibration, calibration_source),
    }
    embeddings = embedding_layers(model)
    if any(quantized for _, quantized in embeddings):  # 8-bit embeddings (a language model's recipe)
        report["embeddings"] = len(embeddings)
        report["quantized_embeddings"] = sum(quantized for _, quantized in embeddings)
        report["float_embeddings"] = sorted(name for name, quantized in embeddings if not quantized)
    if keep_float:  # mixed precision: what was asked, and checked in the graph (a quantized one is a bug)
        still_quantized = sorted({op.layer for op in operations if op.quantized} & set(kept_paths))
        if still_quantized:
            raise RuntimeError(f"layers kept in float came out quantized: {', '.join(still_quantized)}")
        report["kept_float"] = sorted(keep_float)
    padded = padded_layers(model)
    if padded:  # 4-bit groups that did not divide a linear's input features: padded to a multiple of the group
        report["padded_linears"] = padded
    shared = shared_head_lines(model)
    if shared:  # a tied head reading the embedding's quantized table (quantize/shared_head.py): stored once
        report["shared_heads"] = sorted(shared)
    return Quantized(program, report)


class KeptLayerUnknown(ValueError):
    """`--keep-float` naming what is no linear or convolution of the model; `layers` are those it has."""

    def __init__(self, unknown: list[str], layers: list[str]) -> None:
        super().__init__(f"no linear or convolution named {', '.join(unknown)}")
        self.unknown = unknown
        self.layers = layers


_WRAPPED = "model."  # etlab's wrappers hold the user's model as `model` (numerics and reports name it without)


def kept_layer_paths(keep_float: tuple[str, ...], layers: list[str]) -> tuple[str, ...]:
    """The module paths of the layers `keep_float` names, as the user's model names them (a wrapper's `model.`
    prefix optional); KeptLayerUnknown with the names the model takes if one is no linear or convolution."""
    known = set(layers)
    paths = [name if name in known else f"{_WRAPPED}{name}" for name in keep_float]
    unknown = [name for name, path in zip(keep_float, paths, strict=True) if path not in known]
    if unknown:
        raise KeptLayerUnknown(unknown, [layer.removeprefix(_WRAPPED) for layer in layers])
    return tuple(paths)


def shared_head_lines(module: Any) -> list[str]:
    """Lines like "lm_head shares model.embed_tokens' 4-bit table": each head (shared_head.SharedHead) and the
    embedding whose table it reads, named from `module`."""
    tables = [(name, child) for name, child in module.named_modules() if hasattr(child, "quantized_table_bits")]
    return sorted(
        f"{name} shares {table_name}' {child.bits}-bit table"
        for name, child in module.named_modules()
        if hasattr(child, "shares")
        for table_name, table in tables
        if table.table is child.table
    )


def embedding_layers(module: Any) -> list[tuple[str, bool]]:
    """Every nn.Embedding, and whether its weight was quantized (torchao swaps in a quantized tensor subclass)."""
    import torch

    return [
        (name, type(child.weight) is not torch.nn.Parameter and type(child.weight) is not torch.Tensor)
        for name, child in module.named_modules()
        if isinstance(child, torch.nn.Embedding)
    ] + [(name, True) for name, child in module.named_modules() if hasattr(child, "quantized_table_bits")]


_DEQUANTIZE = ("dequantize_per_channel", "dequantize_per_tensor", "dequantize_affine", "dequantize")
_PASS_THROUGH = ("t.default", "permute", "transpose", "view", "reshape", "_to_copy", "clone")


def _produced_by_dequantize(node: Any) -> bool:
    import torch

    for _ in range(4):  # weight → (transpose/view)* → dequantize
        if not isinstance(node, torch.fx.Node) or node.op != "call_function":
            return False
        name = str(node.target)
        if any(part in name for part in _DEQUANTIZE):
            return True
        if not any(part in name for part in _PASS_THROUGH) or not node.args:
            return False
        node = node.args[0]
    return False


LINEAR = "linear"
CONVOLUTION = "convolution"
# Graph operators that compute a linear or a convolution -> (kind, index of the weight argument).
_WEIGHTED_OPS = {
    "aten.linear": (LINEAR, 1),
    "aten.addmm": (LINEAR, 2),
    "aten.conv1d": (CONVOLUTION, 1),
    "aten.conv2d": (CONVOLUTION, 1),
    "aten.conv3d": (CONVOLUTION, 1),
    "aten.conv_transpose1d": (CONVOLUTION, 1),
    "aten.conv_transpose2d": (CONVOLUTION, 1),
    "aten.convolution": (CONVOLUTION, 1),
    "aten._convolution": (CONVOLUTION, 1),
}


@dataclass(frozen=True)
class Operation:
    """One linear or convolution of an exported graph: its layer's name and whether its weight is quantized."""

    kind: str  # LINEAR or CONVOLUTION
    layer: str
    quantized: bool


def graph_operations(graph: Any, layers: list[str] | None = None) -> list[Operation]:
    """Every linear and convolution node of `graph`; quantized when its weight comes out of a dequantize.

    A layer is named from the node's nn_module_stack (mapped onto `layers`, the module's own names, where one
    matches), else by the node's name: a graph without modules still names what stayed float.
    """
    operations = []
    for node in graph.nodes:
        if node.op != "call_function":
            continue
        target = str(node.target).rsplit(".", 1)[0]  # aten.conv2d.default -> aten.conv2d
        found = _WEIGHTED_OPS.get(target)
        if found is None or len(node.args) <= found[1]:
            continue
        kind, weight = found
        stack = node.meta.get("nn_module_stack") or {}
        path = list(stack.values())[-1][0] if stack else node.name
        operations.append(
            Operation(kind, _module_name(str(path), layers or []), _produced_by_dequantize(node.args[weight]))
        )
    return operations


def _float_names(operations: list[Operation]) -> list[str]:
    return sorted({op.layer for op in operations if not op.quantized})


def _module_name(path: str, layers: list[str]) -> str:
    """nn_module_stack paths look like `L['self'].model.lm_head` or `model.lm_head`; map to a layer name."""
    cleaned = path.replace("L['self'].", "").replace("L['self']", "")
    if cleaned in layers:
        return cleaned
    return next((name for name in layers if name and cleaned.endswith("." + name)), cleaned)


def _calibration_record(scheme: Scheme, calibration: list[tuple] | None, source: str | None) -> dict[str, Any] | None:
    if not scheme.calibrated:
        return None
    return {"source": source or "generated", "samples": len(calibration or [])}
