"""The board agent, run as a real subprocess against temporary workdirs, with the real native runner."""

from __future__ import annotations

import datetime
import hashlib
import json
import os
import shlex
import shutil
import signal
import stat
import subprocess
import sys
import time
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from orchestrator.versions import executorch_version
from tests.plugins.agent import AGENT_DIR, AgentCli, hung_runner, process_gone, wait_for
from tests.plugins.runner import RunnerModels, executorch_sdk_dir

sys.path.insert(0, str(AGENT_DIR))
from etlab_agent import info as agent_info

BUNDLE_FILES = {
    "timings.json",
    "etdump.etdp",
    "outputs.etlt",
    "runner.log",
    "board_info_before.json",
    "board_info_after.json",
    "run.json",
}
INFO_TYPES: dict[str, tuple[type, ...]] = {
    "schema": (int,),
    "collected_at": (str,),
    "hostname": (str,),
    "model": (str, type(None)),
    "arch": (str, type(None)),
    "cpu": (dict,),
    "cores_online": (int, type(None)),
    "cpufreq": (list,),
    "governor": (str, type(None)),
    "temperature_c": (float, type(None)),
    "temperature_zone": (str, type(None)),
    "thermal_zones": (list,),
    "vcgencmd_temp_c": (float, type(None)),
    "throttled": (dict, type(None)),
    "memory": (dict,),
    "kernel": (str, type(None)),
    "os_release": (str, type(None)),
    "python": (str,),
    "glibc": (str, type(None)),
    "state": (dict, type(None)),
    "runner": (dict, type(None)),
    "perf": (dict,),
    "lock_holder": (dict, type(None)),
}
NO_FLAGS = dict.fromkeys(agent_info.THROTTLED_BITS.values(), False)


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def when(stamp: str) -> datetime.datetime:
    return datetime.datetime.fromisoformat(stamp)


def assert_info_schema(document: dict[str, Any]) -> None:
    assert set(document) == set(INFO_TYPES), set(document) ^ set(INFO_TYPES)
    for key, types in INFO_TYPES.items():
        assert isinstance(document[key], types), (key, document[key])
    assert set(document["memory"]) == {"total_kb", "available_kb"}
    assert set(document["cpu"]) == {"core", "midr", "hwcap", "aes"}
    for policy in document["cpufreq"]:
        assert set(policy) == {"policy", "cpus", "cur_khz", "min_khz", "max_khz", "hw_max_khz", "governor"}
    for zone in document["thermal_zones"]:
        assert set(zone) == {"zone", "type", "temp_c"}


# ---------------------------------------------------------------------------------------------------- info


def test_info_on_this_machine_has_the_documented_schema(agent: AgentCli) -> None:
    result = agent.run("info")
    assert result.returncode == 0, result.stderr
    document = result.document
    assert_info_schema(document)
    assert document["python"].count(".") == 2
    assert document["cores_online"] >= 1
    assert document["memory"]["total_kb"] > 0
    assert document["state"] is None and document["runner"] is None and document["lock_holder"] is None


def test_info_parses_a_throttled_raspberry_pi_4(agent: AgentCli, board_sample_env: Callable) -> None:
    result = agent.run("info", env=board_sample_env("rpi4"))
    assert result.returncode == 0, result.stderr
    document = result.document
    assert_info_schema(document)
    assert document["model"] == "Raspberry Pi 4 Model B Rev 1.4"  # trailing NUL stripped
    assert document["cores_online"] == 4
    assert document["cpufreq"] == [
        {
            "policy": "policy0",
            "cpus": [0, 1, 2, 3],
            "cur_khz": 600000,
            "min_khz": 600000,
            "max_khz": 1800000,
            "hw_max_khz": 1800000,
            "governor": "ondemand",
        }
    ]
    assert document["governor"] == "ondemand"
    assert document["temperature_c"] == pytest.approx(81.768)
    assert document["temperature_zone"] == "cpu-thermal"
    assert document["vcgencmd_temp_c"] == pytest.approx(81.8)
    # 0x50005: under-voltage now, throttled now, and both have occurred.
    throttled = document["throttled"]
    assert throttled["raw"] == "0x50005" and throttled["value"] == 0x50005
    assert throttled["flags"] == dict(
        NO_FLAGS, under_voltage_now=True, throttled_now=True, under_voltage_occurred=True, throttling_occurred=True
    )
    assert throttled["active"] == [
        "under_voltage_now",
        "throttled_now",
        "under_voltage_occurred",
        "throttling_occurred",
    ]
    assert document["memory"] == {"total_kb": 3884332, "available_kb": 3391256}
    assert document["os_release"] == "Debian GNU/Linux 11 (bullseye)"
    assert document["kernel"] == "6.1.21-v8+"
    # The core from MIDR, AES from AT_HWCAP: a Pi 4's Cortex-A72 has no AES instructions.
    assert document["cpu"] == {"core": "Cortex-A72", "midr": "0x410fd083", "hwcap": "0x887", "aes": False}


