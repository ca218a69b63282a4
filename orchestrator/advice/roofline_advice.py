"""The advisor on the operators' roofline (results/op_roofline.py, ops.json's `roofline`): each Fully Connected,
convolution and batch matmul inside the delegates against the board's measured bandwidth and peak.

- Near the bandwidth (a FC or convolution moving its bytes at NEAR_BANDWIDTH_PCT of the board's read bandwidth or
  more, memory-bound or with the peak not measured, its bytes larger than the last-level cache): only fewer bytes
  make it faster, whatever the threads or the kernel. Quantize (int8 weights are a quarter of fp32's), or share a
  tied head's weights. Its saving is a bound: at the bandwidth the time follows the bytes, so int8 weights save at
  most 3/4 of the weights' share of an fp32 node's time; a quantized node's is not predicted.
- Far below both limits (under FAR_BELOW_PCT of what the roofline lets it reach), together over FAR_BELOW_MIN_SHARE
  of the run: neither memory nor arithmetic binds it, so the time goes to threads, the layout or the kernel XNNPACK
  chose. Its saving is a bound too: the nodes' time at their roofline.

A board whose limits are not measured gives no roofline finding (never a guess).
"""

from __future__ import annotations

from collections.abc import Sequence

from orchestrator.advice.findings import GEMM_TYPES, Finding, RunFacts, delegate_node_fields
from orchestrator.results.op_roofline import NodeRoofline
from orchestrator.results.ops_record import DelegateNodeTiming

NEAR_BANDWIDTH_PCT = 70.0  # of the board's read bandwidth
FAR_BELOW_PCT = 25.0  # of the limit that binds
FAR_BELOW_MIN_SHARE = 0.05  # of the run's median: less is not worth a finding
INT8_WEIGHT_SAVING = 0.75  # int8 weights move a quarter of fp32's bytes


def _rows(facts: RunFacts, explained: frozenset[str]) -> list[NodeRoofline]:
    """The roofline rows of delegate calls no earlier finding explained, the costliest first."""
    roofline = facts.ops.roofline
    if roofline is None:
        return []
    open_graphs = {d.graph_id for d in facts.ops.delegates if d.node_id not in explained}
    return [row for row in roofline.rows if row.graph in open_graphs]


def _node_pairs(facts: RunFacts, rows: Sequence[NodeRoofline]) -> list[tuple[str, DelegateNodeTiming]]:
    """(graph id, the ops record's node) of each row, for the finding's fields."""
    nodes = {(d.graph_id, n.node): n for d in facts.ops.delegates for n in d.nodes}
    return [(row.graph, nodes[(row.graph, row.node)]) for row in rows if (row.graph, row.node) in nodes]


def _near_bandwidth(facts: RunFacts, rows: list[NodeRoofline]) -> list[Finding]:
    near = [
        row
        for row in rows
        if row.type in GEMM_TYPES
        and row.bandwidth_pct is not None
        and row.bandwidth_pct >= NEAR_BANDWIDTH_PCT
        and row.bound in ("memory", None)
        and not row.fits_in_cache
    ]
    pairs = _node_pairs(facts, near)
    if not near or not pairs:
        return []
    limits = facts.ops.roofline.limits if facts.ops.roofline is not None else None
    bandwidth = f"{limits.bandwidth_gb_per_s:.1f} GB/s" if limits and limits.bandwidth_gb_per_s else "bandwidth"
    fp32 = [row for row in near if row.kernel == "fp32"]
    bound = sum(row.median_ms * INT8_WEIGHT_SAVING * row.weight_bytes / row.bytes for row in fp32 if row.bytes)
    peers = facts.sidecar.variant.peers if facts.sidecar is not None else ()
    if fp32 and peers:
        fix_kind, fix = "option", f"--quantize {peers[0].scheme.name} (fewer bytes per weight), or share a tied head"
    else:
        fix_kind, fix = "code", "fewer bytes: share the tied embedding and head's weights, or a narrower weight type"
    return [
        Finding(
            kind="memory-bound",
            title=f"{len(near)} matmul/convolution node(s) at the memory bandwidth",
            **delegate_node_fields(facts, pairs),
            cause=f"{len(near)} FullyConnected/convolution node(s) move their bytes at {NEAR_BANDWIDTH_PCT:.0f}% of "
            f"the board's {bandwidth} read bandwidth or more (the costliest {near[0].said}): only fewer bytes make "
            "them faster, not threads or another kernel",
            saving_ms=bound if fp32 else None,
            saving_is_bound=bool(fp32),
            saving_note=(
                f"at most {INT8_WEIGHT_SAVING:.0%} of the fp32 weights' share of those nodes' bytes, of their time: "
                "at the bandwidth the time follows the bytes (fab advise --try measures the quantized program)"
                if fp32
                else "not predicted: the weights are quantized already; sharing a tied head saves its bytes"
            ),
            fix_kind=fix_kind,
            fix=fix,
        )
    ]


def _far_below(facts: RunFacts, rows: list[NodeRoofline]) -> list[Finding]:
    far = [row for row in rows if row.roofline_pct is not None and row.roofline_pct < FAR_BELOW_PCT]
    measured = sum(row.median_ms for row in far)
    pairs = _node_pairs(facts, far)
    if not far or not pairs or facts.ops.share(measured) < FAR_BELOW_MIN_SHARE:
        return []
    at_roofline = sum(row.median_ms * (row.roofline_pct or 0.0) / 100 for row in far)
    limits = facts.ops.roofline.limits if facts.ops.roofline is not None else None
    threads = facts.summary.latency.threads
    measured_at = limits.compute_threads if limits is not None else None
    threads_said = f"the run used {threads} thread(s)" if threads else "the run's threads"
    if measured_at:
        threads_said += f", the peak was measured at {measured_at}"
    return [
        Finding(
            kind="below-roofline",
            title=f"{len(far)} matmul/convolution node(s) far below both limits",
            **delegate_node_fields(facts, pairs),
            cause=f"{len(far)} FullyConnected/convolution/batch-matmul node(s) reach under {FAR_BELOW_PCT:.0f}% of "
            f"what the board's roofline allows them (the costliest {far[0].said}): neither the memory bandwidth nor "
            "the arithmetic peak binds them",
            saving_ms=max(0.0, measured - at_roofline),
            saving_is_bound=True,
            saving_note="at most their time beyond what they would take at the roofline (the limit that binds each)",
            fix_kind="option",
            fix=f"threads ({threads_said}: --threads N), the layout (a batch, a sequence length the kernel tiles "
            "well) or the kernel XNNPACK chose",
        )
    ]


def find_roofline(facts: RunFacts, explained: frozenset[str]) -> list[Finding]:
    """The operators at the bandwidth (fewer bytes) and those far below both limits (threads, layout, kernel)."""
    rows = _rows(facts, explained)
    return _near_bandwidth(facts, rows) + _far_below(facts, rows) if rows else []
