"""The history store on SQLite (the default) and on a real PostgreSQL server (a shared lab): one code path."""

from __future__ import annotations

import sqlite3
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy

from orchestrator.errors import ArtifactError
from orchestrator.lab.history import History
from orchestrator.lab.run_record import RunRecord
from orchestrator.results.documents import load_summary
from tests.plugins.generation import GenerationNights


@pytest.fixture(params=["sqlite", "postgresql"])
def history(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[History]:
    if request.param == "sqlite":
        store = History(f"sqlite:///{tmp_path / 'history.sqlite'}")
    else:
        base = request.getfixturevalue("postgres_url")
        database = f"etlab_{uuid.uuid4().hex[:10]}"
        admin = sqlalchemy.create_engine(base, isolation_level="AUTOCOMMIT")
        with admin.connect() as connection:
            connection.execute(sqlalchemy.text(f"create database {database}"))
        admin.dispose()
        store = History(base.rsplit("/", 1)[0] + f"/{database}")
    yield store
    store.close()


def record(run_id: str, night: str, board: str = "pi5-a", **changes: object) -> RunRecord:
    values: dict[str, object] = {
        "run_id": run_id,
        "night": night,
        "board": board,
        "model": "distilbert",
        "backend": "xnnpack",
        "status": "ok",
        "validity": "valid",
        "versions": {"torch": "2.13.0", "executorch": "1.5.1"},
        "median_ms": 55.0,
        "latencies_ms": [55.0, 54.5, 56.1],
        "ops": {"0:3": ("aten::addmm", 1.25), "0:7": ("XnnpackBackend", 40.0)},
        "conditions": {"governor_before": "performance"},
    }
    values.update(changes)
    return RunRecord(**values)  # type: ignore[arg-type]


def test_round_trip(history: History) -> None:
    history.record(record("r1", "2026-11-01", peak_rss_bytes=123_456_789, planned_bytes=1_024_080))
    (stored,) = history.runs(night="2026-11-01")
    assert (stored.peak_rss_bytes, stored.planned_bytes) == (123_456_789, 1_024_080)
    assert stored.latencies_ms == [55.0, 54.5, 56.1]
    assert stored.ops == {"0:3": ("aten::addmm", 1.25), "0:7": ("XnnpackBackend", 40.0)}
    assert stored.versions == {"torch": "2.13.0", "executorch": "1.5.1"}
    assert stored.conditions == {"governor_before": "performance"}
    assert history.nights() == ["2026-11-01"]


def test_a_failed_write_leaves_nothing_behind(history: History) -> None:
    history.record(record("r1", "2026-11-01"))
    # Same cell, same night: the unique constraint rejects the run, and its samples must not land either.
    with pytest.raises(sqlalchemy.exc.IntegrityError):
        history.record(record("r2", "2026-11-01", latencies_ms=[1.0] * 50))
    assert [r.run_id for r in history.runs()] == ["r1"]
    with history.engine.connect() as connection:
        assert connection.execute(sqlalchemy.text("select count(*) from samples")).scalar() == 3


def test_baseline_queries(history: History) -> None:
    history.record(record("a", "2026-11-01"))
    history.record(record("b", "2026-11-02", validity="invalid"))
    history.record(record("c", "2026-11-03", status="failed", validity="invalid", latencies_ms=[]))
    history.record(record("d", "2026-11-04", versions={"torch": "2.14.0", "executorch": "1.5.1"}))
    history.record(record("e", "2026-11-04", board="pi4-a"))
    baseline = history.runs(
        cell=("pi5-a", "distilbert", "xnnpack"),
        before_night="2026-11-05",
        versions={"torch": "2.13.0", "executorch": "1.5.1"},
        valid_only=True,
    )
    assert [r.run_id for r in baseline] == ["a"]


def test_resume_bookkeeping(history: History) -> None:
    history.record(record("ok", "2026-11-05"))
    history.record(record("down", "2026-11-05", board="pi4-a", status="infra", validity="invalid", latencies_ms=[]))
    assert history.recorded_cells("2026-11-05") == {("pi5-a", "distilbert", "xnnpack")}
    assert len(history.recorded_cells("2026-11-05", include_infra=True)) == 2
    # The retry of the infrastructure failure replaces it, in the same transaction.
    history.record(record("retried", "2026-11-05", board="pi4-a"))
    assert sorted((r.run_id, r.status) for r in history.runs(night="2026-11-05")) == [("ok", "ok"), ("retried", "ok")]


def test_an_older_history_file_still_opens(tmp_path: Path) -> None:
    """A database written before verdicts existed: the new columns are added, old rows read back and judge."""
    path = tmp_path / "old.sqlite"
    old = History(f"sqlite:///{path}")
    old.record(record("before", "2026-10-01"))
    old.close()
    with sqlite3.connect(path) as connection:  # back to the old schema: drop the columns this version added
        for column in ("environment", "verdict", "verdict_info"):
            connection.execute(f"alter table runs drop column {column}")
        assert "verdict" not in {row[1] for row in connection.execute("pragma table_info(runs)")}
    store = History(f"sqlite:///{path}")
    try:
        (before,) = store.runs()
        assert before.run_id == "before" and before.environment == {} and before.verdict is None
        store.record(record("after", "2026-10-02", environment={"runner": "1"}))
        store.set_verdict("after", "drift", {"drift": 1.2})
        after = store.runs(night="2026-10-02")[0]
        assert after.verdict == "drift" and after.verdict_info == {"drift": 1.2}
        assert after.environment == {"runner": "1"}
    finally:
        store.close()


def test_a_language_models_figures_round_trip_typed(history: History, generation_nights: GenerationNights) -> None:
    """A real run's summary.json `generation` (tests/plugins/generation.py) through both databases: the same
    typed Generation back, with its token agreement; a run of another task has none."""
    bundle = generation_nights.records()[0].bundle_path
    assert bundle is not None
    generation = load_summary(Path(bundle)).generation
    assert generation is not None and generation.ttft_ms and generation.tokens
    history.record(record("lm", "2026-11-01", model="smollm2-gen-tiny", generation=generation))
    history.record(record("vision", "2026-11-01", model="resnet"))
    by_id = {r.run_id: r for r in history.runs(night="2026-11-01")}
    assert by_id["lm"].generation == generation and by_id["vision"].generation is None
    assert by_id["lm"].generation.token_agreement == 1.0
    assert [r.generation for r in history.records(night="2026-11-01") if r.run_id == "lm"] == [generation]


def test_an_older_history_without_generation_gains_the_column(
    tmp_path: Path, generation_nights: GenerationNights
) -> None:
    """A database written before language models: the `generation` column is added, its rows read back without
    figures, and a new generation run is stored and read back typed."""
    path = tmp_path / "old.sqlite"
    old = History(f"sqlite:///{path}")
    old.record(record("before", "2026-10-01"))
    old.close()
    with sqlite3.connect(path) as connection:
        connection.execute("alter table runs drop column generation")
        assert "generation" not in {row[1] for row in connection.execute("pragma table_info(runs)")}
    real = generation_nights.records()[0]
    store = History(f"sqlite:///{path}")
    try:
        (before,) = store.runs()
        assert before.run_id == "before" and before.generation is None
        store.record(record("after", "2026-10-02", generation=real.generation))
        (after,) = store.runs(night="2026-10-02")
        assert after.generation == real.generation and after.generation is not None
    finally:
        store.close()
    with sqlite3.connect(path) as connection:
        assert "generation" in {row[1] for row in connection.execute("pragma table_info(runs)")}


def test_nightlies_sharing_kept_programs_never_drop_each_others_baselines(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import os

    from orchestrator.fsutil import sha256_file
    from orchestrator.lowering import programs

    monkeypatch.setenv("ETLAB_STATE", str(tmp_path / "state"))
    shas = {}
    for name in ("a", "b", "c"):
        pte = tmp_path / f"{name}.pte"
        pte.write_bytes(name.encode() * 100)
        shas[name] = sha256_file(pte)
    first, second = programs.holder_id("sqlite:///one.sqlite"), programs.holder_id("postgresql://lab/two")
    programs.keep(tmp_path / "a.pte", shas["a"], first)
    programs.keep(tmp_path / "b.pte", shas["b"], second)  # the second nightly is still running: b is its tonight
    programs.keep(tmp_path / "c.pte", shas["c"], first)
    # The first nightly ends with only `a` as a baseline: `c` goes, the second nightly's `b` stays.
    assert programs.prune([shas["a"]], first) == [shas["c"]]
    assert programs.kept() == {shas["a"], shas["b"]}
    # The second ends needing nothing: `b` goes, and `a` stays for the first.
    assert programs.prune([], second) == [shas["b"]]
    assert programs.find(shas["a"]) is not None
    # A holder nobody renewed for HOLDER_EXPIRY_DAYS protects nothing any more.
    holder_file = programs.store_dir() / "holders" / f"{first}.json"
    old = holder_file.stat().st_mtime - (programs.HOLDER_EXPIRY_DAYS + 1) * 86400
    os.utime(holder_file, (old, old))
    assert programs.prune([], second) == [shas["a"]]
    with pytest.raises(ArtifactError):
        programs.prune([], "../../etc")


def test_a_night_on_postgresql_is_held_by_one_nightly(postgres_url: str, tmp_path: Path) -> None:
    """The night's lock on a server history: an advisory lock, with its holder in a table. While this process
    holds the night, a real `fab nightly` of that night on that history exits 75 naming it; other nights are free."""
    import os
    import socket
    import subprocess
    import sys

    import yaml

    from orchestrator.lab import nightlock
    from orchestrator.paths import PROJECT_ROOT

    database = f"etlab_{uuid.uuid4().hex[:10]}"
    admin = sqlalchemy.create_engine(postgres_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as connection:
        connection.execute(sqlalchemy.text(f"create database {database}"))
    admin.dispose()
    url = postgres_url.rsplit("/", 1)[0] + f"/{database}"
    inventory = tmp_path / "inventory.yaml"
    inventory.write_text(yaml.safe_dump({
        "boards": {"local": {"transport": "local", "workdir": str(tmp_path / "wd")}},
        "nightly": {"history": url, "reports": str(tmp_path / "reports"),
                    "matrix": [{"models": ["distilbert-tiny"], "backends": ["xnnpack"], "boards": ["local"]}]},
    }))  # fmt: skip
    with nightlock.night_lock(url, "2026-11-20", "the lab's database"):
        assert nightlock.try_night(url, "2026-11-20") is None, "held: nobody else has it"
        other = nightlock.try_night(url, "2026-11-21")
        assert other is not None, "another night is free"
        other.release()
        done = subprocess.run(
            [sys.executable, "-m", "fabric", "nightly", "--inventory", str(inventory), "--night", "2026-11-20"],
            cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=300,
            env={**os.environ, "ETLAB_RESULTS": str(tmp_path / "results")},
        )  # fmt: skip
    text = done.stdout + done.stderr
    assert done.returncode == 75, text
    assert f"is being run by another nightly: host {socket.gethostname()}, pid {os.getpid()}, since 20" in text, text
    again = nightlock.try_night(url, "2026-11-20")
    assert again is not None, "released with the block"
    again.release()
    # The check before a night's first cell, on a server: it connects, and a test write leaves nothing behind.
    store = History(url, check=True)
    try:
        store.wait_writable(10)
        assert store.runs() == []
    finally:
        store.close()
