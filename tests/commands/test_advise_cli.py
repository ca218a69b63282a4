"""`fab advise` at its edge, on recorded runs (tests/data/advice/) in a results folder of its own: the findings
table from the profile alone when the program's artifacts are gone, and exit codes for what cannot be advised on
(64: no such run; 65: a run not analysed, or whose ops.json was damaged), never a traceback; and `--try` on the
local board, end to end."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.boards.inventory import Board
from orchestrator.lowering.rewrites.registry import REWRITES, without_superseded
from orchestrator.paths import PROJECT_ROOT
from tests.advice.advice_helpers import DATA
from tests.plugins.artifacts import ARTIFACT_CACHE
from tests.plugins.boards import write_inventory

RUN_ID = "20261201T000000Z-000abc"


def fab(*args: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "ETLAB_RESULTS": str(tmp_path / "results"), "ETLAB_ARTIFACTS": str(tmp_path / "artifacts")}
    return subprocess.run(
        [sys.executable, "-m", "fabric", "advise", *args], cwd=PROJECT_ROOT, env=env, capture_output=True, text=True,
        timeout=120,
    )  # fmt: skip


def recorded_run(tmp_path: Path, model: str = "gpt2-tiny") -> Path:
    run = tmp_path / "results" / "local" / model / "xnnpack" / RUN_ID
    (run / "analysis").mkdir(parents=True)
    (run / "result_manifest.json").write_text(json.dumps({"run_id": RUN_ID}))
    for name in ("ops", "summary"):
        shutil.copy(DATA / model / f"{name}.json", run / "analysis" / f"{name}.json")
    return run


def test_advise_on_a_recorded_run_without_its_artifacts(tmp_path: Path) -> None:
    run = recorded_run(tmp_path)
    result = fab("--run", RUN_ID[:12], tmp_path=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "no artifact for this run's program" in result.stderr
    assert "Advice for run" in result.stdout and "aten::pow" in result.stdout and "F1" in result.stdout
    assert "--rewrites" not in result.stdout  # without the spec nothing says a rewrite applies
    assert json.loads((run / "analysis" / "advice.json").read_text())["findings"]


def test_what_cannot_be_advised_on(tmp_path: Path) -> None:
    assert fab(tmp_path=tmp_path).returncode == 64  # no runs at all
    run = recorded_run(tmp_path)
    unknown = fab("--run", "nosuch", tmp_path=tmp_path)
    assert unknown.returncode == 64 and "no pulled run 'nosuch'" in unknown.stderr
    (run / "analysis" / "ops.json").write_text('{"run_id": "x", "method": "forward", "instructions": []}')
    damaged = fab("--run", RUN_ID, tmp_path=tmp_path)
    assert damaged.returncode == 65 and "ops.json: delegates: is missing" in damaged.stderr  # file and field
    assert "Traceback" not in damaged.stderr
    (run / "analysis" / "summary.json").unlink()
    unanalysed = fab("--model", "gpt2-tiny", tmp_path=tmp_path)
    assert unanalysed.returncode == 65 and "has not been analysed" in unanalysed.stderr


@pytest.mark.slow
def test_try_measures_each_proposed_rewrite_on_the_local_board(local_board: Board, tmp_path: Path) -> None:
    """`fab advise --try --each` on a run of DistilBERT as exported: the two rewrites that apply to it, together and
    one by one, each checked against the original's outputs and measured with an interleaved A/B."""
    results = tmp_path / "results"
    inventory = write_inventory(tmp_path / "inventory.yaml", [local_board])
    # wide enough that no header or title wraps, whatever the figures' widths in this run
    env = {"ETLAB_ARTIFACTS": str(ARTIFACT_CACHE), "ETLAB_RESULTS": str(results), "ETLAB_INVENTORY": str(inventory),
           "ETLAB_WIDTH": "400"}  # fmt: skip
    ran = run_fab("deploy-and-profile", "--model", "distilbert-tiny", "--backend", "xnnpack", "--weights", "random",
                  "--board", "local", "--iterations", "5", "--warmup", "1", "--no-explore", env=env)  # fmt: skip
    assert ran.returncode == 0, ran.stdout + ran.stderr
    (run,) = (results / "local" / "distilbert-tiny" / "xnnpack").iterdir()
    tried = run_fab("advise", "--run", run.name, "--try", "--each", "--rounds", "5", "--retest-seconds", "1", env=env)
    assert tried.returncode == 0, tried.stdout + tried.stderr
    advice = json.loads((run / "analysis" / "advice.json").read_text())
    proposed = [f["rewrite"] for f in advice["findings"] if f["rewrite"]]
    # SDPA's mask operators (eager-attention) and its 4-D matmuls' expand_copy (bmm-attention), and the head
    assert sorted(proposed) == ["bmm-attention", "eager-attention", "head-at-position"]
    trial = json.loads((run / "analysis" / "advice_trial.json").read_text())
    together = list(without_superseded(proposed))
    assert "eager-attention" not in together  # bmm-attention makes its change too
    assert [set(v["rewrites"]) for v in trial["variants"]] == [set(together), *({name} for name in proposed)]
    for variant in trial["variants"]:
        covered = {*variant["rewrites"], *(old for name in variant["rewrites"] for old in REWRITES[name].supersedes)}
        predicted = sum(f["saving_ms"] for f in advice["findings"] if f["rewrite"] in covered)
        assert variant["predicted_ms"] == pytest.approx(predicted)
        assert variant["predicted_share"] == pytest.approx(predicted / advice["method_ms"])
        assert variant["outputs"]["sqnr_db"] >= 40
        retest = variant["retest"]
        assert retest["rounds"] >= 5 and retest["median_a_ms"] > 0 and retest["median_b_ms"] > 0
        assert variant["measured_ms"] == pytest.approx(retest["median_a_ms"] - retest["median_b_ms"])
        at_pace = variant["predicted_share"] * retest["median_a_ms"]
        assert variant["prediction_error"] == pytest.approx((at_pace - variant["measured_ms"]) / variant["measured_ms"])
    assert "Advice tried on local" in tried.stdout and "prediction error" in tried.stdout

    # A run of a variant with one rewrite: the other is still proposed, but --try measures against the model as
    # exported, so it says which run to advise on instead.
    rewritten = next(v["name"] for v in trial["variants"] if v["rewrites"] == ["eager-attention"])
    again = run_fab("deploy-and-profile", "--model", rewritten, "--backend", "xnnpack", "--board", "local",
                    "--iterations", "3", "--warmup", "1", "--no-explore", env=env)  # fmt: skip
    assert again.returncode == 0, again.stdout + again.stderr
    refused = run_fab("advise", "--model", rewritten, "--try", env=env)
    assert refused.returncode == 64 and "has rewrites applied already" in refused.stderr, refused.stderr


