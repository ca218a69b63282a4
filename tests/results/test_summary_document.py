"""summary.json as a versioned document (results/summary.py on orchestrator/records.py): a file written by an earlier
etlab reads back, a newer one is refused by its version, and every field's type is its check (exit 65, the file and
the field named), through `load_summary`, the reader every command and page uses."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from orchestrator.errors import AnalysisError, ExitCode
from orchestrator.records import to_data
from orchestrator.results.documents import load_summary
from orchestrator.results.summary import TokenCheck, read_summary, summary_data

DATA = Path(__file__).parents[1] / "data"
# Written by RunSummary.to_dict() on main at 11bff8d, every optional section filled in (tests/data/summary/).
WRITTEN_BEFORE = DATA / "summary" / "summary_main_11bff8d.json"


def _planted(tmp_path: Path, document: Any) -> Path:
    (tmp_path / "analysis").mkdir(exist_ok=True)
    (tmp_path / "analysis" / "summary.json").write_text(json.dumps(document))
    return tmp_path


def test_a_summary_written_by_the_previous_etlab_reads_back_with_every_section(tmp_path: Path) -> None:
    old = json.loads(WRITTEN_BEFORE.read_text())
    summary = load_summary(_planted(tmp_path, old))
    assert summary.run_id == old["run_id"] and summary.validity.status == old["validity"]["status"]
    assert summary.latency.hashing_ms is not None and summary.latency.hashing_ms.model == 1.5
    assert summary.memory is not None and summary.memory.planned_arenas == (4096, 128)
    assert summary.generation is not None and summary.generation.tokens == TokenCheck(8, 6, 0.75, 6, 8)
    assert summary.generation.ids_text == "75%, parts at 6"
    assert summary.accuracy is not None and summary.accuracy.outputs[0].shape == (1, 8, 64)
    assert summary.counters is not None and summary.counters.missing[0]["reason"] == "no PMU"
    written = summary_data(summary)
    assert written.pop("modules") is None  # a section newer than the file: the time by module (a source map's)
    assert written.pop("numerics") is None  # and the numerics pass's (issue 53)
    assert written.pop("energy") is None  # and the board's power (issue 55)
    assert written.pop("operator_roofline") is None  # and the matmuls against the board's limits (issue 55)
    assert list(written) == list(old), "the same keys in the same order"
    # The one difference: an absent reference_shape (= the output's own) is now written as null, which reads the same.
    for section in ("correctness", "accuracy"):
        for output in written[section]["outputs"]:
            assert output.pop("reference_shape") is None
    # Fields newer than the file, null when it has none: the parameters, the spread of the tokens/s (issue 54)
    assert written["model"].pop("parameters") is None
    assert [written["generation"].pop(f"{phase}_tokens_per_s_sd") for phase in ("prefill", "decode")] == [None, None]
    assert written["generation"].pop("roofline") is None  # the decode against the board's bandwidth (issue 55)
    assert written["generation"].pop("prefill_roofline") is None  # and the prefill against its limits (issue 55)
    assert written == old
    assert read_summary(summary_data(summary)) == summary


@pytest.mark.parametrize("model", sorted(path.name for path in (DATA / "advice").iterdir()))
def test_the_recorded_summaries_of_earlier_runs_read_back(model: str) -> None:
    old = json.loads((DATA / "advice" / model / "summary.json").read_text())
    summary = read_summary(old, f"{model}/summary.json")
    assert read_summary(summary_data(summary)) == summary


def test_a_summary_from_a_newer_etlab_is_refused_by_its_version(tmp_path: Path) -> None:
    newer = {**json.loads(WRITTEN_BEFORE.read_text()), "schema": 2}
    with pytest.raises(AnalysisError, match=r"summary\.json: schema: version 2 was written by a newer etlab") as caught:
        load_summary(_planted(tmp_path, newer))
    assert caught.value.exit_code == ExitCode.DATA


def _damaged(path: str, value: Any) -> dict[str, Any]:
    document = copy.deepcopy(json.loads(WRITTEN_BEFORE.read_text()))
    *parents, last = path.split(".")
    target = document
    for key in parents:
        target = target[int(key)] if isinstance(target, list) else target[key]
    target[last] = value
    return document


@pytest.mark.parametrize(
    ("path", "value", "field"),
    [
        ("latency.threads", True, "latency.threads"),  # a count is never a bool
        ("latency.iterations", -2, "latency.iterations"),
        ("latency.warm.median_ms", -1.0, "latency.warm.median_ms"),  # a time is >= 0
        ("latency.hashing_ms.model", "slow", "latency.hashing_ms.model"),
        ("memory.planned_arenas", [4096, 1.5], "memory.planned_arenas[1]"),
        ("memory.phases.first_execution.peak_rss_bytes", -5, "memory.phases[...][...]"),  # msgspec: no key names
        ("generation.tokens.agreement", 1.5, "generation.tokens.agreement"),  # a share is 0..1
        ("accuracy.verdict", "great", "accuracy.verdict"),
        ("accuracy.outputs.0.top5_overlap", 2, "accuracy.outputs[0].top5_overlap"),
        ("correctness.outputs.0.shape", [1, -8], "correctness.outputs[0].shape[1]"),
        ("validity.status", "great", "validity.status"),
        ("validity.reasons", "none", "validity.reasons"),
        ("model", ["not", "a", "mapping"], "model"),
        ("run_id", "", "run_id"),
    ],
)
def test_a_damaged_field_is_refused_naming_the_file_and_the_field(
    tmp_path: Path, path: str, value: Any, field: str
) -> None:
    with pytest.raises(AnalysisError) as caught:
        load_summary(_planted(tmp_path, _damaged(path, value)))
    assert str(caught.value).startswith(f"{tmp_path / 'analysis' / 'summary.json'}: {field}: "), str(caught.value)
    assert caught.value.exit_code == ExitCode.DATA


def test_board_conditions_stay_a_report_but_their_throttling_is_text(tmp_path: Path) -> None:
    extra = _damaged("board_conditions.anything_a_newer_board_says", {"nested": [1, "two"]})
    assert load_summary(_planted(tmp_path, extra)).board_conditions["anything_a_newer_board_says"] == {
        "nested": [1, "two"]
    }
    with pytest.raises(AnalysisError, match=r"summary\.json: board_conditions\.throttling_during_run"):
        load_summary(_planted(tmp_path, _damaged("board_conditions.throttling_during_run", [1])))


def test_a_field_the_file_lacks_is_its_default_for_every_reader(tmp_path: Path) -> None:
    """Pages and reports read the sections as data (records.to_data): a key a file lacks is there, as its default."""
    old = json.loads(WRITTEN_BEFORE.read_text())
    for key in ("kind_note", "reason", "thresholds"):
        del old["correctness"][key]
    del old["latency"]["stopped_early"]
    summary = load_summary(_planted(tmp_path, old))
    correctness = to_data(summary.correctness)
    assert (correctness["kind_note"], correctness["thresholds"]) == (None, {}) and correctness["reason"]
    assert summary_data(summary)["latency"]["stopped_early"] is None
