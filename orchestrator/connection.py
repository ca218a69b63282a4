"""Connections to boards: one small interface, two transports (SSH through Fabric/paramiko, and local subprocesses).

Nothing else in etlab opens SSH. Commands are argv lists, quoted with shlex.join on the way to the board's shell;
environment variables travel as an `env NAME=value ...` prefix, never as SSH env requests.

Lost links are noticed within seconds: the TCP socket carries TCP_USER_TIMEOUT and the SSH transport sends
keepalives, so a blackholed board fails a command with LinkError instead of hanging.

Large transfers may ask for a *bulk* stream. By default (`bulk_transfer: auto`) that is OpenSSH's `ssh` client
in a subprocess, checking the host key against the same pinned known_hosts, after paramiko has verified it:
its crypto and packet handling are C, and cost far less CPU than paramiko's (bench/README.md).
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import io
import logging
import math
import os
import posixpath
import re
import shlex
import shutil
import signal
import socket
import subprocess
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import IO

import fabric
import paramiko

from orchestrator import console
from orchestrator.errors import BoardError, HostKeyError, UsageError
from orchestrator.hostkeys import KnownHosts, TrustOnFirstUse, fingerprint, host_id, preferred_key_types
from orchestrator.inventory import Board

# paramiko logs a lost link at ERROR level from its own thread; etlab reports it as a BoardError instead.
logging.getLogger("paramiko").addHandler(logging.NullHandler())

# A large receive window keeps bulk pulls streaming, and large packets cut paramiko's per-packet Python cost
# (OpenSSH sends packets up to the size we allow, within its 256 KiB limit).
WINDOW_SIZE = 16 << 20
MAX_PACKET_SIZE = 128 << 10
_PREFERRED_CIPHERS = ("aes128-gcm@openssh.com", "aes256-gcm@openssh.com")
# How long to keep reading output after the exit status arrived, when no more output comes.
_OUTPUT_GRACE = 10.0
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# With `bulk_transfer: auto`, transfers from this size go through OpenSSH: below it, a second handshake
# costs more than it saves.
BULK_FROM = 8 << 20
_OPENSSH_CIPHERS = (
    "aes128-gcm@openssh.com,aes256-gcm@openssh.com,chacha20-poly1305@openssh.com,aes128-ctr,aes192-ctr,aes256-ctr"
)
# ssh exits 255 when it fails itself (connection, authentication, host key); etlab's board commands never do.
_SSH_FAILED = 255
_PIPE_SIZE = 1 << 20  # larger pipes: fewer wake-ups per MiB between etlab and its subprocesses
_F_SETPIPE_SZ = getattr(fcntl, "F_SETPIPE_SZ", 1031)

quote = shlex.quote


class LinkError(BoardError):
    """The connection to a board could not be made or was lost. Transient: worth a retry."""


class AuthError(BoardError):
    """The board refused our credentials. Never retried."""


class CommandError(BoardError):
    """A command on the board exited non-zero."""

    def __init__(self, message: str, result: CommandResult, *, hint: str | None = None) -> None:
        super().__init__(message, hint=hint)
        self.result = result


class CommandTimeout(BoardError):
    """A command on the board ran longer than its timeout and was stopped."""


def is_transient(exc: BaseException) -> bool:
    """Whether a failure is worth retrying: a lost or refused link, never auth or host key errors."""
    return isinstance(exc, LinkError)


@dataclass(frozen=True)
class CommandResult:
    argv: tuple[str, ...]
    exit_code: int
    stdout: str
    stderr: str
    duration: float

    @property
    def ok(self) -> bool:
        return self.exit_code == 0


def _describe_command(argv: Sequence[str], limit: int = 160) -> str:
    text = shlex.join(argv)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _tail(text: str, lines: int = 5) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])


def _env_argv(env: Mapping[str, str] | None) -> list[str]:
    if not env:
        return []
    for name in env:
        if not _ENV_NAME.fullmatch(name):
            raise UsageError(f"invalid environment variable name {name!r}")
    return ["env", *(f"{name}={value}" for name, value in env.items())]


class ReadStream(io.RawIOBase):
    """The stdout of a running command, readable as a binary file (e.g. a tar stream)."""

    def readable(self) -> bool:
        return True


class WriteStream:
    """The stdin of a running command. `result` is set once the command has exited."""

    result: CommandResult | None = None
    _stdout: _Drain

    def write(self, data: bytes) -> int:
        raise NotImplementedError

    def first_line(self, timeout: float | None = None) -> str:
        """The first line the command printed (waiting for it), without its newline; "" if it printed none.

        Lets a command answer before it is fed, e.g. "have" / "send" before an upload.
        """
        return self._stdout.first_line(timeout)


class BoardConnection(ABC):
    """How etlab talks to one board. Use as a context manager; `close()` is idempotent."""

    board: Board

    def __init__(self, board: Board) -> None:
        self.board = board
        self._home: str | None = None

    @abstractmethod
    def run(
        self,
        argv: Sequence[str],
        *,
        timeout: float | None = None,
        check: bool = True,
        env: Mapping[str, str] | None = None,
    ) -> CommandResult:
        """Run argv on the board (quoted, never concatenated). Raises CommandError on non-zero exit if `check`."""

    def run_shell(
        self,
        script: str,
        *,
        timeout: float | None = None,
        check: bool = True,
        env: Mapping[str, str] | None = None,
    ) -> CommandResult:
        """Run a POSIX sh script the caller built with `quote()` (pipelines, redirections)."""
        return self.run(["sh", "-c", script], timeout=timeout, check=check, env=env)

    @abstractmethod
    def open_read_stream(
        self, argv: Sequence[str], *, bulk: bool = False
    ) -> contextlib.AbstractContextManager[IO[bytes]]:
        """Stream a command's stdout. Leaving the block waits for the command and raises if it failed.

        `bulk` asks for the bulk data path (see bulk_threshold()).
        """

    @abstractmethod
    def open_write_stream(
        self, argv: Sequence[str], *, check: bool = True, bulk: bool = False
    ) -> contextlib.AbstractContextManager[WriteStream]:
        """Feed a command's stdin. Leaving the block sends EOF, waits, and sets `stream.result`."""

    def bulk_threshold(self) -> int | None:
        """From how many bytes a transfer should ask for a bulk stream; None when bulk streams are no different."""
        return None

    @abstractmethod
    def _home_dir(self) -> str: ...

    def resolve_path(self, path: str) -> str:
        """An absolute path on the board: `~` and relative paths are taken from the board user's home."""
        if path.startswith("/"):
            return path
        if path.startswith("~") and not (path == "~" or path.startswith("~/")):
            raise UsageError(f"board {self.board.name!r}: only '~' and '~/...' are supported in paths, got {path!r}")
        if self._home is None:
            self._home = self._home_dir()
        rest = path[1:].lstrip("/") if path.startswith("~") else path
        return posixpath.join(self._home, rest) if rest else self._home

    @property
    def workdir(self) -> str:
        """The board's workdir as an absolute path."""
        return self.resolve_path(self.board.workdir)

    def close(self) -> None:  # noqa: B027 - optional hook
        pass

    def __enter__(self) -> BoardConnection:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def _failed(self, argv: Sequence[str], result: CommandResult) -> CommandError:
        detail = _tail(result.stderr) or _tail(result.stdout) or "(no output)"
        return CommandError(
            f"board {self.board.name!r}: `{_describe_command(argv)}` exited {result.exit_code}: {detail}", result
        )


