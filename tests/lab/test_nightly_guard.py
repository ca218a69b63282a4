"""Two nightlies of one night never trip over each other, and a broken history never loses a night: real `fab nightly`
processes on a real local board, real SQLite files (corrupted by overwriting pages, locked by another process in a
write transaction)."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from orchestrator.boards.inventory import Board
from orchestrator.lab.history import History
from orchestrator.lab.run_record import RunRecord
from orchestrator.paths import PROJECT_ROOT
from tests.lab.test_nightly import fab_nightly, nightly_section, stored
from tests.plugins.artifacts import TEST_CACHE
from tests.plugins.boards import write_inventory
from tests.plugins.processes import reaped

NIGHT = "2026-11-20"
TINY = [{"models": ["distilbert-tiny"], "backends": ["xnnpack"], "boards": ["local"]}]


def fab_env(tmp_path: Path) -> dict[str, str]:
    return {**os.environ, "ETLAB_ARTIFACTS": str(TEST_CACHE / "artifacts"), "ETLAB_RESULTS": str(tmp_path / "results")}


def fab_background(inventory: Path, tmp_path: Path, log: Path, *extra: str) -> subprocess.Popen[bytes]:
    """`fab nightly` in the background, stdout and stderr to `log`."""
    with open(log, "wb") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "fabric", "nightly", "--inventory", str(inventory), "--night", NIGHT, *extra],
            cwd=PROJECT_ROOT, env=fab_env(tmp_path), stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip


def fab(inventory: Path, tmp_path: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "fabric", "nightly", "--inventory", str(inventory), *extra],
        cwd=PROJECT_ROOT, env=fab_env(tmp_path), capture_output=True, text=True, timeout=900,
    )  # fmt: skip


def output(log: Path) -> str:
    return log.read_text(errors="replace") if log.exists() else ""


def wait_for(condition: Any, what: str, timeout: float = 300) -> None:
    """Poll `condition()` until true; fail naming `what` (a bound on a hang, never a timing assertion)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


class Locker:
    """Another process with the history open: on lock(), it begins a write transaction and holds it until close()."""

    SCRIPT = (
        "import sqlite3, sys\n"
        "connection = sqlite3.connect(sys.argv[1], isolation_level=None)\n"
        "sys.stdin.readline()\n"
        "connection.execute('BEGIN IMMEDIATE')\n"
        "print('locked', flush=True)\n"
        "sys.stdin.read()\n"
    )

    def __init__(self, database: Path) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-c", self.SCRIPT, str(database)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            text=True, start_new_session=True,
        )  # fmt: skip

    def lock(self) -> None:
        assert self.process.stdin is not None and self.process.stdout is not None
        self.process.stdin.write("lock\n")
        self.process.stdin.flush()
        assert self.process.stdout.readline().strip() == "locked"

    def close(self) -> None:
        if self.process.stdin is not None and not self.process.stdin.closed:
            self.process.stdin.close()  # the transaction ends with the process
        self.process.wait(timeout=60)


@contextlib.contextmanager
def locker(database: Path) -> Iterator[Locker]:
    held = Locker(database)
    with reaped(held.process):
        yield held
        held.close()


def tiny_inventory(local_board: Board, tmp_path: Path, **extra: Any) -> Path:
    section = nightly_section(tmp_path, TINY, iterations=5, **extra)
    return write_inventory(tmp_path / "inventory.yaml", [local_board], nightly=section)


# ---------------------------------------------------------------- item 6: one nightly per history and night


def test_a_second_nightly_of_the_night_names_the_first_or_waits_for_it(local_board: Board, tmp_path: Path) -> None:
    """The first nightly holds the night while it waits for a history another process keeps locked (so it is
    surely still running): a second one exits 75 naming it, a third with --wait runs once it is done, skipping
    the cell the first recorded. The first also shows item 7's wait for a locked history."""
    inventory = tiny_inventory(local_board, tmp_path)
    database = tmp_path / "history.sqlite"
    History(f"sqlite:///{database}").close()
    first_log, third_log = tmp_path / "first.log", tmp_path / "third.log"
    with locker(database) as other_writer:
        other_writer.lock()
        first = fab_background(inventory, tmp_path, first_log)
        with reaped(first):
            wait_for(lambda: "is locked by another writer" in output(first_log), "the first nightly to wait")
            assert first.poll() is None, output(first_log)

            second = fab_nightly(inventory, NIGHT, tmp_path)
            text = second.stdout + second.stderr
            assert second.returncode == 75, text
            assert f"night {NIGHT} of the history {database} is being run by another nightly" in text, text
            assert f"host {socket.gethostname()}, pid {first.pid}, since 20" in text, text
            assert "--wait" in text  # the hint

            third = fab_background(inventory, tmp_path, third_log, "--wait")
            with reaped(third):
                wait_for(lambda: f"pid {first.pid}" in output(third_log), "the third nightly to wait for the first")
                assert third.poll() is None, output(third_log)
                other_writer.close()
                assert first.wait(timeout=600) == 0, output(first_log)
                assert third.wait(timeout=600) == 0, output(third_log)
    assert "the history" in output(first_log) and "is free again" in output(first_log)
    assert f"1 cell(s) already recorded for {NIGHT}: skipped" in output(third_log), output(third_log)
    for log in (first_log, third_log):
        assert "IntegrityError" not in output(log) and "Traceback" not in output(log), output(log)
    (record,) = stored(tmp_path, NIGHT)
    assert record.status == "ok" and record.verdict == "new"
    assert not list(tmp_path.glob("history.sqlite.night-*")), "the lock and its note go with the nightly"


