"""`fab compare` that reads (issue 38 item 6), on real analysed runs of DistilBERT (test_compare.py's steady
baseline): the verdict first on stdout with both medians, the ratio and its CI; the memory figures in words; per
operator, only the rows whose own test found a change, labelled by it, the rest folded into one line; the XNNPACK
nodes inside the delegates compared too; an op-type roll-up; the report file still readable without the new parts."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from orchestrator.commands.render_compare import render_comparison
from orchestrator.records import read_document
from orchestrator.results import compare
from orchestrator.results.compare import ComparisonReport, compare_runs
from tests.plugins.analysis import BundleCase, TinyModel, analyze, copy_bundle, make_bundle, rewrite_etdump, steady_copy
from tests.results.test_compare import ITERATIONS, _force_valid, slowed_copy

pytestmark = pytest.mark.slow  # real analysed runs (session fixtures)


@pytest.fixture(scope="module")
def baseline_run(analysis_models: dict[str, TinyModel], tmp_path_factory: pytest.TempPathFactory) -> BundleCase:
    """test_compare.py's baseline: a DistilBERT XNNPACK run, its noise bounded to ±5% (steady_copy), analysed."""
    model = analysis_models["distilbert_xnnpack"]
    folder = tmp_path_factory.mktemp("compare-reads")
    raw = BundleCase(make_bundle(model, folder / "run-raw", iterations=ITERATIONS, run_id="run-a"), model)
    case = steady_copy(raw, folder / "run-a")
    analyze(case)
    return case


def _out(capsys: pytest.CaptureFixture[str]) -> tuple[str, str]:
    captured = capsys.readouterr()
    return captured.out, captured.err


