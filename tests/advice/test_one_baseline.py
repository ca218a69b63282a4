"""One baseline (issue 38 item 3): a real run of DistilBERT with one outlier iteration of one `where`, so the mean-based
and median-based shares differ several-fold; the ops document, the summary's top operators, Model Explorer's `pct`
overlay, the advice and `--try`'s table all give the median-based figure, of one and the same run median."""

from __future__ import annotations

import json
from typing import Any

import pytest

from orchestrator.advice.advisor import advise
from orchestrator.advice.findings import RunFacts
from orchestrator.advice.trial import OutputsCheck, TrialReport, VariantTrial
from orchestrator.commands.render_advice import advice_lines, render_trial
from orchestrator.deploy.abtest import Interleaved
from orchestrator.lowering.lowered import spec_from_record
from orchestrator.lowering.variants import VARIANTS
from orchestrator.results.documents import load_summary
from orchestrator.results.ops_record import load_ops
from orchestrator.results.overlays import overlay_path, shown
from orchestrator.servers.dashboard.where import operator_rows
from tests.plugins.analysis import BundleCase, analyze, rewrite_etdump, steady_copy

pytestmark = pytest.mark.slow  # a real lowered model's run, analysed twice

OUTLIER = 60  # one iteration of the `where` takes this many times its usual time


@pytest.fixture(scope="module")
def outlier_run(analysis_bundles: dict[str, BundleCase], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A steady copy of the run (noise within ±5%), then one timed iteration's last `where` made OUTLIER x slower
    (its OPERATOR_CALL and the method's Method::execute around it), analysed."""
    case = steady_copy(analysis_bundles["distilbert_xnnpack"], tmp_path_factory.mktemp("baseline") / "run-outlier")
    analyze(case)
    rows = json.loads((case.path / "analysis" / "ops.json").read_text())["instructions"]
    where = max((r for r in rows if r["kind"] == "KernelCall" and r["op"].startswith("aten::where")),
                key=lambda r: r["instruction"])  # fmt: skip
    warmup = len(json.loads((case.path / "timings.json").read_text())["warmup_ms"])

    def one_slow_iteration(etdump: Any) -> None:
        block = [r for r in etdump.run_data if r.name == "Execute"][warmup + 1]
        events = [e.profile_event for e in block.events if e.profile_event is not None]
        (call,) = [p for p in events if p.name == "OPERATOR_CALL" and p.instruction_id == where["instruction"]]
        added = (call.end_time - call.start_time) * (OUTLIER - 1)
        call.end_time += added
        for method in (p for p in events if p.name == "Method::execute"):
            method.end_time += added

    rewrite_etdump(case.path, one_slow_iteration)
    analyze(case)
    return {"case": case, "node": where["node_id"]}


def test_every_share_is_of_medians(outlier_run: dict[str, Any], capsys: pytest.CaptureFixture[str]) -> None:
    case, node = outlier_run["case"], outlier_run["node"]
    ops = load_ops(case.path)
    (where,) = [i for i in ops.instructions if i.node_id == node]
    # the baseline, from the document: the method's median, or its instructions' medians summed when larger
    raw = json.loads((case.path / "analysis" / "ops.json").read_text())
    base = max(raw["method_ms"]["median"], sum(r["median_ms"] or 0.0 for r in raw["instructions"]))
    median_share = where.median_ms / base
    mean_share = where.mean_ms / raw["method_ms"]["mean"]
    assert mean_share > 2 * median_share, "the outlier moves the mean-based share"

    # ops.json, the summary's top operators and Model Explorer's pct overlay: the median-based share
    assert next(r for r in raw["instructions"] if r["node_id"] == node)["pct"] == pytest.approx(100 * median_share)
    assert ops.method_median_ms == pytest.approx(base)
    overlay = json.loads(overlay_path(case.path, "pct").read_text())
    assert overlay[ops.method]["results"][node]["value"] == shown(100 * median_share)
    summary = load_summary(case.path)
    assert summary.profile is not None
    for row in summary.profile["top_layers"]:
        (timing,) = [i for i in ops.instructions if i.node_id == row["node_id"]]
        assert row["pct"] == pytest.approx(100 * timing.median_ms / base)
    shares = [i.median_ms / base for i in ops.instructions]
    assert sum(shares) <= 1.0 + 1e-9, "the shares of one run sum to at most 100%"
    # the dashboard's run page: its operator rows and op-type roll-up share the same medians
    rows, _, types = operator_rows(ops, limit=10_000)
    (row,) = [r for r in rows if r.node_id == node]
    assert row.share == pytest.approx(100 * median_share)
    assert sum(t.share for t in types) <= 100.0 + 1e-6

    # the advice: each finding's time is its operators' medians, its share of the same run median
    sidecar = case.model.sidecar
    facts = RunFacts(ops, summary, sidecar, spec_from_record(sidecar.spec, "sidecar"))
    advice = advise(facts)
    assert advice.method_ms == pytest.approx(base)
    (finding,) = [f for f in advice.findings if node in f.nodes.get(ops.method, ())]
    medians = {i.node_id: i.median_ms for i in ops.instructions}
    assert finding.measured_ms == pytest.approx(sum(medians[n] for n in finding.nodes[ops.method]))
    assert finding.share == pytest.approx(finding.measured_ms / base)
    assert f"of the run's median {base:.3g} ms" in advice_lines(advice)[-1]

    # --try's table names both medians it stands on: the A/B's and the profiled run's (the advice's baseline)
    retest = Interleaved(rounds=5, a_ms=[base * 0.9] * 5, b_ms=[base * 0.6] * 5, round_ratios=[0.66] * 5,
                         change="faster", confirmed=True, reason="5 of 5 rounds")  # fmt: skip
    trial = VariantTrial("distilbert-tiny.eager-attention", ("eager-attention",), finding.saving_ms or 0.0,
                         OutputsCheck(60.0, 1e-4, 1e-3), retest, profiled_ms=advice.method_ms)  # fmt: skip
    render_trial(TrialReport("distilbert-tiny", "local", VARIANTS["xnnpack"], base * 0.9, [trial]))
    out = " ".join(capsys.readouterr().out.split())
    assert f"{base:.3g} ms median in the profiled run" in out and f"{base * 0.9:.3g} ms median in this A/B" in out
    assert trial.predicted_share == pytest.approx(finding.saving_ms / base)
