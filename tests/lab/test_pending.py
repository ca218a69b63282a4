"""Pending results (orchestrator/lab/pending.py) as they come back: a language model's cell kept pending is recorded
typed like a fresh one, and damaged or edited pending files are named, kept and skipped, never a crash, through real
`fab nightly` processes on the local board. A hypothesis test feeds the pending reader any document. How a cell
comes to be kept pending (a history locked while it runs): test_nightly_guard.py."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import event, given
from hypothesis import strategies as st

from orchestrator.boards.inventory import Board
from orchestrator.lab import pending
from orchestrator.lab.history import History
from orchestrator.lab.run_record import RunRecord, read_run_record
from orchestrator.lowering.programs import holder_id
from orchestrator.paths import PROJECT_ROOT
from orchestrator.records import to_data
from orchestrator.results.summary import Generation
from orchestrator.strictjson import JsonDataError
from tests.lab.test_nightly import stored
from tests.lab.test_nightly_guard import NIGHT, fab, fab_env, fab_nightly, tiny_inventory
from tests.plugins.fuzz import FUZZ, FUZZ_TIMEOUT
from tests.plugins.generation import GENERATION_MODEL, GenerationNights

EARLIER = "2026-11-19"  # the night the pending results were measured; the nightlies here run NIGHT


def measured(run_id: str, model: str = "distilbert-tiny", **changes: Any) -> RunRecord:
    """A record as a fresh cell makes it (record_from_cell's fields), judged, of the night EARLIER."""
    values: dict[str, Any] = {
        "run_id": run_id, "night": EARLIER, "board": "local", "model": model, "backend": "xnnpack", "status": "ok",
        "validity": "valid", "reasons": [], "versions": {"torch": "2.13.0", "executorch": "1.5.1"},
        "pte_sha256": "c" * 64, "threads": 2, "median_ms": 3.0, "p90_ms": 3.2, "mean_ms": 3.05, "cv": 0.02,
        "conditions": {"governor_before": "performance", "throttling_during_run": []},
        "bundle_path": f"/results/local/{model}/xnnpack/{run_id}", "latencies_ms": [3.0, 2.9, 3.1],
        "ops": {"0:3": ("aten::addmm", 0.5)}, "environment": {"runtime": "1.5.1", "runner": "1"},
        "verdict": "new", "verdict_info": {"detail": "first nights", "slower_ops": []}, "peak_rss_bytes": 50_000_000,
        "planned_bytes": 1_024,
    }  # fmt: skip
    values.update(changes)
    return RunRecord(**values)


def history_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'history.sqlite'}"


# ---------------------------------------------------------------- item 6: a language model's cell, kept pending


def test_a_pending_language_model_cell_is_recorded_typed_by_the_next_nightly(
    local_board: Board, tmp_path: Path, generation_nights: GenerationNights
) -> None:
    """A text-generation cell kept pending (its `generation` figures in the file) is recorded by the next nightly,
    read back as the same typed Generation a fresh cell has; the nightly then runs its own cells."""
    real = next(r for r in generation_nights.records() if r.model == GENERATION_MODEL)
    assert isinstance(real.generation, Generation) and real.generation.ttft_ms
    kept = dataclasses.replace(real, night=EARLIER, verdict="new", verdict_info={"detail": "first nights"})
    inventory = tiny_inventory(local_board, tmp_path)
    path = pending.write(tmp_path / "reports", history_url(tmp_path), kept)
    assert json.loads(path.read_text())["record"]["generation"]["ttft_ms"] == real.generation.ttft_ms

    night = fab_nightly(inventory, NIGHT, tmp_path)
    text = night.stdout + night.stderr
    assert night.returncode == 0, text
    assert f"recorded the pending result of local / {GENERATION_MODEL} / xnnpack ({EARLIER})" in text, text
    (record,) = stored(tmp_path, EARLIER)
    assert isinstance(record.generation, Generation) and record.generation == real.generation
    assert (record.run_id, record.latencies_ms, record.verdict) == (real.run_id, real.latencies_ms, "new")
    assert not path.exists() and not (tmp_path / "reports" / f"nightly-{EARLIER}").exists()
    (tonight,) = stored(tmp_path, NIGHT)
    assert tonight.status == "ok", "the nightly ran its own cell after recording the pending one"


