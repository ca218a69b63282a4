"""The board tables: one line per board (summarize), `fab gc`'s, and the whole reason of each failure under them."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from orchestrator import console
from orchestrator.deploy.agent_client import GC_CATEGORIES, GcResult

if TYPE_CHECKING:  # the types only: rendering a table must not import what produced it
    from orchestrator.boards.fanout import BoardOutcome


def summarize(outcomes: Sequence[BoardOutcome[Any]], *, title: str = "Boards") -> None:
    """Print the per-board summary table (board, status, stage, time, reason)."""
    rows = [
        (
            outcome.board.name,
            "ok" if outcome.ok else "FAILED",
            outcome.stage,
            round(outcome.duration, 2),
            outcome.error,
        )
        for outcome in outcomes
    ]
    failed = sum(not outcome.ok for outcome in outcomes)
    caption = f"{len(outcomes) - failed} ok, {failed} failed" if outcomes else "no boards"
    console.table(title, ["board", "status", "stage", "seconds", "reason"], rows, caption=caption)
    print_details(outcomes)


def print_gc(outcomes: Sequence[BoardOutcome[GcResult]]) -> None:
    """The `fab gc` table: what each board that answered removed, per category and in all, and the space freed."""
    rows = []
    for outcome in outcomes:
        result = outcome.value
        if not outcome.ok or result is None:
            continue
        removed = result.removed
        counts = [len(removed[category]) for category in GC_CATEGORIES]
        rows.append([outcome.board.name, result.removed_count, *counts, f"{result.bytes_freed:,}"])
    if rows:
        console.table("gc", ["board", "removed", *GC_CATEGORIES, "bytes freed"], rows)


def print_details(outcomes: Sequence[BoardOutcome[Any]]) -> None:
    """Under a table that shows one line per board: the whole reason of every failure that has more to say."""
    entries = [
        (outcome.board.name, outcome.stage, outcome.detail)
        for outcome in outcomes
        if not outcome.ok and outcome.detail and outcome.detail != outcome.error
    ]
    if entries:
        console.details("Details", entries)