def connect(board: Board, *, known_hosts: Path | None = None) -> BoardConnection:
    """Open a connection to `board` (SSH, or local subprocesses for a `local` board)."""
    if board.is_local:
        return LocalConnection(board)
    connection = SshConnection(board, known_hosts=known_hosts)
    connection.open()
    return connection


# ---------------------------------------------------------------- SSH


class _QuickAckSocket:
    """A TCP socket that acknowledges every read at once.

    Right after authentication, OpenSSH's answer to our first channel open waited for our delayed ACK of its
    previous packet (Nagle on the server side): 40 ms on every connect, measured on loopback.
    """

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock

    def recv(self, size: int) -> bytes:
        data = self._sock.recv(size)
        with contextlib.suppress(OSError):
            self._sock.setsockopt(socket.IPPROTO_TCP, _TCP_QUICKACK, 1)
        return data

    def __getattr__(self, name: str) -> object:
        return getattr(self._sock, name)


_TCP_QUICKACK = getattr(socket, "TCP_QUICKACK", None)


def _open_socket(board: Board) -> socket.socket:
    """A connected TCP socket whose writes fail after tcp_user_timeout without an acknowledgement."""
    where = f"board {board.name!r} ({board.address})"
    try:
        addresses = socket.getaddrinfo(board.host, board.port, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        raise BoardError(f"{where}: cannot resolve host {board.host!r}: {exc.strerror}") from None
    last: OSError | None = None
    for family, kind, proto, _, address in addresses:
        sock = socket.socket(family, kind, proto)
        sock.settimeout(board.connect_timeout)
        try:
            sock.connect(address)
        except OSError as exc:
            sock.close()
            last = exc
            continue
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if hasattr(socket, "TCP_USER_TIMEOUT"):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT, int(board.tcp_user_timeout * 1000))
        return _QuickAckSocket(sock) if _TCP_QUICKACK is not None else sock  # type: ignore[return-value]
    if isinstance(last, TimeoutError | socket.timeout):
        reason = f"no answer within {board.connect_timeout:g} s (connect_timeout)"
    elif isinstance(last, ConnectionRefusedError):
        reason = "connection refused (is sshd running on that port?)"
    else:
        reason = (last.strerror if last and last.strerror else str(last)) or "cannot connect"
    raise LinkError(f"{where}: {reason}")


