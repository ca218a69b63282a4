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
    kernel: ConvKernel | None = None  # a convolution's window and channel groups


@dataclass(frozen=True)
class ConvKernel:
    """A convolution node's window and channel groups, as serialized (XNNPACK's _XNNNodeConv)."""

    height: int
    width: int
    group_input_channels: int
    group_output_channels: int
    groups: int


# XNNPACK's XNNDatatype codes (schema.fbs) -> name and bits per element (None: no elements, the invalid type)
DATATYPES: dict[int, tuple[str, float | None]] = {
    0: ("invalid", None), 1: ("fp32", 32), 2: ("fp16", 16), 3: ("qint8", 8), 4: ("quint8", 8), 5: ("qint32", 32),
    6: ("qcint8", 8), 7: ("qcint32", 32), 8: ("qcint4", 4), 9: ("qdint8", 8), 10: ("qbint4", 4), 11: ("qpint8", 8),
    12: ("int32", 32), 13: ("pfp32", 32), 14: ("bf16", 16),
}  # fmt: skip


@dataclass(frozen=True)
class XnnValue:
    """One tensor value of a delegate's graph: its element type, dims, whether it is a constant (weights, bias) and,
    for a quantized constant, how many scales it carries and their bytes each (per channel: fp32; per group: bf16)."""

    id: int
    datatype: str  # DATATYPES' name: fp32, qcint8, qbint4, qdint8, ...
    dims: tuple[int, ...]
    constant: bool
    bits: float | None  # bits per element
    scales: int = 0
    scale_bytes: int = 0

    @property
    def elements(self) -> int:
        return math.prod(self.dims)

    @property
    def bytes(self) -> float:
        """Its elements at their width, and its scales."""
        return self.elements * (self.bits or 0) / 8 + self.scales * self.scale_bytes


@dataclass(frozen=True)
class XnnGraph:
    nodes: tuple[XnnNode, ...]
    values: dict[int, XnnValue]


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
    return list(read_xnn_graph(delegate, pte).nodes)


def read_xnn_graph(delegate: DelegateData, pte: Path) -> XnnGraph:
    """The serialized XNN nodes and tensor values of one delegate payload, read without loading its constant data."""
    from pte_adapter_model_explorer.executorch_flatbuffer import xnnpack_generated as xg

    buffer = xnn_graph_buffer(delegate, pte)
    names = xnode_type_names()
    try:
        graph = xg.XNNGraph.GetRootAs(buffer, 0)
        values = _values(graph)
        shapes = {value_id: value.dims for value_id, value in values.items()}
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
            kernel = _kernel(fields)
            nodes.append(XnnNode(index, kind, xnode.DebugHandle(), bool(clamp), shape, reads, output, kernel))
    except Exception as exc:  # the generated reader raises struct/index errors on garbage
        raise AnalysisError(f"{pte.name}: unreadable XNNPACK graph ({exc})") from None
    return XnnGraph(tuple(nodes), values)


def _kernel(fields: object) -> ConvKernel | None:
    """A convolution's window and groups from its node table (the fields only _XNNNodeConv has), else None."""
    found = [getattr(fields, name, None) for name in
             ("kernelHeight", "kernelWidth", "groupInputChannels", "groupOutputChannels", "groups")]  # fmt: skip
    if not all(isinstance(value, int) for value in found):
        return None
    return ConvKernel(*(int(value) for value in found))  # type: ignore[arg-type]


NO_VALUE = 0xFFFFFFFF  # XNN_INVALID_VALUE_ID: a field left unset, as a Linear without bias leaves its `biasId`


def _input_ids(fields: object) -> tuple[int, ...]:
    """The value ids a node's table reads: its `*Id` fields but the output (inputId, input1Id, filterId, biasId...),
    those set."""
    found = vars(fields).items() if fields is not None and hasattr(fields, "__dict__") else ()
    return tuple(v for k, v in found if k.endswith("Id") and k != "outputId" and isinstance(v, int) and v != NO_VALUE)


def _values(graph: object) -> dict[int, XnnValue]:
    """Value id -> the value, for the graph's tensor values (a quantized value's tensor too, with its scales)."""
    from pte_adapter_model_explorer.executorch_flatbuffer import xnnpack_generated as xg

    values = {}
    for k in range(graph.XvaluesLength()):  # type: ignore[attr-defined]
        value = graph.Xvalues(k)  # type: ignore[attr-defined]
        table = value.XvalueUnion()
        if table is None:
            continue
        tensor = xg.XNNTensorValue()
        scales, scale_bytes = 0, 0
        if value.XvalueUnionType() == xg.XValueUnion.XNNQuantizedTensorValue:
            quantized = xg.XNNQuantizedTensorValue()
            quantized.Init(table.Bytes, table.Pos)
            inner = quantized.TensorValue()
            if inner is None:
                continue
            tensor = inner
            scales, scale_bytes = _scales(quantized, tensor)
        else:
            tensor.Init(table.Bytes, table.Pos)
        name, bits = DATATYPES.get(int(tensor.Datatype()), (f"datatype {tensor.Datatype()}", None))
        dims = tuple(int(tensor.Dims(j)) for j in range(tensor.DimsLength()))
        constant = int(tensor.ConstantBufferIdx()) != 0
        values[tensor.IdOut()] = XnnValue(tensor.IdOut(), name, dims, constant, bits, scales, scale_bytes)
    return values


def _scales(quantized: object, tensor: object) -> tuple[int, int]:
    """A quantized constant's scales: how many, and the bytes of each (per channel fp32, per group bf16)."""
    from pte_adapter_model_explorer.executorch_flatbuffer import xnnpack_generated as xg

    params = quantized.QuantParams()  # type: ignore[attr-defined]
    kind = quantized.QuantParamsType()  # type: ignore[attr-defined]
    if params is None or not tensor.ConstantBufferIdx():  # type: ignore[attr-defined]
        return 0, 0
    dims = [int(tensor.Dims(j)) for j in range(tensor.DimsLength())]  # type: ignore[attr-defined]
    if kind == xg.XNNQuantParams.PerChannelQuant:
        channel = xg.PerChannelQuant()
        channel.Init(params.Bytes, params.Pos)
        axis = int(channel.ChannelDim())
        count = int(channel.NumScales()) or int(channel.ScaleLength()) or (dims[axis] if axis < len(dims) else 0)
        return count, 4
    if kind == xg.XNNQuantParams.PerChannelGroupQuant:
        group = xg.PerChannelGroupQuant()
        group.Init(params.Bytes, params.Pos)
        size = int(group.GroupSize())
        count = int(group.NumScales()) or int(group.ScaleLength()) or (math.prod(dims) // size if size else 0)
        return count, 2
    return 0, 0
