"""What users already have keeps working: a nightly inventory, the history its night wrote and its programs'
sidecars, all made by etlab's main of 2026-12-05 (445c180, before a program was one value: tests/data/migration/),
read by today's etlab. The inventory names the programs the history holds, each sidecar's program reads back to
the choices that made it, and tonight's night on that history (an entry with `attention: sdpa` and `context:`, an
`advised` one) continues every cell's trend."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import yaml

from orchestrator.boards.inventory import Board, load_inventory
from orchestrator.commands.common import lower_options
from orchestrator.lab.history import History
from orchestrator.lab.matrix import load_config
from orchestrator.lowering.program import ProgramName
from orchestrator.lowering.sidecar import read_sidecar
from orchestrator.paths import PROJECT_ROOT
from tests.plugins.artifacts import ARTIFACT_CACHE

DATA = Path(__file__).parents[1] / "data" / "migration"
OLD_NIGHT, TONIGHT = "2026-11-20", "2026-11-21"
REWRITTEN = "gpt2-tiny.tanh-gelu.bmm-attention.head-at-position"
CELLS = {("local", name, "xnnpack") for name in ("gpt2-tiny", REWRITTEN, "smollm2-gen-tiny.sdpa.ctx32")}
BIGGER = ("local", "smollm2-gen-tiny.sdpa.ctx128", "xnnpack")  # tonight's new context


def old_lab(tmp_path: Path, workdir: str) -> tuple[Path, str]:
    """The old inventory, its history restored from the SQL the old etlab's SQLite held: (inventory, history URL)."""
    history = tmp_path / "history.sqlite"
    with sqlite3.connect(history) as connection:
        connection.executescript((DATA / f"history-{OLD_NIGHT}.sql").read_text())
    url = f"sqlite:///{history}"
    text = (DATA / "inventory.yaml").read_text()
    for placeholder, value in (("WORKDIR", workdir), ("HISTORY", url), ("REPORTS", str(tmp_path / "reports"))):
        text = text.replace(placeholder, value)
    inventory = tmp_path / "inventory.yaml"
    inventory.write_text(text)
    assert yaml.safe_load(text)["nightly"]["matrix"][1]["attention"] == "sdpa"
    return inventory, url


def test_an_old_inventory_names_the_programs_its_history_and_sidecars_hold(tmp_path: Path) -> None:
    inventory, url = old_lab(tmp_path, str(tmp_path / "wd"))
    config = load_config(load_inventory(inventory))
    planned = {(board.name, program.name, variant.name) for entry in config.entries for board in entry.boards
               for program in entry.programs() for variant in entry.variants}  # fmt: skip
    history = History(url)
    try:
        assert history.recorded_cells(OLD_NIGHT) == planned == CELLS
        # its rows from before energy was stored (issue 55): the column added, each row's energy None
        old_runs = history.runs(night=OLD_NIGHT)
        assert len(old_runs) == len(CELLS) and all(run.energy is None for run in old_runs)
    finally:
        history.close()

    sidecars = {path.parent.name: read_sidecar(path) for path in sorted((DATA / "artifacts").glob("*/*.json"))}
    assert {("local", name, "xnnpack") for name in sidecars} == CELLS
    for name, sidecar in sidecars.items():
        parts = ProgramName.parse(name)
        assert sidecar.model == name and str(parts) == name
        assert sidecar.applied_rewrites == parts.rewrites, name
        if sidecar.generation is not None:  # attention and context in the name: the program's own
            assert (sidecar.generation.attention, sidecar.generation.context) == (parts.attention, parts.context)
    assert ProgramName.parse(REWRITTEN).base == "gpt2-tiny"
    # the lowering that makes each again, by the options a user types
    assert lower_options("smollm2-gen-tiny.sdpa.ctx32", sidecars[REWRITTEN].variant) == (
        "--model smollm2-gen-tiny --attention sdpa --context 32 --backend xnnpack"
    )


def test_tonight_on_an_old_history_continues_every_trend(local_board: Board, tmp_path: Path) -> None:
    inventory, url = old_lab(tmp_path, local_board.workdir)
    # tonight the entry asks for one more KV cache size: a new program and cell beside the one that goes on
    inventory.write_text(inventory.read_text().replace("context: [32]", "context: [32, 128]"))
    env = {**os.environ, "ETLAB_ARTIFACTS": str(ARTIFACT_CACHE), "ETLAB_RESULTS": str(tmp_path / "results")}
    done = subprocess.run(
        [sys.executable, "-m", "fabric", "nightly", "--inventory", str(inventory), "--night", TONIGHT],
        cwd=PROJECT_ROOT, env=env, capture_output=True, text=True, timeout=1500,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    history = History(url)
    try:
        assert history.recorded_cells(TONIGHT) == CELLS | {BIGGER}
        assert [run.night for run in history.runs(cell=BIGGER)] == [TONIGHT]
        for cell in CELLS:
            runs = history.runs(cell=cell)
            assert sorted(run.night for run in runs) == [OLD_NIGHT, TONIGHT], (cell, runs)
            assert all(run.status == "ok" for run in runs), runs
        for cell, context in ((("local", "smollm2-gen-tiny.sdpa.ctx32", "xnnpack"), 32), (BIGGER, 128)):
            assert {run.generation.context for run in history.runs(cell=cell) if run.generation} == {context}
    finally:
        history.close()
    page = (tmp_path / "reports" / f"nightly-{TONIGHT}.html").read_text()
    for _, name, _ in sorted(CELLS | {BIGGER}):
        assert f"latency trend local / {name} / xnnpack" in page, name
    # the advised entry's side by side: the model as exported and its rewritten program
    assert "gpt2-tiny" in page and REWRITTEN in page
