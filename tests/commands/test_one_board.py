"""Work that runs on one board (compare's interleaved re-test, `fab advise --try`) takes it from one check
(commands/common.py `one_board`): one name, one board; else exit 64 naming --board, never a crash on unpacking."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from orchestrator.commands.common import one_board
from orchestrator.errors import UsageError
from orchestrator.paths import PROJECT_ROOT


def inventory(tmp_path: Path) -> Path:
    boards = {name: {"transport": "local", "workdir": str(tmp_path / name)} for name in ("b1", "b2")}
    path = tmp_path / "inventory.yaml"
    path.write_text(yaml.safe_dump({"boards": boards, "groups": {"pair": ["b1", "b2"]}}))
    return path


@pytest.mark.parametrize("board", [None, "", "b1,b2", "b1,b1,b2"])
def test_anything_but_one_board_is_refused_naming_the_option(tmp_path: Path, board: str | None) -> None:
    with pytest.raises(UsageError, match="--try needs exactly one --board") as caught:
        one_board(str(inventory(tmp_path)), board, what="--try needs", example="--board local")
    assert caught.value.hint and "--board local" in caught.value.hint


def test_one_board_named_is_that_board(tmp_path: Path) -> None:
    assert one_board(str(inventory(tmp_path)), "b2", what="--try needs", example="--board local").name == "b2"


def test_compare_interleaved_on_two_boards_is_exit_64(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "fabric", "compare", "a", "b", "--interleave", "5", "--board", "b1,b2",
         "--inventory", str(inventory(tmp_path))],
        cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 64, done.stdout + done.stderr
    assert "--interleave needs exactly one --board" in done.stderr and "Traceback" not in done.stderr