# paramiko's channel buffer memmoves whatever is left after a partial read, so a reader that takes less than is
# buffered pays for the whole window on every call: always take everything and slice it here instead.
_TAKE_ALL = 1 << 31


class _ChannelReader(ReadStream):
    def __init__(self, channel: paramiko.Channel) -> None:
        super().__init__()
        self.channel = channel
        self._pending = memoryview(b"")

    def _fill(self) -> bool:
        if not self._pending:
            self._pending = memoryview(self.channel.recv(_TAKE_ALL))
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


class _ChannelWriter(WriteStream):
    def __init__(self, connection: SshConnection, channel: paramiko.Channel, stdout: _Drain) -> None:
        self.connection = connection
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
            raise self.connection._send_failed(exc) from exc
        return len(data)


class _Drain(threading.Thread):
    """Reads one output stream of a channel to the end, so a chatty command never stalls on a full window."""

    def __init__(self, recv: Callable[[int], bytes], chunk: int = _TAKE_ALL) -> None:
        super().__init__(daemon=True)
        self.recv = recv
        self.chunk = chunk
        self.data = bytearray()
        self.last_activity = time.monotonic()
        self._changed = threading.Condition()
        self._ended = False

    def run(self) -> None:
        try:
            with contextlib.suppress(OSError, EOFError, paramiko.SSHException):
                while chunk := self.recv(self.chunk):
                    with self._changed:
                        self.data += chunk
                        self.last_activity = time.monotonic()
                        self._changed.notify_all()
        finally:
            with self._changed:
                self._ended = True
                self._changed.notify_all()

    def first_line(self, timeout: float | None = None) -> str:
        with self._changed:
            self._changed.wait_for(lambda: b"\n" in self.data or self._ended, timeout)
            end = self.data.find(b"\n")
            return self.data[:end].decode("utf-8", errors="replace") if end >= 0 else ""

    def text(self) -> str:
        return self.data.decode("utf-8", errors="replace")


