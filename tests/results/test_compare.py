"""compare: the change verdict on known samples, and run-vs-run comparison of real analysed bundles."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from typing import Any

import numpy as np
import pytest

from orchestrator.commands.render_compare import render_comparison
from orchestrator.lowering.variants import VARIANTS
from orchestrator.paths import PROJECT_ROOT
from orchestrator.results.compare import CompareError, compare_runs
from orchestrator.results.stats import compare_samples, distribution
from orchestrator.results.verdicts import Kind
from tests.plugins.analysis import (
    BundleCase,
    TinyModel,
    adapter_graphs,
    analyze,
    copy_bundle,
    edit_json,
    make_bundle,
    rewrite_etdump,
    steady_copy,
    write_manifest,
)

pytestmark = pytest.mark.slow  # lowers and runs real models (session fixtures)

ITERATIONS = 20

# ---------------------------------------------------------------------------------------------------------------
# stats


def noisy(median: float, n: int, seed: int, spread: float = 0.02) -> np.ndarray:
    """Latency-like samples: lognormal around `median` with a few slow outliers."""
    rng = np.random.default_rng(seed)
    samples = median * rng.lognormal(0.0, spread, n)
    samples[:: max(1, n // 5)] *= 1.3  # preempted iterations
    return samples


def test_distribution_matches_numpy() -> None:
    samples = noisy(10.0, 37, seed=1)
    dist = distribution(samples)
    assert dist is not None and dist.n == 37
    assert dist.median == np.median(samples) and dist.mean == pytest.approx(samples.mean())
    assert (dist.p10, dist.p90) == tuple(np.percentile(samples, [10, 90]))
    assert dist.cv == pytest.approx(samples.std(ddof=1) / samples.mean())
    assert distribution([]) is None


@pytest.mark.parametrize(
    ("factor", "spread", "expected"),
    [
        (1.0, 0.02, "no change"),  # same distribution, new draw
        (1.20, 0.02, "slower"),
        (0.80, 0.02, "faster"),
        (1.02, 0.002, "no change"),  # real but below the 5% minimum effect
        (1.08, 0.30, "no change"),  # too noisy to tell
    ],
)
def test_verdict_on_known_shifts(factor: float, spread: float, expected: str) -> None:
    a = noisy(100.0, 30, seed=2, spread=spread)
    b = noisy(100.0 * factor, 30, seed=3, spread=spread)
    verdict = compare_samples(a, b)
    assert verdict.change == expected, verdict.reason
    assert verdict.ci_low is not None and verdict.ci_high is not None and verdict.ci_low <= verdict.ci_high
    assert verdict.ratio == pytest.approx(np.median(b) / np.median(a))
    if expected == "no change" and factor == 1.02:
        assert "below the 5% minimum effect" in verdict.reason


def test_verdict_is_reproducible_and_needs_samples() -> None:
    a, b = noisy(50.0, 12, seed=4), noisy(60.0, 12, seed=5)
    assert compare_samples(a, b) == compare_samples(a, b)
    few = compare_samples(a[:3], b)
    assert few.change == "insufficient data" and not few.is_change
    constant = compare_samples([5.0] * 8, [5.0] * 8)
    assert constant.change == "no change" and constant.p_value == 1.0


# ---------------------------------------------------------------------------------------------------------------
# compare_runs on real bundles


@pytest.fixture(scope="module")
def baseline(analysis_models: dict[str, TinyModel], tmp_path_factory: pytest.TempPathFactory) -> BundleCase:
    """A DistilBERT XNNPACK run with enough iterations for per-operator verdicts, its noise bounded to ±5%.

    The tests below inject known shifts (a 3x slower operator, a run 1.5x slower) and check what compare makes of
    them. Measured on this shared machine, a raw run's iterations span up to 25x (2-50 ms), which drowns any
    shift in 20 samples; the steady copy keeps the real samples within ±5% of their medians (see steady_copy).
    """
    model = analysis_models["distilbert_xnnpack"]
    folder = tmp_path_factory.mktemp("compare")
    raw = BundleCase(make_bundle(model, folder / "run-raw", iterations=ITERATIONS, run_id="run-a"), model)
    case = steady_copy(raw, folder / "run-a")
    analyze(case)
    return case


def slowed_copy(baseline: BundleCase, destination: Any, node_index: int, factor: float) -> BundleCase:
    """B: the same run with one instruction `factor` times slower and every iteration slower by that much."""
    case = copy_bundle(baseline, destination)
    extra_ns: list[int] = []

    def stretch(etdump: Any) -> None:
        for run in (r for r in etdump.run_data if r.name == "Execute"):
            for event in run.events:
                profile = event.profile_event
                if profile and profile.instruction_id == node_index and profile.name == "OPERATOR_CALL":
                    added = int((profile.end_time - profile.start_time) * (factor - 1))
                    profile.end_time += added
                    extra_ns.append(added)

    rewrite_etdump(case.path, stretch)
    timings = json.loads((case.path / "timings.json").read_text())
    warmup = len(timings["warmup_ms"])
    slower = [v + extra / 1e6 for v, extra in zip(timings["iterations_ms"], extra_ns[warmup:], strict=True)]
    edit_json(case.path / "timings.json", iterations_ms=[v * 1.25 for v in slower])
    edit_json(case.path / "run.json", run_id=destination.name)
    write_manifest(case.path, run_id=destination.name, model_sha256=baseline.model.sidecar.sha256)
    analyze(case)
    return case


def test_identical_runs_show_no_change(baseline: BundleCase, tmp_path: Any) -> None:
    same = copy_bundle(baseline, tmp_path / "run-same")
    analyze(same)
    comparison = compare_runs(baseline.path, same.path)
    assert comparison.total.change == "no change"
    assert all(op.delta_ms == 0 for op in comparison.ops if op.delta_ms is not None)
    assert not any(op.verdict and op.verdict.is_change for op in comparison.ops)
    assert comparison.overlay is not None
    overlay = json.loads(comparison.overlay.read_text())
    assert {r["bgColor"] for g in overlay.values() for r in g["results"].values()} == {"#ffffff"}


def test_a_slower_operator_is_found_and_painted_red(baseline: BundleCase, tmp_path: Any) -> None:
    ops = json.loads((baseline.path / "analysis" / "ops.json").read_text())["instructions"]
    kernels = [r for r in ops if r["kind"] == "KernelCall"]
    biggest = max(kernels, key=lambda r: r["median_ms"])
    slow = slowed_copy(baseline, tmp_path / "run-b", biggest["instruction"], factor=4.0)

    comparison = compare_runs(baseline.path, slow.path)
    assert comparison.total.change == "slower", comparison.total.reason
    flagged = [op.node_id for op in comparison.ops if op.verdict and op.verdict.is_change]
    assert flagged == [biggest["node_id"]]
    changed = next(op for op in comparison.ops if op.node_id == biggest["node_id"])
    assert changed.verdict is not None and changed.delta_ms is not None
    assert changed.verdict.change == "slower" and changed.delta_ms > 0

    assert comparison.overlay is not None
    overlay = json.loads(comparison.overlay.read_text())
    results = overlay["forward"]["results"]
    assert results[biggest["node_id"]]["bgColor"] == "#b2182b", "the largest change saturates the red end"
    assert all(r["bgColor"] == "#ffffff" for node, r in results.items() if node != biggest["node_id"])
    graphs = adapter_graphs(baseline.model.pte)
    for graph_id, data in overlay.items():
        assert set(data["results"]) <= graphs[graph_id]
    assert [s["bgColor"] for s in overlay["forward"]["gradient"]] == ["#2166ac", "#ffffff", "#b2182b"]
    assert comparison.report is not None
    report = json.loads(comparison.report.read_text())
    assert report["total"]["change"] == "slower" and report["run_b"]["run_id"] == "run-b"

    reverse = compare_runs(slow.path, baseline.path, write=False)
    assert reverse.total.change == "faster" and reverse.overlay is None


def test_render_comparison(baseline: BundleCase, tmp_path: Any, capsys: pytest.CaptureFixture[str]) -> None:
    same = copy_bundle(baseline, tmp_path / "run-same")
    analyze(same)
    _force_valid(baseline.path)
    _force_valid(same.path)
    render_comparison(compare_runs(baseline.path, same.path, write=False), limit=5)
    captured = capsys.readouterr()
    out = captured.out + captured.err
    assert "overall: ok: no program change; within noise" in out and "A run-a: median " in out
    assert "operators within noise by their own tests" in out and "Operators that changed" not in out  # folded


def test_a_changed_firmware_or_config_txt_is_named_beside_the_verdict(
    baseline: BundleCase, tmp_path: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    """The same program on a board whose firmware and config.txt changed (board_info_before.json, as the agent
    records them): compare names both, in its output and its report, whatever the timings say."""
    changed = copy_bundle(baseline, tmp_path / "run-flashed")
    info = json.loads((changed.path / "board_info_before.json").read_text())
    info.update(firmware="2025/01/10 11:00:00; version 1a2b3c4d (release)",
                config_txt={"path": "/boot/firmware/config.txt", "sha256": "c" * 64})  # fmt: skip
    (changed.path / "board_info_before.json").write_text(json.dumps(info))
    write_manifest(changed.path, run_id="run-a", model_sha256=baseline.model.sidecar.sha256)
    analyze(changed)
    comparison = compare_runs(baseline.path, changed.path)
    was = json.loads((baseline.path / "board_info_before.json").read_text()).get("firmware") or "—"
    assert comparison.conditions == [
        f"firmware {was} → 2025/01/10 11:00:00; version 1a2b3c4d (release)",
        f"config.txt — → {'c' * 12}",
    ]
    assert comparison.report is not None
    assert json.loads(comparison.report.read_text())["conditions"] == comparison.conditions
    render_comparison(comparison)
    said = capsys.readouterr()
    assert "board conditions changed: firmware" in " ".join((said.out + said.err).split())


def test_different_models_are_refused(analysis_bundles: dict[str, BundleCase], tmp_path: Any) -> None:
    bert = copy_bundle(analysis_bundles["distilbert_xnnpack"], tmp_path / "bert")
    gpt = copy_bundle(analysis_bundles["gpt2_xnnpack"], tmp_path / "gpt")
    portable = copy_bundle(analysis_bundles["distilbert_portable"], tmp_path / "portable")
    for case in (bert, gpt, portable):
        analyze(case)
    with pytest.raises(CompareError, match="different models"):
        compare_runs(bert.path, gpt.path)
    with pytest.raises(CompareError, match="different programs"):
        compare_runs(bert.path, portable.path)


def test_rebuilt_program_needs_permission(baseline: BundleCase, tmp_path: Any) -> None:
    rebuilt = copy_bundle(baseline, tmp_path / "run-rebuilt")
    analyze(rebuilt)
    summary_path = rebuilt.path / "analysis" / "summary.json"
    summary = json.loads(summary_path.read_text())
    summary["model"]["sha256"] = "0" * 64
    summary_path.write_text(json.dumps(summary))
    with pytest.raises(CompareError, match=r"different \.pte builds") as refused:
        compare_runs(baseline.path, rebuilt.path)
    assert "--" not in str(refused.value)  # the library names no option
    comparison = compare_runs(baseline.path, rebuilt.path, allow_rebuilt=True, write=False)
    assert any("different builds" in note for note in comparison.notes)


def test_fab_compare_names_the_option_that_allows_a_rebuilt_program(
    baseline: BundleCase, tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from orchestrator.commands import results
    from orchestrator.results.store import LocalRun

    rebuilt = copy_bundle(baseline, tmp_path / "run-rebuilt")
    analyze(rebuilt)
    summary_path = rebuilt.path / "analysis" / "summary.json"
    summary_path.write_text(
        summary_path.read_text().replace(json.loads(summary_path.read_text())["model"]["sha256"], "0" * 64)
    )
    runs = {name: LocalRun(case.path, "pi5-test", "distilbert", "xnnpack", name)
            for name, case in (("a", baseline), ("b", rebuilt))}  # fmt: skip
    monkeypatch.setattr(results, "find_run", runs.__getitem__)  # the two bundles, wherever they are
    with pytest.raises(CompareError, match=r"different \.pte builds") as refused:
        results.compare("a", "b")
    assert refused.value.hint is not None and "--allow-rebuilt" in refused.value.hint


def test_unanalysed_run_is_refused(baseline: BundleCase, tmp_path: Any) -> None:
    raw = copy_bundle(baseline, tmp_path / "raw")
    with pytest.raises(CompareError, match="has not been analysed") as caught:
        compare_runs(baseline.path, raw.path)
    assert "run the analysis first" in str(caught.value)


# ---------------------------------------------------------------------------------------------------------------
# verdicts: the same program is drift, a degraded side is inconclusive, a confirmed change needs the A/B re-test


def test_same_program_is_drift_never_a_regression(baseline: BundleCase, tmp_path: Any) -> None:
    slow = copy_bundle(baseline, tmp_path / "run-b")
    timings = json.loads((slow.path / "timings.json").read_text())
    edit_json(slow.path / "timings.json", iterations_ms=[v * 1.5 for v in timings["iterations_ms"]])
    analyze(slow)
    _force_valid(baseline.path)
    _force_valid(slow.path)
    comparison = compare_runs(baseline.path, slow.path)
    assert comparison.total.change == "slower", comparison.total.reason
    assert comparison.verdict == Kind.DRIFT, comparison.verdict_detail
    assert (
        comparison.verdict_detail.startswith("no program change; the measured median +")
        and "run-to-run drift" in comparison.verdict_detail
    )
    assert comparison.report is not None
    assert json.loads(comparison.report.read_text())["verdict"] == "drift"


def test_a_degraded_side_is_inconclusive(baseline: BundleCase, tmp_path: Any) -> None:
    other = copy_bundle(baseline, tmp_path / "run-degraded")
    analyze(other)
    _force_valid(baseline.path)
    summary_path = other.path / "analysis" / "summary.json"
    summary = json.loads(summary_path.read_text())
    summary["validity"] = {"status": "degraded", "reasons": [{"level": "degraded", "reason": "unstable timings"}]}
    summary_path.write_text(json.dumps(summary))
    comparison = compare_runs(baseline.path, other.path, write=False)
    assert comparison.verdict == Kind.INCONCLUSIVE
    assert "is degraded (unstable timings)" in comparison.verdict_detail


def _overall_lines(out: str) -> list[str]:
    lines = " ".join(out.split()).split("overall:")[1:]  # the console wraps long lines
    return [line.strip() for line in lines]


def test_one_verdict_said_once(baseline: BundleCase, tmp_path: Any, capsys: pytest.CaptureFixture[str]) -> None:
    """Two runs of one program whose timings differ far beyond the noise (x1.6): the only overall line says drift,
    with the figure as detail; with one side degraded it says inconclusive. Nothing claims "faster"/"slower"."""
    slow = copy_bundle(baseline, tmp_path / "run-hog")
    timings = json.loads((slow.path / "timings.json").read_text())
    edit_json(slow.path / "timings.json", iterations_ms=[v * 1.6 for v in timings["iterations_ms"]])
    analyze(slow)
    _force_valid(baseline.path)
    _force_valid(slow.path)
    for first, second, sign in ((baseline, slow, "+"), (slow, baseline, "-")):
        render_comparison(compare_runs(first.path, second.path, write=False))
        captured = capsys.readouterr()
        out = captured.out + captured.err
        (overall,) = _overall_lines(out)
        assert overall.startswith(f"drift: no program change; the measured median {sign}"), overall
        assert "verdict:" not in out and "faster" not in overall and "slower" not in overall, out

    summary_path = slow.path / "analysis" / "summary.json"
    summary = json.loads(summary_path.read_text())
    summary["validity"] = {"status": "degraded", "reasons": [{"level": "degraded", "reason": "a CPU hog"}]}
    summary_path.write_text(json.dumps(summary))
    render_comparison(compare_runs(baseline.path, slow.path, write=False))
    captured = capsys.readouterr()
    out = captured.out + captured.err
    (overall,) = _overall_lines(out)
    assert overall.startswith("inconclusive: run ") and "is degraded (a CPU hog); the measured median +" in overall, (
        overall
    )
    assert "cannot be trusted" in overall and "faster" not in overall and "slower" not in overall, out


def _force_valid(run: Any) -> None:
    """The verdict rules under test, not this machine's timing noise (a CV over 5% would make a run degraded)."""
    summary_path = run / "analysis" / "summary.json"
    summary = json.loads(summary_path.read_text())
    summary["validity"] = {"status": "valid", "reasons": []}
    summary_path.write_text(json.dumps(summary))


