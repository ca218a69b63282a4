"""Every Fully Connected, convolution and batch matmul inside the XNNPACK delegates against the board's two limits:
the bytes it moves and the operations it does over its measured median time, against the memory read bandwidth
and the peak arithmetic rate setup-board measured (boards/limits.py, as the bundle's `board_info_before.json`
records them).

- Operations: a multiply-add is 2. Fully Connected 2·M·N·K (M the rows of its input, K its input features, N its
  output features); convolution 2·N·Hout·Wout·Cout·(Cin/groups)·kh·kw (its output's elements times its window);
  transposed convolution 2·(input elements)·kh·kw·(Cout/groups); batch matmul 2·B·M·N·K.
- Bytes: every value the node reads (input activations, weights, bias) and the output it writes, each once, at
  its serialized element type (fp32 4 B, 8-bit 1 B, 4-bit 0.5 B) plus a quantized weight's scales. A dynamically
  quantized input (qdint8) counts as the fp32 it is read as: XNNPACK fuses the conversion into the operator
  (results/xnn_match.py). This is the least traffic the node can cause; re-reads (im2col, tiles) only add to it.
- The limit for its kind: the int8 peak for a node whose weights are 8- or 4-bit (XNNPACK's QD8/QS8 kernels), the
  fp32 peak otherwise. The node is memory-bound when its arithmetic intensity (ops per byte) is below the ridge
  point (peak / bandwidth), compute-bound otherwise; `roofline_pct` is its achieved rate as a share of what the
  roofline lets it reach there, min(peak, intensity x bandwidth): its share of the bandwidth when memory-bound, of
  the peak when compute-bound. A node whose bytes fit the last-level cache is marked so (its bandwidth share can
  pass 100%).

A generation program's shapes are dynamic: its graph holds each activation at the program's upper bound on the
sequence (`max_prompt_len` rows), while a decode step takes one row and a prefill call the prompt's. `SequenceRows`
says how many an execution took, and the work is counted at those rows (a head that runs on the last row stays at 1).

A board without a limit measured says so ("not measured", never 0): with the bandwidth alone a node gets its share
of the bandwidth and no bound; without either, its work and achieved rates only. A malformed record is refused
(RecordError, 65, from boards/limits.py); the analysis says so and goes on without the limits, as the decode's
roofline does (results/roofline.py); the other limit, if sound, is kept.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from orchestrator.boards.limits import ComputePeak, ReadBandwidth, recorded_bandwidth, recorded_compute
from orchestrator.errors import AnalysisError
from orchestrator.programs.plan import ProgramPlan, read_program_plan
from orchestrator.programs.xnn import XNNPACK_BACKEND, XnnNode, XnnValue, read_xnn_graph
from orchestrator.records import Count, Duration, RecordError

if TYPE_CHECKING:  # the types only
    from orchestrator.results.profile import Profile

Kernel = Literal["fp32", "int8"]
Bound = Literal["memory", "compute"]
FULLY_CONNECTED, BATCH_MATMUL = "XNNFullyConnected", "XNNBatchMatrixMultiply"
CONVOLUTIONS = ("XNNConv2d", "XNNDepthwiseConv2d")
TRANSPOSED = "XNNConvTranspose2d"
ROOFLINE_TYPES = (FULLY_CONNECTED, *CONVOLUTIONS, TRANSPOSED, BATCH_MATMUL)
LOW_BIT_WEIGHTS = frozenset({"qint8", "quint8", "qcint8", "qcint4", "qbint4"})  # the int8 kernels' weights
DYNAMIC_INPUTS = frozenset({"qdint8", "qpint8"})  # quantized inside the operator, from the fp32 it reads
FP32_BYTES = 4
SUMMARY_ROWS = 5  # summary.json keeps the costliest few; ops.json every node
NOT_MEASURED = "not measured"


@dataclass(frozen=True)
class SequenceRows:
    """A generation program's dynamic sequence: the rows its graph is serialized at (its `max_prompt_len`) and the
    rows one execution takes (1 in a decode step, the chunk of the prompt in a prefill call)."""

    bound: int
    taken: int


def _at_rows(value: XnnValue, rows: SequenceRows | None) -> XnnValue:
    """An activation's dims at the rows the execution took: its first dim but the last equal to the bound (a FC's
    [1, S, K], a batch matmul's [B, H, S, T]); constants and values without the sequence stay as they are."""
    if rows is None or value.constant or rows.taken >= rows.bound:
        return value
    for index, size in enumerate(value.dims[:-1]):
        if size == rows.bound:
            return replace(value, dims=(*value.dims[:index], rows.taken, *value.dims[index + 1 :]))
    return value


