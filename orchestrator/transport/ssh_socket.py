"""The pieces under an SSH connection: a TCP socket that notices lost links, and channel streams.

Kept apart from ssh.py so that the connection's logic (connect, run, stream, OpenSSH for bulk) reads on its own.
"""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Callable

import paramiko

from orchestrator.boards.inventory import Board
from orchestrator.errors import BoardError
from orchestrator.transport.base import Drain, LinkError, ReadStream, WriteStream


class QuickAckSocket:
    """A TCP socket that acknowledges every read at once.

    Right after authentication, OpenSSH's answer to our first channel open waited for our delayed ACK of its
    previous packet (Nagle on the server side): 40 ms on every connect, measured on loopback.
    """

    def __init__(self, sock: socket.socket, quickack: int) -> None:
        self._sock = sock
        self._quickack = quickack  # socket.TCP_QUICKACK, where the platform has it

    def recv(self, size: int) -> bytes:
        data = self._sock.recv(size)
        with contextlib.suppress(OSError):
            self._sock.setsockopt(socket.IPPROTO_TCP, self._quickack, 1)
        return data

    def __getattr__(self, name: str) -> object:
        return getattr(self._sock, name)


_TCP_QUICKACK = getattr(socket, "TCP_QUICKACK", None)


def open_socket(board: Board) -> socket.socket:
    """A connected TCP socket whose writes fail after tcp_user_timeout without an acknowledgement."""
    where = f"board {board.name!r} ({board.address})"
    link = board.ssh
    try:
        addresses = socket.getaddrinfo(link.host, link.port, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        raise BoardError(f"{where}: cannot resolve host {link.host!r}: {exc.strerror}") from None
    last: OSError | None = None
    for family, kind, proto, _, address in addresses:
        sock = socket.socket(family, kind, proto)
        sock.settimeout(link.connect_timeout)
        try:
            sock.connect(address)
        except OSError as exc:
            sock.close()
            last = exc
            continue
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if hasattr(socket, "TCP_USER_TIMEOUT"):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT, int(link.tcp_user_timeout * 1000))
        return QuickAckSocket(sock, _TCP_QUICKACK) if _TCP_QUICKACK is not None else sock  # type: ignore[return-value]
    if isinstance(last, TimeoutError | socket.timeout):
        reason = f"no answer within {link.connect_timeout:g} s (connect_timeout)"
    elif isinstance(last, ConnectionRefusedError):
        reason = "connection refused (is sshd running on that port?)"
    else:
        reason = (last.strerror if last and last.strerror else str(last)) or "cannot connect"
    raise LinkError(f"{where}: {reason}")


# paramiko's channel buffer memmoves whatever is left after a partial read, so a reader that takes less than is
# buffered pays for the whole window on every call: always take everything and slice it here instead.
TAKE_ALL = 1 << 31


class ChannelReader(ReadStream):
    def __init__(self, channel: paramiko.Channel) -> None:
        super().__init__()
        self.channel = channel
        self._pending = memoryview(b"")

    def _fill(self) -> bool:
        if not self._pending:
            self._pending = memoryview(self.channel.recv(TAKE_ALL))
        return bool(self._pending)

    def read(self, size: int | None = -1) -> bytes:
        if size is None or size < 0:
            return self.readall()
        if not self._fill():
            return b""
        chunk, self._pending = self._pending[:size], self._pending[size:]
        return chunk.tobytes()

    def readall(self) -> bytes:
        parts = []
        while self._fill():
            parts.append(self._pending.tobytes())
            self._pending = memoryview(b"")
        return b"".join(parts)

    def readinto(self, buffer: bytearray | memoryview) -> int:  # type: ignore[override]
        if not self._fill():
            return 0
        size = min(len(buffer), len(self._pending))
        buffer[:size] = self._pending[:size]
        self._pending = self._pending[size:]
        return size


class ChannelWriter(WriteStream):
    """Feeds a channel's stdin; `send_failed` turns a failed send into the connection's error."""

    def __init__(
        self, channel: paramiko.Channel, stdout: Drain, send_failed: Callable[[BaseException], BaseException]
    ) -> None:
        self.send_failed = send_failed
        self.channel = channel
        self._stdout = stdout

    def write(self, data: bytes) -> int:
        view = memoryview(data)
        step = self.channel.out_max_packet_size
        try:
            # paramiko's sendall re-slices what is left after every packet; feed it packet-sized pieces instead.
            for offset in range(0, len(view), step):
                self.channel.sendall(view[offset : offset + step].tobytes())
        except (OSError, EOFError, paramiko.SSHException) as exc:
            raise self.send_failed(exc) from exc
        return len(data)
