"""The nightly matrix's `rewrites:` key (lab/matrix.py): checked like `--rewrites`, with file:line:field."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.boards.inventory import Board, load_inventory
from orchestrator.errors import InventoryError
from orchestrator.lab.matrix import load_config
from orchestrator.lowering.rewrites import NO_REWRITES, RewriteRequest
from tests.lab.test_nightly import nightly_section
from tests.plugins.boards import write_inventory


def _config(tmp_path: Path, board: Board, matrix: list[dict]) -> object:
    inventory = write_inventory(tmp_path / "inventory.yaml", [board], nightly=nightly_section(tmp_path, matrix))
    return load_config(load_inventory(inventory))


def test_matrix_rewrites(local_board: Board, tmp_path: Path) -> None:
    cell = {"backends": ["xnnpack"], "boards": ["local"]}
    config = _config(tmp_path, local_board, [{**cell, "models": ["gpt2-tiny"], "rewrites": ["auto"]},
                                             {**cell, "models": ["distilbert-tiny"]}])  # fmt: skip
    assert [entry.rewrites for entry in config.entries] == [RewriteRequest(auto=True), NO_REWRITES]
    named = _config(tmp_path, local_board, [{**cell, "models": ["gpt2-tiny"], "rewrites": ["tanh-gelu"]}])
    assert named.entries[0].rewrites.names == ("tanh-gelu",)

    with pytest.raises(InventoryError, match=r"inventory.yaml:\d+: nightly.matrix\[0\].rewrites: unknown rewrite "
                                             r"'tanh-gleu' \(did you mean 'tanh-gelu'\?\)"):  # fmt: skip
        _config(tmp_path, local_board, [{**cell, "models": ["gpt2-tiny"], "rewrites": ["tanh-gleu"]}])
    with pytest.raises(InventoryError, match=r"matrix\[0\].rewrites: tanh-gelu does not apply to distilbert-tiny"):
        _config(tmp_path, local_board, [{**cell, "models": ["distilbert-tiny"], "rewrites": ["tanh-gelu"]}])
    with pytest.raises(InventoryError, match=r"matrix\[1\].rewrites: gpt2-tiny is lowered with rewrites auto in "
                                             r"matrix\[0\], none here"):  # fmt: skip
        _config(tmp_path, local_board, [{**cell, "models": ["gpt2-tiny"], "rewrites": ["auto"]},
                                        {**cell, "models": ["gpt2-tiny"], "backends": ["portable"]}])  # fmt: skip
