"""The advisor's findings on recorded profiles (tests/data/advice/: gpt2-tiny and distilbert-tiny as exported, run on
the local board with XNNPACK). Expected values are computed here from the recorded ops.json, never typed in; no
timing is asserted, only what follows from the recorded times. The overlay and untrusted ops documents are in
test_advice_documents.py."""

from __future__ import annotations

import dataclasses
import json
from collections import Counter
from typing import Any

import pytest

from orchestrator.advice.advisor import advise
from orchestrator.advice.detectors import CONV1D_INT8_SAVING, DETECTORS, SDPA_MASK_OPERATORS
from orchestrator.advice.findings import Advice, Finding
from orchestrator.lowering.rewrites.registry import REWRITES
from orchestrator.lowering.variants import Variant
from orchestrator.results.ops_record import read_ops
from tests.advice.advice_helpers import facts_of, recorded


def kernel_rows(raw: dict[str, Any], operator: str) -> list[dict[str, Any]]:
    return [r for r in raw["ops"]["instructions"] if r["kind"] == "KernelCall" and r["op"].split(".")[0] == operator]


def by_kind(advice: Advice) -> dict[str, Any]:
    return {finding.kind: finding for finding in advice.findings if finding.kind != "portable-operator"}


def head_of(raw: dict[str, Any]) -> tuple[str, str, dict[str, Any]]:
    """The last delegate call and its last FullyConnected node, read from the recorded document."""
    calls = [r for r in raw["ops"]["instructions"] if r["kind"] == "DelegateCall"]
    last = max(calls, key=lambda r: r["instruction"])
    delegate = next(d for d in raw["ops"]["delegates"] if d["node_id"] == last["node_id"])
    node = [n for n in delegate["nodes"] if n["type"] == "XNNFullyConnected"][-1]
    return last["node_id"], delegate["graph_id"], node


def test_gpt2_gets_the_three_known_rewrites() -> None:
    raw = recorded("gpt2-tiny")
    found = by_kind(advise(facts_of(raw)))
    assert {"tanh-gelu", "eager-attention", "head-at-position"} <= set(found)

    pows = kernel_rows(raw, "aten::pow")
    gelu = found["tanh-gelu"]
    assert gelu.rewrite == "tanh-gelu" and gelu.fix == "--rewrites tanh-gelu" and gelu.fix_kind == "rewrite"
    assert set(gelu.nodes["forward"]) == {r["node_id"] for r in pows} and gelu.calls == len(pows) == 2
    assert gelu.saving_ms == pytest.approx(sum(r["median_ms"] for r in pows))
    # of the run's median: the method's, or the instructions' medians summed when larger (ops.json's `pct` baseline)
    method_ms = max(raw["ops"]["method_ms"]["median"], sum(r["median_ms"] or 0 for r in raw["ops"]["instructions"]))
    assert gelu.share == pytest.approx(gelu.measured_ms / method_ms)

    head_call, graph, node = head_of(raw)
    head = found["head-at-position"]
    positions = raw["sidecar"]["outputs"][0]["shape"][1]
    assert head.nodes == {"forward": (head_call,), graph: (node["node"],)}
    assert head.saving_ms == pytest.approx(node["median_ms"] * (1 - 1 / positions))


def test_the_sdpa_finding_keeps_the_where_eager_attention_needs() -> None:
    raw = recorded("gpt2-tiny")
    masks = [r for op in SDPA_MASK_OPERATORS for r in kernel_rows(raw, op)]
    first_where = min(kernel_rows(raw, "aten::where"), key=lambda r: r["instruction"])
    attention = by_kind(advise(facts_of(raw)))["eager-attention"]
    assert set(attention.nodes["forward"]) == {r["node_id"] for r in masks} - {first_where["node_id"]}
    assert attention.saving_ms == pytest.approx(sum(r["median_ms"] for r in masks) - first_where["median_ms"])


def test_distilbert_gets_only_the_rewrites_that_apply() -> None:
    raw = recorded("distilbert-tiny")
    found = by_kind(advise(facts_of(raw)))
    assert "tanh-gelu" not in found  # DistilBERT's GELU is exact: no pow, and the rewrite does not apply
    assert {"eager-attention", "head-at-position"} <= set(found)
    assert found["stored-twice"].saving_mb == pytest.approx(
        raw["sidecar"]["outside_delegates"]["stored_twice"]["bytes"] / 1e6
    )


