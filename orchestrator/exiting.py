"""A finished task's process ends without the interpreter's final garbage collections.

At exit, Python finalizes ~700 imported modules and runs full collections over everything they built: 0.1-0.25 s
after the last line a `fab deploy-and-profile` prints (measured on the 2-core bench machine, bench/README.md), time
the user waits for nothing. The hook this module registers when a task starts freezes the objects alive at exit
(gc.freeze), so those collections skip them. Every atexit handler still runs (logging flushes, temporary folders
go, labgrid places are released), stdout and stderr are flushed and the exit code is untouched; what is left alive
at exit is then left to the operating system, without its __del__, which Python never promised at exit anyway.
"""

from __future__ import annotations

import atexit
import gc
import os

_armed = False


def task_started() -> None:
    """A task begins: arm the exit hook (once per process). ETLAB_FULL_TEARDOWN=1 keeps Python's own teardown."""
    global _armed
    if not _armed and not os.environ.get("ETLAB_FULL_TEARDOWN"):
        atexit.register(gc.freeze)
        _armed = True
