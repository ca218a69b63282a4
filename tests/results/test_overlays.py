"""Overlays against the real PTE adapter's graphs, and XNNPACK event placement on real delegates."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from orchestrator.programs.plan import read_program_plan
from orchestrator.programs.xnn import XnnNode, read_xnn_nodes
from orchestrator.results.analysis import analyze_bundle
from orchestrator.results.etdump import read_etdump
from orchestrator.results.etdump_profile import profile_etdump
from orchestrator.results.overlays import METRICS, diverging_color
from orchestrator.results.xnn_match import MatchError, match_events, operator_base
from tests.plugins.analysis import RUNNER_KEYS, BundleCase, BundleCopy, adapter_graphs, analyze, rewrite_etdump

pytestmark = pytest.mark.slow  # lowers and runs real models (session fixtures)

KEYS = ("distilbert_xnnpack", "gpt2_xnnpack", "distilbert_portable", *RUNNER_KEYS)


def overlay(case: BundleCase, metric: str) -> dict:
    return json.loads((case.path / "model_explorer" / f"me_overlay_{metric}.json").read_text())


def measured_blocks(case: BundleCase) -> list:
    timings = json.loads((case.path / "timings.json").read_text())
    return read_etdump(case.path / "etdump.etdp").execute_blocks[len(timings["warmup_ms"]) :]


def instruction_medians(blocks: list) -> dict[tuple[int, int], float]:
    """(chain, instruction) -> the median over the executions of its outer event's time (ns), read from the ETDump."""
    keys = {(int(b.chain[k]), int(b.instruction[k])) for b in blocks for k, n in enumerate(b.event_names)
            if n in ("OPERATOR_CALL", "DELEGATE_CALL")}  # fmt: skip
    return {
        (chain, index): float(np.median([
            sum(int(b.durations[k]) for k, n in enumerate(b.event_names)
                if n in ("OPERATOR_CALL", "DELEGATE_CALL") and b.chain[k] == chain and b.instruction[k] == index)
            for b in blocks
        ]))
        for chain, index in keys
    }  # fmt: skip


def share_base(blocks: list) -> float:
    """What every `pct` is of (ns): the method's median, or its instructions' medians summed when larger."""
    method = [int(b.durations[b.event_names.index("Method::execute")]) for b in blocks]
    return max(float(np.median(method)), sum(instruction_medians(blocks).values()))


@pytest.fixture(scope="module")
def analysed(all_bundles: dict[str, BundleCase], tmp_path_factory: pytest.TempPathFactory) -> dict[str, BundleCase]:
    from tests.plugins.analysis import copy_bundle

    root = tmp_path_factory.mktemp("overlays")
    cases = {key: copy_bundle(all_bundles[key], root / key) for key in KEYS}
    for case in cases.values():
        analyze(case)
    return cases


@pytest.mark.parametrize("key", KEYS)
def test_every_overlay_node_exists_in_the_adapter_graph(analysed: dict[str, BundleCase], key: str) -> None:
    case = analysed[key]
    graphs = adapter_graphs(case.model.pte)
    for metric in METRICS:
        document = overlay(case, metric)
        assert "forward" in document
        for graph_id, data in document.items():
            assert graph_id in graphs, f"{graph_id} is not a graph the adapter draws"
            assert data["results"], f"{graph_id} has no values"
            assert set(data["results"]) <= graphs[graph_id]
            assert [stop["stop"] for stop in data["gradient"]] == [0.0, 0.5, 1.0]
    delegate_graphs = {g for g in graphs if "::" in g}
    if key.endswith("xnnpack"):
        assert set(overlay(case, "mean_ms")) == {"forward", *delegate_graphs}, "every delegate is painted"
    else:
        assert not delegate_graphs and set(overlay(case, "mean_ms")) == {"forward"}


