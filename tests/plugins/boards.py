"""Provisioned boards and inventory files for end-to-end tests.

`local_board` is a local-transport board with its own workdir, provisioned once per session (the real
setup-board: SDK pushed, runner built). `write_inventory` turns Board objects into an inventory.yaml,
so tests drive the real `fab` tasks exactly as users do.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import yaml

from orchestrator.boards.inventory import Board
from orchestrator.deploy import provision
from orchestrator.transport import connect

# For a board whose runner build a test does not look at: the runner built on the workstation (deploy/crossbuild.py),
# cached by source hash and shared between workers, so a session compiles it once instead of once per fake board (an
# on-board build takes ~30 s of both cores). Pass as `sshd_lab.board(name, **SHARED_BUILD)`. The on-board build
# itself is what tests/e2e/test_e2e.py, tests/deploy/test_provision.py and tests/testing/test_pi.py look at.
SHARED_BUILD = {"build": "workstation"}


def provision_board(board: Board) -> provision.ProvisionReport:
    with connect(board) as conn:
        return provision.setup_board(conn)


@pytest.fixture(scope="session")
def local_board(tmp_path_factory: pytest.TempPathFactory) -> Board:
    board = Board(name="local", transport="local", workdir=str(tmp_path_factory.mktemp("local-board") / "wd"))
    provision_board(board)
    return board


def board_entry(board: Board) -> dict[str, Any]:
    entry: dict[str, Any] = {"transport": board.transport, "workdir": board.workdir}
    if board.transport == "ssh":
        entry.update(host=board.ssh.host, port=board.ssh.port, user=board.ssh.user, key=str(board.ssh.key))
        entry.update(connect_timeout=board.ssh.connect_timeout, keepalive=board.ssh.keepalive)
        entry["tcp_user_timeout"] = board.ssh.tcp_user_timeout
    if board.build != "auto":
        entry["build"] = board.build
    if board.transport == "ssh" and board.ssh.bulk_cipher != "auto":
        entry["bulk_cipher"] = board.ssh.bulk_cipher
    if board.tags:
        entry["tags"] = list(board.tags)
    if board.threads:
        entry["threads"] = board.threads
    return entry


def write_inventory(
    path: Path,
    boards: Sequence[Board],
    *,
    groups: dict[str, list[str]] | None = None,
    nightly: dict[str, Any] | None = None,
) -> Path:
    known_hosts = next((b.known_hosts for b in boards if b.transport == "ssh"), None)
    document: dict[str, Any] = {"defaults": {"known_hosts": str(known_hosts)} if known_hosts else {}}
    document["boards"] = {board.name: board_entry(board) for board in boards}
    if groups:
        document["groups"] = groups
    if nightly:
        document["nightly"] = nightly
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    return path
