"""The program options, parsed once (commands/program_options.py) for lower, push, run and deploy-and-profile:
the same choice is refused alike by each, with its option named (exit 64) before anything is lowered, pushed or
run; push and run find a program by the choices that made it; and a task's many options each fall to one group."""

from __future__ import annotations

import inspect
import os
import subprocess
import sys
from pathlib import Path

import pytest

import tasks
from orchestrator.commands.common import AccuracyOptions, BoardOptions, LoweringGroup, RunOptions
from orchestrator.commands.program_options import ProgramOptions
from orchestrator.lowering.builtins import BUILTIN_SPECS
from orchestrator.paths import PROJECT_ROOT

GEN = BUILTIN_SPECS["smollm2-gen-tiny"]
TASKS = ("lower", "push", "run", "deploy-and-profile")


def fab(tmp_path: Path, *args: str) -> tuple[int, str]:
    env = {**os.environ, "ETLAB_ARTIFACTS": str(tmp_path / "artifacts"), "ETLAB_RESULTS": str(tmp_path / "results"),
           "ETLAB_WIDTH": "400"}  # fmt: skip
    proc = subprocess.run([sys.executable, "-m", "fabric", *args], cwd=PROJECT_ROOT, env=env, capture_output=True,
                          text=True, timeout=300)  # fmt: skip
    said = proc.stdout + proc.stderr
    assert "Traceback" not in said, said
    return proc.returncode, " ".join(said.split())


@pytest.mark.parametrize(
    ("choice", "words"),
    [
        (["--model", "smollm2-gen-tiny", "--context", str(GEN.positions() - 1)],
         f"--context {GEN.positions() - 1}: smollm2-gen-tiny's prompt of {GEN.seq_len} tokens"),
        (["--model", "gpt2-tiny", "--context", "128"], "--context: gpt2-tiny is not a text-generation model"),
        (["--model", "distilbert-tiny", "--rewrites", "tanh-gelu"],
         "--rewrites tanh-gelu: tanh-gelu does not apply to distilbert-tiny"),
        (["--model", "smollm2-gen-tiny", "--attention", "flash"], "--attention must be one of etlab, sdpa"),
        (["--model", "smollm2-gen-tiny", "--context", "1,x"], "--context must be a whole number"),
    ],
)  # fmt: skip
def test_every_task_refuses_a_choice_alike(tmp_path: Path, choice: list[str], words: str) -> None:
    said = {}
    for task in TASKS:
        extra = ["--no-explore"] if task == "deploy-and-profile" else []
        code, said[task] = fab(tmp_path, task, *choice, *extra)
        assert code == 64, (task, said[task])
        assert words in said[task], (task, said[task])
    assert not (tmp_path / "artifacts").exists() or not list((tmp_path / "artifacts").rglob("*.pte"))


def test_push_and_run_find_a_program_by_its_choices(tmp_path: Path) -> None:
    for task in ("push", "run"):
        code, said = fab(tmp_path, task, "--model", "smollm2-gen-tiny", "--attention", "sdpa", "--context", "128")
        assert code == 65, said  # missing artifacts: data (errors.ArtifactError)
        # not lowered: the hint is the lowering that makes it, by the options a user types, not by its name
        assert "smollm2-gen-tiny.sdpa.ctx128" in said, said
        assert "fab lower --model smollm2-gen-tiny --attention sdpa --context 128 --backend xnnpack" in said, said


def test_a_task_s_options_each_fall_to_one_group() -> None:
    groups = (ProgramOptions, LoweringGroup, BoardOptions, RunOptions, AccuracyOptions)
    own = {  # what no group holds: the task's own switches
        "lower": {"exported", "etrecord", "force"},
        "push": set(),
        "run": set(),
        "deploy_and_profile": {"no_explore", "no_browser", "port", "markdown"},
    }
    for name, left in own.items():
        body = getattr(tasks, name).body
        given = {parameter: None for parameter in inspect.signature(body).parameters if parameter != "c"}
        for group in groups:
            group.take(given)
        assert set(given) == left, name
