"""The nightly matrix's `rewrites:` and `advised:` keys (lab/matrix.py): checked like `--rewrites`, with
file:line:field; a rewritten program runs under its own name, so one night runs a model as exported and advised,
and the report puts them side by side."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.boards.inventory import Board, load_inventory
from orchestrator.errors import InventoryError
from orchestrator.lab.matrix import NightlyConfig, load_config
from orchestrator.lowering.rewrites.registry import NO_REWRITES, RewriteRequest
from tests.lab.test_nightly import fab_nightly, nightly_section, stored
from tests.plugins.boards import write_inventory

ADVISED = "gpt2-tiny.tanh-gelu.bmm-attention.head-at-position"


def _config(tmp_path: Path, board: Board, matrix: list[dict]) -> NightlyConfig:
    inventory = write_inventory(tmp_path / "inventory.yaml", [board], nightly=nightly_section(tmp_path, matrix))
    return load_config(load_inventory(inventory))


def test_matrix_rewrites(local_board: Board, tmp_path: Path) -> None:
    cell = {"backends": ["xnnpack"], "boards": ["local"]}
    config = _config(tmp_path, local_board, [{**cell, "models": ["gpt2-tiny"], "rewrites": ["auto"]},
                                             {**cell, "models": ["distilbert-tiny"]}])  # fmt: skip
    assert [entry.rewritten.rewrites for entry in config.entries] == [RewriteRequest(auto=True), NO_REWRITES]
    assert [[program.name for program in entry.programs()] for entry in config.entries] == [
        [ADVISED],
        ["distilbert-tiny"],
    ]
    named = _config(tmp_path, local_board, [{**cell, "models": ["gpt2-tiny"], "rewrites": ["tanh-gelu"]}])
    assert named.entries[0].choice.rewrites.names == ("tanh-gelu",)

    with pytest.raises(InventoryError, match=r"inventory.yaml:\d+: nightly.matrix\[0\].rewrites: unknown rewrite "
                                             r"'tanh-gleu' \(did you mean 'tanh-gelu'\?\)"):  # fmt: skip
        _config(tmp_path, local_board, [{**cell, "models": ["gpt2-tiny"], "rewrites": ["tanh-gleu"]}])
    with pytest.raises(InventoryError, match=r"matrix\[0\].rewrites: tanh-gelu does not apply to distilbert-tiny"):
        _config(tmp_path, local_board, [{**cell, "models": ["distilbert-tiny"], "rewrites": ["tanh-gelu"]}])
    # A model as exported and rewritten are two programs with two names: both run the same night.
    both = _config(tmp_path, local_board, [{**cell, "models": ["gpt2-tiny"], "rewrites": ["auto"]},
                                           {**cell, "models": ["gpt2-tiny"]}])  # fmt: skip
    assert [[program.name for program in entry.programs()] for entry in both.entries] == [[ADVISED], ["gpt2-tiny"]]


def test_matrix_advised(local_board: Board, tmp_path: Path) -> None:
    cell = {"backends": ["xnnpack"], "boards": ["local"], "advised": True}
    config = _config(tmp_path, local_board, [{**cell, "models": ["gpt2-tiny", "distilbert-tiny"]}])
    (entry,) = config.entries
    assert [(program.name, str(program.rewrites)) for program in entry.programs()] == [
        ("gpt2-tiny", "none"), ("distilbert-tiny", "none"), (ADVISED, "auto"),
        ("distilbert-tiny.bmm-attention.head-at-position", "auto"),
    ]  # fmt: skip
    assert entry.advised_pairs()[0] == ("gpt2-tiny", ADVISED)
    named = _config(tmp_path, local_board, [{**cell, "models": ["gpt2-tiny"], "rewrites": ["tanh-gelu"]}])
    assert [program.name for program in named.entries[0].programs()] == ["gpt2-tiny", "gpt2-tiny.tanh-gelu"]

    with pytest.raises(InventoryError, match=r"inventory.yaml:\d+: nightly.matrix\[0\].advised: no rewrite applies "
                                             r"to mobilenet-v2-tiny \(torchvision"):  # fmt: skip
        _config(tmp_path, local_board, [{**cell, "models": ["mobilenet-v2-tiny"]}])
    with pytest.raises(InventoryError, match=r"nightly.matrix\[0\].advised: expected"):
        _config(tmp_path, local_board, [{**cell, "models": ["gpt2-tiny"], "advised": "yes"}])
    # The advised program is a cell of its own: asked twice, it is a duplicate like any cell.
    with pytest.raises(InventoryError, match=rf"matrix\[1\]: cell local / {ADVISED} / xnnpack is already in "
                                             r"matrix\[0\]"):  # fmt: skip
        _config(
            tmp_path,
            local_board,
            [
                {**cell, "models": ["gpt2-tiny"]},
                {**cell, "models": ["gpt2-tiny"], "advised": False, "rewrites": ["auto"]},
            ],
        )


@pytest.mark.slow
def test_a_night_runs_a_model_as_exported_and_advised(local_board: Board, tmp_path: Path) -> None:
    matrix = [{"models": ["gpt2-tiny"], "backends": ["xnnpack"], "boards": ["local"], "advised": True}]
    section = nightly_section(tmp_path, matrix, iterations=5, warmup=1, weights="random")
    inventory = write_inventory(tmp_path / "inventory.yaml", [local_board], nightly=section)
    result = fab_nightly(inventory, "2026-11-01", tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    records = {record.model: record for record in stored(tmp_path, "2026-11-01")}
    assert set(records) == {"gpt2-tiny", ADVISED}
    assert all(record.status == "ok" and len(record.latencies_ms) == 5 for record in records.values())
    assert (tmp_path / "results" / "local" / ADVISED / "xnnpack").is_dir()
    report = (tmp_path / "reports" / "nightly-2026-11-01.md").read_text()
    assert "## Advised programs" in report
    exported, advised = records["gpt2-tiny"].median_ms, records[ADVISED].median_ms
    assert exported is not None and advised is not None
    ratio = f"{advised / exported:.3f}"  # the medians as the report shows them (report._fmt)
    assert f"| local | gpt2-tiny | xnnpack | {exported:,.2f} | {ADVISED} | {advised:,.2f} | {ratio} |" in report, report
    assert "id='advised'" in (tmp_path / "reports" / "nightly-2026-11-01.html").read_text()
