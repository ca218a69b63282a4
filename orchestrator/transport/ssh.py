"""The SSH transport: a Fabric/paramiko connection per board, OpenSSH's `ssh` client for bulk streams.

Lost links are noticed within seconds: the TCP socket carries TCP_USER_TIMEOUT and the SSH transport sends
keepalives, so a blackholed board fails a command with LinkError instead of hanging.

Large transfers may ask for a *bulk* stream. By default (`bulk_transfer: auto`) that is OpenSSH's `ssh` client
in a subprocess, checking the host key against the same pinned known_hosts, after paramiko has verified it:
its crypto and packet handling are C, and cost far less CPU than paramiko's (bench/README.md).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import math
import shlex
import socket
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import IO

import fabric
import paramiko

from orchestrator import console
from orchestrator.boards.inventory import Board
from orchestrator.errors import BoardError, HostKeyError, UsageError
from orchestrator.transport.base import (
    AuthError,
    BoardConnection,
    CommandResult,
    CommandTimeout,
    Drain,
    LinkError,
    WriteStream,
    describe_command,
    env_argv,
    overflow,
    tail,
)
from orchestrator.transport.hostkeys import KnownHosts, TrustOnFirstUse, fingerprint, host_id, preferred_key_types
from orchestrator.transport.pipes import (
    Judge,
    openssh_client,
    openssh_path,
    subprocess_read_stream,
    subprocess_write_stream,
)
from orchestrator.transport.ssh_socket import TAKE_ALL, ChannelReader, ChannelWriter, open_socket
from orchestrator.transport.stopper import STOP_GRACE_SECONDS, STOP_TOKEN_ENV, stopper_source

# paramiko logs a lost link at ERROR level from its own thread; etlab reports it as a BoardError instead.
logging.getLogger("paramiko").addHandler(logging.NullHandler())

# A large receive window keeps bulk pulls streaming, and large packets cut paramiko's per-packet Python cost
# (OpenSSH sends packets up to the size we allow, within its 256 KiB limit).
WINDOW_SIZE = 16 << 20
MAX_PACKET_SIZE = 128 << 10
_PREFERRED_CIPHERS = ("aes128-gcm@openssh.com", "aes256-gcm@openssh.com")
# How long to keep reading output after the exit status arrived, when no more output comes.
_OUTPUT_GRACE = 10.0
# With `bulk_transfer: auto`, transfers from this size go through OpenSSH: below it, a second handshake
# costs more than it saves.
BULK_FROM = 8 << 20
# OpenSSH bulk ciphers, in order of preference (the server takes the first one it supports). A CPU with AES
# instructions runs AES-GCM fastest; one without (a Pi 4's Cortex-A72) runs chacha20-poly1305 several times faster.
_AES_FIRST = ("aes128-gcm@openssh.com", "aes256-gcm@openssh.com", "chacha20-poly1305@openssh.com")
_CHACHA_FIRST = ("chacha20-poly1305@openssh.com", "aes128-gcm@openssh.com", "aes256-gcm@openssh.com")
_CTR = ("aes128-ctr", "aes192-ctr", "aes256-ctr")
# Asks the board its architecture, AT_HWCAP (od reads its own /proc/self/auxv: under qemu-user that is the
# emulated CPU's) and, for x86, the CPU flags. /proc/cpuinfo is not read on Arm: under emulation it is the host's.
_CPU_PROBE = (
    "uname -m; od -An -v -tu8 -w16 /proc/self/auxv 2>/dev/null; "
    "case $(uname -m) in x86_64|amd64) grep -m1 '^flags' /proc/cpuinfo 2>/dev/null;; esac; true"
)
_AT_HWCAP = 16
_HWCAP_AES = 1 << 3


def bulk_ciphers(choice: str, aes: bool | None) -> str:
    """OpenSSH's Ciphers option for bulk transfers: the inventory's `bulk_cipher`, else by the CPU's AES support."""
    if choice != "auto":
        preferred: tuple[str, ...] = (choice,)
    else:
        preferred = _CHACHA_FIRST if aes is False else _AES_FIRST
    return ",".join(dict.fromkeys([*preferred, *_AES_FIRST, *_CTR]))


def parse_cpu_probe(text: str) -> bool | None:
    """Whether the board's CPU has AES instructions, from the _CPU_PROBE output (None: cannot tell)."""
    lines = text.splitlines()
    arch = lines[0].strip() if lines else ""
    if arch in ("x86_64", "amd64"):
        flags = next((line for line in lines if line.startswith("flags")), None)
        return None if flags is None else "aes" in flags.split(":", 1)[-1].split()
    if arch not in ("aarch64", "arm64"):
        return None
    for line in lines[1:]:
        words = line.split()
        if len(words) == 2 and words[0].isdigit() and int(words[0]) == _AT_HWCAP and words[1].isdigit():
            return bool(int(words[1]) & _HWCAP_AES)
    return None