def test_info_parses_a_healthy_raspberry_pi_5(agent: AgentCli, board_sample_env: Callable) -> None:
    document = agent.run("info", env=board_sample_env("rpi5")).document
    assert document["model"] == "Raspberry Pi 5 Model B Rev 1.0"
    assert document["cpufreq"][0]["max_khz"] == 2400000
    assert document["cpufreq"][0]["cur_khz"] == 2400000
    assert document["temperature_c"] == pytest.approx(48.3)
    assert document["vcgencmd_temp_c"] == pytest.approx(48.3)
    assert document["throttled"]["value"] == 0
    assert document["throttled"]["flags"] == NO_FLAGS and document["throttled"]["active"] == []
    assert document["memory"]["total_kb"] == 8245936
    assert document["os_release"] == "Debian GNU/Linux 12 (bookworm)"


def test_info_parses_a_multi_cluster_board_without_vcgencmd(agent: AgentCli, board_sample_env: Callable) -> None:
    document = agent.run("info", env=board_sample_env("rk3588")).document
    assert document["model"] == "Radxa ROCK 5 Model B"
    assert document["cores_online"] == 8
    assert [(p["policy"], p["cpus"], p["max_khz"]) for p in document["cpufreq"]] == [
        ("policy0", [0, 1, 2, 3], 1800000),
        ("policy4", [4, 5], 2400000),
        ("policy6", [6, 7], 2400000),
    ]
    assert document["governor"] == "schedutil"
    assert len(document["thermal_zones"]) == 7
    assert document["temperature_zone"] == "soc-thermal"
    assert document["temperature_c"] == pytest.approx(43.49)
    assert document["throttled"] is None and document["vcgencmd_temp_c"] is None


def test_info_with_nothing_to_read_gives_nulls_not_a_crash(agent: AgentCli, tmp_path: Path) -> None:
    empty = tmp_path / "empty-sysroot"
    empty.mkdir()
    broken_vcgencmd = tmp_path / "vcgencmd"
    broken_vcgencmd.write_text("#!/bin/sh\necho 'garbage output'\n")
    broken_vcgencmd.chmod(0o755)
    result = agent.run("info", env={"ETLAB_AGENT_SYSROOT": str(empty), "ETLAB_AGENT_VCGENCMD": str(broken_vcgencmd)})
    assert result.returncode == 0, result.stderr
    document = result.document
    assert_info_schema(document)
    for key in ("model", "cores_online", "governor", "temperature_c", "throttled", "vcgencmd_temp_c", "os_release"):
        assert document[key] is None, key
    assert document["cpufreq"] == [] and document["thermal_zones"] == []
    assert document["memory"] == {"total_kb": None, "available_kb": None}