def test_rewrites_already_applied_are_not_proposed_again() -> None:
    raw = recorded("gpt2-tiny")
    facts = facts_of(raw)
    assert facts.sidecar is not None
    applied = dataclasses.replace(
        facts.sidecar, rewrites=("tanh-gelu", "eager-attention", "bmm-attention", "head-at-position")
    )
    advice = advise(dataclasses.replace(facts, sidecar=applied))
    assert not advice.rewrites
    # the pow kernels are still in this (recorded) profile: reported as a portable operator, with a bound only
    pow_finding = next(f for f in advice.findings if f.operators == ("aten::pow",))
    assert pow_finding.kind == "portable-operator" and pow_finding.saving_is_bound


def test_a_common_operator_counts_only_from_the_functions_the_rewrite_replaces() -> None:
    """RoPE's finding takes the slices the source map places in rotate_half, not another slice (the logits'):
    the same recorded calls, given sources."""
    raw = json.loads(json.dumps(recorded("smollm2-gen-tiny.sdpa")))
    slices = [row for row in raw["ops"]["instructions"] if row in kernel_rows(raw, "aten::slice_copy")]
    assert len(slices) > 2
    for row in slices:
        row["source"] = "modeling_llama.py:121 in rotate_half"
    slices[-1]["source"] = "modeling_utils.py:5198 in slice_logits_to_keep"
    rope = by_kind(advise(facts_of(raw)))["rope"]
    assert set(rope.nodes["forward"]) == {row["node_id"] for row in slices[:-1]}
    assert rope.calls == len(slices) - 1
    assert rope.saving_ms == pytest.approx(sum(row["median_ms"] for row in slices[:-1]))


def test_etlabs_own_operators_are_never_portable_kernels_to_write_away() -> None:
    """The same recorded calls under an etlab operator's name (attend, rope, ... run outside the delegates by design,
    as native kernels): no portable-operator finding for them, where the aten name got one."""
    raw = recorded("gpt2-tiny")
    facts = facts_of(raw)
    assert facts.sidecar is not None
    applied = dataclasses.replace(
        facts.sidecar, rewrites=("tanh-gelu", "eager-attention", "bmm-attention", "head-at-position")
    )
    pow_calls = kernel_rows(raw, "aten::pow")
    assert pow_calls and any(
        f.operators == ("aten::pow",) for f in advise(dataclasses.replace(facts, sidecar=applied)).findings
    )
    renamed = json.loads(json.dumps(raw))
    for row in renamed["ops"]["instructions"]:
        if row in pow_calls:
            row["op"] = "etlab::attend.out"
    own = dataclasses.replace(facts_of(renamed), sidecar=applied)
    assert not [f for f in advise(own).findings if any(op.startswith("etlab::") for op in f.operators)]


@pytest.mark.parametrize(("model", "output"), [("gpt2-tiny", "last"), ("distilbert-tiny", "mask")])
def test_a_program_that_selects_its_position_after_the_head_gets_the_head_finding(model: str, output: str) -> None:
    """The built-in gpt2 and distilbert return one position's logits, [B, vocab], selected after a head that
    projected every position (the course's programs): the head's own output shape says how many it projected, and
    the finding predicts the same saving as for every position's program. A head whose shape is unknown: no
    finding (nothing to predict from)."""
    raw = recorded(model)
    facts = facts_of(raw)
    every = by_kind(advise(facts))["head-at-position"]
    assert facts.spec is not None and facts.sidecar is not None
    (logits,) = facts.sidecar.outputs
    one_row = (logits.shape[0], logits.shape[2])
    _, graph, recorded_head = head_of(raw)

    def head_shaped(shape: tuple[int, ...] | None) -> Any:
        """The recorded profile with the head node's output shape (recorded before etlab read node shapes): a run's
        ops.json has it, e.g. [1, 128, 30522] for the course's DistilBERT."""
        delegates = tuple(
            dataclasses.replace(d, nodes=tuple(
                dataclasses.replace(n, shape=shape) if (d.graph_id, n.node) == (graph, recorded_head["node"]) else n
                for n in d.nodes))
            for d in facts.ops.delegates
        )  # fmt: skip
        return dataclasses.replace(facts.ops, delegates=delegates)

    selected = dataclasses.replace(
        facts,
        spec=dataclasses.replace(facts.spec, output=output),
        sidecar=dataclasses.replace(facts.sidecar, outputs=(dataclasses.replace(logits, shape=one_row),)),
        ops=head_shaped(logits.shape),  # the head projects every position: [B, seq_len, vocab]
    )
    head = by_kind(advise(selected))["head-at-position"]
    assert head.saving_ms == pytest.approx(every.saving_ms) and head.share == pytest.approx(every.share)
    assert "selects after the head" in head.cause and head.fix == "--rewrites head-at-position"
    shapeless = head_shaped(None)
    assert "head-at-position" not in by_kind(advise(dataclasses.replace(selected, ops=shapeless)))


