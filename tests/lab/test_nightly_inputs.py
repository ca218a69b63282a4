"""What a nightly is told before it runs anything, through real `fab nightly` and `fab dashboard --static` processes:
`--history` values (and the inventory's `history:`), a history server that is down or refuses us (a real PostgreSQL),
`--night` spellings, and a reports folder two histories would share. Nothing is run, locked or written for a value
that is refused. The night's lock and a broken history: test_nightly_guard.py; pending results: test_pending.py."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from orchestrator.boards.inventory import Board
from orchestrator.lab.history import History
from orchestrator.paths import PROJECT_ROOT
from tests.lab.test_nightly import nightly_section
from tests.lab.test_nightly_guard import NIGHT, TINY, fab_env
from tests.plugins.boards import write_inventory
from tests.plugins.sshd import free_port

FORMS = "a history is sqlite:///PATH (a SQLite file; sqlite:////abs/path for an absolute one) or postgresql+psycopg://"


def run_fab(tmp_path: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "fabric", *argv], cwd=PROJECT_ROOT, env=fab_env(tmp_path), capture_output=True,
        text=True, timeout=300,
    )  # fmt: skip


def unreachable_inventory(tmp_path: Path, **nightly: Any) -> Path:
    """An inventory whose one board never answers (a closed port): a nightly that got as far as a board would show."""
    path = tmp_path / "inventory.yaml"
    board = {"host": "127.0.0.1", "port": free_port("127.0.0.1"), "user": "nobody", "connect_timeout": 2}
    matrix = [{"models": ["distilbert-tiny"], "backends": ["xnnpack"], "boards": ["gone"]}]
    section = {"history": f"sqlite:///{tmp_path / 'history.sqlite'}", "reports": str(tmp_path / "reports"),
               "matrix": matrix, **nightly}  # fmt: skip
    path.write_text(yaml.safe_dump({"boards": {"gone": board}, "nightly": section}, sort_keys=False))
    return path


def nothing_written(tmp_path: Path) -> None:
    """Nothing a refused nightly could have left: no history, lock, report, result or dashboard."""
    left = sorted(p.name for p in tmp_path.iterdir() if p.name not in ("inventory.yaml",))
    assert left == [], left


def commands(inventory: Path, tmp_path: Path) -> list[list[str]]:
    """Every command that takes --history: the nightly, its --record-pending, the static dashboard."""
    return [
        ["nightly", "--inventory", str(inventory), "--night", NIGHT],
        ["nightly", "--inventory", str(inventory), "--record-pending"],
        ["dashboard", "--inventory", str(inventory), "--static", str(tmp_path / "static")],
    ]


# ---------------------------------------------------------------- item 8: --history values

MALFORMED = {
    "notaurl": "not a database URL",
    "foo://x": "SQLAlchemy knows no database 'foo'",
    "mysql://etlab@db.lab/etlab": "the driver of mysql:// is not installed (MySQLdb)",
    "sqlite:///": "an in-memory SQLite database keeps nothing once etlab ends",
    "sqlite://": "an in-memory SQLite database keeps nothing once etlab ends",
}


def test_a_malformed_history_is_refused_naming_it_and_the_forms(tmp_path: Path) -> None:
    inventory = unreachable_inventory(tmp_path)
    for value, problem in MALFORMED.items():
        for argv in commands(inventory, tmp_path):
            done = run_fab(tmp_path, *argv, "--history", value)
            text = done.stdout + done.stderr
            assert done.returncode == 64, (argv, value, text)
            assert f"--history {value!r}: {problem}" in text and FORMS in text, (argv, text)
            assert "Traceback" not in text
    nothing_written(tmp_path)


def test_the_inventorys_history_is_checked_the_same_with_file_line_and_field(tmp_path: Path) -> None:
    inventory = unreachable_inventory(tmp_path, history="foo://x")
    line = next(n for n, text in enumerate(inventory.read_text().splitlines(), 1) if "foo://x" in text)
    for argv in commands(inventory, tmp_path):
        done = run_fab(tmp_path, *argv)
        text = done.stdout + done.stderr
        assert done.returncode == 64, (argv, text)
        assert f"{inventory}:{line}: nightly.history: 'foo://x': SQLAlchemy knows no database 'foo'" in text, text
        assert FORMS in text
    nothing_written(tmp_path)


def test_a_history_server_that_is_down_is_75_naming_it(tmp_path: Path) -> None:
    """Nothing listens on the port: every command says which server, exit 75, before a lock or a cell."""
    port = free_port("127.0.0.1")
    url = f"postgresql+psycopg://etlab:secret@127.0.0.1:{port}/etlab"
    inventory = unreachable_inventory(tmp_path)
    for argv in commands(inventory, tmp_path):
        done = run_fab(tmp_path, *argv, "--history", url)
        text = done.stdout + done.stderr
        assert done.returncode == 75, (argv, text)
        assert f"the history's server 127.0.0.1:{port} cannot be reached: " in text, (argv, text)
        assert "secret" not in text and "Traceback" not in text
    # The inventory's history too.
    inventory = unreachable_inventory(tmp_path, history=url)
    done = run_fab(tmp_path, *commands(inventory, tmp_path)[0])
    assert done.returncode == 75 and f"127.0.0.1:{port} cannot be reached" in done.stderr, done.stderr
    nothing_written(tmp_path)


def test_a_history_server_that_refuses_us_is_named(postgres_url: str, tmp_path: Path) -> None:
    """The server answers, but has no such database: the history cannot be used (65), the server's words said."""
    url = postgres_url.rsplit("/", 1)[0] + "/no_such_history"
    inventory = unreachable_inventory(tmp_path)
    for argv in commands(inventory, tmp_path):
        done = run_fab(tmp_path, *argv, "--history", url)
        text = done.stdout + done.stderr
        assert done.returncode == 65, (argv, text)
        assert 'database "no_such_history" does not exist' in text and "Traceback" not in text, (argv, text)
    nothing_written(tmp_path)


