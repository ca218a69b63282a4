"""The lab survives its own infrastructure, with real processes: a TLS scheduler and two `fab worker`s (one lab for
the module). Workers come back after the scheduler restarts and after their host froze; a worker with another lab's
certificate says why and stops; Dask's own HTTP endpoints serve nothing and every port binds the lab's interface."""

from __future__ import annotations

import http.client
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
import yaml

from orchestrator.lab import cluster
from orchestrator.lab.cluster import lab_state
from orchestrator.paths import PROJECT_ROOT
from orchestrator.testing.lab import LocalLab

# Names `fab worker --name` takes that rich would read as markup (`[@...]` is an event tag): shown as they are.
MARKUP_NAME, BRACKET_NAME = "[@x=(", "]"
TTL_SECONDS = 6.0


def fab(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "fabric", *argv], cwd=PROJECT_ROOT, capture_output=True, text=True,
                          timeout=300, env=dict(os.environ))  # fmt: skip


class Lab:
    def __init__(self, local: LocalLab, inventory: Path) -> None:
        self.local, self.inventory = local, inventory

    def workers(self) -> dict[str, str]:
        return {worker.name: worker.address for worker in lab_state(self.local.settings).workers}

    def refused(self, name: str, inventory: Path, key: str) -> tuple[int, str]:
        """A `fab worker` the lab should refuse: its exit status (it must end by itself) and what it said."""
        worker = self.local.start_worker(name, inventory, lowering=False, key=key)
        try:
            code = worker.wait(timeout=120)
        finally:
            if worker.poll() is None:
                worker.kill()
            self.local.processes.pop(key)
        return code, self.local.log(key)

    def wait_until(self, check: object, timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if callable(check) and check():
                return
            time.sleep(0.25)
        raise AssertionError(f"{what} within {timeout:g} s\n{self.local.log('w1')[-3000:]}")


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    root = tmp_path_factory.mktemp("resilient-lab")
    local = LocalLab(root / "lab", worker_ttl_seconds=TTL_SECONDS)
    try:
        inventory = root / "inventory.yaml"
        inventory.write_text(yaml.safe_dump({"boards": {"local": {"transport": "local", "workdir": str(root)}}}))
        local.with_lab(inventory)
        local.start_scheduler(inventory)
        local.start_worker("w1", inventory, lowering=False)
        local.start_worker(MARKUP_NAME, inventory, lowering=False, key="w2")
        local.start_worker(BRACKET_NAME, inventory, lowering=False, key="w3")
        local.wait_workers({"w1", MARKUP_NAME, BRACKET_NAME})
        yield Lab(local, inventory)
    finally:
        local.close()


def _listening(pid: int) -> list[tuple[str, int]]:
    return [(c.laddr.ip, c.laddr.port) for c in psutil.Process(pid).net_connections("inet") if c.status == "LISTEN"]


def test_dasks_own_endpoints_serve_nothing_and_every_port_binds_the_labs_interface(lab: Lab) -> None:
    """The scheduler's HTTP port would answer /json/identity.json (names, resources, folders) and info pages with a
    "close worker" form to any Host header; workers of a loopback lab listened on 0.0.0.0 and [::]."""
    lab_port = int(lab.local.settings.scheduler.rsplit(":", 1)[1])
    answered = {}
    for name in ("scheduler", "w1"):
        ports = _listening(lab.local.processes[name].pid)
        assert ports, name
        assert {host for host, _ in ports} == {"127.0.0.1"}, f"{name} listens beyond the lab's interface: {ports}"
        for _, port in ports:
            if port == lab_port or any(port == int(a.rsplit(":", 1)[1]) for a in lab.workers().values()):
                continue  # the lab's TLS ports
            for path in ("/json/identity.json", "/info/main/workers.html", "/health", "/metrics", "/"):
                for host in ("rebound.example", f"127.0.0.1:{port}"):
                    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
                    connection.request("GET", path, headers={"Host": host})
                    reply = connection.getresponse()
                    body = reply.read()
                    connection.close()
                    answered[(name, path, host)] = reply.status
                    assert reply.status == 404, (name, path, host, reply.status, body[:300])
                    assert b"w1" not in body and b"resources" not in body
    assert answered, "no HTTP endpoint was found to check"


def test_fab_lab_shows_worker_names_as_they_are(lab: Lab) -> None:
    shown = fab("lab", "--inventory", str(lab.inventory))
    assert shown.returncode == 0, shown.stdout + shown.stderr
    names = {line.split("│")[1].strip() for line in shown.stdout.splitlines() if line.count("│") > 3}
    assert {"w1", MARKUP_NAME, BRACKET_NAME} <= names, shown.stdout


def test_a_worker_name_with_a_control_character_is_refused(lab: Lab) -> None:
    for name in ("two\nlines", "bell\x07", "rtl\u202eoverride"):
        done = fab("worker", "--inventory", str(lab.inventory), "--name", name)
        assert done.returncode == 64, done.stdout + done.stderr
        assert "control character" in done.stderr and "Traceback" not in done.stderr, done.stderr


def test_a_worker_with_another_labs_certificate_says_why_and_stops(lab: Lab, tmp_path: Path) -> None:
    """A second `fab lab-certs` (or a stale copy): today's worker retried 8-9 times a second, forever, silently."""
    stranger = tmp_path / "other-lab"
    cluster.make_certificates(stranger)
    document = yaml.safe_load(lab.inventory.read_text())
    document["lab"]["certificates"] = str(stranger)
    inventory = tmp_path / "stranger.yaml"
    inventory.write_text(yaml.safe_dump(document))
    before = lab.local.log("scheduler").count("\n")
    code, said = lab.refused("stranger", inventory, "stranger")
    assert code == 69, said
    assert "TLS certificate does not match" in said and "are this host's certificates the lab's?" in said, said
    assert "Traceback" not in said
    tried = lab.local.log("scheduler").splitlines()[before:]
    assert len([line for line in tried if "handshake" in line.lower() or "ssl" in line.lower()]) <= 3, tried
    assert "stranger" not in lab.workers()


def test_workers_join_again_after_the_scheduler_restarts(lab: Lab) -> None:
    """SIGTERM to the scheduler, as a service manager's restart: today's workers left for good ("scheduler-connection-
    broken", exit 0)."""
    lab.local.stop_scheduler()
    time.sleep(3)  # the workers notice and wait for it
    for key in ("w1", "w2", "w3"):
        assert lab.local.processes[key].poll() is None, f"{key} left the lab: {lab.local.log(key)[-2000:]}"
    lab.local.start_scheduler(lab.inventory)
    lab.local.wait_workers({"w1", MARKUP_NAME, BRACKET_NAME}, timeout=120)
    assert "joining the lab again" in lab.local.log("w1")


def test_a_frozen_worker_joins_again_when_it_comes_back(lab: Lab) -> None:
    """A host frozen past the worker TTL (a suspended VM): the scheduler gives it up, its work goes elsewhere; when it
    wakes, today's worker heard "Scheduler was unaware of this worker" and exited 0."""
    lab.local.wait_workers({"w1"}, timeout=120)
    # The TTL is checked every quarter of it (at most every 5 s), not every TTL as Dask does: a silent host is given
    # up after the TTL plus at most that, as docs/DESIGN.md says.
    client = cluster.connect(lab.local.settings)
    try:
        every = client.run_on_scheduler(
            lambda dask_scheduler: dask_scheduler.periodic_callbacks["etlab-worker-ttl"].callback_time
        )
    finally:
        client.close()
    assert every == TTL_SECONDS / 4 * 1000, every
    lab.local.freeze("w1")
    try:
        lab.wait_until(lambda: "w1" not in lab.workers(), 90, "the frozen worker was not given up")
    finally:
        lab.local.thaw("w1")
    lab.local.wait_workers({"w1"}, timeout=120)
    assert lab.local.processes["w1"].poll() is None
    assert "given this worker up" in lab.local.log("w1"), lab.local.log("w1")[-3000:]


def test_a_second_worker_with_a_taken_name_says_so_and_stops(lab: Lab) -> None:
    lab.local.wait_workers({"w1"}, timeout=120)
    code, said = lab.refused("w1", lab.inventory, "twin")
    assert code == 69, said
    assert "another worker of the lab is named 'w1'" in said and "another --name" in said, said
    assert "Traceback" not in said
    assert lab.local.processes["w1"].poll() is None, "the first w1 stays in the lab"
