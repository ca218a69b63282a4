"""A nightly matrix entry says a program's attention and KV cache sizes (`attention:`, `context:`), as `--attention`
and `--context` do (lowering/program.py names each program): checked with the file, line and field, and run
for real on the local board two nights, each cell keeping its trend."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from orchestrator.boards.inventory import Board, load_inventory
from orchestrator.errors import InventoryError
from orchestrator.lab.history import History
from orchestrator.lab.matrix import load_config
from orchestrator.lowering.attention.choice import attention_of
from orchestrator.paths import PROJECT_ROOT
from tests.plugins.artifacts import ARTIFACT_CACHE
from tests.plugins.boards import write_inventory

MODEL = "smollm2-gen-tiny"
NIGHTS = ("2026-11-10", "2026-11-11")


def inventory_with(tmp_path: Path, entry: dict[str, Any]) -> Path:
    document = {"boards": {"local": {"transport": "local", "workdir": str(tmp_path / "wd")}},
                "nightly": {"matrix": [{"backends": ["xnnpack"], "boards": ["local"], **entry}]}}  # fmt: skip
    path = tmp_path / "inventory.yaml"
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    return path


def test_an_entry_names_its_programs_by_attention_and_context(tmp_path: Path) -> None:
    entry = {"models": [MODEL], "attention": "sdpa", "context": [32, 128]}
    (matrix,) = load_config(load_inventory(inventory_with(tmp_path, entry))).entries
    programs = [program.spec for program in matrix.programs()]
    assert [p.name for p in programs] == [f"{MODEL}.sdpa.ctx32", f"{MODEL}.sdpa.ctx128"]
    assert [(p.cache_capacity, attention_of(p)) for p in programs] == [(32, "sdpa"), (128, "sdpa")]
    advised = {"models": [MODEL], "context": 128, "advised": True, "rewrites": ["eager-attention"]}
    (matrix,) = load_config(load_inventory(inventory_with(tmp_path, advised))).entries
    assert matrix.advised_pairs() == [(f"{MODEL}.ctx128", f"{MODEL}.ctx128.eager-attention")]


@pytest.mark.parametrize(
    ("entry", "says"),
    [
        (
            {"models": ["distilbert-tiny"], "attention": "sdpa"},
            "nightly.matrix[0].attention: distilbert-tiny is not a text-generation model",
        ),
        ({"models": [MODEL], "attention": "flash"}, "nightly.matrix[0].attention: expected one of etlab, sdpa"),
        ({"models": [MODEL], "context": [128, "x"]}, "nightly.matrix[0].context: expected an integer 2-"),
        ({"models": [MODEL], "context": 8}, "nightly.matrix[0].context: 8: smollm2-gen-tiny's prompt of 8 tokens"),
        ({"models": ["distilbert-tiny"], "context": 128}, "nightly.matrix[0].context: distilbert-tiny is not"),
    ],
)
def test_a_bad_choice_names_its_line_and_field(tmp_path: Path, entry: dict[str, Any], says: str) -> None:
    with pytest.raises(InventoryError) as caught:
        load_config(load_inventory(inventory_with(tmp_path, entry)))
    assert says in str(caught.value) and "inventory.yaml:" in str(caught.value), caught.value


def test_two_nights_of_attention_and_contexts_keep_their_trends(local_board: Board, tmp_path: Path) -> None:
    section = {"history": f"sqlite:///{tmp_path / 'history.sqlite'}", "reports": str(tmp_path / "reports"),
               "iterations": 5, "warmup": 1, "cooldown_seconds": 1, "weights": "random",
               "matrix": [{"models": [MODEL], "backends": ["xnnpack"], "boards": ["local"], "attention": "sdpa",
                           "context": [32, 128]}]}  # fmt: skip
    inventory = write_inventory(tmp_path / "inventory.yaml", [local_board], nightly=section)
    env = {**os.environ, "ETLAB_ARTIFACTS": str(ARTIFACT_CACHE), "ETLAB_RESULTS": str(tmp_path / "results")}
    for night in NIGHTS:
        done = subprocess.run(
            [sys.executable, "-m", "fabric", "nightly", "--inventory", str(inventory), "--night", night],
            cwd=PROJECT_ROOT, env=env, capture_output=True, text=True, timeout=1500,
        )  # fmt: skip
        assert done.returncode == 0, done.stdout + done.stderr
    history = History(f"sqlite:///{tmp_path / 'history.sqlite'}")
    try:
        for context in (32, 128):
            cell = ("local", f"{MODEL}.sdpa.ctx{context}", "xnnpack")
            runs = history.runs(cell=cell)
            assert sorted(r.night for r in runs) == list(NIGHTS), runs
            assert all(r.status == "ok" and r.generation and r.generation.context == context for r in runs), runs
    finally:
        history.close()
    page = (tmp_path / "reports" / f"nightly-{NIGHTS[1]}.html").read_text()
    for context in (32, 128):
        assert f"latency trend local / {MODEL}.sdpa.ctx{context} / xnnpack" in page