@pytest.mark.parametrize("key", KEYS)
def test_top_level_values_add_up_to_the_measured_totals(analysed: dict[str, BundleCase], key: str) -> None:
    case = analysed[key]
    blocks = measured_blocks(case)
    # Independently of the analysis: every instruction's outer event, summed per execution, averaged.
    per_block = [
        sum(int(b.durations[k]) for k, n in enumerate(b.event_names) if n in ("OPERATOR_CALL", "DELEGATE_CALL"))
        for b in blocks
    ]
    method = [int(b.durations[b.event_names.index("Method::execute")]) for b in blocks]
    mean_ms = overlay(case, "mean_ms")["forward"]["results"]
    pct = overlay(case, "pct")["forward"]["results"]
    # values as Model Explorer shows them: 4 significant digits (0.08934, not 0.08933781538461538)
    assert sum(v["value"] for v in mean_ms.values()) == pytest.approx(np.mean(per_block) / 1e6, rel=5e-4)
    # shares of medians: every instruction's median over the run's (one outlier moves a mean, not a median)
    medians = instruction_medians(blocks)
    assert len(method) == len(blocks)
    assert sum(v["value"] for v in pct.values()) == pytest.approx(
        sum(medians.values()) / share_base(blocks) * 100, rel=5e-4
    )
    assert all(len(f"{v['value']:g}".replace(".", "").replace("-", "").lstrip("0")) <= 4 for v in pct.values())
    plan = read_program_plan(case.model.pte)
    timed = {i.node_id("forward") for i in plan.instructions if i.kind in ("KernelCall", "DelegateCall")}
    assert set(mean_ms) == timed
    median = overlay(case, "median_ms")["forward"]["results"]
    for node_id, value in median.items():
        chain, index = (int(x) for x in node_id.split("_")[1:])
        samples = [sum(int(b.durations[k]) for k, n in enumerate(b.event_names)
                       if n in ("OPERATOR_CALL", "DELEGATE_CALL") and b.chain[k] == chain and b.instruction[k] == index)
                   for b in blocks]  # fmt: skip
        assert value["value"] == pytest.approx(np.median(samples) / 1e6, rel=5e-4)


@pytest.mark.parametrize("key", ["distilbert_xnnpack", "gpt2_xnnpack", "runner_distilbert_xnnpack"])
def test_delegate_node_values_add_up_to_the_matched_events(analysed: dict[str, BundleCase], key: str) -> None:
    case = analysed[key]
    blocks = measured_blocks(case)
    base = share_base(blocks)
    mean_ms, pct = overlay(case, "mean_ms"), overlay(case, "pct")
    ops = json.loads((case.path / "analysis" / "ops.json").read_text())
    for delegate in ops["delegates"]:
        graph_id = delegate["graph_id"]
        index = int(delegate["node_id"].split("_")[-1])
        events = [
            sum(
                int(b.durations[k])
                for k, d in enumerate(b.delegate_names)
                if d is not None and b.instruction[k] == index
            )
            for b in blocks
        ]
        assert delegate["status"] == "placed" and not delegate["unplaced_events"]
        assert sum(v["value"] for v in mean_ms[graph_id]["results"].values()) == pytest.approx(
            np.mean(events) / 1e6, rel=5e-4
        )
        per_event = np.array([[int(b.durations[k]) for k, d in enumerate(b.delegate_names)
                               if d is not None and b.instruction[k] == index] for b in blocks])  # fmt: skip
        assert sum(v["value"] for v in pct[graph_id]["results"].values()) == pytest.approx(
            float(np.median(per_event, axis=0).sum()) / base * 100, rel=5e-4
        )
        for node in delegate["nodes"]:
            assert len(node["events"]) == 1
            assert (
                operator_base(node["events"][0])
                in {
                    "XNNFullyConnected": ("Fully Connected",),
                    "XNNStaticReshape": ("Static Reshape",),
                    "XNNStaticTranspose": ("Transpose",),
                    "XNNBatchMatrixMultiply": ("Batch Matrix Multiply",),
                    "XNNSoftmax": ("Softmax",),
                    "XNNAdd": ("Add",),
                    "XNNMultiply": ("Multiply",),
                    "XNNTanh": ("TanH",),
                    "XNNGelu": ("GELU",),
                    "XNNCopy": ("Copy",),
                }[node["type"]]
            )


def _drop_event(name: str, instruction: int, only_block: int | None = None):
    def doomed(event: Any) -> bool:
        profile = event.profile_event
        return profile is not None and profile.instruction_id == instruction and profile.delegate_debug_id_str == name

    def edit(etdump: Any) -> None:
        execute = [run for run in etdump.run_data if run.name == "Execute"]
        for number, run in enumerate(execute):
            if only_block is None or number == only_block:
                run.events = [event for event in run.events if not doomed(event)]

    return edit


def _swap_events(first: str, second: str, instruction: int):
    def edit(etdump: Any) -> None:
        for run in etdump.run_data:
            where = {
                e.profile_event.delegate_debug_id_str: k
                for k, e in enumerate(run.events or [])
                if e.profile_event and e.profile_event.instruction_id == instruction
            }
            if first in where and second in where:
                a, b = where[first], where[second]
                run.events[a], run.events[b] = run.events[b], run.events[a]

    return edit


def _site_with(ops: dict, event_prefix: str) -> tuple[str, int, list[str]]:
    for delegate in ops["delegates"]:
        names = [e["name"] for e in delegate["events"]]
        if any(n.startswith(event_prefix) for n in names) and len(names) > 3:
            return delegate["graph_id"], int(delegate["node_id"].split("_")[-1]), names
    raise AssertionError(f"no delegate runs {event_prefix}")


