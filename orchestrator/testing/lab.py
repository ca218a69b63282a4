"""A lab of real processes on this machine: a scheduler and workers, each worker with its own state, artifacts and
results folders, as `fab lab-scheduler` and `fab worker` run them (for tests and bench/bench_lab.py)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml

from orchestrator.lab.cluster import lab_state, make_certificates
from orchestrator.lab.lab_settings import DEFAULT_WORKER_TTL_SECONDS, LabSettings
from orchestrator.paths import PROJECT_ROOT
from orchestrator.testing.sshd import free_port


class LocalLab:
    """`root/certs`, `root/store`, `root/<worker>/{state,artifacts,results}`, logs in `root/*.log`."""

    def __init__(self, root: Path, *, wait_seconds: float = 600.0, worker_ttl_seconds: float | None = None) -> None:
        self.root = root
        root.mkdir(parents=True, exist_ok=True)
        self.certificates = root / "certs"
        make_certificates(self.certificates)
        self.store = root / "store"
        self.settings = LabSettings(
            scheduler=f"tls://127.0.0.1:{free_port('127.0.0.1')}",
            store=str(self.store),
            certificates=self.certificates,
            wait_seconds=wait_seconds,
            worker_ttl_seconds=worker_ttl_seconds or DEFAULT_WORKER_TTL_SECONDS,
        )
        self.processes: dict[str, subprocess.Popen[bytes]] = {}

    def section(self) -> dict[str, Any]:
        """The inventory's `lab:` section for this lab."""
        return {
            "scheduler": self.settings.scheduler,
            "certificates": str(self.certificates),
            "store": str(self.store),
            "wait_seconds": self.settings.wait_seconds,
            "worker_ttl_seconds": self.settings.worker_ttl_seconds,
        }

    def with_lab(self, inventory: Path) -> Path:
        """Add this lab's section to an inventory file."""
        document = yaml.safe_load(inventory.read_text())
        document["lab"] = self.section()
        inventory.write_text(yaml.safe_dump(document, sort_keys=False))
        return inventory

    def env(self, name: str, **extra: str) -> dict[str, str]:
        home = self.root / name
        return {
            **os.environ,
            "ETLAB_STATE": str(home / "state"),
            "ETLAB_ARTIFACTS": str(home / "artifacts"),
            "ETLAB_RESULTS": str(home / "results"),
            **extra,
        }

    def _start(self, name: str, argv: list[str], env: dict[str, str]) -> subprocess.Popen[bytes]:
        log = open(self.root / f"{name}.log", "ab")  # noqa: SIM115 - the process writes it until it ends
        process = subprocess.Popen(
            [sys.executable, "-m", "fabric", *argv], cwd=PROJECT_ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
        log.close()
        self.processes[name] = process
        return process

    def start_scheduler(self, inventory: Path) -> None:
        self._start("scheduler", ["lab-scheduler", "--inventory", str(inventory)], self.env("scheduler"))

    def stop_scheduler(self, how: signal.Signals = signal.SIGTERM) -> int:
        """Stop the scheduler (SIGTERM: as a service manager does; SIGKILL: as a crash); its exit status."""
        process = self.processes["scheduler"]
        os.killpg(process.pid, how)
        return process.wait(timeout=60)

    def freeze(self, name: str) -> None:
        """SIGSTOP the process: a host that hangs (a suspended VM, a cut network) and says nothing."""
        os.killpg(self.processes[name].pid, signal.SIGSTOP)

    def thaw(self, name: str) -> None:
        os.killpg(self.processes[name].pid, signal.SIGCONT)

    def start_worker(
        self,
        name: str,
        inventory: Path,
        *,
        lowering: bool = True,
        artifacts: Path | None = None,
        boards: str | None = None,
        key: str | None = None,
    ) -> subprocess.Popen[bytes]:
        """`fab worker --name NAME`; `key` names its process and log when the name is not a file name."""
        extra = {"ETLAB_ARTIFACTS": str(artifacts)} if artifacts is not None else {}
        argv = ["worker", "--inventory", str(inventory), "--name", name] + ([] if lowering else ["--no-lowering"])
        argv += ["--boards", boards] if boards is not None else []
        return self._start(key or name, argv, self.env(key or name, **extra))

    def wait_workers(self, names: set[str], timeout: float = 300.0) -> None:
        """Until every named worker is in the lab (the scheduler up and each worker joined)."""
        deadline = time.monotonic() + timeout
        seen: set[str] = set()
        while time.monotonic() < deadline:
            for name, process in self.processes.items():
                if process.poll() is not None:
                    raise RuntimeError(f"{name} ended ({process.returncode}): {self.log(name)[-2000:]}")
            try:
                seen = {worker.name for worker in lab_state(self.settings).workers}
            except Exception:  # the scheduler is not up yet
                seen = set()
            if names <= seen:
                return
            time.sleep(0.5)
        raise TimeoutError(f"workers {sorted(names - seen)} did not join in {timeout:g} s")

    def log(self, name: str) -> str:
        path = self.root / f"{name}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def kill(self, name: str) -> None:
        """SIGKILL, as a host that dies: no goodbye to the scheduler."""
        process = self.processes[name]
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()

    def close(self) -> None:
        for process in self.processes.values():
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGCONT)  # a frozen one too
                os.killpg(process.pid, signal.SIGTERM)
        for process in self.processes.values():
            try:
                process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
