"""`fab analyze --by module` on the local board: a factory model of two submodules of very different cost (a 16-wide
linear layer and a 512-wide one, 1000x the multiply-adds) is lowered, profiled with the native runner, and its time
by module ranks the large one first, in the terminal and in summary.json's `modules`. The source map itself is
tests/lowering/test_source_map.py and tests/results/test_source_map.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.boards.inventory import Board
from orchestrator.paths import PROJECT_ROOT
from tests.e2e.test_model_sources_e2e import deploy_on_local
from tests.lowering.test_factory import write_factory

TWO_PARTS = """
import torch


class TwoParts(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.tiny = torch.nn.Linear(16, 16)
        self.large = torch.nn.Linear(512, 512)

    def forward(self, small: torch.Tensor, big: torch.Tensor) -> torch.Tensor:
        return self.large(big) + self.tiny(small).sum()


def build():
    torch.manual_seed(0)
    return TwoParts(), {"small": torch.rand(1, 64, 16), "big": torch.rand(1, 64, 512)}
"""


@pytest.mark.slow
def test_the_larger_module_ranks_first(local_board: Board, tmp_path: Path) -> None:
    spec = str(write_factory(tmp_path, TWO_PARTS))
    artifacts = tmp_path / "artifacts"
    run, _ = deploy_on_local(local_board, tmp_path, "my-small", artifacts, "--spec", spec, "--trust-code")
    sources = json.loads((artifacts / "my-small" / "my-small_xnnpack.sources.json").read_text())
    assert {"tiny", "large"} <= {source["module"] for source in sources["sources"]}
    assert all(s["file"] == "small.py" for s in sources["sources"] if s["module"] in ("tiny", "large"))
    env = {**os.environ, "ETLAB_ARTIFACTS": str(artifacts), "ETLAB_RESULTS": str(tmp_path / "results"),
           "ETLAB_WIDTH": "200"}  # fmt: skip
    ran = subprocess.run(
        [sys.executable, "-m", "fabric", "analyze", "--bundle", str(run), "--by", "module:1"],
        cwd=PROJECT_ROOT, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    said = ran.stdout + ran.stderr
    assert ran.returncode == 0, said
    table = said[said.index("Time by module") :]
    assert table.index("large") < table.index("tiny"), table
    tree = json.loads((run / "analysis" / "summary.json").read_text())["modules"]
    by_name = {row["module"]: row for row in tree["modules"]}
    assert by_name["large"]["total_ms"] > by_name["tiny"]["total_ms"] > 0
    assert by_name["large"]["module_type"] == "torch.nn.modules.linear.Linear"
    assert tree["attributed_share"] > 0.5
