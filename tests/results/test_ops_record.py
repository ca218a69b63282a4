"""analysis/ops.json read back as typed records (results/ops_record.py on orchestrator/records.py): the recorded
profiles of earlier runs read back, an untimed instruction's null time is 0, and a damaged field is an AnalysisError
(exit 65) naming the file and the field."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from orchestrator.errors import AnalysisError, ExitCode
from orchestrator.results.ops_record import read_ops

DATA = Path(__file__).parents[1] / "data" / "advice"
MODELS = sorted(path.name for path in DATA.iterdir())


def _recorded(model: str = "distilbert-tiny") -> dict[str, Any]:
    return copy.deepcopy(json.loads((DATA / model / "ops.json").read_text()))


@pytest.mark.parametrize("model", MODELS)
def test_the_recorded_profiles_of_earlier_runs_read_back(model: str) -> None:
    raw = _recorded(model)
    ops = read_ops(raw)
    assert [i.node_id for i in ops.instructions] == [row["node_id"] for row in raw["instructions"]]
    assert [i.index for i in ops.instructions] == [row["instruction"] for row in raw["instructions"]]
    assert [d.placed for d in ops.delegates] == [row["status"] == "placed" for row in raw["delegates"]]
    assert ops.method_mean_ms == raw["method_ms"]["mean"]
    medians = sum(row["median_ms"] or 0.0 for row in raw["instructions"])
    assert ops.method_median_ms == max(raw["method_ms"]["median"], medians)  # the baseline of every share


def test_an_untimed_instruction_reads_as_zero_and_the_method_falls_back_to_their_sum() -> None:
    raw = _recorded()
    raw["instructions"][0].update(mean_ms=None, median_ms=None, samples=0)
    raw["method_ms"] = None
    ops = read_ops(raw)
    assert ops.instructions[0].mean_ms == 0.0 and ops.instructions[0].timed_median_ms is None
    assert ops.method_mean_ms == pytest.approx(sum(row["mean_ms"] or 0.0 for row in raw["instructions"]))
    assert ops.method_median_ms == pytest.approx(sum(row["median_ms"] or 0.0 for row in raw["instructions"]))


@pytest.mark.parametrize(
    ("damage", "field"),
    [
        (lambda raw: raw["instructions"][0].update(samples=-3), "instructions[0].samples"),
        (lambda raw: raw["instructions"][1].update(median_ms="fast"), "instructions[1].median_ms"),
        (lambda raw: raw["instructions"][0].update(instruction=True), "instructions[0].instruction"),
        (lambda raw: raw["delegates"][0]["nodes"][0].update(mean_ms=-1), "delegates[0].nodes[0].mean_ms"),
        (lambda raw: raw.pop("instructions"), "instructions"),
        (lambda raw: raw.update(run_id=7), "run_id"),
    ],
)
def test_a_damaged_field_is_named_with_its_file(damage: Any, field: str) -> None:
    raw = _recorded()
    damage(raw)
    with pytest.raises(AnalysisError) as caught:
        read_ops(raw, "run/analysis/ops.json")
    assert str(caught.value).startswith(f"run/analysis/ops.json: {field}: "), str(caught.value)
    assert caught.value.exit_code == ExitCode.DATA
