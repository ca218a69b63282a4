"""A lab's engine is no open door: its settings are checked, its scheduler wants the lab's certificate, and nothing a
worker returns runs code on the workstation."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from orchestrator.lab import cluster
from orchestrator.lab.lab_settings import LabSettings
from orchestrator.paths import PROJECT_ROOT
from orchestrator.testing.lab import LocalLab
from orchestrator.testing.sshd import free_port


def fab(*argv: str, cwd: Path = PROJECT_ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "fabric", *argv], cwd=cwd, capture_output=True, text=True,
                          timeout=300, env=dict(os.environ))  # fmt: skip


def inventory(tmp_path: Path, lab: dict[str, Any], nightly: dict[str, Any] | None = None) -> Path:
    document: dict[str, Any] = {"boards": {"local": {"transport": "local", "workdir": str(tmp_path / "wd")}}}
    document["lab"] = lab
    if nightly is not None:
        document["nightly"] = nightly
    path = tmp_path / "inventory.yaml"
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    return path


@pytest.mark.parametrize(
    ("lab", "says"),
    [
        (
            {"scheduler": "tcp://0.0.0.0:8786", "store": "s"},
            "'tcp://0.0.0.0:8786' would be an open port",
        ),
        ({"scheduler": "tcp://10.1.2.3:8786", "store": "s"}, "would be an open port without TLS"),
        ({"scheduler": "http://host:1", "store": "s"}, "lab.scheduler: expected tls://HOST:PORT"),
        ({"scheduler": "tls://host", "store": "s"}, "has no port"),
        ({"scheduler": "tls://host:8786", "store": "s"}, "lab.certificates: is required for a tls:// scheduler"),
        ({"scheduler": "tls://host:8786", "certificates": "c"}, "lab.store: is required"),
        ({"store": "s"}, "lab.scheduler: is required"),
        ({"scheduler": "tcp://127.0.0.1:1", "store": "s", "wait_secnds": 3}, "did you mean 'wait_seconds'"),
    ],
)
def test_a_bad_lab_section_names_its_line_and_field(tmp_path: Path, lab: dict[str, Any], says: str) -> None:
    done = fab("lab", "--inventory", str(inventory(tmp_path, lab)))
    assert done.returncode == 64, done.stdout + done.stderr
    assert says in done.stderr, done.stderr
    assert "inventory.yaml" in done.stderr and "Traceback" not in done.stderr


def test_a_lab_night_needs_a_history_server(tmp_path: Path) -> None:
    nightly = {"history": f"sqlite:///{tmp_path / 'h.sqlite'}",
               "matrix": [{"models": ["distilbert-tiny"], "backends": ["xnnpack"], "boards": ["local"]}]}  # fmt: skip
    path = inventory(tmp_path, {"scheduler": "tcp://127.0.0.1:1", "store": "s"}, nightly)
    done = fab("nightly", "--inventory", str(path), "--night", "2026-12-01")
    assert done.returncode == 64, done.stdout + done.stderr
    assert "its history must be a server every host reaches" in done.stderr, done.stderr
    assert not (tmp_path / "h.sqlite").exists()


def test_the_scheduler_refuses_a_stranger(tmp_path: Path) -> None:
    """Without the lab's certificate (plain TCP, or another lab's certificate) nobody joins or submits."""
    lab = LocalLab(tmp_path / "lab")
    try:
        lab.start_scheduler(inventory(tmp_path, lab.section()))
        lab.wait_workers(set())
        stranger_certs = tmp_path / "other-lab"
        cluster.make_certificates(stranger_certs)
        other = LabSettings(lab.settings.scheduler, lab.settings.store, stranger_certs)
        with pytest.raises(cluster.LabUnreachable):
            cluster.connect(other, timeout=5).close()
        plain = LabSettings(lab.settings.scheduler.replace("tls://", "tcp://"), lab.settings.store)
        with pytest.raises(cluster.LabUnreachable):
            cluster.connect(plain, timeout=5).close()
        cluster.connect(lab.settings, timeout=20).close()  # the lab's own certificate: in
    finally:
        lab.close()


class _Payload:
    """What a hostile worker could return: unpickling it would create a file."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (Path(self.marker).touch, ())


def _hostile(marker: str) -> _Payload:
    return _Payload(marker)


def test_nothing_a_worker_returns_runs_code_on_the_workstation(tmp_path: Path) -> None:
    from distributed import LocalCluster

    port = free_port("127.0.0.1")
    with LocalCluster(
        n_workers=1, processes=False, protocol="tcp", host="127.0.0.1", scheduler_port=port, dashboard_address=None
    ):
        settings = LabSettings(f"tcp://127.0.0.1:{port}", str(tmp_path / "store"))
        client = cluster.connect(settings)
        try:
            marker = tmp_path / "ran"
            with pytest.raises(Exception):  # noqa: B017 - any refusal will do, as long as nothing ran
                client.submit(_hostile, str(marker), pure=False).result(timeout=30)
            assert not marker.exists(), "a worker's pickled reply ran code on the workstation"
            assert client.submit(lambda: {"cells": [1, 2]}, pure=False).result(timeout=30) == {"cells": [1, 2]}
        finally:
            client.close()


def test_lab_certs_wants_an_empty_folder(tmp_path: Path) -> None:
    (tmp_path / "a-file").write_text("x")
    for target in (tmp_path / "a-file", tmp_path):  # a file, a folder that holds something
        done = fab("lab-certs", str(target))
        assert done.returncode == 64 and "is not an empty folder" in done.stderr, done.stdout + done.stderr
    made = fab("lab-certs", str(tmp_path / "certs"))
    assert made.returncode == 0, made.stderr
    assert (tmp_path / "certs" / "lab-key.pem").stat().st_mode & 0o077 == 0, "the lab's key is private"
