"""Real OpenSSH servers as fake boards, for tests and benchmarks.

Each fake board is a private `/usr/sbin/sshd` on its own loopback address (127.0.0.2, 127.0.0.3, ...) and free
port, with its own host key, an authorized_keys holding the lab's client key, and its own HOME (set with sshd's
SetEnv, so `~/.etlab` on the board is a folder of the lab). The server runs as PID 1 of a private PID namespace
when the kernel allows it, so stopping it kills every session too (sessions call setsid, and PID 1 of this
machine does not reap); otherwise the server's descendants are found and killed by PID.

`SshdLab` and `SshdBoard` are plain classes, for tests (tests/plugins/sshd.py wraps them in fixtures) and for
bench/, as Fabric ships `fabric.testing`. Setup problems raise LabSetupError: CI installs everything, so a
missing piece is a bug to see, never a reason to skip.
"""

from __future__ import annotations

import contextlib
import functools
import os
import random
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from orchestrator.boards.inventory import Board


class LabSetupError(RuntimeError):
    """The machine lacks something the fake lab needs (sshd, ip, namespaces)."""


SSHD = Path("/usr/sbin/sshd")
_START_TIMEOUT = 15.0


def require_sshd() -> None:
    """Fail (never skip) when OpenSSH's server is missing: CI installs it, so its absence is a setup bug."""
    if not SSHD.exists() or shutil.which("ssh-keygen") is None:
        raise LabSetupError(f"{SSHD} or ssh-keygen is missing: run `apt-get install -y openssh-server`")


@functools.cache
def pid_namespaces_work() -> bool:
    try:
        done = subprocess.run(["unshare", "--pid", "--fork", "--kill-child", "true"], capture_output=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0


def _parents() -> dict[int, int]:
    """pid -> parent pid for every process (this kernel may lack /proc/PID/task/PID/children)."""
    parents = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError, ValueError, IndexError):
                stat = Path(f"/proc/{entry}/stat").read_text()
                parents[int(entry)] = int(stat[stat.rindex(")") + 2 :].split()[1])
    return parents


def descendants(pid: int) -> list[int]:
    parents = _parents()
    found: list[int] = []
    frontier = [pid]
    while frontier:
        current = frontier.pop()
        children = [child for child, parent in parents.items() if parent == current]
        found += children
        frontier += children
    return found


def keygen(path: Path, comment: str) -> None:
    for leftover in (path, path.with_name(path.name + ".pub")):
        leftover.unlink(missing_ok=True)
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)], check=True, capture_output=True
    )


def free_port(address: str) -> int:
    with socket.socket() as probe:
        probe.bind((address, 0))
        return probe.getsockname()[1]