def test_interleaved_retest_confirms_a_really_slower_program(local_board: Any, tmp_path: Any) -> None:
    """The A/B re-test on a real board: distilbert-small vs its 4x wider feed-forward twin (same name, same inputs)."""
    from orchestrator.deploy.abtest import ABProgram, interleave
    from orchestrator.deploy.runs import RunParams
    from orchestrator.lowering.builtins import resolve_spec
    from orchestrator.lowering.export import lower as lowering
    from orchestrator.results.compare import Comparison, interleaved_verdict
    from orchestrator.transport import connect
    from tests.plugins.artifacts import TEST_CACHE

    specs = PROJECT_ROOT / "tests" / "data" / "specs"
    built = {}
    for name, root in (("distilbert-small", "artifacts"), ("distilbert-small-slow", "artifacts-slow")):
        lowered = lowering.lower(
            resolve_spec(None, specs / f"{name}.json"), variants=[VARIANTS["xnnpack"]], root=TEST_CACHE / root
        )
        built[name] = lowered
    fast, slow = (
        built["distilbert-small"].variants[VARIANTS["xnnpack"]],
        built["distilbert-small-slow"].variants[VARIANTS["xnnpack"]],
    )
    a = ABProgram("A", fast.pte, fast.sidecar.sha256)
    b = ABProgram("B", slow.pte, slow.sidecar.sha256)
    reference_inputs = built["distilbert-small"].paths.reference_inputs
    inputs = (reference_inputs, fast.sidecar.reference_inputs_sha256)
    with connect(local_board) as conn:
        result = interleave(conn, a, b, inputs, RunParams(warmup=2), rounds=5, budget_seconds=0)
        leftovers = conn.run(["ls", f"{conn.workdir}/bundles"], check=False).stdout
    assert result.error is None, result.error
    assert result.rounds == 5 and result.iterations_per_run >= 5
    assert result.confirmed and result.change == "slower", result.reason
    # Re-test bundles are named `<run id>-ab`; a run id's own random hex may start with "ab".
    assert not [name for name in leftovers.split() if name.endswith("-ab")], "re-test bundles are scratch"
    comparison = Comparison(tmp_path, tmp_path, "a", "b", compare_samples([1.0] * 8, [1.0] * 8), None, None, [])
    comparison.sha_a, comparison.sha_b = a.sha256, b.sha256
    interleaved_verdict(comparison, result)
    assert comparison.verdict == Kind.REGRESSION and "confirmed slower" in comparison.verdict_detail


