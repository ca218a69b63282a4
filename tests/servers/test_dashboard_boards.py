"""The dashboard's overview looks at the inventory's boards: reachable or not (and why), who holds the board lock,
in the background (a dead board's connect timeout never holds a page), the holder's text inert; the static export
looks once. The rest of the server: test_dashboard_server.py; the pages in Chromium: test_dashboard_browser.py."""

from __future__ import annotations

import html
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator.boards.inventory import Board
from orchestrator.servers.dashboard.app import Sources, start_dashboard
from orchestrator.servers.dashboard.static import write_static
from tests.plugins.agent import agent_workdir, holding_lock
from tests.plugins.dashboard import EVIL
from tests.plugins.explorer import free_port
from tests.servers.test_dashboard_server import request

HOLDER = {"purpose": "profile", "run_id": f"r1 {EVIL}", "user": "mallory", "hostname": "pi", "pid": os.getpid()}


@pytest.fixture
def boards(tmp_path: Path) -> Iterator[tuple[Board, Board]]:
    """A board whose lock a run holds, and a board nothing answers on (a refused port on 127.0.0.1)."""
    workdir = agent_workdir(tmp_path / "held")
    (workdir / "state.json").write_text(json.dumps({"executorch_version": "1.5.1"}))
    held = Board(name="held", transport="local", workdir=str(workdir))
    dead = Board.of("dead", transport="ssh", host="127.0.0.1", port=free_port(), user="pi", connect_timeout=2,
                    known_hosts=tmp_path / "known_hosts")  # fmt: skip
    with holding_lock(workdir, HOLDER):
        yield held, dead


def overview_rows(page: str) -> dict[str, str]:
    """Each board row of the overview's boards table, as its text (tags stripped)."""
    rows = {}
    for chunk in page.split('<tr class="board-row">')[1:]:
        row = chunk.split("</tr>", 1)[0]
        cells = [cell.split(">", 1)[1] for cell in row.split("</td>")[:-1]]
        rows[html.unescape(cells[0])] = " | ".join(html.unescape(cell) for cell in cells[1:])
    return rows


def test_the_overview_says_which_boards_answer_and_who_holds_them(tmp_path: Path, boards: tuple[Board, Board]) -> None:
    held, dead = boards
    sources = Sources(tmp_path / "results", None, None, ("held", "dead"), boards=(held, dead))
    server = start_dashboard(sources, port=free_port(), board_interval=0.5)
    try:
        status, page = request(server, "/")
        assert status == 200  # the first look may still run: the page does not wait for it
        deadline = time.monotonic() + 60
        while "not looked at" in page and time.monotonic() < deadline:
            time.sleep(0.3)
            status, page = request(server, "/")
        rows = overview_rows(page)
    finally:
        server.stop()
    assert rows["held"].startswith("yes | r1 ") and "(mallory@pi)" in rows["held"], rows
    assert rows["dead"].startswith("no: ") and "connect" in rows["dead"], rows
    assert EVIL not in page and html.escape(EVIL) in page  # the holder's text is shown, not obeyed
    assert not server.app.watch._thread.is_alive()  # type: ignore[union-attr]  # stopped with the server


def test_the_static_overview_looks_once(tmp_path: Path, boards: tuple[Board, Board]) -> None:
    from orchestrator.servers.dashboard.boardwatch import look

    held, dead = boards
    live = look([held, dead])
    assert live["held"].reachable and live["held"].runtime == "1.5.1" and not live["dead"].reachable
    sources = Sources(tmp_path / "results", None, None, ("held", "dead"))
    (index, *_) = write_static(sources.lab(), tmp_path / "static", sources.inventory_boards, live)
    rows = overview_rows(index.read_text())
    assert rows["held"].startswith("yes | r1 ") and rows["dead"].startswith("no: ")
    without = write_static(sources.lab(), tmp_path / "plain", sources.inventory_boards)[0].read_text()
    assert "fab boards" in without and "reachable" not in overview_rows(without).get("held", "")
