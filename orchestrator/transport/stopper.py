"""Stop a command on a board with everything it started, wherever that went.

Every command etlab runs on a board carries a random token in its environment (STOP_TOKEN_ENV). Children inherit
it, including those in other sessions and process groups (the agent starts its runner in its own session, so a
process group kill of the command would miss it). Stopping a command sends SIGTERM to every process carrying its
token (the agent then stops its runner and finishes the bundle), and SIGKILL to those still there after a grace
period: nothing keeps running and the board lock is free.

This file is self-contained (standard library only, Python 3.7+): an SSH board runs it as `python3 -c <this file>
TOKEN GRACE` over a fresh channel; the local board calls stop() in-process.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import sys
import time

STOP_TOKEN_ENV = "ETLAB_STOP_TOKEN"
STOP_GRACE_SECONDS = 3.0  # SIGTERM → SIGKILL: the agent needs well under a second to stop its runner
_POLL_SECONDS = 0.05


def new_token() -> str:
    return secrets.token_hex(12)


def stopper_source() -> str:
    """This file's text, for `python3 -c` on a board."""
    with open(__file__, encoding="utf-8") as handle:
        return handle.read()


def _marked(token: str) -> list[int]:
    """Live processes (not zombies) with `STOP_TOKEN_ENV=token` in their environment, by the pids we can signal."""
    needle = f"{STOP_TOKEN_ENV}={token}".encode()
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/environ", "rb") as handle:
                if needle not in handle.read().split(b"\0"):
                    continue
            with open(f"/proc/{name}/status", encoding="utf-8", errors="replace") as handle:
                fields = dict(line.split(":", 1) for line in handle if ":" in line)
        except OSError:  # gone meanwhile, or not ours to read
            continue
        # A /proc mounted outside our PID namespace (a container) names processes by the outer pids: NSpid ends
        # with the pid in the process's own namespace, which is ours.
        pid = int((fields.get("NSpid") or name).split()[-1])
        if not fields.get("State", "").strip().startswith("Z") and pid != os.getpid():
            found.append(pid)
    return found


def _signal(pid: int, number: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, number)


def stop(token: str, grace: float = STOP_GRACE_SECONDS) -> int:
    """SIGTERM every process carrying `token`, SIGKILL what is left after `grace` s; the number signalled."""
    signalled: set[int] = set()
    deadline = time.monotonic() + grace
    while True:
        alive = _marked(token)
        if not alive:
            return len(signalled)
        if time.monotonic() >= deadline:
            break
        for pid in alive:
            if pid not in signalled:  # also what a stopping process starts meanwhile
                _signal(pid, signal.SIGTERM)
                signalled.add(pid)
        time.sleep(_POLL_SECONDS)
    for _ in range(3):  # a process forking while it is killed leaves a child: sweep again
        alive = _marked(token)
        if not alive:
            break
        for pid in alive:
            _signal(pid, signal.SIGKILL)
            signalled.add(pid)
        time.sleep(_POLL_SECONDS)
    return len(signalled)


if __name__ == "__main__":
    stop(sys.argv[1], float(sys.argv[2]) if len(sys.argv) > 2 else STOP_GRACE_SECONDS)
