"""The numerics program (lowering/export/numerics.py): which values are tapped, and that tapping them does not change
the program. A conv -> relu -> linear model, fp32 and int8-static, lowered to XNNPACK with and without its taps and
run by ExecuTorch's runtime: the same delegates and bit-identical outputs; in the int8 program each operator's value
is the int8 one after it (its scale and zero point recorded), the convolution measured with the relu it is fused
with. Programs the pass cannot measure are refused (exit 64) saying what it takes. End to end on the board:
tests/e2e/test_numerics_e2e.py."""

from __future__ import annotations

import copy
import dataclasses
from pathlib import Path
from typing import Any

import pytest
import torch

from orchestrator.errors import ExitCode
from orchestrator.lowering.artifacts import Artifact, ArtifactPaths
from orchestrator.lowering.export.numerics import NumericsRefused, check_measurable
from orchestrator.lowering.export.numerics_taps import node_places, op_name, tap_points, tap_program
from orchestrator.lowering.quantize.methods import int8_static
from orchestrator.lowering.sidecar import sidecar_from_data
from orchestrator.lowering.variants import Variant
from tests.advice.advice_helpers import recorded


class Small(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3)
        self.norm = torch.nn.BatchNorm2d(4)
        self.drop = torch.nn.Dropout(0.1)
        self.head = torch.nn.Linear(4 * 6 * 6, 5)

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        features = self.drop(torch.relu(self.norm(self.conv(image)))).flatten(1)
        return self.head(features)


def _lowered(program: Any, tapped: bool) -> tuple[list[torch.Tensor], int]:
    """The program lowered to XNNPACK (taps stripped after partitioning, as numerics.py does), run once: its
    outputs and its number of delegate calls."""
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.devtools.intermediate_output_tap import strip_taps_
    from executorch.exir import to_edge_transform_and_lower
    from executorch.runtime import Runtime

    edge = to_edge_transform_and_lower(program, partitioner=[XnnpackPartitioner()])
    if tapped:
        strip_taps_(edge)
    graph = edge.exported_program().graph
    delegates = sum(1 for node in graph.nodes if "executorch_call_delegate" in str(node.target))
    buffer = edge.to_executorch().buffer  # kept alive while the program runs: the runtime reads it in place
    program = Runtime.get().load_program(buffer)
    outputs = list(program.load_method("forward").execute([EXAMPLE]))
    return [output.clone() for output in outputs], delegates


torch.manual_seed(0)
EXAMPLE = torch.randn(1, 3, 8, 8)


@pytest.mark.parametrize("scheme", ["fp32", "int8-static"])
def test_taps_leave_the_program_as_it_was(scheme: str) -> None:
    model = Small().eval()
    if scheme == "fp32":
        program = torch.export.export(model, (EXAMPLE,))
    else:
        program = int8_static(copy.deepcopy(model), (EXAMPLE,), None, None)
    points, fused = tap_points(program)
    labels = [point.label for point in points]
    assert not any(label.startswith(("dropout", "flatten", "view")) for label in labels)  # values moved, not computed
    untapped, delegates = _lowered(copy.deepcopy(program), tapped=False)
    taps = tap_program(program, points, first=1)
    tapped, tapped_delegates = _lowered(program, tapped=True)
    assert tapped_delegates == delegates
    assert torch.equal(tapped[0], untapped[0])  # the model's own output, bit for bit
    assert len(tapped) == 1 + len(taps) and [tap.index for tap in taps] == list(range(1, 1 + len(taps)))
    by_module = {tap.module: tap for tap in taps}
    assert by_module["head"].source is not None and by_module["head"].source.startswith("test_numerics_program.py:")
    if scheme == "fp32":
        assert labels == ["batch_norm", "relu", "linear"] and fused == 1  # the convolution as XNNPACK folds it
        assert all(tap.dtype == "float32" and tap.qparams is None for tap in taps)
        by_node = {tap.node: tap for tap in taps}
        assert by_node["linear"].reads == (by_node["relu"].index,)  # through dropout and flatten to the relu
    else:
        assert labels == ["relu", "linear"] and fused == 1  # conv2d measured with its relu, named by the conv
        conv = next(tap for tap in taps if tap.fused == ("conv2d",))
        assert conv.module == "conv" and conv.dtype == "int8" and tapped[conv.index].dtype == torch.int8
        scale, zero_point = conv.qparams or (0.0, 0)
        assert scale > 0 and -128 <= zero_point <= 127


def _artifact(tmp_path: Path, model: str, **sidecar_changes: Any) -> Artifact:
    sidecar = sidecar_from_data(recorded(model)["sidecar"])
    if sidecar_changes:
        sidecar = dataclasses.replace(sidecar, **sidecar_changes)
    return Artifact(ArtifactPaths.for_model(sidecar.model, tmp_path), Variant.parse(sidecar.backend), sidecar)


def test_programs_the_pass_cannot_measure_are_refused(tmp_path: Path) -> None:
    lowered = _artifact(tmp_path, "distilbert-tiny")
    bare = _artifact(tmp_path, "distilbert-tiny", spec={**lowered.sidecar.spec, "model_source": "pte"})
    with pytest.raises(NumericsRefused) as caught:
        check_measurable(bare)
    assert caught.value.exit_code == ExitCode.USAGE
    assert "a .pte brought as it is" in str(caught.value) and "it takes a model etlab lowered" in str(caught.value)
    check_measurable(_artifact(tmp_path, "distilbert-tiny"))  # an etlab-lowered fp32 program: taken
    check_measurable(_artifact(tmp_path, "smollm2-gen-tiny.sdpa"))  # a text-generation program: its prefill


