"""The fake lab (orchestrator/testing/sshd.py): its own failures (a machine that lacks a piece says which), and the
second board README's recipe starts by hand (tools/sshd_board.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.paths import PROJECT_ROOT
from orchestrator.testing.sshd import LabSetupError, NetnsBoard


def test_a_namespace_that_cannot_be_made_is_a_lab_setup_error() -> None:
    """It was a TypeError: the error was raised with pytest's `pytrace=False`, which no exception takes."""
    board = NetnsBoard.__new__(NetnsBoard)  # only the namespace step: no sshd, no veth pair
    board.namespace = "etlab/invalid"  # `ip netns add` refuses a name with a slash, creating nothing
    with pytest.raises(LabSetupError, match="cannot create a network namespace"):
        board._create_namespace()


def test_the_readmes_second_board_is_one_command(tmp_path: Path) -> None:
    """README's recipe: `tools/sshd_board.py --inventory FILE` starts an SSH board on 127.0.0.2 and writes an inventory
    holding it and `local`, which `fab` then uses as it is."""
    inventory = tmp_path / "two-boards.yaml"
    env = {**os.environ, "TMPDIR": str(tmp_path)}  # the board's files
    tool = subprocess.Popen([sys.executable, "tools/sshd_board.py", "--inventory", str(inventory)], cwd=PROJECT_ROOT,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert tool.stdout is not None
        said = [tool.stdout.readline()]
        while said[-1] and not said[-1].startswith("# written to"):  # EOF ('') if the tool fails
            said.append(tool.stdout.readline())
        assert said[0].startswith("# sshd-b listening on 127.0.0.2:"), said
        assert said[-1].startswith(f"# written to {inventory}"), said
        boards = subprocess.run([sys.executable, "-m", "fabric", "boards", "--inventory", str(inventory)],
                                cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=300)  # fmt: skip
        assert boards.returncode == 0, boards.stdout + boards.stderr
        lines = [line for line in boards.stdout.splitlines() if line.count("│") > 3]
        rows = {line.split("│")[1].strip(): line for line in lines if line.split("│")[1].strip()}  # not a wrapped cell
        assert set(rows) == {"local", "sshd-b"} and "127.0.0.2" in rows["sshd-b"] and " yes " in rows["sshd-b"], rows
        again = subprocess.run([sys.executable, "tools/sshd_board.py", "--inventory", str(inventory)],
                               cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=60)  # fmt: skip
        assert again.returncode == 64 and "exists" in again.stderr, "it never overwrites an inventory"
    finally:
        tool.terminate()
        tool.wait(timeout=30)
