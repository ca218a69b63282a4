"""A rewritten program under its own name (lowering/program.py) at the edges: `fab lower` with and without
`--rewrites` leaves both programs side by side, and `fab deploy-and-profile --model <the rewritten program>` finds
it by its artifacts and lowers it only with the rewrites its sidecar records (a cache hit, nothing lowered).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.boards.inventory import Board
from orchestrator.commands.program_options import model_spec, rewrite_request
from orchestrator.errors import UsageError
from orchestrator.lowering.artifacts import load_artifact
from orchestrator.lowering.program import ProgramName, with_
from orchestrator.lowering.rewrites.registry import RewriteRequest
from orchestrator.lowering.variants import VARIANTS
from orchestrator.paths import PROJECT_ROOT
from tests.plugins.artifacts import ARTIFACT_CACHE
from tests.plugins.boards import write_inventory

REWRITTEN = "gpt2-tiny.tanh-gelu.bmm-attention.head-at-position"
ALL_THREE = ("tanh-gelu", "bmm-attention", "head-at-position")  # what auto resolves to


def fab(*args: str, results: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "ETLAB_ARTIFACTS": str(ARTIFACT_CACHE), "ETLAB_RESULTS": str(results)}
    return subprocess.run([sys.executable, "-m", "fabric", *args], cwd=PROJECT_ROOT, env=env, capture_output=True,
                          text=True, timeout=900)  # fmt: skip


@pytest.mark.slow
def test_rewritten_program_lives_beside_the_model_and_keeps_its_rewrites(
    local_board: Board, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    results = tmp_path / "results"
    lowered = {}
    for rewrites in ("none", "auto"):
        done = fab("lower", "--model", "gpt2-tiny", "--backend", "portable,xnnpack", "--weights", "random",
                   "--rewrites", rewrites, results=results)  # fmt: skip
        assert done.returncode == 0, done.stdout + done.stderr
        lowered[rewrites] = done.stdout
    # Both programs in place, each with its own sidecar: the second lowering did not replace the first.
    plain = load_artifact("gpt2-tiny", VARIANTS["xnnpack"], ARTIFACT_CACHE)
    rewritten = load_artifact(REWRITTEN, VARIANTS["xnnpack"], ARTIFACT_CACHE)
    assert plain.sidecar.applied_rewrites == () and rewritten.sidecar.applied_rewrites == ALL_THREE
    assert plain.sidecar.model == "gpt2-tiny" and rewritten.sidecar.model == REWRITTEN
    assert rewritten.sidecar.program == ProgramName("gpt2-tiny", rewrites=ALL_THREE)  # recorded as what it is
    assert plain.sha256 != rewritten.sha256 and "rewrites applied: tanh-gelu" in " ".join(lowered["auto"].split())

    # `--model <the rewritten program>`: the spec and the rewrites come from its sidecar.
    monkeypatch.setenv("ETLAB_ARTIFACTS", str(ARTIFACT_CACHE))
    target = model_spec(REWRITTEN, None)
    assert target.name == REWRITTEN and target.model_type == "gpt2"
    request = rewrite_request("none", target)
    assert request == RewriteRequest(names=ALL_THREE) and with_(target, rewrites=request) == target
    assert rewrite_request("auto", target) == request  # the same set, asked again
    with pytest.raises(UsageError, match=rf"--rewrites tanh-gelu: {REWRITTEN} is a rewritten program, lowered with"):
        rewrite_request("tanh-gelu", target)

    inventory = write_inventory(tmp_path / "inventory.yaml", [local_board])
    done = fab("deploy-and-profile", "--model", REWRITTEN, "--backend", "xnnpack", "--weights", "random",
               "--board", "local", "--iterations", "3", "--warmup", "1", "--no-explore", "--inventory", str(inventory),
               results=results)  # fmt: skip
    output = " ".join((done.stdout + done.stderr).split())
    assert done.returncode == 0, output
    # only the backend asked for: the XNNPACK program (the portable one is lowered for Model Explorer alone)
    assert f"{REWRITTEN}: using cached artifacts for xnnpack (nothing changed)" in output, output
    assert f"{REWRITTEN}: rewrites applied" not in output  # nothing was lowered
    assert load_artifact(REWRITTEN, VARIANTS["xnnpack"], ARTIFACT_CACHE).sha256 == rewritten.sha256
    runs = list((results / "local" / REWRITTEN / "xnnpack").glob("*/analysis/summary.json"))
    assert len(runs) == 1 and not (results / "local" / "gpt2-tiny").exists()
