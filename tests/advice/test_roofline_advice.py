"""The advisor on the operators' roofline (advice/roofline_advice.py), on the recorded distilbert-tiny run with a
synthetic `roofline` section on its real delegate nodes: a FullyConnected at the bandwidth gets "fewer bytes" with a
bound from its weights' share of its bytes, nodes far below both limits over 5% of the run get "threads, layout or
the kernel", and nothing is said on too small a share, on a node a rewrite already explains, or without the
board's limits. The figures themselves: tests/results/test_op_roofline.py."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from orchestrator.advice.advisor import advise
from orchestrator.advice.detectors import DETECTORS
from orchestrator.advice.roofline_advice import FAR_BELOW_MIN_SHARE, INT8_WEIGHT_SAVING, find_roofline
from orchestrator.records import to_data
from orchestrator.results.op_roofline import BoardLimits, NodeRoofline, OperatorRooflines
from tests.advice.advice_helpers import facts_of, recorded

GRAPH = "distilbert-tiny_xnnpack.pte::forward_0_{}"
LIMITS = BoardLimits(bandwidth_gb_per_s=10.0, bandwidth_threads=2, llc_bytes=1 << 20, fp32_gflops=40.0,
                     int8_gops=120.0, compute_threads=2)  # fmt: skip
LIN1 = ("48", "0")  # distilbert.transformer.layer.0.ffn.lin1, 0.026 ms in the recording
FAR = [("37", "0"), ("37", "5"), ("46", "2"), ("55", "5"), ("64", "2"), ("66", "0")]  # 0.121 ms of 2.07
HEAD = ("70", "0")  # the vocabulary projector, which head-at-position explains


def node(raw: dict[str, Any], call: str, index: str) -> dict[str, Any]:
    delegate = next(d for d in raw["ops"]["delegates"] if d["graph_id"] == GRAPH.format(call))
    return next(n for n in delegate["nodes"] if n["node"] == index)


def row(raw: dict[str, Any], call: str, index: str, **figures: Any) -> NodeRoofline:
    recorded_node = node(raw, call, index)
    base = dict(kernel="fp32", ops=1_000_000, bytes=400_000, weight_bytes=300_000, achieved_gb_per_s=1.0,
                achieved_gops=1.0, intensity=2.5, bound="memory", fits_in_cache=False)  # fmt: skip
    return NodeRoofline(graph=GRAPH.format(call), node=index, type=recorded_node["type"],
                        median_ms=recorded_node["median_ms"], **{**base, **figures})  # fmt: skip


def with_roofline(raw: dict[str, Any], rows: list[NodeRoofline], limits: BoardLimits = LIMITS) -> dict[str, Any]:
    section = OperatorRooflines(limits=limits, nodes=len(rows), rows=tuple(sorted(rows, key=lambda r: -r.median_ms)))
    return {**raw, "ops": {**raw["ops"], "roofline": to_data(section)}}


def test_a_fully_connected_at_the_bandwidth_needs_fewer_bytes() -> None:
    raw = recorded("distilbert-tiny")
    near = row(raw, *LIN1, bandwidth_pct=82.0, peak_pct=20.0, roofline_pct=82.0)
    facts = facts_of(with_roofline(raw, [near]))
    (finding,) = find_roofline(facts, frozenset())
    assert finding.kind == "memory-bound" and finding.nodes == {GRAPH.format(LIN1[0]): (LIN1[1],)}
    assert "memory-bound at 82% of bandwidth" in finding.cause and "10.0 GB/s" in finding.cause
    assert finding.saving_is_bound and finding.saving_ms == pytest.approx(
        node(raw, *LIN1)["median_ms"] * INT8_WEIGHT_SAVING * 300_000 / 400_000
    )
    assert finding.fix_kind == "option" and finding.fix.startswith("--quantize int8-dynamic")
    assert "tied head" in finding.fix
    # quantized weights: fewer bytes still, but no bound predicted; in cache, or compute-bound: no finding
    quantized = facts_of(with_roofline(raw, [dataclasses.replace(near, kernel="int8")]))
    (finding,) = find_roofline(quantized, frozenset())
    assert finding.saving_ms is None and finding.fix_kind == "code" and "not predicted" in finding.saving_note
    for other in (dataclasses.replace(near, fits_in_cache=True), dataclasses.replace(near, bound="compute")):
        assert find_roofline(facts_of(with_roofline(raw, [other])), frozenset()) == []


def test_nodes_far_below_both_limits_point_at_threads_layout_or_the_kernel() -> None:
    raw = recorded("distilbert-tiny")
    far = [row(raw, *key, bandwidth_pct=5.0, peak_pct=10.0, roofline_pct=10.0) for key in FAR]
    facts = facts_of(with_roofline(raw, far))
    measured = sum(r.median_ms for r in far)
    assert facts.ops.share(measured) >= FAR_BELOW_MIN_SHARE
    (finding,) = find_roofline(facts, frozenset())
    assert finding.kind == "below-roofline" and finding.calls == len(FAR)
    assert finding.measured_ms == pytest.approx(measured) and finding.saving_is_bound
    assert finding.saving_ms == pytest.approx(measured * 0.9)
    assert "threads" in finding.fix and "layout" in finding.fix and "kernel" in finding.fix
    assert "the run used 2 thread(s), the peak was measured at 2" in finding.fix
    # one small node is not worth a finding; nor are the same nodes without both limits measured
    assert find_roofline(facts_of(with_roofline(raw, far[:1])), frozenset()) == []
    unbound = [dataclasses.replace(r, bound=None, roofline_pct=None, peak_pct=None) for r in far]
    assert find_roofline(facts_of(with_roofline(raw, unbound, BoardLimits(bandwidth_gb_per_s=10.0))), frozenset()) == []


def test_the_advisor_runs_it_after_the_rewrites_and_never_on_what_they_explain() -> None:
    raw = recorded("distilbert-tiny")
    assert "roofline" in DETECTORS
    head = row(raw, *HEAD, bandwidth_pct=95.0, peak_pct=30.0, roofline_pct=95.0)
    near = row(raw, *LIN1, bandwidth_pct=75.0, peak_pct=20.0, roofline_pct=75.0)
    advice = advise(facts_of(with_roofline(raw, [head, near])))
    found = [f for f in advice.findings if f.kind == "memory-bound"]
    assert len(found) == 1 and GRAPH.format(HEAD[0]) not in found[0].nodes, "head-at-position explains the head"
    assert any(f.kind == "head-at-position" for f in advice.findings)
    assert found[0].saving_ms not in (None, 0) and advice.predicted_ms == pytest.approx(
        sum(f.saving_ms or 0.0 for f in advice.findings if not f.saving_is_bound)
    ), "a bound is not counted in the predicted total"
    # a run analysed before the roofline, or on a board without limits, gets none of these findings
    assert not [f for f in advise(facts_of(raw)).findings if f.kind in ("memory-bound", "below-roofline")]
