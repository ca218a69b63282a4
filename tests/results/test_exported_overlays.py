"""A run's cost painted on the exported .pt2 (results/exported_overlays.py): the source map's `.pt2` node names, the
overlays on the PyTorch adapter's graph, split and fused nodes summed and said so. In the browser:
tests/servers/test_explorer.py."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pytest

from orchestrator.results.exported_overlays import exported_groups, exported_values, lowering_notes
from orchestrator.results.profile import Attribution, DelegateProfile, InstructionProfile, Profile, XnnNodeProfile
from orchestrator.results.stats import distribution
from tests.plugins.analysis import BundleCase, analyze, copy_bundle
from tests.plugins.artifacts import ARTIFACT_CACHE

if TYPE_CHECKING:
    import torch.fx

pytestmark = pytest.mark.slow  # a real run of a real lowered model (session fixtures)


def _graph_nodes(pt2: Path) -> dict[str, torch.fx.Node]:
    import torch

    return {node.name: node for node in torch.export.load(str(pt2)).graph.nodes if node.op == "call_function"}


def test_a_run_is_painted_on_the_exported_program_it_was_lowered_from(
    runner_bundles: dict[str, BundleCase], tmp_path: Path
) -> None:
    case = copy_bundle(runner_bundles["runner_distilbert_xnnpack"], tmp_path / "run")
    analyze(case)
    overlays = case.path / "model_explorer"
    index = json.loads((overlays / "overlays.json").read_text())["exported_program"]
    assert index["file"] == case.model.exported.name and index["graph"] == "graph"
    nodes = _graph_nodes(case.model.exported)
    pct = json.loads((overlays / index["overlays"]["pct"]).read_text())["graph"]["results"]
    median = json.loads((overlays / index["overlays"]["median_ms"]).read_text())["graph"]["results"]
    notes = json.loads((overlays / index["overlays"]["lowering"]).read_text())["graph"]["results"]
    assert pct and set(pct) <= set(nodes) and set(notes) <= set(nodes)  # Model Explorer's node ids of the .pt2
    # Each of the model's linear layers, delegated to XNNPACK, is painted where the user's module sits.
    linears = [name for name, node in nodes.items() if "linear" in str(node.target)]
    q_lin = [n for n in linears if any(path.endswith("q_lin") for path, _ in nodes[n].meta["nn_module_stack"].values())]
    assert q_lin and all(median[name]["value"] > 0 for name in q_lin)
    assert sum(name in pct for name in linears) >= 0.9 * len(linears)
    # SDPA is split by lowering into portable kernels and XNNPACK nodes: the node shows their sum, and says so.
    sdpa = next(name for name in nodes if name.startswith("scaled_dot_product_attention"))
    assert notes[sdpa]["value"].startswith("split into ") and "aten::where" in notes[sdpa]["value"]
    ops = json.loads((case.path / "analysis" / "ops.json").read_text())
    sdpa_rows = [row for row in ops["instructions"] if row["kind"] == "KernelCall" and row["module"] is not None]
    assert pct[sdpa]["value"] > max(row["pct"] or 0 for row in sdpa_rows if "attention" in row["module"]) * 0.999
    # nothing is painted twice: with no fused groups, the .pt2's shares add up to at most the measured whole
    assert not any(note["value"].startswith("fused with") for note in notes.values())
    # and most of what the profile attributes to instructions (the run's share outside every instruction, the
    # runner's own time between them, grows with the machine's load: the bound is on what is attributed)
    attributed = sum(row["pct"] or 0.0 for row in ops["instructions"])
    assert 0.8 * attributed < sum(value["value"] for value in pct.values()) <= 100.0 + 1e-6
    assert index["painted_pct"] == pytest.approx(sum(value["value"] for value in pct.values()), rel=5e-4)


def test_a_quantized_program_names_no_exported_nodes(quantized_artifacts: dict[str, object]) -> None:
    """A quantized variant is exported again from the eager model: its map cannot name the .pt2's nodes."""
    maps = sorted((ARTIFACT_CACHE / "distilbert-tiny").glob("*.sources.json"))
    by_variant = {path.name.removesuffix(".sources.json").removeprefix("distilbert-tiny_"): path for path in maps}
    fp32 = json.loads(by_variant["xnnpack"].read_text())
    assert fp32["exported_program"] == "distilbert-tiny_exported.pt2"
    assert all(row["exported"] for row in fp32["instructions"])
    quantized = [json.loads(path.read_text()) for variant, path in by_variant.items() if variant.startswith("xnnpack-")]
    assert quantized
    for data in quantized:
        assert "exported_program" not in data and not any(row.get("exported") for row in data["instructions"])


def _instruction(
    index: int, kind: str, label: str, ms: float, pct: float, exported: tuple[str, ...]
) -> InstructionProfile:
    samples = np.full(5, ms)
    return InstructionProfile(
        node_id=f"forward_0_{index}", chain=0, index=index, kind=kind, op=label, label=label, samples_ms=samples,
        dist=distribution(samples), pct=pct, source=Attribution("m", None, None, exported),
    )  # fmt: skip


def test_split_and_fused_nodes_get_the_sum_and_a_note() -> None:
    split = [_instruction(k, "KernelCall", "aten::view_copy", 1.0, 10.0, ("linear",)) for k in (0, 1)]
    fused_a = _instruction(2, "KernelCall", "aten::addmm", 2.0, 20.0, ("mm", "add"))
    fused_b = _instruction(3, "KernelCall", "aten::relu", 3.0, 30.0, ("add", "relu"))
    alone = _instruction(4, "KernelCall", "aten::mean", 4.0, 40.0, ("mean",))
    untraced = _instruction(5, "KernelCall", "aten::sum", 5.0, 50.0, ())
    call = _instruction(6, "DelegateCall", "XnnpackBackend", 9.0, 9.0, ("gelu", "softmax"))
    node = XnnNodeProfile("0", "XNNGelu", ["e"], np.full(5, 6.0), distribution(np.full(5, 6.0)), 6.0,
                          Attribution("m", None, None, ("gelu",)))  # fmt: skip
    delegate = DelegateProfile(
        node_id=call.node_id, backend="XnnpackBackend", graph_id="p.pte::forward_0_6", call=call.dist,
        event_names=["e"], event_samples_ms=np.full((5, 1), 6.0), status="placed", nodes=[node], fused_nodes=["1"],
        node_types={"0": "XNNGelu", "1": "XNNSoftmax"},
        node_sources={"1": Attribution("m", None, None, ("softmax",))},
    )  # fmt: skip
    instructions = [*split, fused_a, fused_b, alone, untraced, call]
    profile = Profile("forward", "p.pte", 5, 1.0, None, instructions, [delegate], [], exported_program="p.pt2")
    groups = exported_groups(profile)
    values = exported_values(groups, "median_ms")
    assert values["linear"] == pytest.approx(2.0)  # split: its two operators summed
    assert values["mm"] == values["add"] == values["relu"] == pytest.approx(5.0)  # fused: the group's sum on each
    assert values["mean"] == pytest.approx(4.0) and values["gelu"] == pytest.approx(6.0)  # the XNN node, not the call
    assert "softmax" not in values  # fused inside XNNPACK: no time of its own
    notes = lowering_notes(profile, groups)
    assert notes["linear"].startswith("split into 2 operators (aten::view_copy ×2)")
    assert notes["add"].startswith("fused with mm, relu into aten::addmm, aten::relu")
    assert "fused by XNNPACK" in notes["softmax"] and "XNNSoftmax" in notes["softmax"]
    assert "mean" not in notes and "gelu" not in notes
