"""End to end on the local board, one tiny model per model source and input kind: `fab deploy-and-profile` lowers it,
feeds the runner its reference inputs (a float32 image, log-mel features, a factory's two inputs) and checks every
output against eager, relative to the output's own scale (random weights give small outputs). The lowering side of
each source is in tests/lowering/ (test_torchvision.py, test_timm.py, test_huggingface_*.py, test_factory.py); your
own `.pte` and `.pt2` are test_own_programs_e2e.py, HF text models the whole chains of test_e2e.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from orchestrator.boards.inventory import Board
from orchestrator.paths import PROJECT_ROOT
from tests.lowering.test_factory import write_factory
from tests.plugins.artifacts import ARTIFACT_CACHE
from tests.plugins.boards import write_inventory

OVERLAYS = {"me_overlay_median_ms.json", "me_overlay_pct.json", "me_overlay_live_bytes.json"}


def deploy_on_local(board: Board, tmp_path: Path, model: str, artifacts: Path, *chosen: str) -> tuple[Path, str]:
    """`fab deploy-and-profile` of `chosen` (`--model M` or `--spec F ...`) on the local board: the run's folder, and
    what fab said."""
    inventory = write_inventory(tmp_path / "inventory.yaml", [board])
    results = tmp_path / "results"
    env = {**os.environ, "ETLAB_ARTIFACTS": str(artifacts), "ETLAB_RESULTS": str(results)}
    proc = subprocess.run(
        [sys.executable, "-m", "fabric", "deploy-and-profile", *chosen, "--board", "local", "--backend", "xnnpack",
         "--iterations", "3", "--warmup", "1", "--no-explore", "--inventory", str(inventory)],
        cwd=PROJECT_ROOT, env=env, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    said = proc.stdout + proc.stderr
    assert proc.returncode == 0, said
    (run,) = [manifest.parent for manifest in results.glob(f"local/{model}/xnnpack/*/result_manifest.json")]
    timings = json.loads((run / "timings.json").read_text())
    assert timings["inputs_source"] == "file"  # the reference inputs, not ones the runner generated
    assert {path.name for path in (run / "model_explorer").glob("me_overlay_*.json")} >= OVERLAYS
    return run, said


def checked_output(run: Path) -> dict[str, Any]:
    """The one output's correctness, which must pass, its error small against the output's own scale."""
    summary = json.loads((run / "analysis" / "summary.json").read_text())
    correctness = summary["correctness"]
    assert summary["status"] == "ok" and correctness["checked"] and correctness["ok"], correctness
    (output,) = correctness["outputs"]
    assert output["max_abs_error"] <= 1e-3 * output["reference_max_abs"], output
    return output


@pytest.mark.parametrize(
    ("model", "input_name", "output_shape", "kind"),
    [
        ("mobilenet-v2-tiny", "pixel_values", [1, 10], "logits"),  # torchvision
        ("efficientnet-b0-tiny", "pixel_values", [1, 10], "logits"),  # timm
        ("vit-tiny", "pixel_values", [1, 10], "logits"),  # HuggingFace vision
        ("whisper-tiny-encoder-tiny", "input_features", [1, 50, 64], "values"),  # HuggingFace audio
    ],
)
def test_a_built_in_model_of_each_source_and_input_kind(
    local_board: Board, tmp_path: Path, model: str, input_name: str, output_shape: list[int], kind: str
) -> None:
    run, _ = deploy_on_local(local_board, tmp_path, model, ARTIFACT_CACHE, "--model", model)
    sidecar = json.loads((ARTIFACT_CACHE / model / f"{model}_xnnpack.json").read_text())
    assert [item["name"] for item in sidecar["inputs"]] == [input_name]
    output = checked_output(run)
    assert output["shape"] == output_shape and output["kind"] == kind
    if kind == "logits":
        assert output["top1_agreement"] == 1.0
    else:  # hidden states: no top-1 to speak of
        assert output.get("top1_agreement") is None


def test_a_factory_module(local_board: Board, tmp_path: Path) -> None:
    """`--spec small.json --trust-code`: the spec's factory runs, its module is lowered and fed its own two
    example inputs."""
    spec = str(write_factory(tmp_path))
    chosen = ("--spec", spec, "--trust-code")
    run, said = deploy_on_local(local_board, tmp_path, "my-small", tmp_path / "artifacts", *chosen)
    assert "running factory build from" in said
    assert checked_output(run)["shape"] == [1, 4]
