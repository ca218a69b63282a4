"""A real labgrid lab on 127.0.0.1, for tests and benchmarks: a coordinator, exporters publishing `NetworkService`
resources for fake sshd boards (orchestrator/testing/sshd.py), and places made with `labgrid-client`.

As in labgrid's own test suite, the coordinator and exporters are the installed `labgrid-coordinator` and
`labgrid-exporter` programs; the coordinator keeps its places file in the lab's own folder. Setup problems raise
LabSetupError: CI installs labgrid (pyproject's test extras), so a missing piece is a bug to see, never a skip.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import yaml

from orchestrator.testing.sshd import LabSetupError, SshdBoard, free_port

_BIN = Path(sys.executable).parent
_START_TIMEOUT = 30.0


def _program(name: str) -> str:
    found = _BIN / name
    if not found.exists():
        raise LabSetupError(f"{found} is missing: install the test extras (pip install -e '.[test]')")
    return str(found)


class LabgridLab:
    """A coordinator on 127.0.0.1:<free port> and the exporters started with publish()."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.port = free_port("127.0.0.1")
        self.address = f"127.0.0.1:{self.port}"
        self.coordinator: subprocess.Popen[bytes] | None = None
        self.exporters: dict[str, subprocess.Popen[bytes]] = {}
        self._count = 0
        self.start()

    # ------------------------------------------------------------ processes

    def _spawn(self, argv: list[str], log: Path) -> subprocess.Popen[bytes]:
        with open(log, "ab") as out:
            return subprocess.Popen(
                argv, cwd=self.root, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True, env={**os.environ, "PYTHONUNBUFFERED": "1"},
            )  # fmt: skip

    def start(self) -> None:
        """Start (or restart) the coordinator; it reloads its places from the lab's folder, locks forgotten."""
        argv = [_program("labgrid-coordinator"), "-l", self.address]
        self.coordinator = self._spawn(argv, self.root / "coordinator.log")
        deadline = time.monotonic() + _START_TIMEOUT
        while time.monotonic() < deadline:
            if self.coordinator.poll() is not None:
                raise LabSetupError(f"labgrid-coordinator exited: {self.log('coordinator')[-2000:]}")
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", self.port), timeout=1):
                return
            time.sleep(0.1)
        raise LabSetupError(f"labgrid-coordinator did not listen on {self.address}")

    def kill_coordinator(self) -> None:
        """The coordinator goes away at once (SIGKILL), as a crashed or rebooted lab server does."""
        if self.coordinator is not None and self.coordinator.poll() is None:
            self.coordinator.send_signal(signal.SIGKILL)
            self.coordinator.wait()

    def log(self, name: str) -> str:
        path = self.root / f"{name}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def publish(self, services: Mapping[str, tuple[str, int]], *, exporter: str | None = None) -> str:
        """Start an exporter publishing one NetworkService (user root) per group name -> (address, port); returns
        the exporter's name once the coordinator lists the resources."""
        self._count += 1
        name = exporter or f"etlab-exporter-{self._count}"
        groups = {
            group: {"NetworkService": {"address": address, "username": "root", "port": port}}
            for group, (address, port) in services.items()
        }
        config = self.root / f"{name}.yaml"
        config.write_text(yaml.safe_dump(groups))
        argv = [_program("labgrid-exporter"), "-c", self.address, "-n", name, "--hostname", "127.0.0.1", str(config)]
        self.exporters[name] = self._spawn(argv, self.root / f"{name}.log")
        deadline = time.monotonic() + _START_TIMEOUT
        wanted = {f"{name}/{group}/NetworkService" for group in groups}
        while time.monotonic() < deadline:
            if self.exporters[name].poll() is not None:
                raise LabSetupError(f"labgrid-exporter {name} exited: {self.log(name)[-2000:]}")
            listed = set(self.client("resources").stdout.split())
            if wanted <= listed:
                return name
            time.sleep(0.2)
        raise LabSetupError(f"labgrid-exporter {name} did not publish {sorted(wanted)}")

    def publish_boards(self, boards: Iterable[SshdBoard], *, exporter: str | None = None) -> str:
        """publish() the fake boards, one group per board name."""
        return self.publish({fake.name: (fake.address, fake.port) for fake in boards}, exporter=exporter)

    def close(self) -> None:
        for process in [*self.exporters.values(), self.coordinator]:
            if process is not None and process.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
                process.wait()
        self.exporters.clear()

    # ------------------------------------------------------------ labgrid-client

    def env(self, user: str | None = None) -> dict[str, str]:
        """labgrid-client's environment for this lab; `user` acts as another person (LG_USERNAME)."""
        env = {**os.environ, "LG_COORDINATOR": self.address}
        if user is not None:
            env["LG_USERNAME"] = user
        return env

    def client(
        self, *args: str, place: str | None = None, user: str | None = None, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        """Run `labgrid-client [-p PLACE] ARGS...` against this lab."""
        argv = [_program("labgrid-client"), *(["-p", place] if place else []), *args]
        done = subprocess.run(argv, env=self.env(user), capture_output=True, text=True, timeout=60)
        if check and done.returncode != 0:
            raise LabSetupError(f"labgrid-client {' '.join(args)} failed: {done.stdout}{done.stderr}")
        return done

    def add_place(self, place: str, exporter: str, group: str, *, tags: Mapping[str, str] | None = None) -> None:
        """Create a place matching the exporter's NetworkService of `group`, with tags."""
        self.client("create", place=place)
        self.client("add-match", f"{exporter}/{group}/NetworkService", place=place)
        if tags:
            self.client("set-tags", *(f"{k}={v}" for k, v in tags.items()), place=place)

    def add_places(self, exporter: str, places: Mapping[str, Mapping[str, str]]) -> None:
        """add_place() for each place -> tags (the group named like the place), the places side by side."""
        with ThreadPoolExecutor(max_workers=len(places) or 1) as pool:
            for done in [pool.submit(self.add_place, name, exporter, name, tags=tags) for name, tags in places.items()]:
                done.result()

    # ------------------------------------------------------------ looking, with labgrid's own gRPC API

    def _ask(self, method: str, request: str) -> Any:
        """One unary request to the coordinator (a fresh channel each time: nothing lingers across forks)."""
        import grpc
        from labgrid.remote.generated import labgrid_coordinator_pb2, labgrid_coordinator_pb2_grpc

        with grpc.insecure_channel(self.address) as channel:
            stub = labgrid_coordinator_pb2_grpc.CoordinatorStub(channel)
            return getattr(stub, method)(getattr(labgrid_coordinator_pb2, request)(), timeout=30)

    def holder(self, place: str) -> str | None:
        """Who holds the place's lock (`host/user`), or None."""
        for found in self._ask("GetPlaces", "GetPlacesRequest").places:
            if found.name == place:
                return found.acquired or None  # the coordinator sends "" for a free place
        raise LabSetupError(f"no place {place!r} on {self.address}")

    def reservation_owners(self) -> list[str]:
        """The owner (`host/user`) of every reservation the coordinator has, waiting or not."""
        return [r.owner for r in self._ask("GetReservations", "GetReservationsRequest").reservations]


class SilentPort:
    """A TCP port that accepts connections (the kernel's backlog) and never says a word: an SSH connect to it
    hangs for the board's connect_timeout. Tests use it to keep a job busy while its place is held."""

    def __init__(self, address: str = "127.0.0.1") -> None:
        self.socket = socket.socket()
        self.socket.bind((address, 0))
        self.socket.listen(64)
        self.address, self.port = self.socket.getsockname()

    def close(self) -> None:
        self.socket.close()
