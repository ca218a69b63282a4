"""`fab advise` at its edge, on recorded runs (tests/data/advice/) in a results folder of its own: the findings
table from the profile alone when the program's artifacts are gone, and exit codes for what cannot be advised on
(64: no such run; 65: a run not analysed, or whose ops.json was damaged), never a traceback."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from orchestrator.paths import PROJECT_ROOT
from tests.advice.advice_helpers import DATA

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
    (run / "analysis" / "ops.json").write_text('{"run_id": "x", "method": "forward", "instructions": [{}]}')
    damaged = fab("--run", RUN_ID, tmp_path=tmp_path)
    assert damaged.returncode == 65 and "not a usable ops document" in damaged.stderr
    assert "Traceback" not in damaged.stderr
    (run / "analysis" / "summary.json").unlink()
    unanalysed = fab("--model", "gpt2-tiny", tmp_path=tmp_path)
    assert unanalysed.returncode == 65 and "has not been analysed" in unanalysed.stderr
