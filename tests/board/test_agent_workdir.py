"""The board agent's workdir: `set-state` and state.json round trips, and `gc` keeping the newest bundles, the
models they use and protected baselines."""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

from tests.board.agent_helpers import sha256
from tests.plugins.agent import AgentCli
from tests.plugins.runner import RunnerModels

# ------------------------------------------------------------------------------------------------ state


def test_state_round_trip_and_tilde_workdir(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    agent = AgentCli(Path("~/boardwd"), env={"HOME": str(home)})
    assert agent.run("state").document == {
        "provisioned": False,
        "path": str(home / "boardwd" / "state.json"),
        "state": None,
    }
    result = agent.run("set-state", "executorch_version=1.5.1", "board_tree_sha256=abc", "provisioned_at=now")
    assert result.returncode == 0, result.stderr
    assert json.loads((home / "boardwd" / "state.json").read_text()) == {
        "executorch_version": "1.5.1",
        "board_tree_sha256": "abc",
        "provisioned_at": "now",
    }
    assert agent.run("set-state", "--unset", "provisioned_at").document["state"] == {
        "executorch_version": "1.5.1",
        "board_tree_sha256": "abc",
    }
    unknown = agent.run("set-state", "colour=blue")
    assert unknown.returncode == 2 and "colour" in unknown.document["error"]
    assert agent.run("state").document["state"]["executorch_version"] == "1.5.1"


# ------------------------------------------------------------------------------------------------- gc


def test_gc_keeps_the_newest_bundles_and_the_models_they_use(
    provisioned_agent: AgentCli, runner_models: RunnerModels
) -> None:
    agent = provisioned_agent
    models = agent.workdir / "models"
    inputs = agent.workdir / "inputs"
    models.mkdir()
    inputs.mkdir()

    def place(source: Path, folder: Path, suffix: str) -> Path:
        digest = sha256(source)
        target = folder / f"{digest}{suffix}"
        shutil.copyfile(source, target)
        Path(f"{target}.sha256").write_text(digest + "\n")
        return target

    old_model = place(runner_models.portable_pte, models, ".pte")  # used only by the oldest bundle
    kept_model = place(runner_models.xnnpack_pte, models, ".pte")  # used by the kept bundles
    kept_inputs = place(runner_models.inputs_etlt, inputs, ".etlt")
    unused_old = models / ("0" * 64 + ".pte")
    unused_old.write_bytes(b"old and unused")
    unused_recent = models / ("1" * 64 + ".pte")
    unused_recent.write_bytes(b"recent and unused")
    runs = [("oldest", old_model, None), ("middle", kept_model, kept_inputs), ("newest", kept_model, kept_inputs)]
    for run_id, model, model_inputs in runs:
        extra = ["--inputs", str(model_inputs)] if model_inputs else []
        result = agent.run("profile", "--model", model, "--run-id", run_id, "--iterations", "1", "--no-etdump", *extra)
        assert result.returncode == 0, result.stdout + result.stderr

    three_days_ago = time.time() - 3 * 86400
    for path in (old_model, kept_model, kept_inputs, unused_old):
        os.utime(path, (three_days_ago, three_days_ago))
    stale_tmp = agent.workdir / "bundles" / ".tmp-crashed"
    stale_tmp.mkdir()
    (stale_tmp / "runner.log").write_text("left by a killed agent")
    os.utime(stale_tmp, (time.time() - 7200, time.time() - 7200))
    fresh_tmp = agent.workdir / "bundles" / ".tmp-recent"
    fresh_tmp.mkdir()

    assert [b["run_id"] for b in agent.run("bundles").document["bundles"]] == ["newest", "middle", "oldest"]
    expected_freed = (
        sum(path.stat().st_size for path in agent.bundle("oldest").iterdir())
        + len("left by a killed agent")
        + sum(path.stat().st_size for path in (old_model, Path(f"{old_model}.sha256"), unused_old))
    )
    dry = agent.run("gc", "--keep", "2", "--dry-run").document
    assert dry["bytes_freed"] == expected_freed and agent.bundle("oldest").exists() and old_model.exists()

    result = agent.run("gc", "--keep", "2")
    assert result.returncode == 0, result.stderr
    document = result.document
    assert document["kept"] == ["newest", "middle"]
    assert document["removed"] == {
        "bundles": ["oldest"],
        "temporaries": [".tmp-crashed"],
        "models": sorted([old_model.name, unused_old.name]),
        "inputs": [],
    }
    assert document["bytes_freed"] == expected_freed
    assert not agent.bundle("oldest").exists() and agent.bundle("middle").exists()
    assert not old_model.exists() and not Path(f"{old_model}.sha256").exists() and not unused_old.exists()
    assert kept_model.exists() and kept_inputs.exists() and unused_recent.exists() and fresh_tmp.exists()
    assert [b["run_id"] for b in agent.run("bundles").document["bundles"]] == ["newest", "middle"]


def test_gc_never_removes_a_protected_baseline(provisioned_agent: AgentCli) -> None:
    agent = provisioned_agent
    models = agent.workdir / "models"
    models.mkdir(exist_ok=True)
    baseline, other = models / ("2" * 64 + ".pte"), models / ("3" * 64 + ".pte")
    for path in (baseline, other):
        path.write_bytes(b"an old program no bundle uses")
        os.utime(path, (time.time() - 3 * 86400, time.time() - 3 * 86400))
    result = agent.run("gc", "--keep", "0", "--protect", "2" * 64)
    assert result.returncode == 0, result.stderr
    assert other.name in result.document["removed"]["models"] and not other.exists()
    assert baseline.exists(), "a nightly baseline stays on the board for the interleaved re-test"
