"""End to end for a timm model: `fab deploy-and-profile --model efficientnet-b0-tiny` on the local board lowers the
timm model, feeds the runner its float32 image and checks the logits against eager. The lowering side is
tests/lowering/test_timm.py; the torchvision counterpart is test_torchvision_e2e.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from orchestrator.boards.inventory import Board
from orchestrator.paths import PROJECT_ROOT
from tests.plugins.artifacts import ARTIFACT_CACHE
from tests.plugins.boards import write_inventory

MODEL = "efficientnet-b0-tiny"


def test_deploy_and_profile_a_timm_model_on_the_local_board(local_board: Board, tmp_path: Path) -> None:
    inventory = write_inventory(tmp_path / "inventory.yaml", [local_board])
    results = tmp_path / "results"
    env = {**os.environ, "ETLAB_ARTIFACTS": str(ARTIFACT_CACHE), "ETLAB_RESULTS": str(results)}
    proc = subprocess.run(
        [sys.executable, "-m", "fabric", "deploy-and-profile", "--model", MODEL, "--board", "local",
         "--backend", "xnnpack", "--iterations", "5", "--warmup", "1", "--no-explore", "--inventory", str(inventory)],
        cwd=PROJECT_ROOT, env=env, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (run,) = [manifest.parent for manifest in results.glob(f"local/{MODEL}/xnnpack/*/result_manifest.json")]
    summary = json.loads((run / "analysis" / "summary.json").read_text())
    correctness = summary["correctness"]
    assert summary["status"] == "ok" and correctness["checked"] and correctness["ok"], correctness
    (output,) = correctness["outputs"]
    assert output["shape"] == [1, 10] and output["top1_agreement"] == 1.0
    assert output["max_abs_error"] <= 1e-3 * output["reference_max_abs"], output
