"""The board agent's `profile`, run as a real subprocess: with the real native runner, with a misbehaving one (hung,
stopped, missing), and the inputs it refuses (run ids, a missing model, usage errors)."""

from __future__ import annotations

import json
import os
import shutil
import signal
from pathlib import Path

import pytest

from orchestrator.versions import executorch_version
from tests.board.agent_helpers import assert_info_schema, sha256, when
from tests.plugins.agent import AgentCli, hung_runner, process_gone, wait_for
from tests.plugins.runner import RunnerModels

BUNDLE_FILES = {
    "timings.json",
    "etdump.etdp",
    "outputs.etlt",
    "runner.log",
    "board_info_before.json",
    "board_info_after.json",
    "run.json",
}

# ------------------------------------------------------------------------------------- profile, real runner


def test_profile_with_the_real_runner_writes_a_verified_bundle(
    provisioned_agent: AgentCli, runner_models: RunnerModels
) -> None:
    agent = provisioned_agent
    # Lay the model out as the workstation pushes it: content-addressed, with its sha256 sidecar.
    model_sha = sha256(runner_models.xnnpack_pte)
    model = agent.workdir / "models" / f"{model_sha}.pte"
    model.parent.mkdir(parents=True)
    shutil.copyfile(runner_models.xnnpack_pte, model)
    Path(f"{model}.sha256").write_text(f"{model_sha}  {model.name}\n")

    result = agent.run(
        "profile",
        "--model", model,
        "--inputs", runner_models.inputs_etlt,
        "--run-id", "run-1",
        "--label", "model=tiny-distilbert",
        "--label", "backend=xnnpack",
        "--warmup", "1",
        "--iterations", "3",
        "--threads", "1",
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    bundle = agent.bundle("run-1")
    assert result.document == {"run_id": "run-1", "bundle": str(bundle), "status": "ok", "error": None}

    manifest = json.loads((bundle / "result_manifest.json").read_text())
    assert manifest["schema"] == 1 and manifest["run_id"] == "run-1"
    assert manifest["status"] == "ok" and manifest["error"] is None and manifest["runner_exit_code"] == 0
    on_disk = {path.name for path in bundle.iterdir()}
    assert on_disk == BUNDLE_FILES | {"result_manifest.json"}
    assert set(manifest["files"]) == BUNDLE_FILES
    for name, entry in manifest["files"].items():
        assert entry == {"sha256": sha256(bundle / name), "size": (bundle / name).stat().st_size}, name
    assert not list((agent.workdir / "bundles").glob(".tmp-*"))

    run = json.loads((bundle / "run.json").read_text())
    assert run["model"] == str(model)
    assert run["model_sha256"] == model_sha and run["model_sha256_source"] == "computed"
    assert manifest["model_sha256"] == model_sha and manifest["inputs_sha256"] == run["inputs_sha256"]
    assert run["hashing_ms"]["model"] >= 0 and run["hashing_ms"]["inputs"] >= 0
    assert run["inputs_sha256"] == sha256(runner_models.inputs_etlt)
    assert run["labels"] == {"model": "tiny-distilbert", "backend": "xnnpack"}
    assert run["parameters"]["warmup"] == 1 and run["parameters"]["iterations"] == 3
    assert run["expect_executorch_version"] == executorch_version()
    assert "--expect-executorch-version" in run["runner_argv"]
    assert when(run["lock_acquired_at"]) <= when(run["started_at"]) <= when(run["ended_at"])

    timings = json.loads((bundle / "timings.json").read_text())
    assert len(timings["iterations_ms"]) == 3 and len(timings["warmup_ms"]) == 1
    assert timings["threads"] == 1 and timings["inputs_source"] == "file"
    before = json.loads((bundle / "board_info_before.json").read_text())
    assert_info_schema(before)
    assert before["runner"]["executorch_version"] == executorch_version()
    assert before["lock_holder"]["run_id"] == "run-1"  # the run holds the lock while it describes the board

    listed = agent.run("bundles").document["bundles"]
    assert [(b["run_id"], b["status"], b["model"]) for b in listed] == [("run-1", "ok", "tiny-distilbert")]
    assert listed[0]["size"] == sum(path.stat().st_size for path in bundle.iterdir())

    again = agent.run("profile", "--model", model, "--run-id", "run-1")
    assert again.returncode == 2 and "already exists" in again.document["error"]


def test_a_corrupt_program_gives_a_failed_bundle_with_the_runners_error(
    provisioned_agent: AgentCli, tmp_path: Path
) -> None:
    corrupt = tmp_path / "corrupt.pte"
    corrupt.write_bytes(os.urandom(4096))
    result = provisioned_agent.run("profile", "--model", corrupt, "--run-id", "corrupt")
    assert result.returncode == 1, result.stderr
    document = result.document
    assert document["status"] == "failed"
    assert (
        document["error"].startswith("etlab_runner: error:") and "not a valid ExecuTorch program" in document["error"]
    )
    manifest = provisioned_agent.read_bundle_json("corrupt", "result_manifest.json")
    assert manifest["status"] == "failed" and manifest["runner_exit_code"] == 4
    assert manifest["error"] == document["error"]
    assert document["error"] in (provisioned_agent.bundle("corrupt") / "runner.log").read_text(errors="replace")
    assert {"runner.log", "run.json", "board_info_before.json", "board_info_after.json"} <= set(manifest["files"])
    run = provisioned_agent.read_bundle_json("corrupt", "run.json")
    assert run["model_sha256"] == sha256(corrupt) and run["model_sha256_source"] == "computed"


def test_the_runner_refuses_a_board_provisioned_for_another_executorch(
    provisioned_agent: AgentCli, runner_models: RunnerModels
) -> None:
    assert provisioned_agent.run("set-state", "executorch_version=0.0.1").returncode == 0
    result = provisioned_agent.run("profile", "--model", runner_models.xnnpack_pte, "--run-id", "mismatch")
    assert result.returncode == 1
    manifest = provisioned_agent.read_bundle_json("mismatch", "result_manifest.json")
    assert manifest["runner_exit_code"] == 8
    assert manifest["error"].startswith("etlab_runner: error:") and "0.0.1" in manifest["error"]


def test_two_profiles_serialize_on_the_board_lock(provisioned_agent: AgentCli, runner_models: RunnerModels) -> None:
    agent = provisioned_agent
    # Runs of real inference bounded by --max-seconds: the first one holds the lock long enough for the checks below.
    model_args = ["--model", str(runner_models.xnnpack_pte), "--warmup", "0", "--iterations", "1000000", "--no-etdump"]
    first_args = [*model_args, "--max-seconds", "5"]
    run_args = [*model_args, "--max-seconds", "1"]
    first = agent.start("profile", "--run-id", "first", *first_args)
    try:
        # lock.json names the holder an instant after the flock is taken, so wait for the name.
        status = wait_for(
            lambda: (doc := agent.run("lock-status").document)["held"] and doc["holder"]["run_id"] == "first" and doc,
            what="the first run to take the lock",
        )
        second = agent.start("profile", "--run-id", "second", "--lock-timeout", "120", *run_args)
        try:
            assert status["holder"]["run_id"] == "first" and status["holder"]["pid"] == first.pid
            assert status["holder"]["pid_alive"] is True and status["holder"]["purpose"] == "profile"

            # Callers that cannot wait get exit 3 and the holder; gc never deletes under a running profile.
            third = agent.run("profile", "--run-id", "third", "--lock-timeout", "0.2", *run_args)
            assert third.returncode == 3, third.stdout + third.stderr
            assert third.document["holder"]["run_id"] == "first"
            gc = agent.run("gc", "--keep", "0", "--lock-timeout", "0.2")
            assert gc.returncode == 3 and gc.document["holder"]["run_id"] == "first"
        finally:
            second_result = agent.finish(second)
    finally:
        first_result = agent.finish(first)

    assert first_result.returncode == 0, first_result.stdout + first_result.stderr
    assert second_result.returncode == 0, second_result.stdout + second_result.stderr
    assert "waiting for the board lock, held by run first" in second_result.stderr
    assert not agent.bundle("third").exists()
    run_first = agent.read_bundle_json("first", "run.json")
    run_second = agent.read_bundle_json("second", "run.json")
    assert json.loads((agent.bundle("first") / "timings.json").read_text())["stopped_early"] is True
    # The second run took the lock only after the first run's runner had finished.
    assert when(run_first["ended_at"]) <= when(run_second["lock_acquired_at"]) <= when(run_second["started_at"])
    assert run_second["lock_waited_s"] > 0
    assert agent.run("lock-status").document == {"held": False, "holder": None}
    assert [b["run_id"] for b in agent.run("bundles").document["bundles"]] == ["second", "first"]


# ------------------------------------------------------------------------------ profile, misbehaving runner


def test_a_hung_runner_is_killed_with_its_whole_process_group(agent: AgentCli, tmp_path: Path) -> None:
    runner, pid_file = hung_runner(tmp_path)
    model = tmp_path / "model.pte"
    model.write_bytes(b"never read by the stand-in")
    result = agent.run(
        "profile", "--model", model, "--run-id", "hung", "--runner", runner, "--timeout", "1", "--kill-grace", "0.5"
    )
    assert result.returncode == 1, result.stdout + result.stderr
    assert result.document["status"] == "timeout"
    assert "timeout" in result.document["error"]
    leader, child = map(int, pid_file.read_text().split())
    assert process_gone(leader) and process_gone(child)
    manifest = agent.read_bundle_json("hung", "result_manifest.json")
    assert manifest["status"] == "timeout" and manifest["runner_exit_code"] == -signal.SIGKILL
    assert "stand-in runner: hanging" in (agent.bundle("hung") / "runner.log").read_text()
    run = agent.read_bundle_json("hung", "run.json")
    assert run["timed_out"] is True and run["expect_executorch_version"] is None
    assert agent.run("lock-status").document["held"] is False


def test_a_stopped_agent_stops_its_runner_and_still_writes_the_bundle(agent: AgentCli, tmp_path: Path) -> None:
    runner, pid_file = hung_runner(tmp_path)
    model = tmp_path / "model.pte"
    model.write_bytes(b"x")
    process = agent.start(
        "profile",
        "--model",
        model,
        "--run-id",
        "stopped",
        "--runner",
        runner,
        "--timeout",
        "300",
        "--kill-grace",
        "0.5",
    )
    wait_for(pid_file.exists, what="the stand-in runner to start")
    process.send_signal(signal.SIGHUP)  # what an ssh session that dies sends
    result = agent.finish(process, timeout=60)
    assert result.returncode == 1, result.stderr
    assert result.document["status"] == "failed" and "SIGHUP" in result.document["error"]
    leader, child = map(int, pid_file.read_text().split())
    assert process_gone(leader) and process_gone(child)
    assert agent.read_bundle_json("stopped", "result_manifest.json")["status"] == "failed"


def test_a_runner_that_cannot_start_gives_a_failed_bundle(agent: AgentCli, tmp_path: Path) -> None:
    wrong_binary = tmp_path / "etlab_runner"
    wrong_binary.write_bytes(b"\x7fELF but not for this machine")
    wrong_binary.chmod(0o755)
    model = tmp_path / "model.pte"
    model.write_bytes(b"x")
    result = agent.run("profile", "--model", model, "--run-id", "cannot-start", "--runner", wrong_binary)
    assert result.returncode == 1, result.stdout + result.stderr
    assert result.document["status"] == "failed"
    assert result.document["error"].startswith(f"cannot start the runner {wrong_binary}: Exec format error")
    manifest = agent.read_bundle_json("cannot-start", "result_manifest.json")
    assert manifest["error"] == result.document["error"] and manifest["runner_exit_code"] is None
    assert "Exec format error" in (agent.bundle("cannot-start") / "runner.log").read_text()


# ---------------------------------------------------------------------------------------- input checking


@pytest.mark.parametrize("run_id", ["../escape", "a/b", "..", "x..y", ".hidden", "", "with space", "semi;colon"])
def test_unsafe_run_ids_are_refused(agent: AgentCli, tmp_path: Path, run_id: str) -> None:
    model = tmp_path / "model.pte"
    model.write_bytes(b"x")
    result = agent.run("profile", "--model", model, "--run-id", run_id, "--runner", "/bin/true")
    assert result.returncode == 2, result.stdout + result.stderr
    assert "invalid run id" in result.document["error"]
    assert not (agent.workdir / "bundles").exists()
    assert not (tmp_path / "escape").exists()


def test_profile_before_provisioning_exits_4(agent: AgentCli, tmp_path: Path) -> None:
    model = tmp_path / "model.pte"
    model.write_bytes(b"x")
    result = agent.run("profile", "--model", model, "--run-id", "r")
    assert result.returncode == 4
    assert "not provisioned" in result.document["error"]


def test_profile_names_a_missing_model(agent: AgentCli, tmp_path: Path) -> None:
    result = agent.run("profile", "--model", tmp_path / "absent.pte", "--run-id", "r", "--runner", "/bin/true")
    assert result.returncode == 2
    assert "absent.pte" in result.document["error"] and "does not exist" in result.document["error"]


def test_usage_errors_are_json_with_exit_2(agent: AgentCli) -> None:
    result = agent.run("profile", "--run-id", "r")
    assert result.returncode == 2
    assert result.document == {"error": "Missing option '--model'.", "exit_code": 2}
    bad_label = agent.run("profile", "--model", "m", "--run-id", "r", "--label", "novalue", "--runner", "/bin/true")
    assert bad_label.returncode == 2
