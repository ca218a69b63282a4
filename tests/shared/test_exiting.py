"""A finished task's process skips the interpreter's final collections: every atexit handler still runs and the exit
code and the output are whole; what is alive at exit is left to the operating system."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = textwrap.dedent(
    """
    import atexit, sys
    from orchestrator import exiting

    class Says:
        def __init__(self, words):
            self.words = words
        def __del__(self):
            sys.stderr.write(self.words + "\\n")

    atexit.register(lambda: sys.stderr.write("handler registered before the task ran\\n"))
    released = Says("released by its last reference")  # a module global: freed as the module is torn down
    cycle = Says("collected by the final collection")
    cycle.itself = cycle  # a reference cycle: only the garbage collector frees it
    del cycle
    exiting.task_started()
    atexit.register(lambda: sys.stderr.write("handler registered by the task\\n"))
    sys.stdout.write("x" * 200_000)  # more than a pipe holds: all of it arrives
    sys.exit(int(sys.argv[1]))  # as Invoke ends a failed task
    """
)


def run(code: int, **env: str) -> subprocess.CompletedProcess[str]:
    environment = {key: value for key, value in os.environ.items() if key != "ETLAB_FULL_TEARDOWN"}
    return subprocess.run(
        [sys.executable, "-c", SCRIPT, str(code)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**environment, **env},
        timeout=60,
    )


def test_a_finished_task_skips_only_the_final_collections() -> None:
    result = run(3)
    assert result.returncode == 3 and result.stdout == "x" * 200_000
    for said in ("handler registered before the task ran", "handler registered by the task"):
        assert said in result.stderr
    assert "collected by the final collection" not in result.stderr


def test_the_opt_out_keeps_pythons_own_teardown() -> None:
    result = run(5, ETLAB_FULL_TEARDOWN="1")
    assert result.returncode == 5 and result.stdout == "x" * 200_000
    assert "collected by the final collection" in result.stderr
    assert "released by its last reference" in result.stderr