class SshConnection(BoardConnection):
    """A Fabric Connection to one board, with host keys pinned on first use and a socket that notices lost links."""

    def __init__(self, board: Board, *, known_hosts: Path | None = None) -> None:
        super().__init__(board)
        if not board.host:
            raise UsageError(f"board {board.name!r} has no host")
        self.known_hosts = KnownHosts(known_hosts or board.known_hosts)
        self._fabric: fabric.Connection | None = None
        self._lock = threading.Lock()

    @property
    def where(self) -> str:
        return f"board {self.board.name!r} ({self.board.address})"

    # -- connecting

    def open(self) -> None:
        """Connect (or reconnect, if the link was lost). Raises LinkError, AuthError, HostKeyError or BoardError."""
        with self._lock:
            if self._fabric is not None and self._fabric.is_connected:
                return
            self._close_locked()
            self._fabric = self._connect()

    def _connect(self) -> fabric.Connection:
        board = self.board
        sock = _open_socket(board)
        pinned = self.known_hosts.pinned(host_id(board.host or "", board.port))

        def transport_factory(sock: socket.socket, disabled_algorithms: dict | None = None) -> paramiko.Transport:
            transport = paramiko.Transport(
                sock,
                disabled_algorithms=disabled_algorithms,
                default_window_size=WINDOW_SIZE,
                default_max_packet_size=MAX_PACKET_SIZE,
            )
            # paramiko deadlocks for 30 s when a channel closes during a rekey it started itself (its transport
            # thread waits on the very kex it should be running). Leave rekeying to the server: OpenSSH rekeys
            # at its RekeyLimit and holds channel messages back while it does.
            transport.packetizer.REKEY_BYTES = transport.packetizer.REKEY_PACKETS = 1 << 62
            options = transport.get_security_options()
            offered = tuple(options.ciphers)
            options.ciphers = tuple(dict.fromkeys([c for c in _PREFERRED_CIPHERS if c in offered] + list(offered)))
            if pinned:
                options.key_types = preferred_key_types(pinned, tuple(options.key_types))
            return transport

        connect_kwargs: dict[str, object] = {
            "sock": sock,
            "timeout": board.connect_timeout,
            "banner_timeout": board.connect_timeout,
            "auth_timeout": board.connect_timeout,
            "channel_timeout": board.connect_timeout,
            "allow_agent": board.agent,
            "look_for_keys": board.key is None and not board.agent,
            "transport_factory": transport_factory,
        }
        if board.key is not None:
            if not board.key.is_file():
                sock.close()
                raise BoardError(f"{self.where}: key file {board.key} not found")
            connect_kwargs["key_filename"] = str(board.key)
        config = fabric.Config(overrides={"load_ssh_configs": False})
        connection = fabric.Connection(
            board.host or "", user=board.user, port=board.port, config=config, connect_kwargs=connect_kwargs
        )
        policy = TrustOnFirstUse(self.known_hosts, board.name)
        connection.client.set_missing_host_key_policy(policy)
        try:
            connection.open()
        except HostKeyError:
            connection.close()
            raise
        except paramiko.PasswordRequiredException:
            connection.close()
            raise AuthError(
                f"{self.where}: key file {board.key} is encrypted", hint="load it into ssh-agent and set `agent: true`"
            ) from None
        except paramiko.AuthenticationException as exc:
            connection.close()
            keys = f"key {board.key}" if board.key else ("ssh-agent" if board.agent else "default keys in ~/.ssh")
            raise AuthError(f"{self.where}: authentication failed as {board.user!r} with {keys}: {exc}") from None
        except (paramiko.SSHException, OSError, EOFError) as exc:
            connection.close()
            raise LinkError(f"{self.where}: SSH handshake failed: {exc or type(exc).__name__}") from None
        transport = connection.client.get_transport()
        assert transport is not None
        transport.set_keepalive(max(1, round(board.keepalive)))
        if policy.pinned_now:
            key = transport.get_remote_server_key()
            console.info(
                f"{self.where}: trusted host key {fingerprint(key)} on first use (pinned in {self.known_hosts.path})"
            )
        return connection

    def _transport(self) -> paramiko.Transport:
        self.open()
        assert self._fabric is not None
        transport = self._fabric.client.get_transport()
        if transport is None or not transport.is_active():
            raise LinkError(f"{self.where}: connection lost")
        return transport

    def _close_locked(self) -> None:
        if self._fabric is not None:
            with contextlib.suppress(Exception):
                self._fabric.close()
            self._fabric = None

    def close(self) -> None:
        with self._lock:
            self._close_locked()

    # -- commands

    def _lost(self, what: str) -> LinkError:
        transport = self._fabric.client.get_transport() if self._fabric else None
        cause = transport.get_exception() if transport is not None else None
        reason = f" ({cause})" if cause else ""
        timeout = f"; no answer within tcp_user_timeout={self.board.tcp_user_timeout:g} s" if cause is None else ""
        return LinkError(f"{self.where}: connection lost {what}{reason}{timeout}")

    def _link_alive(self) -> bool:
        """Whether the transport is still up. paramiko closes channels just before it marks a dead transport
        inactive, so a channel that ended without an exit status gives the transport a moment to settle."""
        transport = self._fabric.client.get_transport() if self._fabric else None
        settle = time.monotonic() + 0.5
        while transport is not None and transport.is_active():
            if time.monotonic() > settle:
                return True
            time.sleep(0.01)
        return False

    def _exec(self, argv: Sequence[str]) -> paramiko.Channel:
        command = shlex.join(argv)
        transport = self._transport()
        try:
            channel = transport.open_session(
                window_size=WINDOW_SIZE, max_packet_size=MAX_PACKET_SIZE, timeout=self.board.connect_timeout
            )
            channel.exec_command(command)
        except (paramiko.SSHException, OSError, EOFError) as exc:
            if not self._link_alive():
                raise self._lost(f"starting `{_describe_command(argv)}`") from exc
            raise BoardError(f"{self.where}: cannot start `{_describe_command(argv)}`: {exc}") from exc
        return channel

    def _finish(
        self,
        argv: Sequence[str],
        channel: paramiko.Channel,
        drains: Sequence[_Drain],
        started: float,
        deadline: float | None,
    ) -> CommandResult:
        """Wait for the exit status and the rest of the output, honouring the deadline.

        `drains` are the stdout and stderr readers, or just the stderr reader when stdout was streamed.
        """
        while not channel.status_event.wait(0.2):
            if deadline is not None and time.monotonic() > deadline:
                channel.close()
                raise CommandTimeout(
                    f"{self.where}: `{_describe_command(argv)}` did not finish within "
                    f"{deadline - started:g} s and was stopped"
                )
        while any(d.is_alive() for d in drains):
            newest = max(d.last_activity for d in drains)
            if time.monotonic() - newest > _OUTPUT_GRACE or (deadline is not None and time.monotonic() > deadline):
                channel.close()  # a background process holds the output open; do not wait for it
            for drain in drains:
                drain.join(0.2)
        exit_code = channel.exit_status if channel.exit_status_ready() else -1
        if exit_code == -1 and not self._link_alive():
            raise self._lost(f"while running `{_describe_command(argv)}`")
        channel.close()
        stdout = drains[0].text() if len(drains) == 2 else ""
        return CommandResult(tuple(argv), exit_code, stdout, drains[-1].text(), time.monotonic() - started)

    def run(
        self,
        argv: Sequence[str],
        *,
        timeout: float | None = None,
        check: bool = True,
        env: Mapping[str, str] | None = None,
    ) -> CommandResult:
        argv = [*_env_argv(env), *argv]
        timeout = timeout if timeout is not None else self.board.command_timeout
        started = time.monotonic()
        channel = self._exec(argv)
        try:
            channel.shutdown_write()
            drains = [_Drain(channel.recv), _Drain(channel.recv_stderr)]
            for drain in drains:
                drain.start()
            result = self._finish(argv, channel, drains, started, started + timeout if timeout else None)
        finally:
            channel.close()
        if check and not result.ok:
            raise self._failed(argv, result)
        return result

    # -- streams

    def bulk_threshold(self) -> int | None:
        mode = self.board.bulk_transfer
        if mode == "paramiko":
            return None
        if openssh_client() is None:
            if mode == "openssh":
                raise UsageError(
                    f"{self.where}: bulk_transfer is 'openssh' but OpenSSH's `ssh` client is not installed",
                    hint="install openssh-client, or set `bulk_transfer: auto` to fall back to paramiko",
                )
            return None
        return 0 if mode == "openssh" else BULK_FROM

    def open_read_stream(
        self, argv: Sequence[str], *, bulk: bool = False
    ) -> contextlib.AbstractContextManager[IO[bytes]]:
        if bulk and self.bulk_threshold() is not None:
            self.open()  # paramiko verifies (or pins) the host key first; ssh then checks it against the same file
            return _subprocess_read_stream(argv, self.openssh_argv(argv), self._openssh_judge(argv))
        return self._channel_read_stream(argv)

    def open_write_stream(
        self, argv: Sequence[str], *, check: bool = True, bulk: bool = False
    ) -> contextlib.AbstractContextManager[WriteStream]:
        if bulk and self.bulk_threshold() is not None:
            self.open()
            return _subprocess_write_stream(argv, self.openssh_argv(argv), self._openssh_judge(argv), check=check)
        return self._channel_write_stream(argv, check=check)

    def openssh_argv(self, argv: Sequence[str]) -> list[str]:
        """The `ssh` command line that runs argv on the board with this connection's settings and pinned host key."""
        board = self.board
        client = openssh_client()
        if client is None or not board.host:
            raise UsageError(f"{self.where}: OpenSSH's `ssh` client is not installed")
        keepalive = max(1, round(board.keepalive))
        options = {
            "BatchMode": "yes",  # never prompt
            "StrictHostKeyChecking": "yes",  # the key paramiko verified or pinned, nothing else
            "UserKnownHostsFile": _openssh_path(self.known_hosts.path),
            "GlobalKnownHostsFile": "/dev/null",
            "UpdateHostKeys": "no",
            "CheckHostIP": "no",
            "ConnectTimeout": str(max(1, math.ceil(board.connect_timeout))),
            "ConnectionAttempts": "1",
            "ServerAliveInterval": str(keepalive),
            "ServerAliveCountMax": str(max(1, math.ceil(board.tcp_user_timeout / keepalive))),
            "Ciphers": _OPENSSH_CIPHERS,
            "IdentityAgent": "SSH_AUTH_SOCK" if board.agent else "none",
            "PasswordAuthentication": "no",
            "KbdInteractiveAuthentication": "no",
            "ForwardAgent": "no",
            "ForwardX11": "no",
            "ClearAllForwardings": "yes",
            "RequestTTY": "no",
            "EscapeChar": "none",
            "ControlMaster": "no",
            "ControlPath": "none",
            "LogLevel": "ERROR",
        }
        if board.key is not None:
            options.update(IdentityFile=_openssh_path(board.key), IdentitiesOnly="yes")
        command = [client, "-F", "/dev/null", *(f"-o{name}={value}" for name, value in options.items())]
        command += ["-p", str(board.port), *(["-l", board.user] if board.user else [])]
        return [*command, "--", board.host, shlex.join(argv)]

    def _openssh_judge(self, argv: Sequence[str]) -> _Judge:
        def judge(result: CommandResult, check: bool) -> BoardError | None:
            if result.exit_code == _SSH_FAILED:
                return self._openssh_failure(result)
            return self._failed(argv, result) if check and not result.ok else None

        return judge

    def _openssh_failure(self, result: CommandResult) -> BoardError:
        text = result.stderr.strip()
        detail = _tail(text, 2).replace("\n", " ") or "no message"
        if "Host key verification failed" in text or "HOST IDENTIFICATION HAS CHANGED" in text:
            return HostKeyError(
                f"{self.where}: OpenSSH refused the board's host key ({detail}); it differs from the one pinned in "
                f"{self.known_hosts.path}",
                hint="run `fab boards` to see what etlab's own check says about the key",
            )
        if "Permission denied" in text:
            return AuthError(f"{self.where}: OpenSSH could not authenticate as {self.board.user!r}: {detail}")
        return LinkError(f"{self.where}: the OpenSSH connection of a bulk transfer failed: {detail}")

    @contextlib.contextmanager
    def _channel_read_stream(self, argv: Sequence[str]) -> Iterator[IO[bytes]]:
        started = time.monotonic()
        channel = self._exec(argv)
        try:
            channel.shutdown_write()
            stderr = _Drain(channel.recv_stderr)
            stderr.start()
            try:
                yield _ChannelReader(channel)  # type: ignore[misc]
                while channel.recv(_TAKE_ALL):  # the reader may stop before EOF (e.g. at tar's end blocks)
                    pass
            except Exception as exc:
                # A broken stream is most often a lost link or a failed command: report that, not the symptom.
                self._raise_stream_failure(argv, channel, stderr, started, exc)
                raise
            result = self._finish(argv, channel, [stderr], started, None)
            if not result.ok:
                raise self._failed(argv, result)
        finally:
            channel.close()

    def _raise_stream_failure(
        self, argv: Sequence[str], channel: paramiko.Channel, stderr: _Drain, started: float, exc: Exception
    ) -> None:
        if isinstance(exc, BoardError):
            return
        if not self._link_alive():
            raise self._lost(f"while streaming from `{_describe_command(argv)}`") from exc
        if channel.status_event.wait(2.0) and channel.exit_status_ready() and channel.exit_status != 0:
            stderr.join(2.0)
            result = CommandResult(tuple(argv), channel.exit_status, "", stderr.text(), time.monotonic() - started)
            raise self._failed(argv, result) from exc

    def _send_failed(self, exc: BaseException) -> BoardError:
        if not self._link_alive():
            return self._lost("while sending data")
        return BoardError(f"{self.where}: the receiving command stopped early ({exc or type(exc).__name__})")

    @contextlib.contextmanager
    def _channel_write_stream(self, argv: Sequence[str], *, check: bool) -> Iterator[WriteStream]:
        started = time.monotonic()
        channel = self._exec(argv)
        try:
            drains = [_Drain(channel.recv), _Drain(channel.recv_stderr)]
            for drain in drains:
                drain.start()
            writer = _ChannelWriter(self, channel, drains[0])
            try:
                yield writer
            except BoardError as exc:
                # The command may have exited early (disk full, bad path): its stderr says why.
                if self._link_alive() and channel.status_event.wait(2.0) and channel.exit_status_ready():
                    for drain in drains:
                        drain.join(2.0)
                    early = CommandResult(tuple(argv), channel.exit_status, drains[0].text(), drains[1].text(), 0.0)
                    if not early.ok:
                        raise self._failed(argv, early) from exc
                raise
            try:
                channel.shutdown_write()
            except (OSError, EOFError, paramiko.SSHException) as exc:
                raise self._send_failed(exc) from exc
            writer.result = self._finish(argv, channel, drains, started, None)
            if check and not writer.result.ok:
                raise self._failed(argv, writer.result)
        finally:
            channel.close()

    def _home_dir(self) -> str:
        # A user's home on a board does not move while etlab runs: ask once per process, not once per connection.
        key = (self.board.host, self.board.port, self.board.user)
        with _homes_lock:
            if key in _homes:
                return _homes[key]
        home = self.run(["sh", "-c", 'printf "%s" "$HOME"'], timeout=60).stdout
        if not home.startswith("/"):
            home = self.run(["sh", "-c", "cd && pwd"], timeout=60).stdout.strip()
        if not home.startswith("/"):
            raise BoardError(f"{self.where}: cannot find the home directory of {self.board.user!r}")
        with _homes_lock:
            _homes[key] = home
        return home


