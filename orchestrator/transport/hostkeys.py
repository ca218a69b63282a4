"""Host keys: trust a board's key on first use, pin it in a project-local known_hosts, refuse a changed key.

The file is OpenSSH known_hosts format (plain entries are written; hashed entries are read too), so
`ssh-keygen -R '[host]:port' -f FILE` clears an entry. Writes are atomic and serialised with flock,
so parallel connects from threads or processes never lose or corrupt an entry.
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import hashlib
import shlex
from collections.abc import Iterator
from pathlib import Path

import paramiko

from orchestrator.errors import HostKeyError
from orchestrator.fsutil import atomic_write_text


def host_id(host: str, port: int) -> str:
    """The name OpenSSH files a host under: `host` on port 22, `[host]:port` otherwise."""
    return host if port == 22 else f"[{host}]:{port}"


def fingerprint(key: paramiko.PKey) -> str:
    """OpenSSH-style fingerprint, e.g. `ssh-ed25519 SHA256:abc...`."""
    digest = base64.b64encode(hashlib.sha256(key.asbytes()).digest()).decode().rstrip("=")
    return f"{key.get_name()} SHA256:{digest}"


class KnownHosts:
    """A known_hosts file that etlab owns (default `.etlab/known_hosts`)."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        # flock locks belong to the open file description, so this also excludes other threads of this process.
        with open(self.path.parent / f".{self.path.name}.lock", "a") as lock:
            fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(lock.fileno(), fcntl.LOCK_UN)

    def _read(self) -> str:
        try:
            return self.path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return ""

    def pinned(self, name: str, text: str | None = None) -> dict[str, paramiko.PKey]:
        """Key type -> key pinned for host `name` (a host_id)."""
        entries = _entries(self._read() if text is None else text)
        return {entry.key.get_name(): entry.key for entry in entries if _entry_matches(entry, name)}

    def check_or_pin(self, board: str, name: str, key: paramiko.PKey) -> bool:
        """Accept `key` for host `name` if it is the pinned one, pin it if the host is unknown; True if pinned now.

        Raises HostKeyError if a different key is pinned for the host.
        """
        with self._locked():
            text = self._read()
            pinned = self.pinned(name, text)
            if pinned:
                same_type = pinned.get(key.get_name())
                if same_type is not None and same_type.asbytes() == key.asbytes():
                    return False
                raise self._changed(board, name, key, same_type or next(iter(pinned.values())))
            line = f"{name} {key.get_name()} {key.get_base64()}\n"
            if text and not text.endswith("\n"):
                text += "\n"
            atomic_write_text(self.path, text + line)
            return True

    def _changed(self, board: str, name: str, presented: paramiko.PKey, pinned: paramiko.PKey) -> HostKeyError:
        address = name[1:].replace("]:", ":") if name.startswith("[") else f"{name}:22"
        clear = f"ssh-keygen -R {shlex.quote(name)} -f {shlex.quote(str(self.path))}"
        return HostKeyError(
            f"board {board!r} ({address}) presented a host key that differs from the one pinned in {self.path}:\n"
            f"  pinned:    {fingerprint(pinned)}\n"
            f"  presented: {fingerprint(presented)}\n"
            "The board may have been reinstalled, or something is intercepting the connection; refusing to connect.",
            hint=f"if the board was deliberately reinstalled, clear the old key with: {clear}",
        )


class TrustOnFirstUse(paramiko.MissingHostKeyPolicy):
    """Pins an unknown host's key; refuses a key that differs from the pinned one. Never AutoAddPolicy."""

    def __init__(self, known_hosts: KnownHosts, board: str) -> None:
        self.known_hosts = known_hosts
        self.board = board
        self.pinned_now = False

    def missing_host_key(self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey) -> None:
        # paramiko calls this for every connect because the client is given no host keys of its own:
        # the pinned keys are checked here, against the file as it is now.
        self.pinned_now = self.known_hosts.check_or_pin(self.board, hostname, key)


def preferred_key_types(pinned: dict[str, paramiko.PKey], offered: tuple[str, ...]) -> tuple[str, ...]:
    """Host key algorithms with the pinned key's types first, so the server presents the key we know."""
    first: list[str] = []
    for key_type in pinned:
        if key_type == "ssh-rsa":
            first += [t for t in ("rsa-sha2-512", "rsa-sha2-256", "ssh-rsa") if t in offered]
        elif key_type in offered:
            first.append(key_type)
    return tuple(dict.fromkeys([*first, *offered]))


def _entries(text: str) -> list[paramiko.hostkeys.HostKeyEntry]:
    entries = []
    for number, line in enumerate(text.splitlines(), start=1):
        with contextlib.suppress(paramiko.SSHException, ValueError, TypeError, IndexError):
            entry = paramiko.hostkeys.HostKeyEntry.from_line(line, number)
            if entry is not None and entry.key is not None:
                entries.append(entry)
    return entries


def _entry_matches(entry: paramiko.hostkeys.HostKeyEntry, name: str) -> bool:
    for pattern in entry.hostnames:
        if pattern.startswith("|1|"):
            with contextlib.suppress(IndexError, ValueError, TypeError):
                if paramiko.HostKeys.hash_host(name, pattern.split("|")[2]) == pattern:
                    return True
        elif pattern == name:
            return True
    return False
