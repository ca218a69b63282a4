"""The XNNPACK delegates of a program: their serialized XNN graphs and nodes, read from the .pte.

The node types come from the XNNPACK schema shipped with the installed ExecuTorch, found without importing it.
"""

from __future__ import annotations

import functools
import importlib.util
import math
import re
from dataclasses import dataclass
from pathlib import Path

from orchestrator.errors import AnalysisError
from orchestrator.programs.plan import DelegateData

XNNPACK_BACKEND = "XnnpackBackend"  # the backend id of an XNNPACK DelegateCall


@dataclass(frozen=True)
class XnnNode:
    index: int  # the PTE adapter's node id inside the delegate graph
    type: str  # XNNFullyConnected, ...
    debug_handle: int
    output_clamp: bool  # output_min_max set to something narrower than (-inf, inf)
    shape: tuple[int, ...] | None = None  # its output tensor's dims as serialized (upper bounds where dynamic)
    inputs: tuple[int, ...] = ()  # the value ids it reads (data, weights, bias), as serialized
    output: int | None = None  # the value id it writes


@functools.cache
def xnode_type_names() -> dict[int, str]:
    """Union code -> node type name, from the XNNPACK schema shipped with the installed ExecuTorch."""
    # Located without importing executorch, whose package import pulls in torch (seconds).
    spec = importlib.util.find_spec("executorch")
    roots = list(spec.submodule_search_locations or []) if spec else []
    candidates = [Path(root) / "backends/xnnpack/serialization/schema.fbs" for root in roots]
    schema = next((path for path in candidates if path.is_file()), None)
    if schema is None:
        raise AnalysisError("cannot find ExecuTorch's XNNPACK schema.fbs: is executorch installed?")
    text = schema.read_text(encoding="utf-8")
    block = re.search(r"union\s+XNodeUnion\s*\{(?P<body>[^}]*)\}", text)
    if block is None:
        raise AnalysisError(f"cannot find the XNodeUnion in {schema}")
    body = re.sub(r"//[^\n]*", "", block.group("body"))
    names = [entry.split(":")[0].strip() for entry in body.split(",") if entry.strip()]
    return {code: name for code, name in enumerate(names, start=1)}


def xnn_graph_buffer(delegate: DelegateData, pte: Path) -> bytes:
    """The XNNGraph flatbuffer of one delegate payload, without its constant data."""
    head = delegate.read(pte, limit=32)
    if head[4:8] == b"XH00":
        flatbuffer_offset = int.from_bytes(head[10:14], "little")
        flatbuffer_size = int.from_bytes(head[14:18], "little")
        buffer = delegate.read_range(pte, flatbuffer_offset, flatbuffer_size)
    else:
        buffer = delegate.read(pte)
    if buffer[4:8] != b"XN01":
        raise AnalysisError(f"{pte.name}: an XNNPACK payload has no XNNGraph (identifier {buffer[4:8]!r})")
    return buffer


def read_xnn_nodes(delegate: DelegateData, pte: Path) -> list[XnnNode]:
    """The serialized XNN nodes of one delegate payload, read without loading its constant data."""
    from pte_adapter_model_explorer.executorch_flatbuffer import xnnpack_generated as xg

    buffer = xnn_graph_buffer(delegate, pte)
    names = xnode_type_names()
    try:
        graph = xg.XNNGraph.GetRootAs(buffer, 0)
        shapes = _value_shapes(graph)
        nodes = []
        for index in range(graph.XnodesLength()):
            xnode = graph.Xnodes(index)
            bounds = xnode.OutputMinMax()
            clamp = bounds is not None and (math.isfinite(bounds.OutputMin()) or math.isfinite(bounds.OutputMax()))
            code = xnode.XnodeUnionType()
            # The node's own table (its fields differ by type); every operator XNNPACK takes has one output_id.
            fields = xg.XnodeUnionCreator(code, xnode.XnodeUnion())
            output = getattr(fields, "outputId", None)
            output = output if isinstance(output, int) else None
            shape = shapes.get(output) if output is not None else None
            reads = _input_ids(fields)
            kind = names.get(code, f"XNode{code}")
            nodes.append(XnnNode(index, kind, xnode.DebugHandle(), bool(clamp), shape, reads, output))
    except Exception as exc:  # the generated reader raises struct/index errors on garbage
        raise AnalysisError(f"{pte.name}: unreadable XNNPACK graph ({exc})") from None
    return nodes


def _input_ids(fields: object) -> tuple[int, ...]:
    """The value ids a node's table reads: its `*Id` fields but the output (inputId, input1Id, filterId, biasId...)."""
    found = vars(fields).items() if fields is not None and hasattr(fields, "__dict__") else ()
    return tuple(v for k, v in found if k.endswith("Id") and k != "outputId" and isinstance(v, int))


def _value_shapes(graph: object) -> dict[int, tuple[int, ...]]:
    """Value id -> dims, for the graph's tensor values (a quantized value's tensor too)."""
    from pte_adapter_model_explorer.executorch_flatbuffer import xnnpack_generated as xg

    shapes = {}
    for k in range(graph.XvaluesLength()):  # type: ignore[attr-defined]
        value = graph.Xvalues(k)  # type: ignore[attr-defined]
        table = value.XvalueUnion()
        if table is None:
            continue
        tensor = xg.XNNTensorValue()
        if value.XvalueUnionType() == xg.XValueUnion.XNNQuantizedTensorValue:
            quantized = xg.XNNQuantizedTensorValue()
            quantized.Init(table.Bytes, table.Pos)
            inner = quantized.TensorValue()
            if inner is None:
                continue
            tensor = inner
        else:
            tensor.Init(table.Bytes, table.Pos)
        shapes[tensor.IdOut()] = tuple(int(tensor.Dims(j)) for j in range(tensor.DimsLength()))
    return shapes