class CachedAttention(torch.nn.Module):
    """One attention layer over a KV cache, as etlab's generation programs attend: `etlab::update_cache` writes the
    new rows into the cache buffers, `etlab::attend` reads the caches."""

    def __init__(self) -> None:
        super().__init__()
        self.q = torch.nn.Linear(8, 8)
        self.k = torch.nn.Linear(8, 4)
        self.v = torch.nn.Linear(8, 4)
        self.out = torch.nn.Linear(8, 8)
        self.register_buffer("key_cache", torch.zeros(1, 1, 16, 4))
        self.register_buffer("value_cache", torch.zeros(1, 1, 16, 4))

    def forward(self, hidden: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        rows = hidden.shape[1]
        query = self.q(hidden).view(1, rows, 2, 4).transpose(1, 2)
        key = self.k(hidden).view(1, rows, 1, 4).transpose(1, 2)
        value = self.v(hidden).view(1, rows, 1, 4).transpose(1, 2)
        torch.ops.etlab.update_cache(key, self.key_cache, positions)
        torch.ops.etlab.update_cache(value, self.value_cache, positions)
        attended = torch.ops.etlab.attend(query, self.key_cache, self.value_cache, positions, 0.5)
        return self.out(attended.transpose(1, 2).reshape(1, rows, 8))


def test_a_kv_cache_is_read_through_not_tapped() -> None:
    """A cache write's result is no value of the model (update_cache returns a placeholder): it is not tapped. The
    attention that reads the caches reads what the writes before it put there: its query's, key's and value's taps,
    so the error it adds is its own, not its inputs'."""
    import orchestrator.lowering.attention.ops  # noqa: F401  # registers etlab's operators

    positions = torch.arange(3)
    program = torch.export.export(CachedAttention().eval(), (torch.randn(1, 3, 8), positions))
    points, _ = tap_points(program)
    assert not any("update_cache" in op_name(point.operator) for point in points)
    taps = {tap.node: tap for tap in tap_program(program, points, first=1)}
    attend = next(tap for tap in taps.values() if tap.op == "etlab.attend")
    assert set(attend.reads) == {taps["linear"].index, taps["linear_1"].index, taps["linear_2"].index}
    assert taps["linear_3"].reads == (attend.index,)


def test_a_tap_xnnpack_refuses_as_a_pass_through_is_left_out_and_the_rest_measured(tmp_path: Path) -> None:
    """Whisper's encoder: the positional add is made in one partition and read by the next (around the layer_norm
    XNNPACK leaves out); tapped, XNNPACK refuses the partition ("pass through arguments"). That one tap is left out,
    named in the record, and every other operator is measured: the numerics pass is not lost for one value."""
    from orchestrator.lowering.builtins import BUILTIN_SPECS
    from orchestrator.lowering.export import lower as lowering
    from orchestrator.lowering.export.numerics import make_numerics
    from orchestrator.lowering.variants import VARIANTS

    xnnpack = VARIANTS["xnnpack"]
    result = lowering.lower(BUILTIN_SPECS["whisper-tiny-encoder-tiny"], variants=[xnnpack], weights="random",
                            root=tmp_path)  # fmt: skip
    lowered = result.variants[xnnpack]
    program = make_numerics(Artifact(result.paths, xnnpack, lowered.sidecar))
    record = program.record
    assert "add" in record.unmatched and "add" not in {tap.node for tap in record.taps}
    assert len(record.taps) > 20 and program.pte.is_file()
    assert any(tap.op == "aten.linear" for tap in record.taps) and any(tap.op == "aten.gelu" for tap in record.taps)


def test_a_quantized_programs_operators_are_named_by_the_fp32_node_at_their_place() -> None:
    """Exported again after quantizing, wav2vec2's program has a getitem the fp32 one has not: every later `add_<n>`
    is another add there. Each operator is named by the fp32 node at the same place (its module, its operator and
    how many of it came before in that module), so the error of a residual add is its own, not another add's."""
    from orchestrator.lowering.builtins import BUILTIN_SPECS
    from orchestrator.lowering.export.numerics_taps import fp32_names
    from orchestrator.lowering.export.program import export_module
    from orchestrator.lowering.quantize.quantized import quantize
    from orchestrator.lowering.quantize.schemes import SCHEMES
    from orchestrator.lowering.sources.builders.models import example_inputs, load_model

    spec = BUILTIN_SPECS["wav2vec2-tiny"]
    module = load_model(spec, "random").module
    args = tuple(torch.from_numpy(t.array) for t in example_inputs(spec, module))
    fp32 = export_module(module, args, model="wav2vec2-tiny")
    quantized = quantize(module, args, SCHEMES["int8-dynamic"]).program
    names = fp32_names(quantized, fp32)
    places, fp32_places = node_places(quantized), node_places(fp32)
    by_name = {node.name: node for node in fp32_places}
    shifted = [node.name for node in places if names.get(node.name, node.name) != node.name]
    assert shifted  # the two exports do name some operators differently: a match by name pairs the wrong ones
    for node, place in places.items():
        if node.name in names:  # the same module and operator in both, whatever the name
            assert fp32_places[by_name[names[node.name]]] == place
    fp32_ops = {node.name: op_name(node) for node in fp32.graph.nodes}
    for point in tap_points(quantized, names)[0]:  # a label is the fp32 node of the same operator, or none of its
        assert fp32_ops.get(point.label, op_name(point.operator)) == op_name(point.operator), point.label
        assert point.label in fp32_ops or "getitem" in point.label  # unplaced: a choose_qparams' scale, left out