@pytest.mark.parametrize(
    ("text", "active"),
    [
        ("throttled=0x1", ["under_voltage_now"]),
        ("throttled=0x2", ["arm_frequency_capped_now"]),
        ("throttled=0x4", ["throttled_now"]),
        ("throttled=0x8", ["soft_temperature_limit_now"]),
        ("throttled=0x10000", ["under_voltage_occurred"]),
        ("throttled=0x20000", ["arm_frequency_capping_occurred"]),
        ("throttled=0x40000", ["throttling_occurred"]),
        ("throttled=0x80000", ["soft_temperature_limit_occurred"]),
        (
            "throttled=0xe0000",
            ["arm_frequency_capping_occurred", "throttling_occurred", "soft_temperature_limit_occurred"],
        ),
    ],
)
def test_each_documented_throttled_bit(text: str, active: list[str]) -> None:
    parsed = agent_info.parse_throttled(text)
    assert parsed is not None
    assert parsed["active"] == active
    assert [name for name, on in parsed["flags"].items() if on] == active


def test_unparseable_probe_outputs_are_null() -> None:
    assert agent_info.parse_throttled('error=1 error_msg="Command not registered"') is None
    assert agent_info.parse_measure_temp("temp=?") is None
    assert agent_info.parse_cpu_list("0-3,6,8-9") == [0, 1, 2, 3, 6, 8, 9]
    assert agent_info.parse_cpu_list("x-y") is None


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


# ------------------------------------------------------------------- profile, hashing while the runner loads


def content_addressed(agent: AgentCli, source: Path, kind: str, suffix: str) -> Path:
    """Lay a file out as a push does: named by its sha256, with its sidecar."""
    digest = sha256(source)
    path = agent.workdir / kind / f"{digest}{suffix}"
    path.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(source, path)
    Path(f"{path}.sha256").write_text(f"{digest}  {path.name}\n")
    return path


def gated_runner(folder: Path) -> tuple[Path, Path]:
    """Test-only stand-in runner that honours --start-fd as etlab_runner does: it reads one byte and "executes"
    (writes the marker) only on `g`; it logs every call's first argument to `calls` beside the marker. Returns the
    script and the marker file."""
    marker = folder / "executed"
    script = folder / "gated_runner.sh"
    script.write_text(
        "#!/bin/sh\n"
        f'echo "$1" >> {shlex.quote(str(folder / "calls"))}\n'
        'if [ "$1" = --version ]; then echo \'{"runner_version": "stand-in", "executorch_version": "0"}\'; exit 0; fi\n'
        'if [ "$1" = --probe-counters ]; then echo \'{"counters": {"cycles": "ok"}}\'; exit 0; fi\n'
        'fd=""; previous=""\n'
        'for word in "$@"; do [ "$previous" = --start-fd ] && fd="$word"; previous="$word"; done\n'
        '[ -n "$fd" ] || { echo "stand-in runner: no --start-fd"; exit 2; }\n'
        'byte=$(eval "dd bs=1 count=1 2>/dev/null <&$fd")\n'
        "echo \"stand-in runner: got '$byte' on --start-fd $fd\"\n"
        '[ "$byte" = g ] || exit 10\n'
        f"touch {shlex.quote(str(marker))}\n"
    )
    script.chmod(0o755)
    return script, marker


def flip_a_byte(path: Path, offset: int = 200) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x01
    path.write_bytes(bytes(data))  # same size: only a hash can tell


def test_the_runner_starts_only_once_the_model_and_inputs_match(
    agent: AgentCli, runner_models: RunnerModels, tmp_path: Path
) -> None:
    """The agent hashes while the runner loads; the runner is released (`g` on --start-fd) only after both match."""
    runner, executed = gated_runner(tmp_path)
    model = content_addressed(agent, runner_models.xnnpack_pte, "models", ".pte")
    inputs = content_addressed(agent, runner_models.inputs_etlt, "inputs", ".etlt")
    result = agent.run("profile", "--model", model, "--inputs", inputs, "--run-id", "gated", "--runner", runner)
    assert result.returncode == 1, result.stdout + result.stderr  # the stand-in writes no timings: a failed bundle
    assert executed.exists()
    assert "stand-in runner: got 'g'" in (agent.bundle("gated") / "runner.log").read_text()
    run = agent.read_bundle_json("gated", "run.json")
    assert run["model_sha256"] == sha256(model) and run["inputs_sha256"] == sha256(inputs)
    assert run["runner_argv"][-2] == "--start-fd" and run["runner_exit_code"] == 0
    # The board is described before and after the run; the same runner binary answers its questions once.
    calls = (tmp_path / "calls").read_text().split()
    assert sorted(calls) == ["--model", "--probe-counters", "--version"], calls
    before, after = (agent.read_bundle_json("gated", f"board_info_{when}.json") for when in ("before", "after"))
    assert before["runner"] == after["runner"] == {"runner_version": "stand-in", "executorch_version": "0"}
    assert before["perf"]["counters"] == after["perf"]["counters"] == {"cycles": "ok"}


