"""How etlab talks to boards: `base` (the interface), `ssh` and `local` (the transports), `pipes` (subprocess
streams), `hostkeys`, `transfer` (verified pushes and pulls) and `tarstream` (the strict tar reader)."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from pathlib import Path

from orchestrator.boards.inventory import Board
from orchestrator.boards.transports import TRANSPORTS
from orchestrator.errors import UsageError
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
    "opener",
    "quote",
]


def connect(board: Board, *, known_hosts: Path | None = None) -> BoardConnection:
    """Open a connection to `board` through its transport's opener (boards/transports.py TRANSPORTS)."""
    return opener(board.transport, board.name)(board, known_hosts=known_hosts)


def opener(transport: str, board: str = "") -> Callable[..., BoardConnection]:
    """The function that opens a connection of `transport`, its module imported now: paramiko and fabric load only
    for SSH boards."""
    if transport not in TRANSPORTS:
        on = f" of board {board!r}" if board else ""
        raise UsageError(f"unknown transport {transport!r}{on}; known: {', '.join(TRANSPORTS)}")
    module, _, function = TRANSPORTS[transport].opener.partition(":")
    return getattr(importlib.import_module(module), function)
