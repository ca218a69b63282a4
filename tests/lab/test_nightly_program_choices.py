"""A nightly matrix entry says a program's attention and KV cache sizes (`attention:`, `context:`), as `--attention`
and `--context` do (lowering/program.py names each program), checked with the file, line and field (the same
refusals as the command line's). Such an entry runs for real and keeps its trends in tests/lab/test_migration.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from orchestrator.boards.inventory import load_inventory
from orchestrator.errors import InventoryError
from orchestrator.lab.matrix import load_config
from orchestrator.lowering.attention.choice import attention_of

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


@pytest.mark.parametrize(("given", "mode"), [(True, "stats"), ("full", "full"), (False, None), ("stats", "stats")])
def test_an_entry_asks_for_a_numerics_pass(tmp_path: Path, given: Any, mode: str | None) -> None:
    entry = {"models": ["distilbert-tiny"], "numerics": given}
    (matrix,) = load_config(load_inventory(inventory_with(tmp_path, entry))).entries
    assert matrix.params.numerics == mode


def test_a_bad_numerics_value_names_its_line(tmp_path: Path) -> None:
    with pytest.raises(InventoryError) as caught:
        load_config(load_inventory(inventory_with(tmp_path, {"models": ["distilbert-tiny"], "numerics": "all"})))
    said = str(caught.value)
    assert "nightly.matrix[0].numerics: expected one of stats, full, got 'all'" in said and "inventory.yaml:" in said
