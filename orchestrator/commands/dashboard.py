"""`fab dashboard`: the lab's results and nightly history in a browser, or written as static pages."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

from orchestrator import console, paths
from orchestrator.boards.inventory import Board, load_inventory
from orchestrator.commands import options
from orchestrator.errors import InventoryError
from orchestrator.lab.history_url import default_url
from orchestrator.lab.matrix import DEFAULT_BASELINE_NIGHTS, load_config, load_history_url
from orchestrator.servers.dashboard.app import Sources, serve_dashboard
from orchestrator.servers.dashboard.boardwatch import look
from orchestrator.servers.dashboard.static import write_static
from orchestrator.servers.errors import PortBusy


def sources(inventory: str | None, history: str | None, results: Path | None = None) -> Sources:
    """What the dashboard reads: results/, and the history `--history` names, else the inventory's nightly
    history, else the default SQLite file. An inventory is optional: without one, the boards are those the
    history and results/ know."""
    boards: tuple[str, ...] = ()
    looked_at: tuple[Board, ...] = ()
    url, baseline = history, DEFAULT_BASELINE_NIGHTS
    try:
        found = load_inventory(Path(inventory) if inventory else None)
    except InventoryError:
        if inventory:  # asked for by name: its problems are the user's to fix
            raise
        found = None
    if found is not None:
        boards = tuple(found.boards)
        looked_at = tuple(found.boards.values())
        if found.nightly_node is not None:
            url = url or load_history_url(found)  # a malformed one is named (exit 64), never another history shown
            with contextlib.suppress(InventoryError):  # the rest of a broken nightly section is `fab nightly`'s
                baseline = load_config(found).baseline_nights
    return Sources(results or paths.results_dir(), url or default_url(), None, boards, baseline, looked_at)


def dashboard_task(*, port: Any, no_browser: bool, static: Any, inventory: str | None, history: Any) -> int:
    """`fab dashboard`: its options checked (exit 64), then the pages served or written."""
    listen = options.port(8080 if port is None else port)
    folder = None if static is None else options.output_folder(static, "--static")
    url = None if history is None else options.history(history)
    return serve_or_write(port=listen, open_browser=not no_browser, static=folder, inventory=inventory, history=url)


def serve_or_write(
    *, port: int, open_browser: bool, static: Path | None, inventory: str | None, history: str | None
) -> int:
    chosen = sources(inventory, history)
    if static is not None:
        live = None
        if chosen.boards:
            console.info(f"looking at {len(chosen.boards)} board(s) for the overview")
            live = look(chosen.boards)
        written = write_static(chosen.lab(), static, chosen.inventory_boards, live)
        chosen.close()
        console.info(console.escape(f"wrote {len(written)} files; open {written[0]}"))
        return 0
    try:
        return serve_dashboard(chosen, port=port, open_browser=open_browser)
    except PortBusy as exc:
        exc.hint = "stop it, or choose another port with --port"
        raise


def nightly_dashboard(lab_sources: Sources, folder: Path) -> Path | None:
    """The nightly's static dashboard next to its reports; a failure is a warning (the night's verdicts stand)."""
    try:
        written = write_static(lab_sources.lab(), folder)
    except Exception as exc:  # the reports are written already: a page that fails must not fail the night
        console.warn(f"the static dashboard was not written: {type(exc).__name__}: {exc}")
        return None
    finally:
        lab_sources.close()
    return written[0]