@pytest.mark.slow
def test_try_measures_etlab_s_attention_on_a_static_cache_generation_run(local_board: Board, tmp_path: Path) -> None:
    """`fab advise --try` on a run of smollm2-gen-tiny lowered with `--attention sdpa`: the advisor proposes
    `--attention etlab` and the rewrites that apply, one change; the trial lowers that program (etlab's attention,
    the rewrites, under its own name), checks its generated ids against the original's and A/B-tests the two
    generate loops on the board."""
    results = tmp_path / "results"
    inventory = write_inventory(tmp_path / "inventory.yaml", [local_board])
    env = {"ETLAB_ARTIFACTS": str(ARTIFACT_CACHE), "ETLAB_RESULTS": str(results), "ETLAB_INVENTORY": str(inventory)}
    ran = run_fab("deploy-and-profile", "--model", "smollm2-gen-tiny", "--attention", "sdpa", "--backend", "xnnpack",
                  "--weights", "random", "--board", "local", "--iterations", "3", "--warmup", "1", "--no-explore",
                  env=env)  # fmt: skip
    assert ran.returncode == 0, ran.stdout + ran.stderr
    (run,) = (results / "local" / "smollm2-gen-tiny.sdpa" / "xnnpack").iterdir()
    tried = run_fab("advise", "--run", run.name, "--try", "--rounds", "5", "--retest-seconds", "1", env=env)
    assert tried.returncode == 0, tried.stdout + tried.stderr
    advice = json.loads((run / "analysis" / "advice.json").read_text())
    (switch,) = [f for f in advice["findings"] if f["attention"]]
    assert switch["kind"] == "attention" and switch["fix"] == "--attention etlab" and switch["saving_ms"] > 0
    trial = json.loads((run / "analysis" / "advice_trial.json").read_text())
    rewriting = [f for f in advice["findings"] if f["rewrite"]]
    (variant,) = trial["variants"]  # one kind of change: the attention and the rewrites in one program
    assert variant["attention"] == "etlab" and set(variant["rewrites"]) == {f["rewrite"] for f in rewriting}
    assert variant["name"] == ".".join(["smollm2-gen-tiny", *variant["rewrites"]])
    assert variant["predicted_ms"] == pytest.approx(switch["saving_ms"] + sum(f["saving_ms"] or 0 for f in rewriting))
    sidecar = json.loads((ARTIFACT_CACHE / variant["name"] / f"{variant['name']}_xnnpack.json").read_text())
    assert sidecar["generation"]["attention"] == "etlab" and sidecar["rewrites"] == variant["rewrites"]
    retest = variant["retest"]
    assert retest["rounds"] >= 5 and retest["median_a_ms"] > 0 and retest["median_b_ms"] > 0
    assert variant["measured_ms"] == pytest.approx(retest["median_a_ms"] - retest["median_b_ms"])
    assert "--attention etlab" in " ".join(tried.stdout.split())


def run_fab(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "fabric", *args], cwd=PROJECT_ROOT, env={**os.environ, **env},
                          capture_output=True, text=True, timeout=900)  # fmt: skip
