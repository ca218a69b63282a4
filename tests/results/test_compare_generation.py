"""`compare` of two language-model runs (two real nights of smollm2-gen-tiny on the local board,
tests/plugins/generation.py): time to first token, decode speed and the decode step's median side by side with
their ratio, the per-operator part said to be one decode step's, and the verdict still the overall latency's (the
same program on both sides: never a regression). The rest of compare: test_compare.py."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.paths import PROJECT_ROOT
from orchestrator.records import to_data, write_document
from orchestrator.results.compare import compare_runs
from orchestrator.results.documents import load_summary
from orchestrator.results.verdicts import Kind
from tests.plugins.generation import GenerationNights


def night_runs(nights: GenerationNights) -> tuple[Path, Path]:
    """The first night's run (A) and the second's (B)."""
    older, newer = sorted(nights.records(), key=lambda r: r.night)
    assert older.bundle_path and newer.bundle_path
    return Path(older.bundle_path), Path(newer.bundle_path)


def test_two_generation_runs_compare_their_generation_figures(generation_nights: GenerationNights) -> None:
    run_a, run_b = night_runs(generation_nights)
    comparison = compare_runs(run_a, run_b, write=False)
    a, b = load_summary(run_a).generation, load_summary(run_b).generation
    assert a is not None and b is not None
    rows = {row.figure: row for row in comparison.generation}
    assert list(rows) == ["ttft_ms", "decode_tokens_per_s", "token_ms.median"]
    expected = {
        "ttft_ms": (a.ttft_ms, b.ttft_ms),
        "decode_tokens_per_s": (a.decode_tokens_per_s, b.decode_tokens_per_s),
        "token_ms.median": (a.token_ms["median"], b.token_ms["median"]),
    }
    for figure, (value_a, value_b) in expected.items():
        assert value_a and value_b, figure
        assert (rows[figure].a, rows[figure].b) == (value_a, value_b)
        assert rows[figure].ratio == pytest.approx(value_b / value_a)
    assert "one decode step" in comparison.per_operator_scope
    document = write_document(comparison.document())
    assert document["generation"] == to_data(comparison.generation) and "decode step" in document["per_operator"]
    # The verdict is untouched: one program on both sides is drift at most, or inconclusive on a degraded side.
    assert comparison.sha_a == comparison.sha_b
    assert comparison.verdict in (Kind.OK, Kind.DRIFT, Kind.INCONCLUSIVE), comparison.verdict_detail


def test_a_generation_run_against_itself_has_ratios_of_one(generation_nights: GenerationNights) -> None:
    run_a, _ = night_runs(generation_nights)
    comparison = compare_runs(run_a, run_a, write=False)
    assert [row.ratio for row in comparison.generation] == [1.0, 1.0, 1.0]


def test_fab_compare_prints_the_generation_table(generation_nights: GenerationNights, tmp_path: Path) -> None:
    results = tmp_path / "results"
    runs = []
    for run in night_runs(generation_nights):  # copies: compare writes its overlay and report into run B
        copy = results / run.relative_to(generation_nights.results)
        shutil.copytree(run, copy)
        runs.append(copy)
    env = {**os.environ, "ETLAB_RESULTS": str(results), "COLUMNS": "200"}
    proc = subprocess.run(
        [sys.executable, "-m", "fabric", "compare", runs[0].name, runs[1].name, "--markdown"],
        cwd=PROJECT_ROOT, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    said = proc.stdout + proc.stderr
    assert proc.returncode == 0, said
    assert "Generation" in said and "per operator, over one decode step" in said
    report = json.loads((runs[1] / "analysis" / f"compare_vs_{runs[0].name}.json").read_text())
    ratios = {row["label"]: row["ratio"] for row in report["generation"]}
    assert set(ratios) == {"time to first token ms", "decode tokens/s", "decode step median ms"}
    for label, ratio in ratios.items():
        assert label in said and f"{ratio:.3f}×" in said
    # --markdown: llama-bench's table, a prefill and a decode row per run, the runs told apart by their ids
    header = "| model | size | params | backend | threads | run | test | t/s |"
    lines = [" ".join(line.split()) for line in proc.stdout.splitlines()]
    assert header in lines, proc.stdout
    rows = [line.split(" | ") for line in lines[lines.index(header) + 2 :][:4]]
    assert [(row[5], row[6]) for row in rows] == [
        (run.name, test) for run in runs for test in ("pp8", "tg7 @ d8")
    ], proc.stdout  # fmt: skip
    assert all(" ± " in row[7] for row in rows), proc.stdout