def test_a_runner_that_changed_is_asked_again(tmp_path: Path) -> None:
    runner, _ = gated_runner(tmp_path)
    assert agent_info.runner_version(runner) == agent_info.runner_version(runner)
    assert (tmp_path / "calls").read_text().split() == ["--version"]
    runner.write_text(runner.read_text().replace('"stand-in"', '"rebuilt"'))
    assert agent_info.runner_version(runner) == {"runner_version": "rebuilt", "executorch_version": "0"}
    assert (tmp_path / "calls").read_text().split() == ["--version", "--version"]


@pytest.mark.parametrize("what", ["model", "inputs file"])
@pytest.mark.parametrize("stand_in", ["waits", "ignores the gate"])
def test_a_file_that_does_not_match_is_refused_though_the_runner_started_loading_it(
    agent: AgentCli, runner_models: RunnerModels, tmp_path: Path, what: str, stand_in: str
) -> None:
    """Hashing overlaps the runner's load, yet a mismatch still fails the run with no bundle: a runner that waits at
    --start-fd never executes, and one that does not wait is killed with its whole group and reports nothing."""
    if stand_in == "waits":
        runner, executed = gated_runner(tmp_path)
    else:
        runner, pid_file = hung_runner(tmp_path)
    model = content_addressed(agent, runner_models.xnnpack_pte, "models", ".pte")
    inputs = content_addressed(agent, runner_models.inputs_etlt, "inputs", ".etlt")
    victim = model if what == "model" else inputs
    flip_a_byte(victim)

    result = agent.run(
        "profile", "--model", model, "--inputs", inputs, "--run-id", "refused", "--runner", runner,
        "--timeout", "600", "--kill-grace", "0.5",
    )  # fmt: skip
    assert result.returncode == 1, result.stdout + result.stderr
    assert result.document["error"].startswith(f"{what} on board is corrupt"), result.document
    assert "bundle" not in result.document
    assert not victim.exists() and not Path(f"{victim}.sha256").exists()
    assert not list((agent.workdir / "bundles").iterdir())  # no bundle, no temporary left behind
    if stand_in == "waits":
        assert not executed.exists()
    elif pid_file.exists():  # else it was killed before it got that far: the hash of a tiny model is quick
        leader, child = map(int, pid_file.read_text().split())
        assert process_gone(leader) and process_gone(child)
    assert agent.run("lock-status").document["held"] is False


def test_the_real_runner_holds_at_its_start_descriptor(runner_binary: Path, runner_models: RunnerModels) -> None:
    """etlab_runner loads and initialises, then runs only after `g`; EOF is exit 10 with nothing written."""
    argv = [str(runner_binary), "--model", str(runner_models.xnnpack_pte), "--warmup", "0", "--iterations", "1"]
    for sent, code in ((b"g", 0), (b"", 10), (b"x", 10)):
        read_end, write_end = os.pipe()
        timings = runner_models.xnnpack_pte.parent / f"gate-{code}-{sent.hex()}.json"
        process = subprocess.Popen(
            [*argv, "--timings", str(timings), "--start-fd", str(read_end)],
            pass_fds=(read_end,),
            stderr=subprocess.PIPE,
            text=True,
        )
        os.close(read_end)
        os.write(write_end, sent)
        os.close(write_end)
        _, stderr = process.communicate(timeout=120)
        assert process.returncode == code, stderr
        assert timings.exists() == (code == 0)
        if code:
            assert "etlab_runner: error: not started" in stderr
        timings.unlink(missing_ok=True)
    closed = subprocess.run([*argv, "--start-fd", "999"], capture_output=True, text=True, timeout=120)
    assert closed.returncode == 2 and "--start-fd 999 is not an open descriptor" in closed.stderr