# ---------------------------------------------------------------------------------------------------------------
# `fab compare A B --interleave N --board B` through the real command, on the real local board


def _lower_small(name: str, root: str) -> Any:
    from orchestrator.lowering.artifacts import load_artifact
    from orchestrator.lowering.builtins import resolve_spec
    from orchestrator.lowering.export import lower as lowering
    from tests.plugins.artifacts import TEST_CACHE

    spec = resolve_spec(None, PROJECT_ROOT / "tests" / "data" / "specs" / f"{name}.json")
    lowering.lower(spec, variants=[VARIANTS["xnnpack"]], root=TEST_CACHE / root)
    return load_artifact(spec.name, VARIANTS["xnnpack"], TEST_CACHE / root)


@pytest.fixture(scope="module")
def small_lab(local_board: Any, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Three analysed runs of distilbert-small on the local board: two of the program ("a", "a2") and one of its
    4x wider feed-forward twin ("slow": the same name and graph, another .pte), in a results folder of their own.

    The baseline's program is kept (as a nightly keeps it) in a private state folder; `fab compare` runs with the
    slow twin as the current artifact, so both sides must be found the way a user's would.
    """
    from orchestrator.deploy.runs import RunParams, profile, pull, push_artifact
    from orchestrator.results.analysis import analyze_bundle
    from orchestrator.results.store import new_run_id
    from orchestrator.transport import connect
    from tests.plugins.artifacts import TEST_CACHE
    from tests.plugins.boards import write_inventory

    root = tmp_path_factory.mktemp("compare-lab")
    fast, slow = _lower_small("distilbert-small", "artifacts"), _lower_small("distilbert-small-slow", "artifacts-slow")
    runs = {}
    with connect(local_board) as conn:
        for key, artifact in (("a", fast), ("a2", fast), ("slow", slow)):
            remote = profile(conn, artifact, push_artifact(conn, artifact), RunParams(warmup=2, iterations=10),
                             f"{new_run_id()}-{key}")  # fmt: skip
            assert remote.status == "ok", remote.error
            bundle = pull(conn, remote, artifact, root / "results")
            analyze_bundle(bundle, pte=artifact.pte, sidecar=artifact.sidecar,
                           reference_outputs=artifact.paths.reference_outputs)  # fmt: skip
            runs[key] = bundle
    kept = root / "state" / "programs" / f"{fast.sha256}.pte"
    kept.parent.mkdir(parents=True)
    shutil.copyfile(fast.pte, kept)
    env = {**os.environ, "ETLAB_RESULTS": str(root / "results"), "ETLAB_ARTIFACTS": str(TEST_CACHE / "artifacts-slow"),
           "ETLAB_STATE": str(root / "state")}  # fmt: skip
    inventory = write_inventory(root / "inventory.yaml", [local_board])
    return {"runs": runs, "env": env, "inventory": inventory, "sha": {"fast": fast.sha256, "slow": slow.sha256}}


def fab_compare(lab: dict[str, Any], a: str, b: str, *options: str) -> subprocess.CompletedProcess[str]:
    run_a, run_b = lab["runs"][a].name, lab["runs"][b].name
    return subprocess.run(
        [sys.executable, "-m", "fabric", "compare", run_a, run_b, *options, "--inventory", str(lab["inventory"])],
        cwd=PROJECT_ROOT, env=lab["env"], capture_output=True, text=True, timeout=900,
    )  # fmt: skip


def compare_report(lab: dict[str, Any], a: str, b: str) -> dict[str, Any]:
    return json.loads((lab["runs"][b] / "analysis" / f"compare_vs_{lab['runs'][a].name}.json").read_text())


def test_fab_compare_interleave_confirms_a_really_slower_program(small_lab: dict[str, Any]) -> None:
    result = fab_compare(small_lab, "a", "slow", "--interleave", "8", "--board", "local")
    assert result.returncode == 1, result.stdout + result.stderr
    output = " ".join((result.stdout + result.stderr).split())  # the console wraps long lines
    assert "overall: regression: confirmed slower" in output
    report = compare_report(small_lab, "a", "slow")
    retest = report["retest"]
    assert report["verdict"] == "regression" and retest["confirmed"] and retest["change"] == "slower", retest
    assert retest["rounds"] == 8 and retest["median_b_ms"] > 1.3 * retest["median_a_ms"]
    taken = f"8 rounds of {retest['iterations_per_run']} iterations in {retest['seconds']:.0f} s (budget 180 s)"
    assert retest["budget_seconds"] == 180 and taken in output


def test_fab_compare_interleave_same_program_is_never_a_regression(small_lab: dict[str, Any]) -> None:
    # A budget of 0 s: the re-test stops after the 5 rounds it needs at least, not the 8 asked for.
    result = fab_compare(small_lab, "a", "a2", "--interleave", "8", "--board", "local", "--retest-seconds", "0")
    assert result.returncode == 0, result.stdout + result.stderr
    report = compare_report(small_lab, "a", "a2")
    assert report["verdict"] in ("ok", "drift"), report["verdict_detail"]
    assert report["verdict_detail"].startswith("no program change; interleaved, 5 rounds of ")
    assert report["retest"]["rounds"] == 5 and report["retest"]["budget_seconds"] == 0
    output = " ".join((result.stdout + result.stderr).split())
    assert f"overall: {report['verdict']}: no program change" in output and "REGRESSION" not in output.upper()


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (["--interleave", "2", "--board", "local"], "--interleave must be a number of rounds from 5 to 1000"),
        (["--interleave", "abc", "--board", "local"], "--interleave must be a whole number"),
        (["--interleave", "5"], "--interleave needs exactly one --board"),
        (["--interleave", "5", "--board", "local,local"], "--interleave needs exactly one --board"),
        (["--interleave", "5", "--board", "local", "--retest-seconds", "nan"], "--retest-seconds must be a finite"),
        (["--interleave", "5", "--board", "local", "--retest-seconds=-1"], "--retest-seconds must be a number"),
        (["--board", "local"], "--board only applies to the interleaved re-test"),
    ],
)
def test_fab_compare_bad_options_exit_64_before_anything_runs(
    small_lab: dict[str, Any], options: list[str], message: str
) -> None:
    written = {p for run in small_lab["runs"].values() for p in run.rglob("*compare_vs_*")}
    result = fab_compare(small_lab, "a", "slow", *options)
    assert result.returncode == 64, result.stdout + result.stderr
    assert message in " ".join(result.stderr.split()), result.stderr
    assert {p for run in small_lab["runs"].values() for p in run.rglob("*compare_vs_*")} == written, "nothing written"
