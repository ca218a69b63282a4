"""Child processes that tests start: never left running, whatever way a test ends."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from collections.abc import Iterator


@contextlib.contextmanager
def reaped(process: subprocess.Popen) -> Iterator[subprocess.Popen]:
    """Yield `process`; when the block ends, kill it and everything in its process group.

    For a process started with `start_new_session=True` the group outlives its leader (e.g. a Model Explorer
    server launched by `fab deploy-and-profile`), so the whole group is killed, not just the process.
    """
    try:
        yield process
    finally:
        # A group named after the process exists only if it leads one; it may outlive its leader.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, signal.SIGKILL)
        if process.poll() is None:
            process.kill()
        process.wait()


def pytest_configure(config: object) -> None:
    # Tests send SIGINT as Ctrl+C would. A shell that starts the suite in the background (`cmd &`) ignores SIGINT,
    # children inherit an ignored signal across exec, and Python then never raises KeyboardInterrupt: give the
    # signal a handler here, which exec resets to the default in every child.
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