@dataclass(frozen=True)
class NodeWork:
    """What one node does per execution, from its serialized shapes and types alone."""

    ops: int
    bytes: int
    weight_bytes: int  # of `bytes`, its constants (weights, bias, their scales)
    kernel: Kernel


def _value_bytes(value: XnnValue) -> float:
    if value.datatype in DYNAMIC_INPUTS and not value.constant:
        return value.elements * FP32_BYTES
    return value.bytes


def node_work(node: XnnNode, values: Mapping[int, XnnValue], rows: SequenceRows | None = None) -> NodeWork | None:
    """A FC, convolution or batch matmul node's operations and bytes (at `rows` for a generation program); None for
    any other node, or one whose values the graph does not give (then nothing is counted rather than something
    wrong)."""
    if node.type not in ROOFLINE_TYPES or node.output is None or node.output not in values:
        return None
    reads = [_at_rows(values[i], rows) for i in node.inputs if i in values]
    if len(reads) != len(node.inputs) or not reads:
        return None
    output, first = _at_rows(values[node.output], rows), reads[0]
    if not output.dims or not first.dims:
        return None
    if node.type == TRANSPOSED:
        if node.kernel is None:
            return None
        k = node.kernel
        ops = 2 * first.elements * k.height * k.width * k.group_output_channels
    elif node.type in CONVOLUTIONS:
        if node.kernel is None:
            return None
        k = node.kernel
        ops = 2 * output.elements * k.height * k.width * k.group_input_channels
    else:  # FC and batch matmul: every output element is a dot product over the input's last dimension
        ops = 2 * output.elements * first.dims[-1]
    weights = [value for value in reads if value.constant]
    low_bit = any(value.datatype in LOW_BIT_WEIGHTS for value in weights)
    total = sum(_value_bytes(value) for value in reads) + _value_bytes(output)
    weight_bytes = sum(_value_bytes(value) for value in weights)
    return NodeWork(int(ops), math.ceil(total), math.ceil(weight_bytes), "int8" if low_bit else "fp32")


@dataclass(frozen=True)
class BoardLimits:
    """The board's two limits as its state recorded them (None: not measured), in the units the rows use."""

    bandwidth_gb_per_s: Duration | None = None
    bandwidth_threads: Count | None = None
    llc_bytes: Count | None = None
    fp32_gflops: Duration | None = None
    int8_gops: Duration | None = None
    compute_threads: Count | None = None

    def peak_gops(self, kernel: str) -> float | None:
        return self.int8_gops if kernel == "int8" else self.fp32_gflops

    @property
    def text(self) -> str:
        """ "10.1 GB/s, fp32 38.0 GFLOP/s, int8 120 GOP/s", each limit not measured said so."""
        bandwidth = f"{self.bandwidth_gb_per_s:.1f} GB/s" if self.bandwidth_gb_per_s else f"bandwidth {NOT_MEASURED}"
        fp32 = f"fp32 {self.fp32_gflops:.1f} GFLOP/s" if self.fp32_gflops else f"fp32 peak {NOT_MEASURED}"
        int8 = f"int8 {self.int8_gops:.1f} GOP/s" if self.int8_gops else f"int8 peak {NOT_MEASURED}"
        return f"{bandwidth}, {fp32}, {int8}"


def _board_limits(bandwidth: ReadBandwidth | None, compute: ComputePeak | None) -> BoardLimits:
    return BoardLimits(
        bandwidth_gb_per_s=bandwidth.gb_per_s if bandwidth is not None else None,
        bandwidth_threads=bandwidth.threads if bandwidth is not None else None,
        llc_bytes=bandwidth.llc_bytes if bandwidth is not None else None,
        fp32_gflops=compute.fp32_gflops if compute is not None else None,
        int8_gops=compute.int8_gops if compute is not None else None,
        compute_threads=compute.threads if compute is not None else None,
    )


def board_limits(state: Mapping[str, Any] | None, where: str) -> BoardLimits:
    """The limits a board state records (a bundle's copy of it); RecordError (65) when one is malformed."""
    return _board_limits(recorded_bandwidth(state, where), recorded_compute(state, where))