def test_the_counters_pass_runs_without_the_start_descriptor() -> None:
    from etlab_agent.counters import counters_argv

    timing = ["runner", "--model", "m.pte", "--threads", "4", "--timings", "t.json", "--start-fd", "5"]
    argv = counters_argv(timing, Path("/bundle"), "default")
    assert "--start-fd" not in argv and "5" not in argv and argv[:3] == ["runner", "--model", "m.pte"]


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


# --------------------------------------------------------------------------------------------- unpack


def make_wheel(path: Path, members: dict[str, tuple[bytes, int]]) -> Path:
    """A zip with the given members, each (content, unix mode)."""
    with zipfile.ZipFile(path, "w") as archive:
        for name, (content, mode) in members.items():
            info = zipfile.ZipInfo(name)
            info.external_attr = mode << 16
            archive.writestr(info, content)
    return path


@pytest.mark.parametrize(
    "hostile",
    ["../escape.txt", "/tmp/absolute-escape.txt", "pkg/../../escape.txt", "pkg/..\\..\\escape.txt"],
)
def test_unpack_refuses_members_that_escape(agent: AgentCli, tmp_path: Path, hostile: str) -> None:
    wheel = make_wheel(
        tmp_path / "evil-1.0-py3-none-any.whl",
        {"pkg/ok.py": (b"ok", 0o644), hostile: (b"pwned", 0o644)},
    )
    dest = tmp_path / "unpacked" / "dest"
    result = agent.run("unpack", "--wheel", wheel, "--dest", dest)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "refusing member" in result.document["error"] and result.document["member"] == hostile
    assert not dest.exists() and not (tmp_path / "unpacked" / "escape.txt").exists()
    assert not (tmp_path / "escape.txt").exists() and not Path("/tmp/absolute-escape.txt").exists()
    assert not list(tmp_path.rglob(".tmp-unpack-*"))


def test_unpack_refuses_symlink_members(agent: AgentCli, tmp_path: Path) -> None:
    wheel = make_wheel(tmp_path / "link.whl", {"pkg/link": (b"/etc/passwd", stat.S_IFLNK | 0o777)})
    result = agent.run("unpack", "--wheel", wheel, "--dest", tmp_path / "dest")
    assert result.returncode == 1 and "symbolic link" in result.document["error"]
    assert not (tmp_path / "dest").exists()


def test_unpack_selects_strips_keeps_exec_bits_and_replaces_atomically(agent: AgentCli, tmp_path: Path) -> None:
    wheel = make_wheel(
        tmp_path / "cmake-4.0-py3-none-manylinux.whl",
        {
            "cmake/__init__.py": (b"# python shim\n", 0o644),
            "cmake/data/bin/cmake": (b"#!/bin/sh\necho cmake version 4.0.0\n", 0o755),
            "cmake/data/share/cmake-4.0/Modules/X.cmake": (b"# module\n", 0o644),
            "cmake-4.0.dist-info/RECORD": (b"", 0o644),
        },
    )
    dest = tmp_path / "tools" / "cmake"
    dest.mkdir(parents=True)
    (dest / "stale-file").write_text("from an older cmake")
    result = agent.run(
        "unpack", "--wheel", wheel, "--dest", dest, "--member-prefix", "cmake/data/", "--strip-prefix", "cmake/data/"
    )
    assert result.returncode == 0, result.stdout + result.stderr
    document = result.document
    assert document["files"] == 2 and document["replaced"] is True and document["wheel_sha256"] == sha256(wheel)
    files = sorted(str(path.relative_to(dest)) for path in dest.rglob("*") if path.is_file())
    assert files == [".etlab_unpacked.json", "bin/cmake", "share/cmake-4.0/Modules/X.cmake"]
    assert os.access(dest / "bin" / "cmake", os.X_OK)
    assert not os.access(dest / "share" / "cmake-4.0" / "Modules" / "X.cmake", os.X_OK)
    assert subprocess.run([dest / "bin" / "cmake"], capture_output=True, text=True).stdout == "cmake version 4.0.0\n"
    assert not list(dest.parent.glob(".tmp-unpack-*")) and not list(dest.parent.glob(".old-unpack-*"))

    nothing = agent.run("unpack", "--wheel", wheel, "--dest", tmp_path / "x", "--member-prefix", "absent/")
    assert nothing.returncode == 1 and "no file" in nothing.document["error"]


