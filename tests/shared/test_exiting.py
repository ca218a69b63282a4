"""A finished task's process ends at once with the task's code, its output whole and etlab's clean-ups run."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = textwrap.dedent(
    """
    import sys
    from orchestrator import exiting

    class Teardown:
        def __del__(self):
            sys.stderr.write("interpreter teardown ran\\n")

    kept = Teardown()  # a module global: only the interpreter's teardown deletes it
    exiting.at_exit(lambda: sys.stderr.write("etlab clean-up ran\\n"))
    exiting.task_started()
    sys.stdout.write("x" * 200_000)  # more than any pipe buffer: flushed before the process ends
    if sys.argv[1] != "unfinished":
        exiting.task_finished(int(sys.argv[1]))
        sys.exit(int(sys.argv[1]))  # as Invoke ends a failed task
    """
)


def run(arg: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", SCRIPT, arg],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, **env},
        timeout=60,
    )


def test_a_finished_task_skips_the_teardown_keeps_its_code_output_and_clean_ups() -> None:
    result = run("3")
    assert result.returncode == 3
    assert result.stdout == "x" * 200_000
    assert "etlab clean-up ran" in result.stderr
    assert "interpreter teardown ran" not in result.stderr


def test_an_unfinished_task_and_the_opt_out_tear_down_as_usual() -> None:
    unfinished = run("unfinished")
    assert unfinished.returncode == 0
    assert "etlab clean-up ran" in unfinished.stderr and "interpreter teardown ran" in unfinished.stderr
    opted_out = run("5", ETLAB_FULL_TEARDOWN="1")
    assert opted_out.returncode == 5
    assert "etlab clean-up ran" in opted_out.stderr and "interpreter teardown ran" in opted_out.stderr
    assert opted_out.stdout == "x" * 200_000
