"""The layout of a board's workdir (default `~/.etlab`), as the workstation names it.

The board agent keeps the same layout in its own `Workdir` (board/agent/etlab_agent/workdir.py); docs/DESIGN.md
lists it. Paths are POSIX strings on the board, never local Paths.
"""

from __future__ import annotations

import posixpath
from dataclasses import dataclass


@dataclass(frozen=True)
class BoardWorkdir:
    root: str

    def _join(self, *parts: str) -> str:
        return posixpath.join(self.root, *parts)

    @property
    def board_tree(self) -> str:
        """The copy of the repository's board/ folder (agent and runner sources)."""
        return self._join("board")

    @property
    def agent_bootstrap(self) -> str:
        return self._join("board", "agent", "bootstrap.py")

    @property
    def runner_sources(self) -> str:
        return self._join("board", "runner")

    @property
    def pylib(self) -> str:
        return self._join("pylib")

    def tool(self, *parts: str) -> str:
        return self._join("tools", *parts)

    def runtime(self, version: str) -> str:
        return self._join("runtime", version)

    def runner(self, version: str) -> str:
        return self._join("runner", version)

    def store(self, kind: str) -> str:
        """A content-addressed store: `models`, `inputs`, `wheels`, `cache`."""
        return self._join(kind)

    def bundle(self, run_id: str) -> str:
        return self._join("bundles", run_id)