# ---------------------------------------------------------------- item 7: damaged or edited pending files

TAMPERED = {  # file stem -> (the record's field set to a bad value, the field the message names)
    "latencies": ("latencies_ms", 5, "record.latencies_ms"),
    "board": ("board", ["x"], "record.board"),
    "threads": ("threads", 10**30, "record.threads"),  # past any int64: the strict JSON reader refuses it
    "conditions": ("conditions", "hot", "record.conditions"),
    "generation": ("generation", "fast", "record.generation"),
    "ops": ("ops", {"0:1": ["aten::add", "slow"]}, "record.ops[...][1]"),  # msgspec names no dict key
}


def write_tampered(reports: Path, url: str) -> dict[str, Path]:
    """One pending file per TAMPERED entry, each a real pending file with one field edited."""
    paths = {}
    for number, (stem, (name, value, _field)) in enumerate(TAMPERED.items()):
        path = pending.write(reports, url, measured(f"run-{stem}", model=f"model-{number}"))
        document = json.loads(path.read_text())
        document["record"][name] = value
        path.write_text(json.dumps(document))
        paths[stem] = path
    return paths


def test_malformed_pending_files_are_named_kept_and_skipped(local_board: Board, tmp_path: Path) -> None:
    inventory = tiny_inventory(local_board, tmp_path)
    reports, url = tmp_path / "reports", history_url(tmp_path)
    History(url).close()
    good = pending.write(reports, url, measured("run-good"))
    tampered = write_tampered(reports, url)
    before = {path: path.read_bytes() for path in tampered.values()}

    recorded = fab(inventory, tmp_path, "--record-pending")
    text = recorded.stdout + recorded.stderr
    assert recorded.returncode == 75, text  # some are left: try again once they are mended
    assert "1 pending result(s) recorded" in text and "Traceback" not in text, text
    for stem, (_name, _value, field) in TAMPERED.items():
        assert f"{tampered[stem]}: {field}: " in text, (stem, text)
    assert {path: path.read_bytes() for path in tampered.values()} == before, "kept as they were"
    assert not good.exists()
    (record,) = stored(tmp_path, EARLIER)
    assert record.run_id == "run-good" and record.latencies_ms == [3.0, 2.9, 3.1]

    # What was recorded shows on the dashboard's pages.
    env = fab_env(tmp_path)
    static = subprocess.run(
        [sys.executable, "-m", "fabric", "dashboard", "--inventory", str(inventory), "--static", str(tmp_path / "d")],
        cwd=PROJECT_ROOT, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert static.returncode == 0, static.stdout + static.stderr

    # A nightly runs its night all the same; good otherwise, it exits 75 for what it had to leave behind.
    night = fab_nightly(inventory, NIGHT, tmp_path)
    text = night.stdout + night.stderr
    assert night.returncode == 75, text
    assert "Traceback" not in text and f"{tampered['latencies']}: record.latencies_ms: " in text, text
    (tonight,) = stored(tmp_path, NIGHT)
    assert tonight.status == "ok"
    markdown = (reports / f"nightly-{NIGHT}.md").read_text()
    assert f"**Still pending**: {len(TAMPERED)} result(s) of earlier nights" in markdown, markdown
    assert str(tampered["conditions"]) in markdown
    assert all(path.exists() for path in tampered.values())


# ---------------------------------------------------------------- the pending reader takes any document

MINE = holder_id("sqlite:///history.sqlite")
# Values near a field's edges: a column's size, a night's other spellings, what SQLite or PostgreSQL refuse to store.
EDGES = ["", "\x00", "a\ud800", "x" * 97, "x" * 201, "x" * 5000, EARLIER, "20261119", "2026-W47-4", "ok", "infra",
         "valid", "new", "a" * 64, "A" * 64, 0, -1, 1, 4097, 2**31, 2**63 - 1, -(2**63), 1e308, -0.0, 0.5, [1.5, -2],
         ["aten::add", 1.0], ["a", "b"], {"a": "b"}, {"0:1": ["aten::add", 1.0]}, {"x": {"y": [1, None]}}]  # fmt: skip
json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats()
    | st.sampled_from(EDGES)
    | st.text(st.characters(exclude_categories=()), max_size=80),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=12), children, max_size=4),
    max_leaves=12,
)
FIELDS = [field.name for field in dataclasses.fields(RunRecord)]
edit = st.one_of(
    st.tuples(st.just("set"), st.sampled_from(FIELDS), json_values),
    st.tuples(st.just("set"), st.sampled_from(FIELDS), st.sampled_from(EDGES)),
    st.tuples(st.just("drop"), st.sampled_from(FIELDS), st.none()),
    st.tuples(st.just("document"), st.sampled_from(["schema", "history", "record"]), json_values),
)


