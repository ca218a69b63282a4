"""End to end for HuggingFace models of other input kinds: `fab deploy-and-profile` on the local board lowers a ViT
(float32 pixel_values) and Whisper's encoder (log-mel input_features), feeds the runner the reference inputs, checks
the outputs against eager and writes the overlays. The lowering side is tests/lowering/test_huggingface_lowering.py;
the torchvision image model is test_torchvision_e2e.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.boards.inventory import Board
from orchestrator.paths import PROJECT_ROOT
from tests.plugins.artifacts import ARTIFACT_CACHE
from tests.plugins.boards import write_inventory


@pytest.mark.parametrize(
    ("model", "input_name", "output_shape"),
    [("vit-tiny", "pixel_values", [1, 10]), ("whisper-tiny-encoder-tiny", "input_features", [1, 50, 64])],
)
def test_deploy_and_profile_a_huggingface_vision_and_audio_model_on_the_local_board(
    local_board: Board, tmp_path: Path, model: str, input_name: str, output_shape: list[int]
) -> None:
    inventory = write_inventory(tmp_path / "inventory.yaml", [local_board])
    results = tmp_path / "results"
    env = {**os.environ, "ETLAB_ARTIFACTS": str(ARTIFACT_CACHE), "ETLAB_RESULTS": str(results)}
    proc = subprocess.run(
        [sys.executable, "-m", "fabric", "deploy-and-profile", "--model", model, "--board", "local",
         "--backend", "xnnpack", "--iterations", "3", "--warmup", "1", "--no-explore", "--inventory", str(inventory)],
        cwd=PROJECT_ROOT, env=env, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (run,) = [manifest.parent for manifest in results.glob(f"local/{model}/xnnpack/*/result_manifest.json")]
    timings = json.loads((run / "timings.json").read_text())
    assert timings["inputs_source"] == "file"  # the reference inputs, not generated ones
    sidecar = json.loads((ARTIFACT_CACHE / model / f"{model}_xnnpack.json").read_text())
    assert [item["name"] for item in sidecar["inputs"]] == [input_name]
    summary = json.loads((run / "analysis" / "summary.json").read_text())
    correctness = summary["correctness"]
    assert summary["status"] == "ok" and correctness["checked"] and correctness["ok"], correctness
    (output,) = correctness["outputs"]
    assert output["shape"] == output_shape
    # Random weights give small outputs: the error must be small against them, not only absolutely.
    assert output["max_abs_error"] <= 1e-3 * output["reference_max_abs"], output
    overlays = {path.name for path in (run / "model_explorer").glob("me_overlay_*.json")}
    assert {"me_overlay_median_ms.json", "me_overlay_pct.json"} <= overlays
