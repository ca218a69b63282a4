"""Placing XNNPACK's per-operator runtime events on the serialized XNN nodes of a delegate.

The XNNPACK delegate reports one event per runtime operator, in runtime order, named after XNNPACK's operator
type ("Fully Connected (NC, F32) GEMM #1"); the events carry no node index or debug handle. The serialized graph
(what the PTE adapter shows, node ids "0", "1", ...) is the list of XNN nodes ExecuTorch defined, in order.
XNNPACK keeps that order but does not map nodes one to one. Measured with ExecuTorch 1.5.1 on x86:

- a node may emit no operator: an XNNClamp that follows an FC is fused into it;
- a node may emit two: a binary node whose `output_min_max` is set becomes the op plus an inserted "Clamp";
- XNNConcatenate reports only its first copy ("Copy (NC, X32)"); reshapes report "Static Reshape (NC)";
- DistilBERT and GPT-2 (tiny and full size) are one event per node: FC, BMM, Add, Mul, TanH, GELU, Softmax,
  Transpose, Static Reshape, Copy;
- an XNNConv2d with a 1x1 kernel (MobileNetV2's pointwise convolutions, full size) reports "Fully Connected": XNNPACK
  runs it as one; its XNNGlobalAvgPooling2d reports "Mean (ND) Reduce2";
- quantized programs add XNNConvert nodes (to qdint8 / qint8 and back): a dynamic one before an FC emits nothing
  (fused into the FC); a static one emits "Convert (NC)", except around a unary op, where convert → GELU → convert
  becomes one lookup-table operator reported as "Invalid Unary Op" (the unary node's, its converts fused).

From XNNPACK's operator list rather than measured here: on Arm with KleidiAI it may insert "Pack LH" operators
that belong to no serialized node; their time is left unplaced.

`match_events` aligns the two sequences under exactly these rules (RUNTIME_NAMES below is the type table). It
counts the alignments; a delegate is placed only when exactly one exists, so a value never lands on a node
that might not have produced it. No alignment (count mismatch, unknown names, reordering) or several (e.g. a
fused clamp next to an inserted one) leave the delegate out, with the reason.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import numpy as np

from orchestrator.programs.xnn import XnnNode

_BINARY = ("Binary Elementwise",)
# A quantized unary (convert → op → convert, fused into one lookup-table operator) reports "Invalid Unary Op".
_UNARY = ("Unary Elementwise", "Invalid Unary Op")  # the whole name: a kernel name comes only after "(types)"

# Serialized XNN node type -> base names of the runtime operators it can emit (the operator name before its
# "(layout, types)" part). Names taken from XNNPACK's operator strings in the installed ExecuTorch wheel.
RUNTIME_NAMES: dict[str, tuple[str, ...]] = {
    "XNNAdd": ("Add", *_BINARY),
    "XNNSubtract": ("Subtract", *_BINARY),
    "XNNMultiply": ("Multiply", *_BINARY),
    "XNNDiv": ("Divide", *_BINARY),
    "XNNMinimum": ("Minimum", *_BINARY),
    "XNNMaximum": ("Maximum", *_BINARY),
    "XNNPReLU": ("PReLU", *_BINARY),
    "XNNFullyConnected": ("Fully Connected", "Dynamic Fully Connected"),
    "XNNBatchMatrixMultiply": ("Batch Matrix Multiply",),
    "XNNConv2d": ("Convolution", "Fully Connected"),  # a 1x1 convolution runs as a fully-connected operator
    "XNNDepthwiseConv2d": ("Convolution",),
    "XNNConvTranspose2d": ("Deconvolution",),
    "XNNSoftmax": ("Softmax",),
    "XNNSigmoid": ("Sigmoid", *_UNARY),
    "XNNTanh": ("TanH", *_UNARY),
    "XNNGelu": ("GELU", "ApproxGELU", *_UNARY),
    "XNNClamp": ("Clamp", *_UNARY),
    "XNNHardswish": ("HardSwish", *_UNARY),
    "XNNLeakyReLU": ("LeakyReLU", *_UNARY),
    "XNNELU": ("ELU", *_UNARY),
    "XNNAbs": ("Abs", *_UNARY),
    "XNNNegate": ("Negate", *_UNARY),
    "XNNSquare": ("Square", *_UNARY),
    "XNNSquareRoot": ("Square Root", *_UNARY),
    "XNNReciprocalSquareRoot": ("Reciprocal Square Root", *_UNARY),
    "XNNFloor": ("Floor", *_UNARY),
    "XNNCeiling": ("Ceiling", *_UNARY),
    "XNNExp": ("Exp", *_UNARY),
    "XNNLog": ("Log", *_UNARY),
    "XNNSin": ("Sine", *_UNARY),
    "XNNCos": ("Cosine", *_UNARY),
    "XNNConvert": ("Convert", *_UNARY),
    "XNNStaticTranspose": ("Transpose",),
    "XNNStaticReshape": ("Static Reshape", "Copy"),
    "XNNCopy": ("Copy",),
    "XNNConcatenate2": ("Copy", "Concatenate"),
    "XNNConcatenate3": ("Copy", "Concatenate"),
    "XNNConcatenate4": ("Copy", "Concatenate"),
    "XNNConcatenate5": ("Copy", "Concatenate"),
    "XNNStaticSlice": ("Slice",),
    "XNNStaticConstantPad": ("Constant Pad",),
    "XNNAvgPooling2d": ("Average Pooling",),
    "XNNMaxPooling2d": ("Max Pooling",),
    "XNNArgMaxPooling2d": ("ArgMax Pooling",),
    "XNNGlobalAvgPooling2d": ("Mean", "Global Average Pooling"),
    "XNNStaticResizeBilinear2D": ("Resize Bilinear",),
    "XNNScaledDotProductAttention": ("Scaled Dot-Product Attention",),
}
# Node types XNNPACK may fuse into a neighbour, leaving no operator of their own: a clamp into its producer, and
# the dynamic quantization of a quantized fully-connected's input into that operator (measured, ExecuTorch 1.5.1:
# int8-dynamic and 8da4w FCs report "Fully Connected (NC, QD8, F32, QC8W)" and no convert of their own).
FUSIBLE_TYPES = frozenset({"XNNClamp", "XNNConvert"})
# The operator XNNPACK appends to a node whose output_min_max it cannot fuse.
OUTPUT_CLAMP = "Clamp"
# Operators XNNPACK inserts that belong to no serialized node: their time stays unplaced.
INSERTED_OPERATORS = frozenset({"Pack LH"})

MAX_ALIGNMENT_CELLS = 4_000_000
# "<base> (<types>) <kernel> #<n>", the kernel (GEMM, IGEMM, DWConv, Reduce2) only after the types.
_EVENT_NAME = re.compile(r"^(?P<base>.*?)(?: \((?P<types>[^)]*)\)(?: (?P<kernel>[A-Za-z0-9]+))?)?(?: #(?P<n>\d+))?$")


def operator_base(event_name: str) -> str:
    """'Fully Connected (NC, F32) GEMM #1' -> 'Fully Connected'."""
    match = _EVENT_NAME.match(event_name)
    return match.group("base") if match else event_name


def operator_type(event_name: str) -> str:
    """'Fully Connected (NC, F32) GEMM #1' -> 'Fully Connected (NC, F32) GEMM' (the name without its counter)."""
    return re.sub(r" #\d+$", "", event_name)


@dataclass(frozen=True)
class Placement:
    """Which runtime events (positions in one execution's event list) each XNN node produced."""

    node_events: dict[int, list[int]]
    unplaced_events: list[int] = field(default_factory=list)
    fused_nodes: list[int] = field(default_factory=list)  # nodes that emitted no operator


class MatchError(Exception):
    """The events cannot be placed on nodes with certainty; the message says why."""


def match_events(nodes: list[XnnNode], event_names: list[str]) -> Placement:
    """Align runtime event names with nodes; raise MatchError unless exactly one alignment exists."""
    bases = [operator_base(name) for name in event_names]
    unknown = sorted({node.type for node in nodes if node.type not in RUNTIME_NAMES})
    if unknown:
        raise MatchError(f"no runtime operator names known for node type(s) {', '.join(unknown)}")
    n_nodes, n_events = len(nodes), len(bases)
    if (n_nodes + 1) * (n_events + 1) > MAX_ALIGNMENT_CELLS:
        raise MatchError(f"too large to align ({n_nodes} nodes x {n_events} events)")

    def fits(node: XnnNode, event: int) -> bool:
        return bases[event] in RUNTIME_NAMES[node.type]

    # ways[i][j]: alignments of nodes[:i] with events[:j], capped at 2 (we only need 0, 1 or "several").
    ways = np.zeros((n_nodes + 1, n_events + 1), dtype=np.int8)
    ways[0][0] = 1
    for i in range(n_nodes + 1):
        for j in range(n_events + 1):
            count = int(ways[i][j])
            if not count:
                continue
            targets = []
            if j < n_events and bases[j] in INSERTED_OPERATORS:
                targets.append((i, j + 1))
            if i < n_nodes:
                node = nodes[i]
                if node.type in FUSIBLE_TYPES:
                    targets.append((i + 1, j))
                if j < n_events and fits(node, j):
                    targets.append((i + 1, j + 1))
                    if node.output_clamp and j + 1 < n_events and bases[j + 1] == OUTPUT_CLAMP:
                        targets.append((i + 1, j + 2))
            for ti, tj in targets:
                ways[ti][tj] = min(2, int(ways[ti][tj]) + count)
    total = int(ways[n_nodes][n_events])
    if total == 0:
        raise MatchError(_explain_no_alignment(nodes, bases))
    if total > 1:
        raise MatchError(f"ambiguous: {len(bases)} events fit {len(nodes)} nodes in more than one way")
    return _backtrack(nodes, bases, ways)


def _backtrack(nodes: list[XnnNode], bases: list[str], ways: np.ndarray) -> Placement:
    i, j = len(nodes), len(bases)
    node_events: dict[int, list[int]] = {}
    unplaced: list[int] = []
    fused: list[int] = []
    while (i, j) != (0, 0):
        candidates: list[tuple[int, int, str]] = []
        if j > 0 and bases[j - 1] in INSERTED_OPERATORS and ways[i][j - 1]:
            candidates.append((i, j - 1, "unplaced"))
        if i > 0:
            node = nodes[i - 1]
            if node.type in FUSIBLE_TYPES and ways[i - 1][j]:
                candidates.append((i - 1, j, "fused"))
            if j > 0 and bases[j - 1] in RUNTIME_NAMES[node.type] and ways[i - 1][j - 1]:
                candidates.append((i - 1, j - 1, "one"))
            if (
                j > 1
                and node.output_clamp
                and bases[j - 1] == OUTPUT_CLAMP
                and bases[j - 2] in RUNTIME_NAMES[node.type]
                and ways[i - 1][j - 2]
            ):
                candidates.append((i - 1, j - 2, "two"))
        assert len(candidates) == 1, "a unique alignment has exactly one predecessor per step"
        i, j, step = candidates[0]
        if step == "unplaced":
            unplaced.append(j)
        elif step == "fused":
            fused.append(i)
        elif step == "one":
            node_events[nodes[i].index] = [j]
        else:
            node_events[nodes[i].index] = [j, j + 1]
    return Placement(node_events, sorted(unplaced), sorted(nodes[k].index for k in fused))


def _explain_no_alignment(nodes: list[XnnNode], bases: list[str]) -> str:
    if len(bases) != len(nodes):
        detail = f"{len(bases)} runtime events for {len(nodes)} nodes"
    else:
        detail = f"{len(bases)} events for {len(nodes)} nodes"
    for position, (node, base) in enumerate(zip(nodes, bases, strict=False)):
        if base not in RUNTIME_NAMES.get(node.type, ()):
            return (
                f"events do not follow the nodes ({detail}; first difference at #{position}: {node.type} vs {base!r})"
            )
    return f"events do not follow the nodes ({detail})"