# ---------------------------------------------------------------- item 7: a broken history never loses a night


def real_history(database: Path) -> None:
    """A history as nights leave it: runs with their samples and op medians over many pages."""
    history = History(f"sqlite:///{database}")
    try:
        for day in range(1, 21):
            history.record(
                RunRecord(
                    run_id=f"run-{day}", night=f"2026-10-{day:02d}", board="local", model="distilbert-tiny",
                    backend="xnnpack", status="ok", validity="valid", median_ms=1.0,
                    latencies_ms=[1.0 + i / 1000 for i in range(200)],
                    ops={f"0:{i}": ("aten::addmm", 0.01 * i) for i in range(40)},
                )
            )  # fmt: skip
    finally:
        history.close()  # the last connection checkpoints the WAL into the file


def overwrite_page(database: Path, page: int) -> None:
    with sqlite3.connect(database) as connection:
        size = connection.execute("pragma page_size").fetchone()[0]
    connection.close()
    with open(database, "r+b") as handle:
        handle.seek((page - 1) * size)
        handle.write(bytes([0xA5]) * size)


def test_a_corrupt_history_is_named_before_any_cell_runs(local_board: Board, tmp_path: Path) -> None:
    inventory = tiny_inventory(local_board, tmp_path)
    database = tmp_path / "history.sqlite"
    real_history(database)
    with sqlite3.connect(database) as connection:
        (samples_root,) = connection.execute("select rootpage from sqlite_master where name = 'samples'").fetchone()
    connection.close()

    # Damaged pages inside: the schema still reads, the samples table does not.
    overwrite_page(database, samples_root)
    before = database.read_bytes()
    damaged = fab_nightly(inventory, NIGHT, tmp_path)
    text = damaged.stdout + damaged.stderr
    assert damaged.returncode == 65, text
    assert f"the history {database} is corrupt (SQLite's integrity check): Page {samples_root}" in text, text
    assert ".recover" in text  # the hint
    assert not (tmp_path / "results").exists() or not any((tmp_path / "results").rglob("result_manifest.json"))
    assert not (tmp_path / "reports").exists()
    assert database.read_bytes() == before, "the history is left as it was found"

    # Its header overwritten: not a database any more.
    overwrite_page(database, 1)
    header = fab_nightly(inventory, NIGHT, tmp_path)
    text = header.stdout + header.stderr
    assert header.returncode == 65, text
    assert f"the history {database} is corrupt or not a SQLite database: file is not a database" in text, text
    assert "Traceback" not in text and "internal error" not in text


def test_a_cell_the_history_fails_to_record_is_kept_then_recorded(local_board: Board, tmp_path: Path) -> None:
    """The history passes the check, then another process locks it while the cell runs, longer than the nightly
    waits: the cell's result is kept pending, the bundle stays, the reports show it; `--record-pending` records it."""
    inventory = tiny_inventory(local_board, tmp_path, history_wait_seconds=1)
    database = tmp_path / "history.sqlite"
    History(f"sqlite:///{database}").close()
    log = tmp_path / "nightly.log"
    with locker(database) as other_writer:
        nightly = fab_background(inventory, tmp_path, log, "--verbose")  # the board's step lines
        with reaped(nightly):
            # The board's first line comes after the history's check, seconds before the cell can be recorded.
            wait_for(lambda: "[local]" in output(log) or nightly.poll() is not None, "the board's first step")
            other_writer.lock()
            code = nightly.wait(timeout=600)
    text = output(log)
    assert code == 2, text  # measured, but the history is incomplete: infrastructure
    assert "did not record it" in text and "Traceback" not in text, text
    (pending,) = (tmp_path / "reports" / f"nightly-{NIGHT}" / "pending").glob("*.json")
    kept = json.loads(pending.read_text())["record"]
    assert (kept["board"], kept["model"], kept["backend"], kept["status"]) == ("local", "distilbert-tiny", "xnnpack",
                                                                               "ok")  # fmt: skip
    assert kept["verdict"] == "new" and len(kept["latencies_ms"]) == 5
    assert Path(kept["bundle_path"], "result_manifest.json").is_file(), "the bundle stays"
    report = (tmp_path / "reports" / f"nightly-{NIGHT}.md").read_text()
    assert "| local | distilbert-tiny | xnnpack |" in report and "**Not recorded**" in report, report
    assert stored(tmp_path, NIGHT) == []

    recorded = fab(inventory, tmp_path, "--record-pending")
    assert recorded.returncode == 0, recorded.stdout + recorded.stderr
    assert "1 pending result(s) recorded" in recorded.stderr
    (record,) = stored(tmp_path, NIGHT)
    assert record.run_id == kept["run_id"] and record.latencies_ms == kept["latencies_ms"]
    assert record.verdict == "new" and record.bundle_path == kept["bundle_path"]
    assert not (tmp_path / "reports" / f"nightly-{NIGHT}").exists(), "nothing is pending any more"

    # The night is complete: re-running it runs nothing.
    again = fab_nightly(inventory, NIGHT, tmp_path)
    assert again.returncode == 0, again.stdout + again.stderr
    assert f"1 cell(s) already recorded for {NIGHT}: skipped" in again.stderr
