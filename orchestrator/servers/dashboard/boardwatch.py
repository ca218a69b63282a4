"""The inventory's boards looked at in the background, for the overview: reachable, lock holder (and a labgrid
place's), runtime. A look at a dead board waits out its connect timeout, so it never happens in a page request:
a thread looks every `interval` seconds and pages read the latest look."""

from __future__ import annotations

import threading
from collections.abc import Sequence

from orchestrator.boards.inventory import Board
from orchestrator.deploy.board_status import BoardStatus, board_statuses

DEFAULT_INTERVAL = 60.0


def look(boards: Sequence[Board]) -> dict[str, BoardStatus]:
    """One look at every board, in parallel."""
    statuses, _ = board_statuses(boards)
    return {status.name: status for status in statuses}


class BoardWatch:
    def __init__(self, boards: Sequence[Board], interval: float = DEFAULT_INTERVAL) -> None:
        self.boards = tuple(boards)
        self.interval = interval
        self._latest: dict[str, BoardStatus] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="etlab-dashboard-boards", daemon=True)

    def start(self) -> BoardWatch:
        if self.boards:
            self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                latest = look(self.boards)
            except Exception as exc:  # a bug must not end the watch: the overview then says so per board
                latest = {b.name: BoardStatus(b.name, None, False, f"not looked at: {exc}") for b in self.boards}
            with self._lock:
                self._latest = latest
            self._stop.wait(self.interval)

    def snapshot(self) -> dict[str, BoardStatus]:
        with self._lock:
            return dict(self._latest)

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)
