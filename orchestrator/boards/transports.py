"""The board transports, one registry: what an inventory's `transport:` may name, and what each one means.

The inventory (inventory.py) accepts exactly these names, refuses a field that a board's transport does not use,
and `orchestrator.transport.connect` opens a board through its transport's `opener`. The opener is a
`module:function` path rather than an import: `boards` sits below `transport`, and a transport's module is
imported only when a board of that transport connects (paramiko and fabric load only for SSH boards).

Add a transport: one `Transport` here with the record of its own fields (as SshOptions: the inventory's keys, each
with its check; a board holds it as its `link`), and the module in orchestrator/transport/ that its opener names
(`function(board, *, known_hosts) -> BoardConnection`); tests/transport/test_connection.py ties the two. Board
itself does not change.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, ClassVar

from orchestrator.config import Check, boolean, choice, integer, seconds, text

# How large transfers travel: "auto" uses OpenSSH's `ssh` client for them when it is installed (its C crypto
# costs far less CPU than paramiko's), "openssh" always does, "paramiko" never does.
BULK_TRANSFERS = ("auto", "openssh", "paramiko")
# The cipher of OpenSSH bulk transfers: "auto" picks from the board's CPU (AES instructions or not).
BULK_CIPHERS = ("auto", "aes128-gcm@openssh.com", "aes256-gcm@openssh.com", "chacha20-poly1305@openssh.com")
DEFAULT_CONNECT_TIMEOUT = 10.0
DEFAULT_KEEPALIVE = 5.0
DEFAULT_TCP_USER_TIMEOUT = 20.0


@dataclass(frozen=True)
class SshOptions:
    """How a board is reached over SSH: its address and login, and how the link is watched and used. The fields
    are the inventory's keys (its `defaults:` may set them too), each checked by FIELDS."""

    host: str | None = None  # None for a labgrid selector until its place gives one
    port: int = 22
    user: str | None = None
    key: Path | None = None
    agent: bool = False
    connect_timeout: float = DEFAULT_CONNECT_TIMEOUT
    keepalive: float = DEFAULT_KEEPALIVE
    tcp_user_timeout: float = DEFAULT_TCP_USER_TIMEOUT
    bulk_transfer: str = "auto"
    bulk_cipher: str = "auto"

    FIELDS: ClassVar[dict[str, Check]] = {
        "host": text,
        "port": integer(1, 65535),
        "user": text,
        "key": text,  # a workstation path: the inventory resolves it against its own folder
        "agent": boolean,
        "connect_timeout": seconds,
        "keepalive": seconds,
        "tcp_user_timeout": seconds,
        "bulk_transfer": choice(BULK_TRANSFERS),
        "bulk_cipher": choice(BULK_CIPHERS),
    }

    @property
    def address(self) -> str:
        """`user@host:port`, for messages."""
        return f"{self.user}@{self.host}:{self.port}" if self.user else f"{self.host}:{self.port}"


@dataclass(frozen=True)
class LocalOptions:
    """The workstation itself: nothing to reach, no field of its own."""

    FIELDS: ClassVar[dict[str, Check]] = {}

    @property
    def address(self) -> str:
        return "local"


TransportOptions = SshOptions | LocalOptions


@dataclass(frozen=True)
class Transport:
    name: str
    opener: str  # "orchestrator.transport.<module>:<function>", imported when a board of this transport connects
    options: type[TransportOptions]  # its own fields (a board's `link`), checked by their FIELDS
    # The board is the workstation itself: no address; its workdir is a workstation path (default
    # .etlab/boards/<name>), and the other transports' fields are refused.
    on_workstation: bool = False
    needs: tuple[str, ...] = ("host",)  # fields a board of this transport must set (unless a labgrid place gives them)

    @property
    def uses(self) -> tuple[str, ...]:
        """The inventory keys of its own fields."""
        return tuple(item.name for item in fields(self.options))

    def link(self, settings: dict[str, Any]) -> TransportOptions:
        """Its options record from a board's settings (the inventory's keys): the fields it has, the rest ignored."""
        return self.options(**{key: value for key, value in settings.items() if key in self.uses})


TRANSPORTS: dict[str, Transport] = {
    t.name: t
    for t in (
        Transport("ssh", "orchestrator.transport.ssh:open_ssh", SshOptions),
        Transport("local", "orchestrator.transport.local:open_local", LocalOptions, on_workstation=True, needs=()),
    )
}
DEFAULT_TRANSPORT = "ssh"
LABGRID_TRANSPORT = "ssh"  # a labgrid place is reached at its NetworkService's address, over SSH
# Every transport's own fields, by inventory key, with its check: what a board may set for some transport.
LINK_FIELDS: dict[str, Check] = {key: check for t in TRANSPORTS.values() for key, check in t.options.FIELDS.items()}