def bundle_limits(
    board_before: Mapping[str, Any] | None, where: str, threads: int | None
) -> tuple[BoardLimits, str | None]:
    """The limits `board_info_before.json` carries in its `state`, and a note on what is missing, refused or
    measured at another thread count than the run's; a malformed record is said and left out (the other kept),
    never fatal."""
    found = (board_before or {}).get("state")
    state = found if isinstance(found, dict) else None
    notes: list[str] = []
    missing: list[str] = []
    records: list[Any] = []
    for name, read in (("read bandwidth", recorded_bandwidth), ("peak arithmetic rate", recorded_compute)):
        try:
            records.append(read(state, where))
        except RecordError as exc:
            records.append(None)
            notes.append(f"the board's recorded {name} is refused ({exc})")
            continue
        missing += [name] if records[-1] is None else []
    limits = _board_limits(*records)
    if missing:
        verb, pronoun = ("is", "it") if len(missing) == 1 else ("are", "them")
        notes.append(f"the board's {' and '.join(missing)} {verb} not measured: fab setup-board measures {pronoun}")
    measured = {limits.bandwidth_threads, limits.compute_threads} - {None}
    if threads is not None and measured and measured != {threads}:
        said = ", ".join(str(n) for n in sorted(n for n in measured if n is not None))
        notes.append(f"the limits were measured at {said} thread(s), the run used {threads}")
    return limits, "; ".join(notes) or None


@dataclass(frozen=True)
class NodeRoofline:
    """One FC, convolution or batch matmul node of a delegate against the board's limits. Rates per second of its
    median time; shares in percent (None: that limit is not measured)."""

    graph: str  # Model Explorer's delegate graph: "<pte>::<method>_<chain>_<instruction>"
    node: str  # the node's id inside it
    type: str  # XNNFullyConnected, ...
    kernel: Kernel  # which peak applies: int8 for 8- and 4-bit weights
    ops: Count  # per execution; a multiply-add is 2
    bytes: Count  # per execution: inputs, weights and output, each once
    weight_bytes: Count
    median_ms: Duration
    achieved_gb_per_s: Duration
    achieved_gops: Duration
    intensity: Duration  # ops per byte
    bandwidth_pct: Duration | None = None
    peak_pct: Duration | None = None
    bound: Bound | None = None  # None: not both limits measured
    roofline_pct: Duration | None = None  # the share against the limit that binds
    fits_in_cache: bool = False
    module: str | None = None
    source: str | None = None

    @property
    def label(self) -> str:
        """ "memory-bound 71%", "compute-bound 38%", "71% of bandwidth" (the peak not measured), "" (neither)."""
        if self.bound is not None and self.roofline_pct is not None:
            cached = " (in cache)" if self.fits_in_cache and self.bound == "memory" else ""
            return f"{self.bound}-bound {self.roofline_pct:.0f}%{cached}"
        if self.bandwidth_pct is not None:
            return f"{self.bandwidth_pct:.0f}% of bandwidth"
        if self.peak_pct is not None:
            return f"{self.peak_pct:.0f}% of {self.kernel} peak"
        return ""

    @property
    def said(self) -> str:
        """In a sentence's words: "memory-bound at 71% of bandwidth", "compute-bound at 38% of peak"."""
        if self.bound == "memory" and self.roofline_pct is not None:
            return f"memory-bound at {self.roofline_pct:.0f}% of bandwidth"
        if self.bound == "compute" and self.roofline_pct is not None:
            return f"compute-bound at {self.roofline_pct:.0f}% of the {self.kernel} peak"
        return self.label or f"limits {NOT_MEASURED}"


def node_roofline(graph: str, node: str, node_type: str, work: NodeWork, median_ms: float,
                  limits: BoardLimits) -> NodeRoofline | None:  # fmt: skip
    """One node's figures against `limits`; None when it was not timed."""
    if median_ms <= 0 or work.bytes <= 0:
        return None
    seconds = median_ms / 1e3
    gb_per_s, gops = work.bytes / seconds / 1e9, work.ops / seconds / 1e9
    intensity = work.ops / work.bytes
    bandwidth, peak = limits.bandwidth_gb_per_s, limits.peak_gops(work.kernel)
    bandwidth_pct = gb_per_s / bandwidth * 100 if bandwidth else None
    peak_pct = gops / peak * 100 if peak else None
    bound: Bound | None = None
    roofline_pct = None
    if bandwidth and peak:
        bound = "memory" if intensity < peak / bandwidth else "compute"
        roofline_pct = gops / min(peak, intensity * bandwidth) * 100
    return NodeRoofline(
        graph=graph, node=node, type=node_type, kernel=work.kernel, ops=work.ops, bytes=work.bytes,
        weight_bytes=work.weight_bytes, median_ms=median_ms, achieved_gb_per_s=gb_per_s, achieved_gops=gops,
        intensity=intensity, bandwidth_pct=bandwidth_pct, peak_pct=peak_pct, bound=bound, roofline_pct=roofline_pct,
        fits_in_cache=limits.llc_bytes is not None and work.bytes <= limits.llc_bytes,
    )  # fmt: skip


