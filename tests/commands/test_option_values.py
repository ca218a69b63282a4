"""Every numeric option of every `fab` task takes a negative number as its value, as `--opt=-1` and as `--opt -1`,
so that etlab's own check refuses it (exit 64, the option named, the value shown): Invoke once read `-1` as the short
flag of `--min-top1` ("needed value", exit 1). Through real `python -m fabric` processes; the option checks
themselves are in test_cli.py."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.errors import ExitCode
from orchestrator.paths import PROJECT_ROOT

MISSING_INVENTORY = "no-such-inventory.yaml"  # a task that got past its options would stop there, not exit 64
# (task and what it needs before its options, option, a value its check refuses)
NUMERIC_OPTIONS = [
    (["lower", "--model", "gpt2-tiny"], "--jobs", "-1"),
    (["lower", "--model", "smollm2-gen-tiny"], "--context", "-1"),
    (["setup-board"], "--lg-wait", "-1"),
    (["pull"], "--lg-wait", "-1"),
    (["gc"], "--keep", "-1"),
    (["gc"], "--lg-wait", "-1"),
    (["run", "--model", "gpt2-tiny"], "--iterations", "-1"),
    (["run", "--model", "gpt2-tiny"], "--warmup", "-1"),
    (["run", "--model", "gpt2-tiny"], "--threads", "-1"),
    (["run", "--model", "gpt2-tiny"], "--max-seconds", "-1"),
    (["run", "--model", "gpt2-tiny"], "--timeout", "-1"),
    (["run", "--model", "gpt2-tiny"], "--new-tokens", "-1"),
    (["analyze"], "--min-sqnr", "-5000"),
    (["analyze"], "--min-top1", "-1"),
    (["analyze"], "--min-top5", "-5"),
    (["explore"], "--port", "-1"),
    (["dashboard"], "--port", "-1"),
    (["compare", "a", "b"], "--interleave", "-1"),
    (["compare", "a", "b"], "--retest-seconds", "-1"),
    (["advise", "--try"], "--rounds", "-1"),
    (["advise", "--try"], "--retest-seconds", "-1"),
    *[(["deploy-and-profile", "--model", "gpt2-tiny", "--no-explore"], option, value) for option, value in (
        ("--iterations", "-1"), ("--warmup", "-1"), ("--threads", "-1"), ("--max-seconds", "-1"), ("--port", "-1"),
        ("--min-sqnr", "-5000"), ("--min-top1", "-1"), ("--min-top5", "-5"), ("--jobs", "-1"),
        ("--new-tokens", "-1"), ("--lg-wait", "-1"))],
    (["deploy-and-profile", "--model", "smollm2-gen-tiny", "--no-explore"], "--context", "-1"),
]  # fmt: skip


def fab(*args: str, tmp_path: Path, artifacts: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "ETLAB_RESULTS": str(tmp_path / "results"),
           "ETLAB_ARTIFACTS": str(artifacts or tmp_path / "artifacts"), "ETLAB_WIDTH": "400"}  # fmt: skip
    return subprocess.run([sys.executable, "-m", "fabric", *args], cwd=PROJECT_ROOT, env=env, capture_output=True,
                          text=True, timeout=120)  # fmt: skip


@pytest.mark.parametrize(
    ("task", "option", "value"), NUMERIC_OPTIONS, ids=[f"{t[0]} {o} {v}" for t, o, v in NUMERIC_OPTIONS]
)
def test_a_negative_value_reaches_the_options_check_in_both_forms(
    task: list[str], option: str, value: str, tmp_path: Path
) -> None:
    inventory = [] if task[0] in ("analyze", "explore", "compare", "lower") else ["--inventory", MISSING_INVENTORY]
    for given in ([f"{option}={value}"], [option, value]):
        result = fab(*task, *given, *inventory, tmp_path=tmp_path)
        output = result.stdout + result.stderr
        assert result.returncode == ExitCode.USAGE, output
        error = next((line for line in result.stderr.splitlines() if line.startswith("error: ")), "")
        assert error.startswith(f"error: {option} must ") and value in error, output
        assert "needed value" not in output and "Traceback" not in output, output


@pytest.mark.parametrize("task", ["run", "push"])
def test_a_negative_lg_wait_reaches_its_check_once_the_programs_are_found(
    task: str, artifact_root: Path, tmp_path: Path
) -> None:
    """`run` and `push` find the programs first (a missing one is exit 65), then select the boards."""
    for given in (["--lg-wait=-1"], ["--lg-wait", "-1"]):
        result = fab(task, "--model", "gpt2-tiny", *given, "--inventory", MISSING_INVENTORY, tmp_path=tmp_path,
                     artifacts=artifact_root)  # fmt: skip
        assert result.returncode == ExitCode.USAGE, result.stdout + result.stderr
        assert "error: --lg-wait must be a number of seconds >= 0, got '-1'" in result.stderr, result.stderr


def test_a_negative_value_is_a_value_where_it_is_valid(tmp_path: Path) -> None:
    """`--min-sqnr -5` is a loose gate, not `-5` (once `--min-top5`'s short flag): the next option is checked."""
    result = fab("deploy-and-profile", "--model", "gpt2-tiny", "--no-explore", "--min-sqnr", "-5", "--min-top1", "2",
                 "--inventory", MISSING_INVENTORY, tmp_path=tmp_path)  # fmt: skip
    assert result.returncode == ExitCode.USAGE, result.stdout + result.stderr
    assert "error: --min-top1 must be a number from 0 to 1, got '2'" in result.stderr, result.stderr


def test_no_task_has_a_short_flag_a_value_could_be_mistaken_for(monkeypatch: pytest.MonkeyPatch) -> None:
    """Short flags are letters: a number, negative or not, is never a flag."""
    from invoke import Collection

    import tasks

    collection = Collection.from_module(tasks)
    for name in collection.task_names:
        # get_arguments() pops each option's help from the task's `help` dict: on a copy, so a later test in this
        # process (the test_cli.py help checks, whichever order the workers run the files in) still finds it.
        monkeypatch.setattr(collection[name], "help", dict(collection[name].help))
    flags = {
        f"{name} {argument.name}": flag
        for name in collection.task_names
        for argument in collection[name].get_arguments()
        for flag in argument.names
        if len(flag) == 1 and not flag.isalpha()
    }
    assert not flags, flags
    assert collection["run"].get_arguments()[0].names == ("model", "m")  # letters are kept
    # One meaning per letter in every task (`-b` was --board in five tasks and --backend in four), `-h` only help.
    meanings: dict[str, set[str]] = {}
    for name in collection.task_names:
        for argument in collection[name].get_arguments():
            for flag in argument.names:
                if len(flag) == 1:
                    meanings.setdefault(flag, set()).add(argument.name)
    assert all(len(names) == 1 for names in meanings.values()), meanings
    assert meanings["b"] == {"board"} and "h" not in meanings and meanings["m"] == {"model"}


def test_every_task_prints_its_help(tmp_path: Path) -> None:
    """`fab TASK --help` for every task, compare's positional run ids included (Invoke handed `--help` to its first
    positional argument: "did not receive required positional arguments")."""
    from invoke import Collection

    import tasks

    for name in Collection.from_module(tasks).task_names:
        shown = fab(name, "--help", tmp_path=tmp_path)
        assert shown.returncode == 0, (name, shown.stdout + shown.stderr)
        assert f"[--core-opts] {name} " in shown.stdout.splitlines()[0] and "Traceback" not in shown.stderr, name
    assert fab("compare", "--help", tmp_path=tmp_path).stdout.count("baseline run id") == 1
    missing = fab("compare", tmp_path=tmp_path)  # without --help the run ids are still required
    assert missing.returncode != 0 and "did not receive required positional arguments" in missing.stderr


@pytest.mark.parametrize(
    ("option", "value", "meant"),
    [("--weights", "randm", "random"), ("--backend", "xnnpak", "xnnpack"), ("--quantize", "8da4", "8da4w"),
     ("--attention", "etlb", "etlab")],
)  # fmt: skip
def test_a_mistyped_option_value_gets_a_did_you_mean(option: str, value: str, meant: str, tmp_path: Path) -> None:
    """As a mistyped model name does: the closest choice, before anything is lowered (exit 64)."""
    result = fab("lower", "--model", "smollm2-gen-tiny", option, value, tmp_path=tmp_path)
    assert result.returncode == ExitCode.USAGE, result.stdout + result.stderr
    assert f"(did you mean '{meant}'?)" in result.stderr and option in result.stderr, result.stderr
    assert not (tmp_path / "artifacts").exists() or not list((tmp_path / "artifacts").rglob("*.pte"))
