"""The board agent's `profile` while it hashes the model and inputs as the runner loads them: the runner is released
(`g` on `--start-fd`) only once both match, a file that does not match is refused even though the runner started
loading it, and the real runner holds at its start descriptor. The rest of `profile` is in test_agent_profile.py."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.board.agent_helpers import sha256
from tests.plugins.agent import AGENT_DIR, AgentCli, hung_runner, process_gone
from tests.plugins.runner import RunnerModels

sys.path.insert(0, str(AGENT_DIR))
from etlab_agent import info as agent_info


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