@dataclass(frozen=True)
class OperatorRooflines:
    """ops.json's `roofline` (every node, by time) and summary.json's `operator_roofline` (the costliest few):
    the limits they were judged against, what was not measured, and the counts by bound."""

    limits: BoardLimits
    nodes: Count  # timed FC, convolution and batch matmul nodes
    memory_bound: Count = 0
    compute_bound: Count = 0
    note: str | None = None
    rows: tuple[NodeRoofline, ...] = ()

    def top(self, count: int = SUMMARY_ROWS) -> OperatorRooflines:
        return replace(self, rows=self.rows[:count])

    def find(self, graph: str, node: str) -> NodeRoofline | None:
        return next((row for row in self.rows if row.graph == graph and row.node == node), None)

    def overlay_values(self) -> dict[str, dict[str, float]]:
        """graph id -> node id -> roofline_pct, for the nodes that have one."""
        graphs: dict[str, dict[str, float]] = {}
        for row in self.rows:
            if row.roofline_pct is not None:
                graphs.setdefault(row.graph, {})[row.node] = row.roofline_pct
        return graphs

    @property
    def line(self) -> str | None:
        """One line for the analysis's output: the costliest memory-bound node, else the costliest node."""
        if not self.rows:
            return None
        memory = [row for row in self.rows if row.bound == "memory"]
        row = memory[0] if memory else self.rows[0]
        where = f" ({row.module})" if row.module else ""
        if self.memory_bound or self.compute_bound:
            counts = f"{self.memory_bound} memory-bound, {self.compute_bound} compute-bound of {self.nodes}"
        else:
            counts = f"{self.nodes} nodes, no bound without both limits measured"
        return f"{row.type.removeprefix('XNN')} {row.node} in {row.graph.split('::')[-1]}{where}: {row.said}; {counts}"


def operator_rooflines(profile: Profile, plan: ProgramPlan | None, limits: BoardLimits, note: str | None = None,
                       sequence: SequenceRows | None = None) -> OperatorRooflines | None:  # fmt: skip
    """Every timed FC, convolution and batch matmul node of the profile's placed XNNPACK delegates against
    `limits`, the costliest first; None when the run has none (or no program to read their shapes from)."""
    if plan is None:
        return None
    by_node_id = {i.node_id(profile.method): i for i in plan.delegates()}
    rows: list[NodeRoofline] = []
    for delegate in profile.delegates:
        planned = by_node_id.get(delegate.node_id)
        wanted = [node for node in delegate.nodes if node.type in ROOFLINE_TYPES and node.dist is not None]
        if delegate.status != "placed" or planned is None or planned.delegate is None or not wanted:
            continue
        if delegate.backend != XNNPACK_BACKEND:
            continue
        try:
            graph = read_xnn_graph(planned.delegate, plan.pte)
        except AnalysisError:
            continue  # etdump_profile read the same payload: it would not have been placed
        nodes = {str(node.index): node for node in graph.nodes}
        for timed in wanted:
            xnode = nodes.get(timed.node)
            work = node_work(xnode, graph.values, sequence) if xnode is not None else None
            median = timed.dist.median if timed.dist is not None else 0.0
            row = node_roofline(delegate.graph_id, timed.node, timed.type, work, median, limits) if work else None
            if row is not None:
                rows.append(replace(row, module=timed.source.module, source=timed.source.source))
    if not rows:
        return None
    rows.sort(key=lambda row: -row.median_ms)
    return OperatorRooflines(
        limits=limits,
        nodes=len(rows),
        memory_bound=sum(1 for row in rows if row.bound == "memory"),
        compute_bound=sum(1 for row in rows if row.bound == "compute"),
        note=note,
        rows=tuple(rows),
    )


def run_rooflines(profile: Profile | None, pte: Path | None, board_before: Mapping[str, Any] | None, where: str,
                  threads: int | None, sequence: SequenceRows | None = None) -> OperatorRooflines | None:  # fmt: skip
    """The analysis's entry: the run's profile and program against the limits its bundle recorded (a generation
    program's at the rows its profiled execution took)."""
    if profile is None or pte is None:
        return None
    limits, note = bundle_limits(board_before, where, threads)
    return operator_rooflines(profile, read_program_plan(pte, profile.method), limits, note, sequence)


def rows_by_node(rooflines: OperatorRooflines | None) -> dict[tuple[str, str], NodeRoofline]:
    """(graph id, node id) -> its row, for the readers that walk the delegates' nodes."""
    return {(row.graph, row.node): row for row in (rooflines.rows if rooflines is not None else ())}