def test_bootstrap_unpacks_click_so_the_agent_runs_on_the_standard_library(tmp_path: Path) -> None:
    """bootstrap.py needs only the standard library; the agent then runs with click from pylib alone."""
    import click

    package = Path(click.__file__).parent
    wheel = tmp_path / "click-test-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        for path in package.rglob("*.py"):
            archive.write(path, f"click/{path.relative_to(package)}")
    pylib = tmp_path / "workdir" / "pylib"
    clean_env = {"PATH": os.environ.get("PATH", ""), "PYTHONDONTWRITEBYTECODE": "1"}
    boot = subprocess.run(
        [sys.executable, "-S", AGENT_DIR / "bootstrap.py", "--wheel", wheel, "--dest", pylib],
        capture_output=True,
        text=True,
        env=clean_env,
    )
    assert boot.returncode == 0, boot.stdout + boot.stderr
    assert json.loads(boot.stdout)["dest"] == str(pylib)
    # -S: no site-packages, so click can only come from pylib.
    agent = subprocess.run(
        [sys.executable, "-S", "-m", "etlab_agent", "--workdir", tmp_path / "workdir", "lock-status"],
        capture_output=True,
        text=True,
        env=dict(clean_env, PYTHONPATH=f"{pylib}:{AGENT_DIR}"),
    )
    assert agent.returncode == 0, agent.stderr
    assert json.loads(agent.stdout) == {"held": False, "holder": None}


# --------------------------------------------------------------------------------------- build-runner


def cmake_version(cmake: str) -> tuple[int, ...]:
    output = subprocess.run([cmake, "--version"], capture_output=True, text=True).stdout
    return tuple(int(part) for part in output.split()[2].split(".")[:2])