_homes: dict[tuple[str | None, int, str | None], str] = {}
_homes_lock = threading.Lock()


# ---------------------------------------------------------------- subprocesses (the local board, OpenSSH streams)


@functools.cache
def openssh_client() -> str | None:
    """The path of OpenSSH's `ssh` client, if installed."""
    return shutil.which("ssh")


def _openssh_path(path: Path) -> str:
    """A path as an ssh option value: `%` escaped (ssh expands %-tokens), quoted if it has blanks."""
    text = str(Path(path).absolute()).replace("%", "%%")
    if '"' in text:
        raise UsageError(f"{path}: OpenSSH cannot be given a path with a double quote in it")
    return f'"{text}"' if any(c.isspace() for c in text) else text


# Judges a command run as a subprocess once it ended (or stopped early): the error to raise, or None.
# `check` is False when the caller looks at a non-zero exit itself.
_Judge = Callable[[CommandResult, bool], "BoardError | None"]


def _exited_with_error(process: subprocess.Popen[bytes], wait: float = 2.0) -> bool:
    try:
        return process.wait(timeout=wait) != 0
    except subprocess.TimeoutExpired:
        return False


def _spawn(argv: Sequence[str], *, stdin: bool) -> subprocess.Popen[bytes]:
    # Unbuffered: a buffered reader turns read(1 MiB) into many small reads plus copies (measured 1.5x slower).
    process = subprocess.Popen(
        list(argv),
        stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        bufsize=0,
    )
    for pipe in (process.stdin, process.stdout):
        if pipe is not None:
            with contextlib.suppress(OSError):  # beyond /proc/sys/fs/pipe-max-size: keep the default
                fcntl.fcntl(pipe.fileno(), _F_SETPIPE_SZ, _PIPE_SIZE)
    return process