@pytest.mark.parametrize("damage", ["missing-event", "reordered", "differs-between-runs"])
def test_unmatchable_delegates_are_left_out_and_reported(
    analysed: dict[str, BundleCase], bundle_copy: BundleCopy, damage: str
) -> None:
    reference = json.loads((analysed["distilbert_xnnpack"].path / "analysis" / "ops.json").read_text())
    graph_id, index, names = _site_with(reference, "Softmax")
    case = bundle_copy("distilbert_xnnpack")
    if damage == "missing-event":
        edit = _drop_event(next(n for n in names if n.startswith("Softmax")), index)
    elif damage == "reordered":
        softmax = next(n for n in names if n.startswith("Softmax"))
        edit = _swap_events(names[names.index(softmax) - 1], softmax, index)
    else:
        edit = _drop_event(next(n for n in names if n.startswith("Softmax")), index, only_block=4)
    rewrite_etdump(case.path, edit)
    summary = analyze_bundle(case.path, pte=case.model.pte, sidecar=case.model.sidecar)

    ops = json.loads((case.path / "analysis" / "ops.json").read_text())
    left_out = [d for d in ops["delegates"] if d["status"] != "placed"]
    assert [d["graph_id"] for d in left_out] == [graph_id]
    expected = {
        "missing-event": "do not follow",
        "reordered": "do not follow",
        "differs-between-runs": "differ between",
    }
    assert expected[damage] in left_out[0]["reason"]
    assert left_out[0]["nodes"] == []
    for metric in METRICS:
        document = overlay(case, metric)
        assert graph_id not in document, "an unmatched delegate paints nothing"
        assert len([g for g in document if "::" in g]) == len(reference["delegates"]) - 1
    index_file = json.loads((case.path / "model_explorer" / "overlays.json").read_text())
    assert [entry["node_id"] for entry in index_file["left_out"]] == [graph_id.split("::")[1]]
    coverage = summary.data["profile"]["overlay_coverage"]
    assert coverage["delegates_placed"] == coverage["delegates"] - 1
    assert coverage["placed_share"] < reference["coverage"]["placed_share"]


# ---------------------------------------------------------------------------------------------------------------
# What XNNPACK does to clamps, on a real delegate


