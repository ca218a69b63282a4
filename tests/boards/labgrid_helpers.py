"""Helpers shared by the labgrid tests (test_labgrid.py, test_labgrid_failures.py): the places and their inventory,
the Lab the tests drive, and `fab` run against it in the foreground or the background."""

from __future__ import annotations

import getpass
import os
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from orchestrator.paths import PROJECT_ROOT
from orchestrator.testing.labgrid import LabgridLab
from orchestrator.testing.sshd import SshdBoard, SshdLab
from tests.plugins.artifacts import ARTIFACT_CACHE

PLACES = ["lg-a", "lg-b"]
SILENT = "lg-silent"  # a place whose board never answers SSH: a job there stays busy for its connect_timeout
ALICE = "alice"


def our_client() -> str:
    """The name etlab has on the coordinator, as labgrid forms it (`host/user`)."""
    host = os.environ.get("LG_HOSTNAME", socket.gethostname())
    return f"{host}/{os.environ.get('LG_USERNAME', getpass.getuser())}"


@dataclass
class Lab:
    labgrid: LabgridLab
    fakes: dict[str, SshdBoard]
    inventory: Path
    folder: Path

    def alice(self, command: str, place: str) -> None:
        self.labgrid.client(command, place=place, user=ALICE)


def write_inventory(path: Path, sshd: SshdLab, coordinator: str, *, nightly: dict[str, Any] | None = None) -> Path:
    document: dict[str, Any] = {
        "defaults": {
            "key": str(sshd.client_key),
            "known_hosts": str(sshd.known_hosts),
            "connect_timeout": 5,
            "keepalive": 2,
            "tcp_user_timeout": 10,
            "labgrid": {"coordinator": coordinator},
        },
        "boards": {
            **{place: {"labgrid": {"place": place}} for place in PLACES},
            "pis": {"labgrid": {"tags": {"board": "pi5"}}},
            SILENT: {"labgrid": {"place": SILENT}, "connect_timeout": 12},
        },
    }
    if nightly:
        document["nightly"] = nightly
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    return path


def fab_argv(*args: str, lab: Lab) -> list[str]:
    return [sys.executable, "-m", "fabric", *args, "--inventory", str(lab.inventory)]


def fab_env(results: Path) -> dict[str, str]:
    # Wide enough that the boards table never cuts a cell the tests read.
    return {**os.environ, "ETLAB_ARTIFACTS": str(ARTIFACT_CACHE), "ETLAB_RESULTS": str(results), "ETLAB_WIDTH": "400"}


def fab(*args: str, lab: Lab, results: Path, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        fab_argv(*args, lab=lab), cwd=PROJECT_ROOT, env=fab_env(results), capture_output=True, text=True,
        timeout=timeout,
    )  # fmt: skip


def fab_background(*args: str, lab: Lab, results: Path, log: Path) -> subprocess.Popen[bytes]:
    """A `fab` task in the background, its output (stdout and stderr) going to `log`."""
    with open(log, "wb") as out:
        return subprocess.Popen(
            fab_argv(*args, lab=lab), cwd=PROJECT_ROOT, env=fab_env(results), stdout=out, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip


def wait_for(condition: Any, what: str, timeout: float = 120) -> None:
    """Poll `condition()` until true; fail naming `what` (a bound on a hang, never a timing assertion)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def output(log: Path) -> str:
    return log.read_text(errors="replace")


def pushed_models(fake: SshdBoard) -> list[Path]:
    models = fake.workdir_path / "models"
    return sorted(models.glob("*.pte")) if models.exists() else []


def no_reservation_of_ours(lab: Lab) -> bool:
    return our_client() not in lab.labgrid.reservation_owners()


def run_to_end(process: subprocess.Popen[bytes], timeout: float = 300) -> int:
    return process.wait(timeout=timeout)