def test_without_a_spec_only_the_profile_speaks() -> None:
    """A program the user lowered: no rewrite is offered, the portable operators are still found."""
    advice = advise(facts_of(recorded("gpt2-tiny"), sidecar=None, spec=None))
    assert not advice.rewrites and advice.findings
    assert {f.kind for f in advice.findings} <= {"portable-operator", "threads", "board"}


@pytest.mark.parametrize("model", ["gpt2-tiny", "distilbert-tiny"])
def test_no_instruction_is_counted_twice_and_ids_follow_the_savings(model: str) -> None:
    raw = recorded(model)
    advice = advise(facts_of(raw))
    top = Counter(node for f in advice.findings for node in f.nodes.get("forward", ()))
    assert top and max(top.values()) == 1
    known = {r["node_id"] for r in raw["ops"]["instructions"]}
    assert set(top) <= known
    assert [f.id for f in advice.findings] == [f"F{k}" for k in range(1, len(advice.findings) + 1)]
    predicted = [f.saving_ms for f in advice.findings if f.saving_ms is not None and not f.saving_is_bound]
    assert predicted == sorted(predicted, reverse=True)
    assert advice.predicted_ms == pytest.approx(sum(predicted))
    assert advice.rewrites == tuple(f.rewrite for f in advice.findings if f.rewrite)


def test_idle_cores_and_board_conditions() -> None:
    raw = recorded("distilbert-tiny")
    raw["summary"]["latency"]["threads"] = 1
    raw["summary"]["board_conditions"].update(
        cores_online=4, governor_before="ondemand", throttling_during_run=["under_voltage_now"]
    )
    advice = advise(facts_of(raw))
    found = by_kind(advice)
    delegated = sum(r["median_ms"] for r in raw["ops"]["instructions"] if r["kind"] == "DelegateCall")
    assert found["threads"].saving_ms == pytest.approx(delegated * 0.75)
    assert found["threads"].fix.startswith("--threads 4")
    for kind in ("governor", "throttling"):
        assert found[kind].saving_ms is None and found[kind].fix_kind == "board"
    assert advice.findings[-1].saving_ms is None  # unpredicted findings come last


def _scaled_profile(raw: dict[str, Any], scale: float, types: tuple[str, ...]) -> dict[str, Any]:
    """The recorded profile with the time of every delegate node of `types` scaled."""
    ops = json.loads(json.dumps(raw["ops"]))
    for delegate in ops["delegates"]:
        for node in delegate["nodes"]:
            if node["type"] in types:
                node["median_ms"] *= scale
    return ops


def _gemm_profile(raw: dict[str, Any], scale: float) -> dict[str, Any]:
    """Every FullyConnected node's time scaled (a stand-in for an int8 run)."""
    return _scaled_profile(raw, scale, ("XNNFullyConnected",))


def test_quantization_saving_is_measured_or_not_predicted() -> None:
    raw = recorded("distilbert-tiny")
    gemm = sum(n["median_ms"] for d in raw["ops"]["delegates"] for n in d["nodes"] if n["type"] == "XNNFullyConnected")
    raw["ops"] = _gemm_profile(raw, read_ops(raw["ops"]).method_median_ms * 0.5 / gemm)  # half the run: proposed
    gemm = read_ops(raw["ops"]).method_median_ms * 0.5
    alone = by_kind(advise(facts_of(raw)))["quantize"]
    assert alone.saving_ms is None and "no int8 run" in alone.saving_note
    peer = read_ops(_gemm_profile(raw, 0.4))
    measured = by_kind(
        advise(facts_of(raw, quantized_peer=peer, quantized_peer_variant=Variant.parse("xnnpack-int8-dynamic")))
    )
    assert measured["quantize"].saving_ms == pytest.approx(gemm * 0.6)
    assert measured["quantize"].fix.startswith("--quantize int8-dynamic")