@pytest.fixture(scope="module")
def clamp_model(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A small MLP whose activations exercise XNNPACK's clamp fusion and clamp insertion; run 3 times."""
    import torch
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.exir import to_edge_transform_and_lower
    from executorch.runtime import Runtime

    class Mlp(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a, self.b, self.c = torch.nn.Linear(16, 32), torch.nn.Linear(32, 32), torch.nn.Linear(32, 8)

        def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            y = torch.relu(self.a(x))  # folded into the FC's output range by ExecuTorch
            z = torch.clamp(self.b(y), -1, 1)  # a separate XNNClamp node: XNNPACK fuses it into the FC
            w = torch.nn.functional.hardtanh(z + y)  # an add with an output range: XNNPACK inserts a Clamp
            return torch.softmax(self.c(w).permute(1, 0), dim=-1), torch.cat([w, y], dim=1).sum()

    folder = tmp_path_factory.mktemp("clamp")
    torch.manual_seed(0)
    x = torch.randn(4, 16)
    pte = folder / "mlp_xnnpack.pte"
    program = torch.export.export(Mlp().eval(), (x,))
    pte.write_bytes(to_edge_transform_and_lower(program, partitioner=[XnnpackPartitioner()]).to_executorch().buffer)
    loaded = Runtime.get().load_program(pte, enable_etdump=True, debug_buffer_size=0)
    method = loaded.load_method("forward")
    for _ in range(3):
        method.execute([x])
    loaded.write_etdump_result_to_file(str(folder / "etdump.etdp"), str(folder / "debug.bin"))
    return pte, folder / "etdump.etdp"


def test_fused_and_inserted_clamps_are_placed_on_the_right_nodes(clamp_model: tuple[Path, Path]) -> None:
    pte, etdump_path = clamp_model
    plan = read_program_plan(pte)
    profile = profile_etdump(read_etdump(etdump_path), plan)
    (delegate,) = profile.delegates
    xnn = next(plan.delegates()).delegate
    assert xnn is not None
    nodes = read_xnn_nodes(xnn, pte)
    types = [n.type for n in nodes]
    clamp = types.index("XNNClamp")
    assert types[clamp - 1] == "XNNFullyConnected" and types[clamp + 1] == "XNNAdd"
    assert nodes[clamp + 1].output_clamp, "the add carries hardtanh as its output range"
    assert delegate.status == "placed", delegate.reason
    placed = {node.node: [operator_base(e) for e in node.events] for node in delegate.nodes}
    assert delegate.fused_nodes == [str(clamp)], "the standalone clamp ran inside the FC"
    assert placed[str(clamp - 1)] == ["Fully Connected"]
    assert placed[str(clamp + 1)] == ["Add", "Clamp"], "the inserted clamp belongs to the add"
    assert placed[str(types.index("XNNConcatenate2"))] == ["Copy"]
    assert all(n.dist is not None for n in delegate.nodes)
    assert sum(n.dist.mean for n in delegate.nodes if n.dist is not None) == pytest.approx(delegate.event_mean_ms())
    graphs = adapter_graphs(pte)
    assert {n.node for n in delegate.nodes} <= graphs[delegate.graph_id]


# ---------------------------------------------------------------------------------------------------------------
# The matcher's rules


def nodes_of(*specs: str) -> list[XnnNode]:
    """'XNNAdd+clamp' = an XNNAdd with an output range."""
    return [XnnNode(i, s.split("+")[0], i, s.endswith("+clamp")) for i, s in enumerate(specs)]


def test_matcher_refuses_an_ambiguous_clamp() -> None:
    # The clamp event may be the FC's inserted clamp (XNNClamp fused) or the XNNClamp node's own operator.
    nodes = nodes_of("XNNFullyConnected+clamp", "XNNClamp")
    with pytest.raises(MatchError, match="ambiguous"):
        match_events(nodes, ["Fully Connected (NC, F32) GEMM #1", "Clamp (NC) #1"])


def test_matcher_leaves_inserted_operators_unplaced() -> None:
    nodes = nodes_of("XNNFullyConnected", "XNNAdd")
    placement = match_events(nodes, ["Pack LH (X32) #1", "Fully Connected (NC, PF32) GEMM #1", "Add (ND) #1"])
    assert placement.node_events == {0: [1], 1: [2]} and placement.unplaced_events == [0]


def test_matcher_places_a_quantized_unary_on_its_node() -> None:
    # int8-static: convert -> GELU -> convert becomes one lookup-table operator, "Invalid Unary Op" (no "(types)"
    # part, so nothing after the base is a kernel name: reading "Op" as one once left these delegates out).
    nodes = nodes_of("XNNFullyConnected", "XNNConvert", "XNNGelu", "XNNConvert", "XNNFullyConnected")
    events = ["Fully Connected (NC, QS8) GEMM #1", "Invalid Unary Op #1", "Fully Connected (NC, QS8) GEMM #2"]
    placement = match_events(nodes, events)
    assert placement.node_events == {0: [0], 2: [1], 4: [2]}


def test_matcher_places_a_pointwise_convolution_run_as_a_fully_connected() -> None:
    # MobileNetV2 (full size, XNNPACK fp32): XNNPACK runs a 1x1 convolution as a fully-connected operator, so the
    # delegate's events read Convolution, DWConv, then Fully Connected for the block's 1x1 XNNConv2d nodes.
    nodes = nodes_of("XNNStaticTranspose", "XNNConv2d", "XNNDepthwiseConv2d", "XNNConv2d", "XNNConv2d", "XNNAdd")
    events = ["Transpose (ND, X32) #1", "Convolution (NHWC, F32) IGEMM #1", "Convolution (NHWC, F32) DWConv #1",
              "Fully Connected (NC, F32) GEMM #1", "Fully Connected (NC, F32) GEMM #2", "Add (ND) #1"]  # fmt: skip
    placement = match_events(nodes, events)
    assert placement.node_events == {i: [i] for i in range(6)} and not placement.unplaced_events


def test_matcher_explains_failures() -> None:
    with pytest.raises(MatchError, match="2 runtime events for 3 nodes"):
        match_events(nodes_of("XNNAdd", "XNNSoftmax", "XNNAdd"), ["Add (ND) #1", "Add (ND) #2"])
    with pytest.raises(MatchError, match="XNNSoftmax vs 'Add'"):
        match_events(nodes_of("XNNAdd", "XNNSoftmax"), ["Add (ND) #1", "Add (ND) #2"])
    with pytest.raises(MatchError, match="no runtime operator names known for node type"):
        match_events(nodes_of("XNNFancyNew"), ["Fancy (NC) #1"])


def test_operator_names_parse() -> None:
    assert operator_base("Fully Connected (NC, F32) GEMM #12") == "Fully Connected"
    assert operator_base("Static Reshape (NC) #1") == "Static Reshape"
    assert operator_base("Scaled Dot-Product Attention (NHTC, F32) #1") == "Scaled Dot-Product Attention"
    assert operator_base("Mean (ND) Reduce2 #1") == "Mean"  # a kernel name with a digit (MobileNetV2's pooling)
    assert operator_base("Invalid Unary Op #2") == "Invalid Unary Op"  # no "(types)": no kernel name to strip


def test_diverging_colors_are_white_at_zero_and_saturate() -> None:
    assert diverging_color(0.0, 2.0) == "#ffffff"
    assert diverging_color(5.0, 2.0) == "#b2182b"
    assert diverging_color(-2.0, 2.0) == "#2166ac"
    assert diverging_color(1.0, 0.0) == "#ffffff"