def _stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.kill()
        process.wait()
    for pipe in (process.stdin, process.stdout, process.stderr):
        if pipe is not None:
            with contextlib.suppress(OSError):
                pipe.close()


@contextlib.contextmanager
def _subprocess_read_stream(argv: Sequence[str], process_argv: Sequence[str], judge: _Judge) -> Iterator[IO[bytes]]:
    """Stream the stdout of `process_argv` (which runs `argv`, the command named in messages)."""
    started = time.monotonic()
    process = _spawn(process_argv, stdin=False)
    assert process.stdout is not None and process.stderr is not None
    stderr = _Drain(process.stderr.read, 1 << 16)
    stderr.start()
    try:
        try:
            yield process.stdout
        except Exception as exc:
            # If the command failed, that is the story; if it is still writing, the reader's error is.
            if _exited_with_error(process):
                stderr.join()
                error = judge(CommandResult(tuple(argv), process.returncode, "", stderr.text(), 0.0), True)
                if error is not None:
                    raise error from exc
            raise
        while process.stdout.read(_PIPE_SIZE):  # the reader may stop before EOF (e.g. at tar's end blocks)
            pass
        process.wait()
        stderr.join()
        error = judge(
            CommandResult(tuple(argv), process.returncode, "", stderr.text(), time.monotonic() - started), True
        )
        if error is not None:
            raise error
    finally:
        _stop(process)