def test_every_detector_is_documented() -> None:
    assert all(detector.description and detector.name == name for name, detector in DETECTORS.items())


def test_a_finding_is_built_by_keyword() -> None:
    """Fifteen fields, several of one type (three times, four texts): a positional call could swap two silently."""
    fields: dict[str, Any] = {"kind": "threads", "title": "2 of 4 cores used", "operators": (), "nodes": {}, "calls": 0,
              "measured_ms": 2.0, "share": 0.5, "cause": "idle cores", "saving_ms": 1.0, "fix_kind": "option",
              "fix": "--threads 4"}  # fmt: skip
    assert Finding(**fields).id == ""  # the advisor numbers findings
    with pytest.raises(TypeError):
        Finding("", *fields.values())  # type: ignore[call-arg]  # positionally on purpose: refused


@pytest.mark.parametrize(
    ("model", "rewrite", "operators"),
    [
        ("wav2vec2-tiny", "fold-weight-norm", {"aten::convolution", "aten::sum"}),  # the positional convolution
        ("smollm2-tiny", "rms-norm", {"aten::mean"}),  # RMSNorm's mean over the last dimension
        ("gpt2-tiny", "bmm-attention", {"aten::expand_copy"}),  # attention's 4-D matmuls
        ("smollm2-gen-tiny.sdpa", "rope", {"aten::slice_copy"}),  # RoPE's rotate_half, 4 slices a layer
        # a program that generates: the whole norm as etlab's operator, not its mean alone in XNNPACK
        ("smollm2-gen-tiny.sdpa", "fused-rms-norm", {"aten::mean"}),
    ],
)
def test_rewrites_named_by_their_portable_operators(model: str, rewrite: str, operators: set[str]) -> None:
    raw = recorded(model)
    found = by_kind(advise(facts_of(raw)))
    finding = found[rewrite]
    calls = [row for op in REWRITES[rewrite].portable_operators for row in kernel_rows(raw, op)]
    assert operators <= set(finding.operators) == {row["op"].split(".")[0] for row in calls}
    assert set(finding.nodes["forward"]) == {row["node_id"] for row in calls}
    assert finding.saving_ms == pytest.approx(sum(row["median_ms"] for row in calls))
    assert finding.fix == f"--rewrites {rewrite}" and rewrite in finding.cause
    assert all(
        f.kind != "portable-operator" or not set(f.operators) & operators for f in advise(facts_of(raw)).findings
    )


# The static-cache attention's bookkeeping outside the delegates (a recorded run of smollm2-gen-tiny.sdpa, XNNPACK):
# repeat_kv's copy of the cache, the cache writes and their write-back, the causal mask over the whole cache.
STATIC_CACHE = ("aten::expand_copy", "aten::index_put", "aten::copy_", "aten::eq", "aten::full_like",
                "aten::logical_not", "aten::any", "aten::where", "aten::le", "aten::arange")  # fmt: skip


def test_a_static_cache_generation_run_is_advised_etlab_s_attention() -> None:
    raw = recorded("smollm2-gen-tiny.sdpa")
    advice = advise(facts_of(raw))
    found = by_kind(advice)
    bookkeeping = [row for op in STATIC_CACHE for row in kernel_rows(raw, op)]
    attention = found["attention"]
    assert attention.fix == "--attention etlab" and attention.fix_kind == "option" and advice.attention == "etlab"
    assert set(attention.nodes["forward"]) == {row["node_id"] for row in bookkeeping}
    assert attention.saving_ms == pytest.approx(sum(row["median_ms"] for row in bookkeeping))
    assert attention.calls == len(bookkeeping) and not attention.saving_is_bound
    assert "eager-attention" not in found  # its mask operators are the static cache's, explained already
    # a sidecar from before the choice (no attention recorded) was lowered with sdpa
    facts = facts_of(raw)
    assert facts.sidecar is not None and facts.sidecar.generation is not None
    old = dataclasses.replace(facts.sidecar, generation=dataclasses.replace(facts.sidecar.generation, attention=None))
    assert advise(dataclasses.replace(facts, sidecar=old)).attention == "etlab"


