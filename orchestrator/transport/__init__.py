"""How etlab talks to boards: `base` (the interface), `ssh` and `local` (the transports), `pipes` (subprocess
streams), `hostkeys`, `transfer` (verified pushes and pulls) and `tarstream` (the strict tar reader)."""

from __future__ import annotations

from pathlib import Path

from orchestrator.boards.inventory import Board
from orchestrator.transport.base import (
    OUTPUT_LIMIT,
    AuthError,
    BoardConnection,
    CommandError,
    CommandResult,
    CommandTimeout,
    LinkError,
    OutputTooLarge,
    ReadStream,
    WriteStream,
    is_transient,
    quote,
)
from orchestrator.transport.local import LocalConnection

__all__ = [
    "OUTPUT_LIMIT",
    "AuthError",
    "BoardConnection",
    "CommandError",
    "CommandResult",
    "CommandTimeout",
    "LinkError",
    "OutputTooLarge",
    "ReadStream",
    "WriteStream",
    "connect",
    "is_transient",
    "quote",
]


def connect(board: Board, *, known_hosts: Path | None = None) -> BoardConnection:
    """Open a connection to `board` (SSH, or local subprocesses for a `local` board)."""
    if board.is_local:
        return LocalConnection(board)
    from orchestrator.transport.ssh import SshConnection  # paramiko and fabric load only for SSH boards

    connection = SshConnection(board, known_hosts=known_hosts)
    connection.open()
    return connection