class _PipeWriter(WriteStream):
    def __init__(self, process: subprocess.Popen[bytes], stdout: _Drain) -> None:
        self.process = process
        self._stdout = stdout

    def write(self, data: bytes) -> int:
        assert self.process.stdin is not None
        view = memoryview(data)
        try:
            while view:
                view = view[self.process.stdin.write(view) or 0 :]
        except BrokenPipeError as exc:
            raise BoardError(f"the receiving command stopped early: {exc}") from exc
        return len(data)


@contextlib.contextmanager
def _subprocess_write_stream(
    argv: Sequence[str], process_argv: Sequence[str], judge: _Judge, *, check: bool
) -> Iterator[WriteStream]:
    """Feed the stdin of `process_argv` (which runs `argv`, the command named in messages)."""
    started = time.monotonic()
    process = _spawn(process_argv, stdin=True)
    assert process.stdin is not None and process.stdout is not None and process.stderr is not None
    drains = [_Drain(process.stdout.read, 1 << 16), _Drain(process.stderr.read, 1 << 16)]
    for drain in drains:
        drain.start()
    writer = _PipeWriter(process, drains[0])
    try:
        try:
            yield writer
        except BoardError as exc:
            if _exited_with_error(process):  # the command quit early: its stderr says why
                for drain in drains:
                    drain.join()
                early = CommandResult(tuple(argv), process.returncode, drains[0].text(), drains[1].text(), 0.0)
                error = judge(early, True)
                if error is not None:
                    raise error from exc
            raise
        finally:
            with contextlib.suppress(BrokenPipeError):
                process.stdin.close()
        process.wait()
        for drain in drains:
            drain.join()
        writer.result = CommandResult(
            tuple(argv), process.returncode, drains[0].text(), drains[1].text(), time.monotonic() - started
        )
        error = judge(writer.result, check)
        if error is not None:
            raise error
    finally:
        _stop(process)