def test_the_verdict_comes_first_and_every_row_agrees_with_its_numbers(
    baseline_run: BundleCase, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ops = json.loads((baseline_run.path / "analysis" / "ops.json").read_text())["instructions"]
    biggest = max((r for r in ops if r["kind"] == "KernelCall"), key=lambda r: r["median_ms"])
    slow = slowed_copy(baseline_run, tmp_path / "run-b", biggest["instruction"], factor=4.0)
    _force_valid(baseline_run.path)
    _force_valid(slow.path)
    comparison = compare_runs(baseline_run.path, slow.path)
    render_comparison(comparison)
    out, err = _out(capsys)
    first, second = out.splitlines()[:2]
    total = comparison.total
    assert first.startswith(f"A run-a: median {comparison.median_a_ms:.4g} ms") and "B run-b: median" in first
    assert f"B / A ×{total.ratio:.3f} (95% CI ×{total.ci_low:.3f}–×{total.ci_high:.3f}" in first
    assert second == f"overall: {comparison.verdict.value}: {comparison.verdict_detail}"
    assert "overall:" not in err and "WARNING: overall" not in err

    # the table holds only the changed rows, each labelled by its own test, whose direction its Δ % shares
    rows = [line for line in out.splitlines() if line.startswith("│")]
    changed = [op for op in [*comparison.ops, *comparison.delegate_ops] if op.verdict and op.verdict.is_change]
    assert [op.node_id for op in changed] == [biggest["node_id"]]
    table = [row for row in rows if "forward_0_" in row and "%" in row and "×" in row]
    assert len(table) == 1 and "no change" not in out
    (row,) = table
    found = re.search(r"([+-]\d+\.\d)%", row)
    assert found is not None
    percent = float(found.group(1))
    assert "slower" in row and percent > 0
    flat = " ".join(out.split())
    quiet = sum(1 for op in [*comparison.ops, *comparison.delegate_ops]
                if op.delta_ms is not None and op.verdict and not op.verdict.is_change)  # fmt: skip
    assert f"{quiet} operators within noise by their own tests (the largest: " in flat

    # a change too small to matter beside the run (here: against a run 1000x as long) is folded, said as such
    comparison.share_base_a_ms = (comparison.share_base_a_ms or 0.0) * 1000
    render_comparison(comparison)
    small, _ = _out(capsys)
    assert "Operators that changed" not in small
    assert "1 changed by less than 0.5% of A's median each (not listed)" in " ".join(small.split())
    comparison.share_base_a_ms = (comparison.share_base_a_ms or 0.0) / 1000

    # memory in words; the op-type roll-up leads with the slowed operator's type
    assert ".pte file" in flat and "constants (weights)" in flat and "_bytes" not in out
    assert compare.memory_label("peak_rss_bytes.method_init") == "peak RSS at method init"  # a native runner's phases
    first_type = comparison.op_types[0]
    assert first_type.op_type == biggest["op"].split(".")[0] and first_type.delta_ms > 0
    assert first_type.share_b == pytest.approx(first_type.b_ms / slow_base(slow))
    assert "By operator type" in out and f"{first_type.op_type}" in out

    # the rest of the method (slowed_copy makes every iteration a quarter longer beyond the operator): with it, the
    # types' deltas add up to the median change, in the data and in the table
    rest, median_a, median_b = comparison.rest, comparison.median_a_ms, comparison.median_b_ms
    assert rest is not None and median_a is not None and median_b is not None and rest.delta_ms > 0
    assert sum(t.delta_ms for t in comparison.op_types) + rest.delta_ms == pytest.approx(median_b - median_a)
    rows = [line for line in out.splitlines() if line.startswith("│")]
    assert any(row.startswith("│ rest of the method ") for row in rows)
    (whole,) = [row for row in rows if row.startswith("│ median (the whole run) ")]
    shown = [f"{ms:.4f}" if ms < 1 else f"{ms:.4g}" for ms in (median_a, median_b)]  # as the tables show ms
    assert shown[0] in whole and shown[1] in whole, whole
    assert "the runner's overhead" in flat


def slow_base(case: BundleCase) -> float:
    from orchestrator.results.ops_record import load_ops

    return load_ops(case.path).method_median_ms


def _slowed_node_copy(baseline_run: BundleCase, destination: Path, factor: float) -> tuple[BundleCase, str, str]:
    """B: the same run with one XNNPACK node (one whose event name is unique in its delegate) `factor` times slower
    in every execution, its delegate call and the method longer by as much."""
    document = json.loads((baseline_run.path / "analysis" / "ops.json").read_text())
    instruction_of = {r["node_id"]: r["instruction"] for r in document["instructions"]}
    for delegate in (d for d in document["delegates"] if d["status"] == "placed"):
        names = [event for node in delegate["nodes"] for event in node["events"]]
        single = [n for n in delegate["nodes"] if len(n["events"]) == 1 and names.count(n["events"][0]) == 1]
        if single:
            node = max(single, key=lambda n: n["median_ms"] or 0.0)
            break
    instruction, event_name = instruction_of[delegate["node_id"]], node["events"][0]
    # enough to clear the floor for "changed" twice over, however long the method took on this machine
    factor = max(factor, 1 + 2 * compare.MATERIAL_SHARE * slow_base(baseline_run) / node["median_ms"])
    case = copy_bundle(baseline_run, destination)

    def stretch(etdump: Any) -> None:
        for run in (r for r in etdump.run_data if r.name == "Execute"):
            events = [e.profile_event for e in run.events if e.profile_event is not None]
            (event,) = [p for p in events if p.instruction_id == instruction and p.delegate_debug_id_str == event_name]
            added = int((event.end_time - event.start_time) * (factor - 1))
            event.end_time += added
            for around in events:
                if around.name in ("DELEGATE_CALL", "Method::execute") and around.instruction_id in (instruction, -1):
                    around.end_time += added

    rewrite_etdump(case.path, stretch)
    analyze(case)
    return case, delegate["graph_id"], node["node"]


def test_operators_inside_delegates_are_compared(
    baseline_run: BundleCase, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    same = copy_bundle(baseline_run, tmp_path / "run-same")
    analyze(same)
    comparison = compare_runs(baseline_run.path, same.path, write=False)
    placed = [(d["graph_id"], n["node"]) for d in json.loads((baseline_run.path / "analysis" / "ops.json").read_text())
              ["delegates"] if d["status"] == "placed" for n in d["nodes"]]  # fmt: skip
    assert placed and [(op.graph, op.node_id) for op in comparison.delegate_ops] == placed
    assert all(op.verdict is not None and not op.verdict.is_change for op in comparison.delegate_ops)

    slow, graph, node = _slowed_node_copy(baseline_run, tmp_path / "run-node", factor=4.0)
    comparison = compare_runs(baseline_run.path, slow.path)
    flagged = [(op.graph, op.node_id) for op in comparison.delegate_ops if op.verdict and op.verdict.is_change]
    assert flagged == [(graph, node)]
    (changed,) = [op for op in comparison.delegate_ops if op.node_id == node and op.graph == graph]
    assert changed.verdict is not None and changed.delta_ms is not None and changed.op is not None
    assert changed.verdict.change == "slower" and changed.delta_ms > 0 and changed.op.startswith("XNN")
    assert comparison.op_types[0].op_type == changed.op
    render_comparison(comparison)
    out, _ = _out(capsys)
    assert f"{graph.rsplit('::', 1)[-1]} #{node}" in out  # the delegate call and its node, as Model Explorer has them

    # the report: the new parts written, and a report without them (an older etlab's) still read
    assert comparison.report is not None
    report = json.loads(comparison.report.read_text())
    assert (
        report["delegate_ops"]
        and report["op_types"]
        and report["memory"][0]["label"] == compare.memory_label(report["memory"][0]["figure"])
    )
    for key in ("delegate_ops", "op_types"):
        report.pop(key)
    for row in report["memory"]:
        row.pop("label")
    older = read_document(report, ComparisonReport, where="compare_vs_run-a.json")
    assert older.delegate_ops == () and older.op_types == () and older.verdict == comparison.verdict.value
