"""The board transports, one registry: what an inventory's `transport:` may name, and what each one means.

The inventory (inventory.py) accepts exactly these names, refuses a field that a board's transport does not use,
and `orchestrator.transport.connect` opens a board through its transport's `opener`. The opener is a
`module:function` path rather than an import: `boards` sits below `transport`, and a transport's module is
imported only when a board of that transport connects (paramiko and fabric load only for SSH boards).

Add a transport: one `Transport` here, and the module in orchestrator/transport/ that its opener names
(`function(board, *, known_hosts) -> BoardConnection`); tests/transport/test_connection.py ties the two.
"""

from __future__ import annotations

from dataclasses import dataclass

# The board fields that only a transport reaching a board over the network (an address, a login) uses.
NETWORK_FIELDS = (
    "host",
    "port",
    "user",
    "key",
    "agent",
    "connect_timeout",
    "keepalive",
    "tcp_user_timeout",
    "bulk_transfer",
    "bulk_cipher",
)


@dataclass(frozen=True)
class Transport:
    name: str
    opener: str  # "orchestrator.transport.<module>:<function>", imported when a board of this transport connects
    # The board is the workstation itself: no address; its workdir is a workstation path (default
    # .etlab/boards/<name>), and the network fields are refused.
    on_workstation: bool = False
    uses: tuple[str, ...] = NETWORK_FIELDS  # which NETWORK_FIELDS a board of this transport may set
    needs: tuple[str, ...] = ("host",)  # fields a board of this transport must set (unless a labgrid place gives them)


TRANSPORTS: dict[str, Transport] = {
    t.name: t
    for t in (
        Transport("ssh", "orchestrator.transport.ssh:open_ssh"),
        Transport("local", "orchestrator.transport.local:open_local", on_workstation=True, uses=(), needs=()),
    )
}
DEFAULT_TRANSPORT = "ssh"
LABGRID_TRANSPORT = "ssh"  # a labgrid place is reached at its NetworkService's address, over SSH
