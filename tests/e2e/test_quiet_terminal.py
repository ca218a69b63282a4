"""What a user sees in the terminal (issue 38 item 1): a deploy of 2 boards × 2 variants through the real `fab`, on
the local board and a real sshd board, counted line by line: at most 25 lines besides the tables, a line per finished
board × variant (stderr is not a terminal here), each warning once, the advice once per model, and the steps only
under `-v`."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from orchestrator.boards.inventory import Board
from orchestrator.paths import PROJECT_ROOT
from tests.plugins.boards import SHARED_BUILD, provision_board, write_inventory

BOARD = "quiet-b"
# --jobs 2: the parallel lowering's lines whatever the machine's load (a busy one lowers in one process by default,
# which says each stage: a line more)
DEPLOY = ("deploy-and-profile", "--model", "distilbert-tiny", "--backend", "xnnpack", "--quantize", "none,int8-static",
          "--board", f"local,{BOARD}", "--iterations", "6", "--warmup", "1", "--no-explore", "--jobs", "2")  # fmt: skip
TABLE_EDGES = tuple("┏┃┡│└")


@pytest.fixture(scope="module")
def two_boards(sshd_lab: Any, local_board: Board, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The local board and a provisioned sshd board, in an inventory."""
    fake = sshd_lab.board(BOARD, **SHARED_BUILD)
    provision_board(fake.board)
    folder = tmp_path_factory.mktemp("quiet")
    yield write_inventory(folder / "inventory.yaml", [local_board, fake.board])
    sshd_lab.discard(fake)


def fab(*args: str, inventory: Path, root: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "ETLAB_ARTIFACTS": str(root / "artifacts"), "ETLAB_RESULTS": str(root / "results")}
    return subprocess.run([sys.executable, "-m", "fabric", *args, "--inventory", str(inventory)], cwd=PROJECT_ROOT,
                          env=env, capture_output=True, text=True, timeout=900)  # fmt: skip


def outside_tables(stdout: str) -> list[str]:
    """stdout's lines that are no table's: not its title (the line before its top edge), rows, edges or caption (the
    lines after its bottom edge, up to the next table)."""
    lines = stdout.splitlines()
    kept, in_caption = [], False
    for index, line in enumerate(lines):
        text = line.strip()
        if text.startswith(TABLE_EDGES):
            in_caption = text.startswith("└")
            continue
        if index + 1 < len(lines) and lines[index + 1].strip().startswith("┏"):
            in_caption = False  # a table's title
            continue
        if not in_caption and text:
            kept.append(line)
    return kept


def test_a_two_board_two_variant_deploy_is_quiet(two_boards: Path, tmp_path: Path) -> None:
    result = fab(*DEPLOY, inventory=two_boards, root=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    said = result.stderr.splitlines() + outside_tables(result.stdout)
    print("\n".join(said))  # what a user reads, for the record
    assert len(said) <= 25, "\n".join(said)  # 73 lines on 11bff8d (49 of them steps, advice 8, warnings 4)
    assert "Results" in result.stdout and "distilbert-tiny →" in result.stdout, "the tables are there"

    # A line per finished board × variant, with its steps' times; no step line of its own.
    finished = [line for line in said if re.match(rf"✓ \[(local|{BOARD})\] distilbert-tiny/xnnpack", line)]
    assert len(finished) == 4 and all("run " in line and "analyze " in line for line in finished), said
    # (a board's steps: "▸ [quiet-b] setup …", "✓ [local] distilbert-tiny/xnnpack push 3 ms"; a lowering in one
    # process, the machine being busy, says its stages, which are no board's)
    steps = [
        line
        for line in said
        if re.search(rf"\[(local|{BOARD})\] (\S+ )?(prepare|save|push|pull|setup)( …| \d+ ms)$", line)
    ]
    assert not steps, said
    assert not [line for line in said if "refused" in line or "within the vocabulary" in line], said

    # Each warning once: the generated calibration is said once (it was twice), and no warning line repeats.
    assert sum("calibrated on" in line for line in said) == 1, said
    warnings = [line for line in said if line.startswith("WARNING")]
    assert len(warnings) == len(set(warnings)), warnings
    assert not [line for line in said if "unstable timings" in line], "degraded runs: one note, not one per run"
    assert sum(line.startswith("degraded:") for line in said) <= 1
    assert sum("to steady them" in line for line in said) <= 1
    # The advice once for the model (it was 4 lines per run), its findings across both boards and variants.
    heads = [line for line in said if line.startswith("advice for distilbert-tiny (4 runs")]
    assert len(heads) == 1 and "fab advise --run " in heads[0], said
    assert not [line for line in said if "] distilbert-tiny/xnnpack advice:" in line], said

    # -v: every step again (the programs are cached now).
    verbose = fab(*DEPLOY, "-v", inventory=two_boards, root=tmp_path)
    assert verbose.returncode == 0, verbose.stdout + verbose.stderr
    for step in ("setup", "distilbert-tiny/xnnpack push", "distilbert-tiny/xnnpack-int8-static analyze"):
        assert f"▸ [{BOARD}] {step} …" in verbose.stderr and f"✓ [local] {step} " in verbose.stderr, verbose.stderr
    assert "board already provisioned" in verbose.stderr
