"""What a lowered program really contains: its XNNPACK FullyConnected and Convolution nodes counted by datatype, read
from the serialized XNNPACK graphs, checked against what the scheme claims (`node_report`, the sidecar's)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

from orchestrator.lowering.quantize.schemes import Scheme
from orchestrator.programs.plan import read_program_plan
from orchestrator.programs.xnn import XNNPACK_BACKEND, xnn_graph_buffer

# XNNPACK datatype codes (schema.fbs XNNDatatype) -> names.
XNN_DATATYPES = {
    0: "invalid", 1: "fp32", 2: "fp16", 3: "qint8", 4: "quint8", 5: "qint32", 6: "qcint8", 7: "qcint32",
    8: "qcint4", 9: "qdint8", 10: "qbint4", 11: "qpint8", 12: "int32", 13: "pfp32", 14: "bf16",
}  # fmt: skip
FLOAT_DATATYPES = frozenset({"fp32", "fp16", "bf16", "pfp32"})


def fully_connected_types(pte: Path) -> Counter[str]:
    """FullyConnected nodes of every XNNPACK delegate of `forward`, counted by `input x weight` datatype."""
    return xnn_node_types(pte)[0]


def convolution_types(pte: Path) -> Counter[str]:
    """Convolution nodes (Conv2d and DepthwiseConv2d) of every XNNPACK delegate of `forward`, by datatype."""
    return xnn_node_types(pte)[1]


def xnn_node_types(pte: Path) -> tuple[Counter[str], Counter[str]]:
    """FullyConnected and Convolution nodes of every XNNPACK delegate of `forward`, counted by `input x weight`
    datatype."""
    from pte_adapter_model_explorer.executorch_flatbuffer import xnnpack_generated as xg

    convolutions = (xg.XNodeUnion.XNNConv2d, xg.XNodeUnion.XNNDepthwiseConv2d)
    fully_connected: Counter[str] = Counter()
    convolution: Counter[str] = Counter()
    plan = read_program_plan(pte, "forward")
    for instruction in plan.instructions:
        if instruction.backend != XNNPACK_BACKEND or instruction.delegate is None:
            continue
        buffer = xnn_graph_buffer(instruction.delegate, pte)
        graph = xg.XNNGraph.GetRootAs(buffer, 0)
        datatypes = {}
        for index in range(graph.XvaluesLength()):
            datatypes.update(_value_datatype(xg, graph.Xvalues(index)))
        for index in range(graph.XnodesLength()):
            xnode = graph.Xnodes(index)
            kind = xnode.XnodeUnionType()
            if kind == xg.XNodeUnion.XNNFullyConnected:
                node: Any = xg.XNNFullyConnected()
                counts = fully_connected
            elif kind in convolutions:
                node = xg._XNNNodeConv()
                counts = convolution
            else:
                continue
            node.Init(xnode.XnodeUnion().Bytes, xnode.XnodeUnion().Pos)
            counts[f"{datatypes.get(node.Input1Id(), '?')} x {datatypes.get(node.FilterId(), '?')}"] += 1
    return fully_connected, convolution


def _value_datatype(xg: Any, value: Any) -> dict[int, str]:
    kind, table = value.XvalueUnionType(), value.XvalueUnion()
    if table is None:
        return {}
    if kind == xg.XValueUnion.XNNQuantizedTensorValue:
        quantized = xg.XNNQuantizedTensorValue()
        quantized.Init(table.Bytes, table.Pos)
        tensor = quantized.TensorValue()
    elif kind == xg.XValueUnion.XNNTensorValue:
        tensor = xg.XNNTensorValue()
        tensor.Init(table.Bytes, table.Pos)
    else:
        return {}
    if tensor is None:
        return {}
    return {tensor.IdOut(): XNN_DATATYPES.get(tensor.Datatype(), f"type{tensor.Datatype()}")}


def node_report(pte: Path, scheme: Scheme, fallback_histogram: dict[str, int]) -> dict[str, Any]:
    """What the lowered program holds: FC and convolution nodes by datatype inside the delegates, and linears and
    convolutions left outside."""
    types, convolutions = xnn_node_types(pte)
    quantized = sum(n for kind, n in types.items() if kind.split(" x ")[-1] not in FLOAT_DATATYPES)
    quantized_conv = sum(n for kind, n in convolutions.items() if kind.split(" x ")[-1] not in FLOAT_DATATYPES)
    outside = {op: n for op, n in fallback_histogram.items() if any(k in op for k in ("addmm", "linear", ".mm."))}
    conv_outside = {op: n for op, n in fallback_histogram.items() if "convolution" in op}
    return {
        "fully_connected": dict(sorted(types.items())),
        "quantized_fully_connected": quantized,
        "float_fully_connected": sum(types.values()) - quantized,
        "expected_fully_connected": scheme.fully_connected,
        "linears_outside_delegates": outside,
        "convolution": dict(sorted(convolutions.items())),
        "quantized_convolution": quantized_conv,
        "float_convolution": sum(convolutions.values()) - quantized_conv,
        "expected_convolution": scheme.convolution,
        "convolutions_outside_delegates": conv_outside,
    }
