"""End to end for programs the user made: a .pte lowered with ExecuTorch's own API in the test, profiled with
`fab deploy-and-profile --pte` on the local board, without and with `--reference`; and a .pt2 exported in the test,
lowered with `fab lower --exported` and run with `fab run --model NAME`. The lowering and the refusals are in
tests/lowering/test_user_programs.py and tests/commands/test_own_programs.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from orchestrator.boards.inventory import Board
from orchestrator.paths import PROJECT_ROOT
from orchestrator.tensorfile import NamedTensor, write_tensors
from tests.plugins.boards import write_inventory

pytestmark = pytest.mark.slow


class TwoOutputs(torch.nn.Module):
    """A float input through a linear layer and an integer input doubled: two outputs of two dtypes."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.linear = torch.nn.Linear(8, 4)

    def forward(self, x: torch.Tensor, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.relu(self.linear(x)), ids * 2


def _lower_yourself(folder: Path) -> tuple[Path, Path]:
    """A .pte made with ExecuTorch's API (as a user would), and its eager outputs on etlab's generated inputs."""
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.exir import to_edge_transform_and_lower

    module = TwoOutputs().eval()
    example = (torch.randn(2, 8), torch.zeros(3, dtype=torch.int64))
    program = to_edge_transform_and_lower(torch.export.export(module, example), partitioner=[XnnpackPartitioner()])
    pte = folder / "mine.pte"
    with open(pte, "wb") as handle:
        program.to_executorch().write_to_file(handle)
    # etlab's inputs for a bare .pte: standard normal floats from seed 0, zeros for integers
    x = np.random.default_rng(0).standard_normal((2, 8)).astype("float32")
    with torch.no_grad():
        first, second = module(torch.from_numpy(x), torch.zeros(3, dtype=torch.int64))
    reference = folder / "expected.etlt"
    write_tensors(reference, [NamedTensor("out", first.numpy()), NamedTensor("ids", second.numpy())])
    return pte, reference


def _fab(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "fabric", *args], cwd=PROJECT_ROOT, env=env, capture_output=True, text=True, timeout=900
    )


def test_deploy_and_profile_your_own_pte_on_the_local_board(local_board: Board, tmp_path: Path) -> None:
    pte, reference = _lower_yourself(tmp_path)
    inventory = write_inventory(tmp_path / "inventory.yaml", [local_board])
    results = tmp_path / "results"
    env = {**os.environ, "ETLAB_ARTIFACTS": str(tmp_path / "artifacts"), "ETLAB_RESULTS": str(results)}
    common = ["--board", "local", "--iterations", "3", "--warmup", "1", "--no-explore", "--inventory", str(inventory)]

    proc = _fab(["deploy-and-profile", "--pte", str(pte), *common], env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "correctness is not checked" in proc.stdout + proc.stderr
    (run,) = [m.parent for m in results.glob("local/mine/xnnpack/*/result_manifest.json")]
    summary = json.loads((run / "analysis" / "summary.json").read_text())
    assert summary["status"] == "ok"
    assert summary["correctness"]["checked"] is False, summary["correctness"]
    overlays = {path.name for path in (run / "model_explorer").glob("me_overlay_*.json")}
    assert {"me_overlay_median_ms.json", "me_overlay_live_bytes.json"} <= overlays

    proc = _fab(["deploy-and-profile", "--pte", str(pte), "--reference", str(reference), *common], env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    runs = sorted(m.parent for m in results.glob("local/mine/xnnpack/*/result_manifest.json"))
    assert len(runs) == 2
    checked = [json.loads((r / "analysis" / "summary.json").read_text())["correctness"] for r in runs]
    (correctness,) = [c for c in checked if c["checked"]]
    assert correctness["ok"] is True, correctness
    assert [o["shape"] for o in correctness["outputs"]] == [[2, 4], [3]]


def test_lower_your_own_exported_program_and_run_it(local_board: Board, tmp_path: Path) -> None:
    program = torch.export.export(TwoOutputs().eval(), (torch.randn(2, 8), torch.ones(3, dtype=torch.int64)))
    torch.export.save(program, str(tmp_path / "exported-mine.pt2"))
    inventory = write_inventory(tmp_path / "inventory.yaml", [local_board])
    env = {**os.environ, "ETLAB_ARTIFACTS": str(tmp_path / "artifacts"), "ETLAB_RESULTS": str(tmp_path / "results")}

    proc = _fab(["lower", "--exported", str(tmp_path / "exported-mine.pt2"), "--backend", "xnnpack"], env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    sidecar = json.loads((tmp_path / "artifacts/exported-mine/exported-mine_xnnpack.json").read_text())
    assert sidecar["spec"]["model_source"] == "exported-program"
    assert sidecar["delegation"]["delegate_backends"] == {"XnnpackBackend": 1}
    assert [o["shape"] for o in sidecar["outputs"]] == [[2, 4], [3]]
    again = _fab(["lower", "--model", "exported-mine"], env)  # no spec to lower: the hint names its own option
    said = again.stdout + again.stderr
    assert again.returncode == 64 and "no spec to lower it from" in said and "--exported FILE.pt2" in said, said

    run = ["run", "--model", "exported-mine", "--board", "local", "--iterations", "2", "--warmup", "0"]
    proc = _fab([*run, "--inventory", str(inventory)], env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "ok" in proc.stdout