def test_no_attention_switch_for_etlab_s_attention_or_a_model_that_does_not_generate() -> None:
    facts = facts_of(recorded("smollm2-gen-tiny.sdpa"))
    assert facts.sidecar is not None and facts.sidecar.generation is not None
    generation = dataclasses.replace(facts.sidecar.generation, attention="etlab")
    etlab = dataclasses.replace(facts, sidecar=dataclasses.replace(facts.sidecar, generation=generation))
    assert "attention" not in by_kind(advise(etlab)) and advise(etlab).attention is None
    for model in ("gpt2-tiny", "smollm2-tiny"):  # all positions' logits, no KV cache
        assert advise(facts_of(recorded(model))).attention is None


def _convolution_profile(raw: dict[str, Any], scale: float) -> dict[str, Any]:
    return _scaled_profile(raw, scale, ("XNNConv2d", "XNNDepthwiseConv2d"))


def test_an_int8_dynamic_audio_program_s_fp32_convolutions_are_conv1d_as_2d() -> None:
    """wav2vec2-tiny int8-dynamic (recorded): its 1-D convolutions stayed fp32 (the sidecar: 0 of 8 quantized).
    Scaled to a fifth of the run, they are a finding with a predicted saving; at their recorded 2%-or-less, none."""
    raw = recorded("wav2vec2-tiny-int8-dynamic")
    quantization = raw["sidecar"]["quantization"]
    assert quantization["scheme"] == "int8-dynamic" and quantization["quantized_convolutions"] == 0
    nodes = [(d["graph_id"], n) for d in raw["ops"]["delegates"] for n in d["nodes"] if "Conv2d" in n["type"]]
    measured = sum(n["median_ms"] for _, n in nodes)
    assert "conv1d-as-2d" not in by_kind(advise(facts_of(raw)))  # a small share: not worth a finding
    scale = read_ops(raw["ops"]).method_median_ms * 0.2 / measured
    raw["ops"] = _convolution_profile(raw, scale)
    finding = by_kind(advise(facts_of(raw)))["conv1d-as-2d"]
    assert finding.measured_ms == pytest.approx(measured * scale)
    assert finding.saving_ms == pytest.approx(measured * scale * CONV1D_INT8_SAVING)
    assert finding.fix == "--rewrites conv1d-as-2d" and finding.rewrite == "conv1d-as-2d"
    assert {node for ids in finding.nodes.values() for node in ids} == {n["node"] for _, n in nodes}
    assert set(finding.nodes) == {graph for graph, _ in nodes}
    assert "fp32 program gets slower" in finding.saving_note  # the trade-off is said where it is proposed
    # not where the rewrite is in the program already, nor for an fp32 program, nor for a family it does not apply to
    applied = dict(raw, sidecar={**raw["sidecar"], "rewrites": ["conv1d-as-2d"]})
    assert "conv1d-as-2d" not in by_kind(advise(facts_of(applied)))
    fp32 = dict(raw, sidecar={**raw["sidecar"], "backend": "xnnpack", "quantization": None})
    assert "conv1d-as-2d" not in by_kind(advise(facts_of(fp32)))
    facts = facts_of(raw)
    assert facts.spec is not None
    other = dataclasses.replace(facts, spec=dataclasses.replace(facts.spec, model_type="distilbert"))
    assert "conv1d-as-2d" not in by_kind(advise(other))


def test_some_convolutions_quantized_only_those_left_fp32_are_counted() -> None:
    raw = recorded("wav2vec2-tiny-int8-dynamic")
    raw["ops"] = _convolution_profile(raw, read_ops(raw["ops"]).method_median_ms)  # every convolution is large
    quantization = raw["sidecar"]["quantization"]
    kept = [name for name in quantization["float_convolutions"] if name.endswith("conv_layers.0.conv")]
    raw["sidecar"] = {**raw["sidecar"], "quantization": {**quantization, "quantized_convolutions": 7,
                                                         "float_convolutions": kept}}  # fmt: skip
    finding = by_kind(advise(facts_of(raw)))["conv1d-as-2d"]
    first = [
        n
        for d in raw["ops"]["delegates"]
        for n in d["nodes"]
        if "Conv2d" in n["type"] and n.get("module") == "feature_extractor.conv_layers.0.conv"
    ]
    assert len(first) == 1 and finding.calls == 1
    assert finding.measured_ms == pytest.approx(first[0]["median_ms"])
