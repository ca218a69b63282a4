"""Extreme JSON values from a board or an edited results folder (issue 34.4), through real `fab` processes on a real
bundle of the native runner: nesting 100,000 deep, 400-digit integers, NaN and ±Infinity, negative times, values of
the wrong type. Planted in the board's files (re-hashed in the manifest, as a board would send them), `fab analyze`
exits 65 naming the file and the field; planted in an analysis's own files (summary.json, ops.json), `fab advise`
and `fab compare` do. Never 70, never a traceback. The typed readers fuzzed: test_fuzz_records.py; the dashboard:
tests/servers/test_dashboard_unreadable.py."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.errors import ExitCode
from orchestrator.paths import PROJECT_ROOT
from tests.plugins.analysis import HUGE_INTEGER, NESTING_BOMB, BundleCase, analyze, plant_json
from tests.plugins.artifacts import ARTIFACT_CACHE

RUN_A, RUN_B = "20261201T000000Z-000aaa", "20261201T000001Z-000bbb"


def fab(*args: str, results: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "ETLAB_RESULTS": str(results), "ETLAB_ARTIFACTS": str(ARTIFACT_CACHE)}
    return subprocess.run([sys.executable, "-m", "fabric", *args], cwd=PROJECT_ROOT, env=env, capture_output=True,
                          text=True, timeout=300)  # fmt: skip


def refused(done: subprocess.CompletedProcess[str], *named: str) -> None:
    """Exit 65, one message naming the file and the field; no traceback."""
    output = done.stdout + done.stderr
    assert done.returncode == ExitCode.DATA, output
    assert "Traceback" not in output and "internal error" not in output, output
    for text in named:
        assert text in done.stderr, (text, done.stderr)


def pulled(case: BundleCase, results: Path, run_id: str, *, analysed: bool = False) -> Path:
    """The bundle as a pulled run under results/local/<model>/<backend>/<run_id>/ (with its analysis if asked)."""
    folder = results / "local" / case.model.sidecar.model / case.model.backend / run_id
    ignore = None if analysed else shutil.ignore_patterns("analysis", "model_explorer")
    shutil.copytree(case.path, folder, ignore=ignore)
    return folder


@pytest.fixture(scope="module")
def analysed_run(runner_bundles: dict[str, BundleCase], tmp_path_factory: pytest.TempPathFactory) -> BundleCase:
    """The native runner's xnnpack bundle, analysed once (its analysis/ is copied into each test's results)."""
    case = runner_bundles["runner_distilbert_xnnpack"]
    copy = BundleCase(tmp_path_factory.mktemp("analysed") / case.path.name, case.model)
    shutil.copytree(case.path, copy.path, ignore=shutil.ignore_patterns("analysis", "model_explorer"))
    analyze(copy)
    return copy


# (file, field, raw JSON, what the message must name): planted in the board's own files, refused by the analysis.
BOARD_VALUES = {
    "timings nesting bomb": ("timings.json", "memory", NESTING_BOMB, "timings.json: nested more than 64 levels"),
    "400-digit peak_rss_bytes": (
        "timings.json", "memory.phases[0].peak_rss_bytes", HUGE_INTEGER,
        "timings.json: memory.phases[0].peak_rss_bytes: a number of 400 characters is out of range",
    ),
    "400-digit warmup_ms": ("timings.json", "warmup_ms[0]", HUGE_INTEGER, "timings.json: warmup_ms[0]: "),
    "400-digit prompt_len": ("timings.json", "generation.prompt_len", HUGE_INTEGER, "generation.prompt_len: "),
    "NaN iteration": ("timings.json", "iterations_ms[1]", "NaN", "timings.json: iterations_ms[1]: NaN is out of"),
    "-Infinity load_ms": ("timings.json", "load_ms", "-Infinity", "timings.json: load_ms: -Infinity"),
    "a negative time": ("timings.json", "iterations_ms[0]", "-5", "timings.json: iterations_ms[0]: -5 is a negative"),
    "manifest nesting bomb": ("result_manifest.json", "error", NESTING_BOMB, "result_manifest.json: nested more"),
}  # fmt: skip


@pytest.mark.parametrize("case", list(BOARD_VALUES), ids=list(BOARD_VALUES))
def test_analyze_refuses_extreme_board_values_by_file_and_field(
    runner_bundles: dict[str, BundleCase], tmp_path: Path, case: str
) -> None:
    name, field, raw, named = BOARD_VALUES[case]
    run = pulled(runner_bundles["runner_distilbert_xnnpack"], tmp_path / "results", RUN_A)
    plant_json(run / name, field, raw)
    refused(fab("analyze", "--run", RUN_A, results=tmp_path / "results"), named)
    assert not (run / "analysis" / "summary.json").exists()


def test_board_conditions_that_cannot_be_read_degrade_the_run(
    runner_bundles: dict[str, BundleCase], tmp_path: Path
) -> None:
    """board_info_*.json is optional: unreadable, the run is analysed, degraded, the reason naming file and field. A
    run.json whose `parameters` is not a mapping is a run without them."""
    run = pulled(runner_bundles["runner_distilbert_xnnpack"], tmp_path / "results", RUN_A)
    plant_json(run / "board_info_before.json", "throttled", NESTING_BOMB)
    plant_json(run / "board_info_after.json", "temperature_c", "NaN")
    plant_json(run / "run.json", "parameters", "true")
    done = fab("analyze", "--run", RUN_A, results=tmp_path / "results")
    assert done.returncode == 0, done.stdout + done.stderr
    reasons = [r["reason"] for r in json.loads((run / "analysis" / "summary.json").read_text())["validity"]["reasons"]]
    assert any("board_info_before.json: nested more than 64 levels" in reason for reason in reasons), reasons
    assert any("board_info_after.json: temperature_c: NaN is out of range" in reason for reason in reasons), reasons


# Planted in the analysis's own files (an edited results folder): refused by every reader of them.
ANALYSIS_VALUES = {
    "NaN median": ("summary.json", "latency.warm.median_ms", "NaN", "summary.json: latency.warm.median_ms: NaN"),
    "400-digit peak": ("summary.json", "memory.peak_rss_bytes", HUGE_INTEGER, "summary.json: memory.peak_rss_bytes"),
    "summary nesting bomb": ("summary.json", "board_conditions", NESTING_BOMB, "summary.json: nested more than 64"),
    "a bool for a count": (
        "summary.json", "latency.iterations", "true", "summary.json: latency.iterations: expected `int`, got `bool`",
    ),
    "a negative count": ("summary.json", "latency.threads", "-2", "summary.json: latency.threads: expected `int` >= 0"),
    "400-digit prompt_len": (
        "summary.json", "generation.prompt_len", HUGE_INTEGER, "summary.json: generation.prompt_len: a number of 400",
    ),
    "Infinity operator time": ("ops.json", "instructions[0].mean_ms", "Infinity", "ops.json: instructions[0].mean_ms"),
    "ops nesting bomb": ("ops.json", "delegates", NESTING_BOMB, "ops.json: nested more than 64 levels"),
    "a negative sample count": ("ops.json", "instructions[0].samples", "-3", "ops.json: instructions[0].samples"),
    "text for a time": ("ops.json", "instructions[1].median_ms", '"fast"', "ops.json: instructions[1].median_ms"),
}  # fmt: skip


@pytest.mark.parametrize("case", list(ANALYSIS_VALUES), ids=list(ANALYSIS_VALUES))
def test_advise_and_compare_refuse_extreme_analysis_values_by_file_and_field(
    analysed_run: BundleCase, tmp_path: Path, case: str
) -> None:
    name, field, raw, named = ANALYSIS_VALUES[case]
    results = tmp_path / "results"
    pulled(analysed_run, results, RUN_A, analysed=True)
    run = pulled(analysed_run, results, RUN_B, analysed=True)
    plant_json(run / "analysis" / name, field, raw)
    refused(fab("advise", "--run", RUN_B, results=results), named)
    refused(fab("compare", RUN_A, RUN_B, results=results), named)