class SshdBoard:
    """One fake board: a private sshd, its files, and the `Board` that reaches it."""

    start_timeout = _START_TIMEOUT

    def __init__(
        self,
        lab: SshdLab,
        name: str,
        address: str,
        root: Path,
        *,
        sshd_config: Sequence[str] = (),
        session_env: Mapping[str, str] | None = None,
        **board_overrides: Any,
    ) -> None:
        self.lab = lab
        self.sshd_config = list(sshd_config)
        self.session_env = dict(session_env or {})
        self.name = name
        self.address = address
        self.root = root
        self.home = root / "home"
        self.host_key = root / "ssh_host_ed25519_key"
        self.config = root / "sshd_config"
        self.log = root / "sshd.log"
        self.port = 0
        self.overrides = board_overrides
        self.process: subprocess.Popen[bytes] | None = None
        self.home.mkdir(parents=True, exist_ok=True)
        keygen(self.host_key, f"host key of {name}")

    @property
    def board(self) -> Board:
        settings: dict[str, Any] = {
            "transport": "ssh",
            "host": self.address,
            "port": self.port,
            "user": "root",
            "key": self.lab.client_key,
            "workdir": "~/.etlab",
            "known_hosts": self.lab.known_hosts,
            "connect_timeout": 5.0,
            "keepalive": 2.0,
            "tcp_user_timeout": 10.0,
            **self.overrides,
        }
        return Board.of(self.name, **settings)

    def local_path(self, remote: str) -> Path:
        """Where a path on this board lives on this machine (the board shares the filesystem)."""
        if remote == "~" or remote.startswith("~/"):
            return self.home / remote[2:]
        return Path(remote)

    @property
    def workdir_path(self) -> Path:
        return self.local_path(self.board.workdir)

    def _server_files(self) -> dict[str, str]:
        """The host key, authorized_keys and HOME as the server sees them (a chrooted board overrides this)."""
        return {
            "host_key": str(self.host_key),
            "authorized_keys": str(self.lab.authorized_keys),
            "home": str(self.home),
        }

    def _write_config(self) -> None:
        # sshd keeps the first value it reads for a keyword, so a test's own options go first and win.
        files = self._server_files()
        lines = [
            *self.sshd_config,
            f"Port {self.port}",
            f"ListenAddress {self.address}",
            f"HostKey {files['host_key']}",
            "PidFile none",
            f"AuthorizedKeysFile {files['authorized_keys']}",
            "PasswordAuthentication no",
            "KbdInteractiveAuthentication no",
            "UsePAM no",
            "StrictModes no",
            "PermitRootLogin prohibit-password",
            "Subsystem sftp internal-sftp",
            # Only the first SetEnv line counts, so every variable goes on it.
            "SetEnv " + " ".join(f'"{k}={v}"' for k, v in {"HOME": files["home"], **self.session_env}.items()),
            "MaxStartups 100:30:200",
            "MaxSessions 100",
            "LogLevel INFO",
        ]
        self.config.write_text("\n".join(lines) + "\n")

    def _command(self) -> list[str]:
        sshd = [str(SSHD), "-D", "-e", "-f", str(self.config)]
        return ["unshare", "--pid", "--fork", "--kill-child", *sshd] if pid_namespaces_work() else sshd

    def start(self, *, new_port: bool = False) -> None:
        """Start the server (on the same port as before unless `new_port` or it never ran)."""
        if self.running:
            return
        Path("/run/sshd").mkdir(parents=True, exist_ok=True)  # sshd's privilege separation directory
        keep_port = self.port and not new_port
        for _attempt in range(20):
            if not keep_port:
                self.port = free_port(self.address)
            self._write_config()
            offset = self.log.stat().st_size if self.log.exists() else 0
            with open(self.log, "ab") as log:
                self.process = subprocess.Popen(
                    self._command(), stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True
                )
            outcome = self._wait_ready(offset)
            if outcome == "ready":
                return
            self._kill()
            if outcome != "port in use":
                raise RuntimeError(f"sshd for {self.name!r} did not start: {outcome}\n{self.log_text(offset)}")
            time.sleep(0.2 if keep_port else 0)  # a restart may race the old socket's release
        raise RuntimeError(f"sshd for {self.name!r}: no free port on {self.address}")

    def log_text(self, offset: int = 0) -> str:
        with contextlib.suppress(OSError), open(self.log, "rb") as handle:
            handle.seek(offset)
            return handle.read().decode(errors="replace")
        return ""

    def _wait_ready(self, offset: int) -> str:
        deadline = time.monotonic() + self.start_timeout
        while time.monotonic() < deadline:
            text = self.log_text(offset)
            if "Server listening on" in text:
                return "ready"
            if "Address already in use" in text or "Cannot bind any address" in text:
                return "port in use"
            assert self.process is not None
            if self.process.poll() is not None:
                return f"exited with {self.process.returncode}"
            time.sleep(0.005)
        return f"not listening after {self.start_timeout} s"

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def _kill(self) -> None:
        process, self.process = self.process, None
        if process is None:
            return
        if pid_namespaces_work():
            # Kill the namespace's PID 1 (sshd), not `unshare`: the kernel then kills every session in the
            # namespace, and `unshare` (our child) reaps sshd, so no zombie is left for PID 1 of this machine.
            victims = [pid for pid, parent in _parents().items() if parent == process.pid]
        else:
            victims = descendants(process.pid)
        for pid in victims:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        try:
            process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()

    def stop(self) -> None:
        """Kill the server and every session it started (in-flight commands die as on a power cut)."""
        self._kill()

    def restart(self) -> None:
        """Stop, then start again on the same address, port and host key."""
        self.stop()
        self.start()

    def regenerate_host_key(self) -> None:
        """Give the board a new host key (as a reinstall would); restarts the server if it was running."""
        was_running = self.running
        self.stop()
        keygen(self.host_key, f"new host key of {self.name}")
        if was_running:
            self.start()

    def ssh_options(self) -> list[str]:
        """Options for OpenSSH's own clients (ssh, scp) to reach this board, for comparisons."""
        return [
            "-i",
            str(self.lab.client_key),
            "-o",
            f"UserKnownHostsFile={self.lab.root / 'openssh_known_hosts'}",
            "-o",
            "StrictHostKeyChecking=accept-new",
            "-o",
            "BatchMode=yes",
            "-o",
            "LogLevel=ERROR",
        ]