# ---------------------------------------------------------------- item 9: --night spellings


@pytest.mark.parametrize(
    ("night", "meant"),
    [("20310101", "2031-01-01"), ("2031-W01-3", "2031-01-01"), ("2031-02-30", None), ("31-01-01", None)],
)
def test_a_night_is_spelled_one_way(tmp_path: Path, night: str, meant: str | None) -> None:
    """`date.fromisoformat` takes 20310101 and 2031-W01-3: one date would become several nights."""
    done = run_fab(tmp_path, "nightly", "--inventory", str(unreachable_inventory(tmp_path)), "--night", night)
    text = done.stdout + done.stderr
    assert done.returncode == 64, text
    assert f"--night must be a date spelled YYYY-MM-DD, e.g. 2026-11-30, got {night!r}" in text, text
    assert (f"(did you mean {meant}?)" in text) == (meant is not None), text
    nothing_written(tmp_path)


# ---------------------------------------------------------------- item 10: two histories, one reports folder


def test_a_reports_folder_holds_one_historys_reports(local_board: Board, tmp_path: Path) -> None:
    """Two inventories with their own histories and one reports folder: the second nightly of the night is refused
    before it runs anything (its reports would overwrite the first's), naming both histories and the remedy."""
    reports = tmp_path / "reports"
    section = nightly_section(tmp_path, TINY, iterations=5)
    first = write_inventory(tmp_path / "first.yaml", [local_board], nightly=section)
    done = run_fab(tmp_path, "nightly", "--inventory", str(first), "--night", NIGHT)
    assert done.returncode == 0, done.stdout + done.stderr
    written = {path: path.read_bytes() for path in reports.rglob("*") if path.is_file()}
    runs = set((tmp_path / "results").rglob("result_manifest.json"))
    assert reports / f"nightly-{NIGHT}.html" in written and reports / f"dashboard-{NIGHT}" / "index.html" in written

    other = tmp_path / "other.sqlite"
    section = {**section, "history": f"sqlite:///{other}"}
    second = write_inventory(tmp_path / "second.yaml", [local_board], nightly=section)
    for argv in (["--inventory", str(second)], ["--inventory", str(first), "--history", f"sqlite:///{other}"]):
        refused = run_fab(tmp_path, "nightly", "--night", NIGHT, *argv)
        text = refused.stdout + refused.stderr
        assert refused.returncode == 64, text
        assert (
            f"the reports folder {reports} holds the nightly reports of the history {tmp_path / 'history.sqlite'}; "
            f"this nightly's history is {other}" in text
        ), text
        assert "`reports:` in the inventory's nightly section, or --reports DIR" in text and "Traceback" not in text
    assert {path: path.read_bytes() for path in reports.rglob("*") if path.is_file()} == written, "nothing rewritten"
    history = History(f"sqlite:///{other}")
    try:
        assert history.runs() == [], "nothing ran for the second history"
    finally:
        history.close()
    assert set((tmp_path / "results").rglob("result_manifest.json")) == runs, "no cell ran"

    # Its own folder: the second history's nightly runs.
    own = run_fab(tmp_path, "nightly", "--inventory", str(second), "--night", NIGHT, "--reports", str(tmp_path / "r2"))
    assert own.returncode == 0, own.stdout + own.stderr
    assert (tmp_path / "r2" / f"nightly-{NIGHT}.md").is_file()
    assert {path: path.read_bytes() for path in reports.rglob("*") if path.is_file()} == written