# ssh exits 255 when it fails itself (connection, authentication, host key); etlab's board commands never do.
_SSH_FAILED = 255
_CHANNEL_ERRORS = (OSError, EOFError, paramiko.SSHException)


class SshConnection(BoardConnection):
    """A Fabric Connection to one board, with host keys pinned on first use and a socket that notices lost links."""

    def __init__(self, board: Board, *, known_hosts: Path | None = None) -> None:
        super().__init__(board)
        self.link = board.ssh  # its SSH fields (boards/transports.py SshOptions)
        if not self.link.host:
            raise UsageError(f"board {board.name!r} has no host")
        self.known_hosts = KnownHosts(known_hosts or board.known_hosts)
        self._fabric: fabric.Connection | None = None
        self._lock = threading.Lock()
        self._aes: tuple[bool | None] | None = None  # asked once per connection

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
        sock = open_socket(board)
        pinned = self.known_hosts.pinned(host_id(self.link.host or "", self.link.port))

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
            "timeout": self.link.connect_timeout,
            "banner_timeout": self.link.connect_timeout,
            "auth_timeout": self.link.connect_timeout,
            "channel_timeout": self.link.connect_timeout,
            "allow_agent": self.link.agent,
            "look_for_keys": self.link.key is None and not self.link.agent,
            "transport_factory": transport_factory,
        }
        if self.link.key is not None:
            if not self.link.key.is_file():
                sock.close()
                raise BoardError(f"{self.where}: key file {self.link.key} not found")
            connect_kwargs["key_filename"] = str(self.link.key)
        config = fabric.Config(overrides={"load_ssh_configs": False})
        connection = fabric.Connection(
            self.link.host or "", user=self.link.user, port=self.link.port, config=config, connect_kwargs=connect_kwargs
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
                f"{self.where}: key file {self.link.key} is encrypted",
                hint="load it into ssh-agent and set `agent: true`",
            ) from None
        except paramiko.AuthenticationException as exc:
            connection.close()
            keys = (
                f"key {self.link.key}"
                if self.link.key
                else ("ssh-agent" if self.link.agent else "default keys in ~/.ssh")
            )
            raise AuthError(f"{self.where}: authentication failed as {self.link.user!r} with {keys}: {exc}") from None
        except (paramiko.SSHException, OSError, EOFError) as exc:
            connection.close()
            raise LinkError(f"{self.where}: SSH handshake failed: {exc or type(exc).__name__}") from None
        transport = connection.client.get_transport()
        assert transport is not None
        transport.set_keepalive(max(1, round(self.link.keepalive)))
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
        timeout = f"; no answer within tcp_user_timeout={self.link.tcp_user_timeout:g} s" if cause is None else ""
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
                window_size=WINDOW_SIZE, max_packet_size=MAX_PACKET_SIZE, timeout=self.link.connect_timeout
            )
            channel.exec_command(command)
        except (paramiko.SSHException, OSError, EOFError) as exc:
            if not self._link_alive():
                raise self._lost(f"starting `{describe_command(argv)}`") from exc
            raise BoardError(f"{self.where}: cannot start `{describe_command(argv)}`: {exc}") from exc
        return channel

    def _finish(
        self,
        argv: Sequence[str],
        channel: paramiko.Channel,
        drains: Sequence[Drain],
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
                    f"{self.where}: `{describe_command(argv)}` did not finish within "
                    f"{deadline - started:g} s and was stopped"
                )
        while any(d.is_alive() for d in drains):
            newest = max(d.last_activity for d in drains)
            if time.monotonic() - newest > _OUTPUT_GRACE or (deadline is not None and time.monotonic() > deadline):
                channel.close()  # a background process holds the output open; do not wait for it
            for drain in drains:
                drain.join(0.2)
        if stream := overflow(drains):  # the drain closed the channel: the command sent too much
            raise self._too_much(argv, stream)
        exit_code = channel.exit_status if channel.exit_status_ready() else -1
        if exit_code == -1 and not self._link_alive():
            raise self._lost(f"while running `{describe_command(argv)}`")
        channel.close()
        stdout = drains[0].text() if len(drains) == 2 else ""
        return CommandResult(tuple(argv), exit_code, stdout, drains[-1].text(), time.monotonic() - started)

    def _run(
        self,
        argv: Sequence[str],
        *,
        timeout: float | None,
        check: bool,
        env: Mapping[str, str] | None,
        token: str,
    ) -> CommandResult:
        argv = [*env_argv(env), *argv]
        timeout = timeout if timeout is not None else self.board.command_timeout
        started = time.monotonic()
        channel = self._exec(_marked(token, argv))
        try:
            channel.shutdown_write()
            drains = self._drains(channel)
            for drain in drains:
                drain.start()
            result = self._finish(argv, channel, drains, started, started + timeout if timeout else None)
        finally:
            channel.close()
        if check and not result.ok:
            raise self._failed(argv, result)
        return result

    def stop_processes(self, token: str) -> None:
        # Over a fresh channel of the same connection, never a new one: a board whose link is gone is out of reach.
        transport = self._fabric.client.get_transport() if self._fabric else None
        if transport is None or not transport.is_active():
            return
        argv = ["python3", "-c", _stopper_source(), token, f"{STOP_GRACE_SECONDS:g}"]
        with contextlib.suppress(*_CHANNEL_ERRORS):
            channel = transport.open_session(timeout=self.link.connect_timeout)
            try:
                channel.exec_command(shlex.join(argv))
                channel.status_event.wait(STOP_GRACE_SECONDS + self.link.connect_timeout)
            finally:
                channel.close()

    @staticmethod
    def _drains(channel: paramiko.Channel) -> list[Drain]:
        """Readers of a channel's stdout and stderr; one that outgrows its limit closes the channel."""
        return [
            Drain(channel.recv, errors=_CHANNEL_ERRORS, stream="stdout", on_overflow=channel.close),
            Drain(channel.recv_stderr, errors=_CHANNEL_ERRORS, stream="stderr", on_overflow=channel.close),
        ]

    # -- streams

    def bulk_threshold(self) -> int | None:
        mode = self.link.bulk_transfer
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

    def _open_read_stream(
        self, argv: Sequence[str], *, bulk: bool, token: str
    ) -> contextlib.AbstractContextManager[IO[bytes]]:
        if bulk and self.bulk_threshold() is not None:
            self.open()  # paramiko verifies (or pins) the host key first; ssh then checks it against the same file
            self._learn_cpu()
            wire = self.openssh_argv(_marked(token, argv))
            return subprocess_read_stream(argv, wire, self._openssh_judge(argv))
        return self._channel_read_stream(argv, token=token)

    def _open_write_stream(
        self, argv: Sequence[str], *, check: bool, bulk: bool, token: str
    ) -> contextlib.AbstractContextManager[WriteStream]:
        if bulk and self.bulk_threshold() is not None:
            self.open()
            self._learn_cpu()
            wire = self.openssh_argv(_marked(token, argv))
            return subprocess_write_stream(argv, wire, self._openssh_judge(argv), check=check)
        return self._channel_write_stream(argv, check=check, token=token)

    def board_has_aes(self) -> bool | None:
        """Whether the board's CPU has AES instructions (None: unknown), asked once over the control channel."""
        if self._aes is None:
            result = self.run(["sh", "-c", _CPU_PROBE], timeout=60, check=False)
            self._aes = (parse_cpu_probe(result.stdout) if result.exit_code == 0 else None,)
        return self._aes[0]

    def _learn_cpu(self) -> None:
        if self.link.bulk_cipher == "auto":
            self.board_has_aes()

    def openssh_argv(self, argv: Sequence[str]) -> list[str]:
        """The `ssh` command line that runs argv on the board with this connection's settings and pinned host key."""
        client = openssh_client()
        if client is None or not self.link.host:
            raise UsageError(f"{self.where}: OpenSSH's `ssh` client is not installed")
        keepalive = max(1, round(self.link.keepalive))
        options = {
            "BatchMode": "yes",  # never prompt
            "StrictHostKeyChecking": "yes",  # the key paramiko verified or pinned, nothing else
            "UserKnownHostsFile": openssh_path(self.known_hosts.path),
            "GlobalKnownHostsFile": "/dev/null",
            "UpdateHostKeys": "no",
            "CheckHostIP": "no",
            "ConnectTimeout": str(max(1, math.ceil(self.link.connect_timeout))),
            "ConnectionAttempts": "1",
            "ServerAliveInterval": str(keepalive),
            "ServerAliveCountMax": str(max(1, math.ceil(self.link.tcp_user_timeout / keepalive))),
            # Picked by the board's CPU once _learn_cpu() has asked it (before every bulk stream).
            "Ciphers": bulk_ciphers(self.link.bulk_cipher, self._aes[0] if self._aes else None),
            "IdentityAgent": "SSH_AUTH_SOCK" if self.link.agent else "none",
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
        if self.link.key is not None:
            options.update(IdentityFile=openssh_path(self.link.key), IdentitiesOnly="yes")
        command = [client, "-F", "/dev/null", *(f"-o{name}={value}" for name, value in options.items())]
        command += ["-p", str(self.link.port), *(["-l", self.link.user] if self.link.user else [])]
        return [*command, "--", self.link.host, shlex.join(argv)]

    def _openssh_judge(self, argv: Sequence[str]) -> Judge:
        def judge(result: CommandResult, check: bool) -> BoardError | None:
            if result.overflow:  # ssh was killed for it: not a failure of ssh itself
                return self._too_much(argv, result.overflow)
            if result.exit_code == _SSH_FAILED:
                return self._openssh_failure(result)
            return self._failed(argv, result) if check and not result.ok else None

        return judge

    def _openssh_failure(self, result: CommandResult) -> BoardError:
        text = result.stderr.strip()
        detail = tail(text, 2).replace("\n", " ") or "no message"
        if "Host key verification failed" in text or "HOST IDENTIFICATION HAS CHANGED" in text:
            return HostKeyError(
                f"{self.where}: OpenSSH refused the board's host key ({detail}); it differs from the one pinned in "
                f"{self.known_hosts.path}",
                hint="run `fab boards` to see what etlab's own check says about the key",
            )
        if "Permission denied" in text:
            return AuthError(f"{self.where}: OpenSSH could not authenticate as {self.link.user!r}: {detail}")
        return LinkError(f"{self.where}: the OpenSSH connection of a bulk transfer failed: {detail}")

    @contextlib.contextmanager
    def _channel_read_stream(self, argv: Sequence[str], *, token: str) -> Iterator[IO[bytes]]:
        started = time.monotonic()
        channel = self._exec(_marked(token, argv))
        try:
            channel.shutdown_write()
            stderr = self._drains(channel)[1]
            stderr.start()
            try:
                yield ChannelReader(channel)  # type: ignore[misc]
                while channel.recv(TAKE_ALL):  # the reader may stop before EOF (e.g. at tar's end blocks)
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
        self, argv: Sequence[str], channel: paramiko.Channel, stderr: Drain, started: float, exc: Exception
    ) -> None:
        if stderr.overflowed:  # it closed the channel, which broke the stream
            raise self._too_much(argv, stderr.stream) from exc
        if isinstance(exc, BoardError):
            return
        if not self._link_alive():
            raise self._lost(f"while streaming from `{describe_command(argv)}`") from exc
        if channel.status_event.wait(2.0) and channel.exit_status_ready() and channel.exit_status != 0:
            stderr.join(2.0)
            result = CommandResult(tuple(argv), channel.exit_status, "", stderr.text(), time.monotonic() - started)
            raise self._failed(argv, result) from exc

    def _send_failed(self, exc: BaseException) -> BoardError:
        if not self._link_alive():
            return self._lost("while sending data")
        return BoardError(f"{self.where}: the receiving command stopped early ({exc or type(exc).__name__})")

    @contextlib.contextmanager
    def _channel_write_stream(self, argv: Sequence[str], *, check: bool, token: str) -> Iterator[WriteStream]:
        started = time.monotonic()
        channel = self._exec(_marked(token, argv))
        try:
            drains = self._drains(channel)
            for drain in drains:
                drain.start()
            writer = ChannelWriter(channel, drains[0], self._send_failed)
            try:
                yield writer
            except BoardError as exc:
                if stream := overflow(drains):  # a drain closed the channel, which stopped the sending
                    raise self._too_much(argv, stream) from exc
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
        key = (self.link.host, self.link.port, self.link.user)
        with _homes_lock:
            if key in _homes:
                return _homes[key]
        home = self.run(["sh", "-c", 'printf "%s" "$HOME"'], timeout=60).stdout
        if not home.startswith("/"):
            home = self.run(["sh", "-c", "cd && pwd"], timeout=60).stdout.strip()
        if not home.startswith("/"):
            raise BoardError(f"{self.where}: cannot find the home directory of {self.link.user!r}")
        with _homes_lock:
            _homes[key] = home
        return home


def _marked(token: str, argv: Sequence[str]) -> list[str]:
    """argv marked with its stop token for stop_processes(): an assignment word the board's shell reads (shlex
    leaves NAME=hex unquoted), so a board needs no `env` program for it."""
    return [f"{STOP_TOKEN_ENV}={token}", *argv]


@functools.cache
def _stopper_source() -> str:
    """stopper.py, run on the board as `python3 -c` (it is self-contained)."""
    return stopper_source()


_homes: dict[tuple[str | None, int, str | None], str] = {}
_homes_lock = threading.Lock()


def open_ssh(board: Board, *, known_hosts: Path | None = None) -> SshConnection:
    """The opener of transport `ssh` (boards/transports.py): connected, its host key verified or pinned."""
    connection = SshConnection(board, known_hosts=known_hosts)
    connection.open()
    return connection
