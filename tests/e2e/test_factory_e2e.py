"""End to end for a user's own module: `fab deploy-and-profile --spec small.json --trust-code` on the local board
runs the spec's factory, lowers its module, feeds the runner the factory's two example inputs and checks the output
against eager. The lowering side (and the refusal without --trust-code) is tests/lowering/test_factory.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from orchestrator.boards.inventory import Board
from orchestrator.paths import PROJECT_ROOT
from tests.lowering.test_factory import write_factory
from tests.plugins.boards import write_inventory


def test_deploy_and_profile_a_factory_module_on_the_local_board(local_board: Board, tmp_path: Path) -> None:
    inventory = write_inventory(tmp_path / "inventory.yaml", [local_board])
    spec = write_factory(tmp_path)
    results = tmp_path / "results"
    env = {**os.environ, "ETLAB_ARTIFACTS": str(tmp_path / "artifacts"), "ETLAB_RESULTS": str(results)}
    proc = subprocess.run(
        [sys.executable, "-m", "fabric", "deploy-and-profile", "--spec", str(spec), "--trust-code", "--board", "local",
         "--backend", "xnnpack", "--iterations", "5", "--warmup", "1", "--no-explore", "--inventory", str(inventory)],
        cwd=PROJECT_ROOT, env=env, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "running factory build from" in proc.stderr + proc.stdout
    (run,) = [manifest.parent for manifest in results.glob("local/my-small/xnnpack/*/result_manifest.json")]
    timings = json.loads((run / "timings.json").read_text())
    assert timings["inputs_source"] == "file"  # the factory's example inputs, not generated ones
    summary = json.loads((run / "analysis" / "summary.json").read_text())
    correctness = summary["correctness"]
    assert summary["status"] == "ok" and correctness["checked"] and correctness["ok"], correctness
    (output,) = correctness["outputs"]
    assert output["shape"] == [1, 4]
    assert output["max_abs_error"] <= 1e-3 * output["reference_max_abs"], output
