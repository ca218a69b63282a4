"""The board lock: `fcntl.flock` on `<wd>/lock`, with `<wd>/lock.json` saying who holds it.

flock is released by the kernel when the holder dies, so a crashed agent never wedges the board; lock.json
is only a description and is trusted only while the flock is really held.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import getpass
import os
import socket
import time
from typing import Any, Iterator

from .errors import LockTimeout
from .files import atomic_write_json, log, read_json_or_none, utc_now
from .workdir import Workdir

POLL_SECONDS = 0.1
REPORT_EVERY_SECONDS = 15.0


def describe_holder(purpose: str, run_id: str | None) -> dict[str, Any]:
    """Who we are, for lock.json: enough for a colleague to know whose run is blocking theirs."""
    ssh_client = os.environ.get("SSH_CLIENT") or os.environ.get("SSH_CONNECTION")
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = str(os.getuid())
    return {
        "purpose": purpose,
        "run_id": run_id,
        "pid": os.getpid(),
        "user": user,
        "client": ssh_client.split()[0] if ssh_client else None,
        "ssh_client": ssh_client,
        "hostname": socket.gethostname(),
        "started_at": utc_now(),
    }


def pid_alive(pid: Any) -> bool | None:
    if not isinstance(pid, int) or pid <= 0:
        return None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _try_flock(fd: int, operation: int) -> bool:
    try:
        fcntl.flock(fd, operation | fcntl.LOCK_NB)
    except OSError as exc:
        if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            return False
        raise
    return True


def current_holder(workdir: Workdir) -> dict[str, Any] | None:
    """Who holds the lock now, or None when it is free (a stale lock.json is ignored)."""
    try:
        fd = os.open(str(workdir.lock), os.O_RDONLY)
    except FileNotFoundError:
        return None
    try:
        if _try_flock(fd, fcntl.LOCK_SH):
            fcntl.flock(fd, fcntl.LOCK_UN)
            return None
    finally:
        os.close(fd)
    return _holder_description(workdir)


def _holder_description(workdir: Workdir) -> dict[str, Any]:
    holder = read_json_or_none(workdir.lock_json)
    if not isinstance(holder, dict):
        # Held, but the holder has not written lock.json yet (or it was removed by hand).
        return {"purpose": None, "run_id": None, "pid": None, "pid_alive": None}
    holder = dict(holder)
    # A dead agent pid with the lock still held means its runner outlived it (it inherits the lock).
    holder["pid_alive"] = pid_alive(holder.get("pid"))
    return holder


def holder_summary(holder: dict[str, Any] | None) -> str:
    if not holder:
        return "nobody"
    what = f"run {holder['run_id']}" if holder.get("run_id") else (holder.get("purpose") or "an unknown holder")
    who = f"{holder.get('user') or '?'}@{holder.get('client') or holder.get('hostname') or '?'}"
    return f"{what} ({who}, pid {holder.get('pid')}, since {holder.get('started_at') or '?'})"


class BoardLock:
    """Exclusive board lock. Use as `with BoardLock(wd).acquired(holder, timeout): ...`."""

    def __init__(self, workdir: Workdir) -> None:
        self.workdir = workdir
        self.fd: int | None = None
        self.holder: dict[str, Any] | None = None

    def acquire(self, holder: dict[str, Any], timeout: float, report_every: float = REPORT_EVERY_SECONDS) -> float:
        """Wait up to `timeout` seconds; returns how long we waited. Raises LockTimeout naming the holder."""
        self.workdir.root.mkdir(parents=True, exist_ok=True)
        fd = os.open(str(self.workdir.lock), os.O_RDWR | os.O_CREAT, 0o644)
        started = time.monotonic()
        next_report = started
        try:
            while not _try_flock(fd, fcntl.LOCK_EX):
                now = time.monotonic()
                other = _holder_description(self.workdir)
                if now - started >= timeout:
                    raise LockTimeout(
                        f"board lock still held after {timeout:g} s by {holder_summary(other)}", holder=other
                    )
                if now >= next_report:
                    log(f"waiting for the board lock, held by {holder_summary(other)}")
                    next_report = now + report_every
                time.sleep(POLL_SECONDS)
        except BaseException:
            os.close(fd)
            raise
        self.fd = fd
        self.holder = dict(holder, acquired_at=utc_now())
        atomic_write_json(self.workdir.lock_json, self.holder)
        return time.monotonic() - started

    def release(self) -> None:
        if self.fd is None:
            return
        # Describe the lock as free before actually freeing it, so lock.json never names a past holder.
        with contextlib.suppress(FileNotFoundError):
            self.workdir.lock_json.unlink()
        fcntl.flock(self.fd, fcntl.LOCK_UN)
        os.close(self.fd)
        self.fd = None

    @contextlib.contextmanager
    def acquired(self, holder: dict[str, Any], timeout: float) -> Iterator[float]:
        waited = self.acquire(holder, timeout)
        try:
            yield waited
        finally:
            self.release()