class NetnsBoard(SshdBoard):
    """A board behind a veth pair in its own network namespace, whose link can be cut with a blackhole route."""

    def __init__(self, lab: SshdLab, name: str, root: Path, **board_overrides: Any) -> None:
        tag = f"{os.getpid() % 100000}{random.randrange(1000):03d}"
        self.namespace = f"etlab-{tag}"
        self.host_veth, self.board_veth = f"etv{tag}h"[:15], f"etv{tag}b"[:15]
        base = random.randrange(0, 1 << 15) * 4  # a /30 inside 198.18.0.0/15 (reserved for benchmarking)
        prefix = f"198.{18 + (base >> 16)}.{(base >> 8) & 255}."
        self.host_address, board_address = f"{prefix}{(base & 255) + 1}", f"{prefix}{(base & 255) + 2}"
        self._created = False
        super().__init__(lab, name, board_address, root, **board_overrides)
        self._create_namespace()

    def _ip(self, *args: str, inside: bool = False) -> subprocess.CompletedProcess[str]:
        argv = ["ip", "netns", "exec", self.namespace, "ip", *args] if inside else ["ip", *args]
        return subprocess.run(argv, capture_output=True, text=True)

    def _create_namespace(self) -> None:
        if shutil.which("ip") is None:
            raise LabSetupError("the `ip` command (iproute2) is missing: it is needed for the lost-link test")
        made = self._ip("netns", "add", self.namespace)
        if made.returncode != 0:
            raise LabSetupError(
                f"cannot create a network namespace (needs root with CAP_NET_ADMIN): {made.stderr.strip()}",
            )
        self._created = True
        steps = [
            (False, ["link", "add", self.host_veth, "type", "veth", "peer", "name", self.board_veth]),
            (False, ["link", "set", self.board_veth, "netns", self.namespace]),
            (False, ["addr", "add", f"{self.host_address}/30", "dev", self.host_veth]),
            (False, ["link", "set", self.host_veth, "up"]),
            (True, ["addr", "add", f"{self.address}/30", "dev", self.board_veth]),
            (True, ["link", "set", self.board_veth, "up"]),
            (True, ["link", "set", "lo", "up"]),
        ]
        for inside, args in steps:
            done = self._ip(*args, inside=inside)
            if done.returncode != 0:
                self.destroy()
                raise LabSetupError(f"network namespace setup failed at `ip {' '.join(args)}`: {done.stderr.strip()}")

    def _command(self) -> list[str]:
        return ["ip", "netns", "exec", self.namespace, *super()._command()]

    def start(self, *, new_port: bool = False) -> None:
        if not new_port and not self.port:
            self.port = 22  # the namespace is private: every port is free
        super().start(new_port=new_port)

    def blackhole(self) -> None:
        """Drop every packet from the board to the workstation, as a pulled cable would."""
        done = self._ip("route", "add", "blackhole", f"{self.host_address}/32", inside=True)
        if done.returncode != 0:
            raise RuntimeError(f"cannot add the blackhole route: {done.stderr.strip()}")

    def restore(self) -> None:
        self._ip("route", "del", "blackhole", f"{self.host_address}/32", inside=True)

    def destroy(self) -> None:
        self.stop()
        if self._created:
            self._ip("netns", "del", self.namespace)  # also removes the veth pair
            self._created = False


class SshdLab:
    """A set of fake boards sharing one client key and one known_hosts file.

    `network` picks the boards' loopback range, 127.<network>.x.y: labs that run at once (the test workers of
    pytest-xdist) take different ones, so a board restarted on its address and port never meets another lab's."""

    def __init__(self, root: Path, network: int = 0) -> None:
        require_sshd()
        if not 0 <= network <= 255:
            raise ValueError(f"network {network} is not an octet")
        self.network = network
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.client_key = self.root / "client_ed25519"
        keygen(self.client_key, "etlab test client")
        self.authorized_keys = self.root / "authorized_keys"
        self.authorized_keys.write_text(self.client_key.with_name(self.client_key.name + ".pub").read_text())
        self.known_hosts = self.root / "known_hosts"
        self.boards: list[SshdBoard] = []
        self._count = 0

    def _next_address(self) -> str:
        # Every board gets its own address, so a host key pinned for one never meets another.
        index = self._count
        self._count += 1
        return f"127.{self.network}.{index // 250}.{2 + index % 250}"

    def allocate(self, name: str | None, *, prefix: str = "board") -> tuple[str, str, Path]:
        """A new board's name (given or numbered), loopback address and folder."""
        number = self._count
        return (name if name is not None else f"{prefix}-{number}"), self._next_address(), self.root / f"board-{number}"

    def board(
        self,
        name: str | None = None,
        *,
        sshd_config: Sequence[str] = (),
        session_env: Mapping[str, str] | None = None,
        **board_overrides: Any,
    ) -> SshdBoard:
        """Start a new fake board. `sshd_config` adds server options (e.g. "RekeyLimit 1M"), `session_env` sets
        variables in its sessions (e.g. a PATH without openssl); `board_overrides` are Board fields."""
        name, address, root = self.allocate(name)
        fake = SshdBoard(self, name, address, root, sshd_config=sshd_config, session_env=session_env, **board_overrides)
        self.boards.append(fake)
        fake.start()
        return fake

    def netns_board(self, name: str = "netns-board", **board_overrides: Any) -> NetnsBoard:
        number = self._count
        self._count += 1
        fake = NetnsBoard(self, name, self.root / f"board-{number}", **board_overrides)
        self.boards.append(fake)
        try:
            fake.start()
        except BaseException:
            fake.destroy()
            raise
        return fake

    def discard(self, fake: SshdBoard) -> None:
        if isinstance(fake, NetnsBoard):
            fake.destroy()
        else:
            fake.stop()
        with contextlib.suppress(ValueError):
            self.boards.remove(fake)

    def close(self) -> None:
        for fake in list(self.boards):
            self.discard(fake)
