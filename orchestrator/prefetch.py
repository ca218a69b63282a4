"""Modules a command needs later, imported in a thread while it waits for something else (a board's run).

A warm `fab deploy-and-profile` spends most of its wall time waiting for the board; importing the analysis (numpy,
the ETDump reader) and the advisor meanwhile takes them off the path. Python's per-module import locks make a
later `import` of the same module wait for the thread instead of importing it twice.
"""

from __future__ import annotations

import importlib
import sys
import threading


def in_background(*modules: str) -> None:
    """Import `modules` (in order) in a daemon thread, unless all are imported already."""
    missing = [name for name in modules if name not in sys.modules]
    if missing:
        threading.Thread(target=_import_all, args=(missing,), name="etlab-prefetch", daemon=True).start()


def _import_all(modules: list[str]) -> None:
    for name in modules:
        try:
            importlib.import_module(name)
        except Exception:  # the real import, later and in its own thread, reports what is wrong
            return