def edited(edits: list[tuple[str, str, Any]]) -> dict[str, Any]:
    """A valid pending document with `edits` applied."""
    record = to_data(measured("run-fuzz"))
    document: dict[str, Any] = {"schema": pending.SCHEMA, "history": MINE, "record": record}
    for kind, name, value in edits:
        if kind == "set":
            record[name] = value
        elif kind == "drop":
            record.pop(name, None)
        else:
            document[name] = value
    return document


# Three in four examples edit a valid document; the others are any JSON value at all.
documents = st.integers(0, 3).flatmap(lambda n: json_values if n == 0 else st.lists(edit, max_size=3).map(edited))


@pytest.fixture(scope="module")
def fuzz_history(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, History]]:
    """A pending folder and a real SQLite history, shared by the examples (each leaves both as it found them)."""
    root = tmp_path_factory.mktemp("pending-fuzz")
    history = History(f"sqlite:///{root / 'history.sqlite'}")
    yield root / "reports" / f"nightly-{EARLIER}" / "pending", history
    history.close()


@FUZZ_TIMEOUT
@FUZZ
@given(document=documents)
def test_the_pending_reader_takes_any_document(fuzz_history: tuple[Path, History], document: Any) -> None:
    """Whatever a pending file holds, the reader gives the typed error (naming the file) or a record the history
    stores and gives back unchanged; nothing else ever escapes."""
    folder, history = fuzz_history
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "local--m--xnnpack.json"
    path.write_text(json.dumps(document, allow_nan=True))
    try:
        record = pending.load(path, MINE)
    except JsonDataError as exc:
        assert str(exc).startswith(f"{path}: "), exc
        event("refused")
        return
    event("read")
    if record is None:
        return  # another history's file
    assert read_run_record(to_data(record), "again") == record, "to_data writes what read_run_record reads"
    history.record(record)
    try:
        (back,) = history.runs(night=record.night)
        assert dataclasses.replace(back, created_at=None) == dataclasses.replace(record, created_at=None)
    finally:
        with history.engine.begin() as connection:
            connection.exec_driver_sql("delete from runs")


@pytest.mark.parametrize("name", ["board", "error", "bundle_path"])
@pytest.mark.parametrize("value", ["pi\ud800", "pi\x00"])
def test_text_a_database_cannot_store_is_refused(tmp_path: Path, name: str, value: str) -> None:
    """JSON spells an unpaired surrogate (SQLite's driver cannot encode it) and NUL (PostgreSQL refuses it): a pending
    file holding one would fail every attempt to record it."""
    path = tmp_path / "reports" / f"nightly-{EARLIER}" / "pending" / "local--m--xnnpack.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(edited([("set", name, value)])))
    with pytest.raises(JsonDataError, match=f"record.{name}: holds a NUL or a lone surrogate"):
        pending.load(path, MINE)
