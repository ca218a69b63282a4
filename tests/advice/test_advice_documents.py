"""What the advisor writes (advice.json, the two Model Explorer overlays) and how it reads an ops document it did
not write (a results folder can be edited: bad values are an AnalysisError, never a traceback). The findings
themselves are in test_findings.py."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator.advice.advisor import advise
from orchestrator.advice.documents import ADVICE_OVERLAY, FINDING_COLOURS, SAVING_OVERLAY, load_advice, write_advice
from orchestrator.errors import AnalysisError
from orchestrator.records import to_data
from orchestrator.results.ops_record import load_ops, read_ops
from orchestrator.results.overlays import overlay_path
from tests.advice.advice_helpers import facts_of, recorded


def _nodes_of(raw: dict[str, Any]) -> dict[str, set[str]]:
    """Every node id Model Explorer draws for the recorded program: top level and inside placed delegates."""
    graphs = {raw["ops"]["method"]: {r["node_id"] for r in raw["ops"]["instructions"]}}
    for delegate in raw["ops"]["delegates"]:
        graphs[delegate["graph_id"]] = {node["node"] for node in delegate["nodes"]}
    return graphs


@pytest.mark.parametrize("model", ["gpt2-tiny", "distilbert-tiny"])
def test_the_advice_overlays_paint_each_findings_real_nodes(model: str, tmp_path: Path) -> None:
    raw = recorded(model)
    advice = advise(facts_of(raw))
    written = write_advice(tmp_path, advice)
    assert json.loads((tmp_path / "analysis" / "advice.json").read_text()) == json.loads(json.dumps(to_data(advice)))
    numbers = json.loads(overlay_path(tmp_path, ADVICE_OVERLAY).read_text())
    savings = json.loads(overlay_path(tmp_path, SAVING_OVERLAY).read_text())
    assert len(written) == 3
    known = _nodes_of(raw)
    for graph, data in numbers.items():
        assert set(data["results"]) <= known[graph], "only node ids Model Explorer has"
        assert all(f"F{k}" in data["name"] for k in {int(r["value"]) for r in data["results"].values()})
    inside = [graph for graph in numbers if "::" in graph]
    assert inside, "the head finding paints a node inside its delegate"
    for finding in advice.findings:
        number = int(finding.id[1:])
        for graph, nodes in finding.nodes.items():
            for node in nodes:
                result = numbers[graph]["results"][node]
                if result["value"] == number:
                    assert result["bgColor"] == FINDING_COLOURS[(number - 1) % len(FINDING_COLOURS)]
        if finding.saving_ms is not None and finding.nodes:
            painted = sum(
                savings[graph]["results"][node]["value"] for graph, ns in finding.nodes.items() for node in ns
            )
            assert painted == pytest.approx(finding.saving_ms, rel=5e-4)  # shown to 4 significant digits


def test_advice_without_nodes_removes_stale_overlays(tmp_path: Path) -> None:
    raw = recorded("distilbert-tiny")
    write_advice(tmp_path, advise(facts_of(raw)))
    assert overlay_path(tmp_path, ADVICE_OVERLAY).is_file()
    quiet = advise(facts_of(raw))
    quiet = type(quiet)(quiet.run_id, quiet.model, quiet.backend, quiet.board, quiet.method_ms, ())
    write_advice(tmp_path, quiet)
    assert not overlay_path(tmp_path, ADVICE_OVERLAY).exists() and not overlay_path(tmp_path, SAVING_OVERLAY).exists()


@pytest.mark.parametrize(
    "damage",
    [
        lambda d: d["instructions"][0].update(mean_ms=-1.0),
        lambda d: d["instructions"][0].update(mean_ms=math.nan),
        lambda d: d["instructions"][0].update(mean_ms="fast"),
        lambda d: d["instructions"][0].update(node_id=7),
        lambda d: d["delegates"][0]["nodes"].append({"node": "9"}),
        lambda d: d.pop("instructions"),
        lambda d: d.update(delegates="none"),
    ],
)
def test_a_damaged_ops_document_is_an_analysis_error(damage: Any, tmp_path: Path) -> None:
    document = recorded("gpt2-tiny")["ops"]
    damage(document)
    (tmp_path / "analysis").mkdir()
    (tmp_path / "analysis" / "ops.json").write_text(json.dumps(document))
    with pytest.raises(AnalysisError, match=r"ops\.json"):
        load_ops(tmp_path)


def test_a_run_without_a_profile_says_so(tmp_path: Path) -> None:
    with pytest.raises(AnalysisError, match="no per-operator profile"):
        load_ops(tmp_path)


@settings(max_examples=60, deadline=None)
@given(
    st.recursive(
        st.none() | st.booleans() | st.floats() | st.text(max_size=5),
        lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
        max_leaves=12,
    )
)
def test_any_json_is_a_record_or_an_analysis_error(document: Any) -> None:
    with contextlib.suppress(AnalysisError):  # anything else (a TypeError, a KeyError) fails the test
        read_ops(document)


def test_advice_json_reads_back_and_a_damaged_one_is_an_analysis_error(tmp_path: Path) -> None:
    advice = advise(facts_of(recorded("gpt2-tiny")))
    assert load_advice(tmp_path) is None  # not advised yet
    write_advice(tmp_path, advice)
    assert load_advice(tmp_path) == advice
    path = tmp_path / "analysis" / "advice.json"
    document = json.loads(path.read_text())
    for damage in (
        lambda d: d["findings"][0].update(saving_ms="lots"),
        lambda d: d["findings"][0].update(nodes=["forward_0_1"]),
        lambda d: d["findings"][0].pop("title"),
        lambda d: d.update(method_ms=math.inf),
        lambda d: d.update(findings={}),
    ):
        broken = json.loads(json.dumps(document))
        damage(broken)
        path.write_text(json.dumps(broken))
        with pytest.raises(AnalysisError, match=r"advice\.json: "):  # the file, then the field (or the JSON's fault)
            load_advice(tmp_path)


def test_an_accuracy_finding_reads_back_whatever_its_cost_costs(tmp_path: Path) -> None:
    """A keep-float finding's cost is signed: on a board where int8 runs slower, keeping layers float saves time."""
    advice = advise(facts_of(recorded("gpt2-tiny")))
    kept = dataclasses.replace(advice.findings[0], kind="keep-float", keep_float=("h.0.mlp.c_fc",), sqnr_db=12.0,
                               predicted_sqnr_db=30.5, cost_ms=-0.25, gate_failed=True, saving_ms=None)  # fmt: skip
    advice = dataclasses.replace(advice, findings=(kept, *advice.findings[1:]))
    write_advice(tmp_path, advice)
    assert load_advice(tmp_path) == advice
    assert advice.predicted_parts["keep-float"] == 0.25  # a saving, then