@pytest.mark.slow
def test_provisioning_flow_unpacks_the_sdk_builds_the_runner_and_profiles(
    agent: AgentCli, tmp_path: Path, runner_models: RunnerModels
) -> None:
    """The board side of provisioning, for real: SDK from a wheel via `unpack`, cmake/ninja from <wd>/tools (the
    system cmake, if any, is too old on Debian 12), `build-runner`, `set-state`, then a profile with that runner."""
    version = executorch_version()
    sdk_source = executorch_sdk_dir()
    wheel = tmp_path / f"executorch-{version}-cp311-cp311-linux.whl"
    with zipfile.ZipFile(wheel, "w") as archive:  # the wheel's SDK members, as the real wheel lays them out
        for part in ("include", "lib", "share"):
            for path in sorted((sdk_source / part).rglob("*")):
                if path.is_file():
                    archive.write(path, f"executorch/{path.relative_to(sdk_source)}")
        archive.writestr("executorch/exir/__init__.py", "# python half of the wheel: not unpacked\n")
    runtime = agent.workdir / "runtime" / version
    prefixes = [arg for part in ("include", "lib", "share") for arg in ("--member-prefix", f"executorch/{part}/")]
    unpacked = agent.run("unpack", "--wheel", wheel, "--dest", runtime, *prefixes, "--strip-prefix", "executorch/")
    assert unpacked.returncode == 0, unpacked.stdout + unpacked.stderr
    assert sorted(path.name for path in runtime.iterdir()) == [".etlab_unpacked.json", "include", "lib", "share"]

    tools = agent.workdir / "tools"
    (tools / "cmake" / "bin").mkdir(parents=True)
    (tools / "ninja" / "bin").mkdir(parents=True)
    import cmake as cmake_package

    (tools / "cmake" / "bin" / "cmake").symlink_to(Path(cmake_package.CMAKE_BIN_DIR) / "cmake")
    (tools / "ninja" / "bin" / "ninja").symlink_to(Path(sys.executable).parent / "ninja")
    out = agent.workdir / "runner" / version
    # As provisioning unpacks them: from a reproducible tarball, every source file has mtime 0.
    source = tmp_path / "runner-source"
    shutil.copytree(AGENT_DIR.parent / "runner", source, ignore=shutil.ignore_patterns("build"))
    for path in source.rglob("*"):
        os.utime(path, (0, 0))
    system_path = {"PATH": "/usr/local/bin:/usr/bin:/bin"}
    result = agent.run(
        "build-runner", "--sdk", runtime, "--source", source, "--out", out, "--jobs", "2", env=system_path, timeout=900
    )
    assert result.returncode == 0, result.stdout + result.stderr
    document = result.document
    system_cmake = shutil.which("cmake", path=system_path["PATH"])
    if system_cmake is None or cmake_version(system_cmake) < (3, 28):
        assert document["cmake"] == str(tools / "cmake" / "bin" / "cmake")
    assert document["runner"] == str(out / "etlab_runner")
    assert document["executorch_version"] == version and document["runner_version"]
    assert f"-DEXECUTORCH_ROOT={runtime}" in (out / "build.log").read_text()
    linked = subprocess.run(["ldd", out / "etlab_runner"], capture_output=True, text=True).stdout
    libexecutorch = next(line for line in linked.splitlines() if "libexecutorch.so" in line)
    assert str(runtime) in libexecutorch  # the unpacked SDK, not the venv's wheel

    assert (
        agent.run("set-state", f"executorch_version={version}", f"runner_path={out / 'etlab_runner'}").returncode == 0
    )
    profiled = agent.run("profile", "--model", runner_models.xnnpack_pte, "--run-id", "built", "--iterations", "2")
    assert profiled.returncode == 0, profiled.stdout + profiled.stderr
    board_info = agent.read_bundle_json("built", "board_info_before.json")
    assert board_info["runner"]["executorch_version"] == version
    assert board_info["state"]["runner_path"] == str(out / "etlab_runner")

    # New sources (still mtime 0) into the same place: the runner must be rebuilt from them, not from stale objects.
    options = source / "src" / "options.cpp"
    options.write_text(options.read_text().replace("Runs an ExecuTorch program", "Runs a rebuilt ExecuTorch program"))
    os.utime(options, (0, 0))
    rebuilt = agent.run(
        "build-runner", "--sdk", runtime, "--source", source, "--out", out, "--jobs", "2", env=system_path, timeout=900
    )
    assert rebuilt.returncode == 0, rebuilt.stdout + rebuilt.stderr
    usage = subprocess.run([out / "etlab_runner", "--help"], capture_output=True, text=True).stdout
    assert "Runs a rebuilt ExecuTorch program" in usage, usage


def test_build_runner_names_the_package_when_no_compiler_exists(agent: AgentCli, tmp_path: Path) -> None:
    bare_path = tmp_path / "bin-without-compiler"
    bare_path.mkdir()
    source = AGENT_DIR.parent / "runner"
    out = tmp_path / "out"
    no_compiler = {"PATH": str(bare_path), "CXX": ""}
    result = agent.run("build-runner", "--sdk", executorch_sdk_dir(), "--source", source, "--out", out, env=no_compiler)
    assert result.returncode == 1, result.stdout + result.stderr
    document = result.document
    assert document["install"] == "sudo apt-get install -y g++"
    assert "sudo apt-get install -y g++" in document["error"] and "build-essential" in document["error"]
    assert not (tmp_path / "out").exists()


def test_build_runner_refuses_a_folder_that_is_not_an_sdk(agent: AgentCli, tmp_path: Path) -> None:
    result = agent.run(
        "build-runner", "--sdk", tmp_path, "--source", AGENT_DIR.parent / "runner", "--out", tmp_path / "o"
    )
    assert result.returncode == 2 and "executorch-config.cmake" in result.document["error"]