class LocalConnection(BoardConnection):
    """The workstation as a board: the same interface, run with subprocesses."""

    def _env(self, env: Mapping[str, str] | None) -> dict[str, str] | None:
        _env_argv(env)  # validates names
        return {**os.environ, **env} if env else None

    def run(
        self,
        argv: Sequence[str],
        *,
        timeout: float | None = None,
        check: bool = True,
        env: Mapping[str, str] | None = None,
    ) -> CommandResult:
        timeout = timeout if timeout is not None else self.board.command_timeout
        started = time.monotonic()
        try:
            process = subprocess.Popen(
                list(argv),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                env=self._env(env),
                start_new_session=True,  # so a timeout stops the whole process group
            )
        except OSError as exc:
            result = CommandResult(tuple(argv), 127, "", f"{argv[0]}: {exc.strerror}", time.monotonic() - started)
        else:
            try:
                stdout, stderr = process.communicate(timeout=timeout)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
                process.communicate()
                raise CommandTimeout(
                    f"board {self.board.name!r}: `{_describe_command(argv)}` did not finish within "
                    f"{timeout:g} s and was stopped"
                ) from None
            except BaseException:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
                process.wait()
                raise
            result = CommandResult(
                tuple(argv),
                process.returncode,
                stdout.decode("utf-8", errors="replace"),
                stderr.decode("utf-8", errors="replace"),
                time.monotonic() - started,
            )
        if check and not result.ok:
            raise self._failed(argv, result)
        return result

    def _judge(self, argv: Sequence[str]) -> _Judge:
        return lambda result, check: self._failed(argv, result) if check and not result.ok else None

    def open_read_stream(
        self, argv: Sequence[str], *, bulk: bool = False
    ) -> contextlib.AbstractContextManager[IO[bytes]]:
        return _subprocess_read_stream(argv, argv, self._judge(argv))

    def open_write_stream(
        self, argv: Sequence[str], *, check: bool = True, bulk: bool = False
    ) -> contextlib.AbstractContextManager[WriteStream]:
        return _subprocess_write_stream(argv, argv, self._judge(argv), check=check)

    def _home_dir(self) -> str:
        return str(Path.home())
