"""A night shared by several hosts, for real: a TLS scheduler, two `fab worker` processes with their own state and
artifacts folders, three sshd boards on 127.0.0.x, one PostgreSQL history; a worker killed (-9) mid-night."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy

from orchestrator.lab.history import History
from orchestrator.lab.run_record import RunRecord
from orchestrator.lowering.artifacts import ArtifactPaths
from orchestrator.lowering.variants import Variant
from orchestrator.paths import PROJECT_ROOT
from orchestrator.testing.lab import LocalLab
from orchestrator.testing.postgres import fresh_database
from orchestrator.testing.sshd import SshdBoard
from tests.plugins.artifacts import ARTIFACT_CACHE
from tests.plugins.boards import provision_board, write_inventory

NIGHT = "2026-12-01"


def fab(*argv: str, env: dict[str, str] | None = None, timeout: float = 900) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "fabric", *argv], cwd=PROJECT_ROOT, env=env or dict(os.environ),
        capture_output=True, text=True, timeout=timeout,
    )  # fmt: skip


def records(url: str, night: str = NIGHT) -> list[RunRecord]:
    history = History(url)
    try:
        return history.runs(night=night)
    finally:
        history.close()


@pytest.fixture
def lab(tmp_path: Path) -> Iterator[LocalLab]:
    started = LocalLab(tmp_path / "lab", wait_seconds=8)
    try:
        yield started
    finally:
        started.close()


def test_a_night_on_two_workers_survives_one_killed(
    lab: LocalLab,
    sshd_boards: Callable[..., list[SshdBoard]],
    postgres_url: str,
    tiny_artifacts: dict[str, Any],
    tmp_path: Path,
) -> None:
    fakes = sshd_boards(3, names=["lab-b1", "lab-b2", "lab-b3"])
    boards = [fake.board for fake in fakes]
    for board in boards:
        provision_board(board)
    url = fresh_database(postgres_url)
    nowhere = boards[0].replace(name="lab-nowhere", port=1)  # in the matrix, offered by no worker
    matrix = [{"models": ["distilbert-tiny", "gpt2-tiny"], "backends": ["xnnpack", "portable"],
               "boards": [b.name for b in boards]},
              {"models": ["distilbert-tiny"], "backends": ["xnnpack"], "boards": ["lab-nowhere"]}]  # fmt: skip
    nightly = {"history": url, "reports": str(tmp_path / "reports"), "iterations": 40, "warmup": 2,
               "retest_seconds": 10, "retest_rounds": 6, "cooldown_seconds": 1, "matrix": matrix}  # fmt: skip
    workstation = lab.with_lab(write_inventory(tmp_path / "inventory.yaml", [*boards, nowhere], nightly=nightly))
    # Each worker has its own inventory: it reaches every board (so either can take a board's cells).
    for name in ("wa", "wb"):
        lab.with_lab(write_inventory(tmp_path / f"{name}.yaml", boards))
    lab.start_scheduler(workstation)
    # wa lowers (from the tests' artifact cache: nothing to do but publish); wb has an empty artifacts folder and
    # takes no lowering: every program it runs comes from the lab's store, verified.
    lab.start_worker("wa", tmp_path / "wa.yaml", artifacts=ARTIFACT_CACHE)
    lab.start_worker("wb", tmp_path / "wb.yaml", lowering=False)
    lab.wait_workers({"wa", "wb"})

    shown = fab("lab", "--inventory", str(workstation))
    assert shown.returncode == 0, shown.stdout + shown.stderr
    for word in ("wa", "wb", "lab-b1", "lab-b3", "2 worker(s)", "queue: empty"):
        assert word in shown.stdout, shown.stdout

    env = {**os.environ, "ETLAB_RESULTS": str(tmp_path / "results"), "ETLAB_STATE": str(tmp_path / "ws-state")}
    night = subprocess.Popen(
        [sys.executable, "-m", "fabric", "nightly", "--inventory", str(workstation), "--night", NIGHT],
        cwd=PROJECT_ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        # Kill the first worker that records a cell, at once: it holds the rest of that board's cells.
        deadline = time.monotonic() + 600
        killed_with: list[RunRecord] = []
        while time.monotonic() < deadline and night.poll() is None:
            killed_with = [r for r in _quietly(records, url) if r.host in ("wa", "wb")]
            if killed_with:
                lab.kill(killed_with[0].host or "?")
                break
            time.sleep(0.1)
        if not killed_with:
            output = (
                night.communicate(timeout=600)[0]
                if night.poll() is None
                else (night.stdout.read() if night.stdout else "")
            )
            pytest.fail(f"no worker recorded a cell:\n{output}\n{lab.log('wa')[-3000:]}\n{lab.log('wb')[-3000:]}")
        victim = killed_with[0].host
        survivor = "wb" if victim == "wa" else "wa"
        output, _ = night.communicate(timeout=900)
    finally:
        if night.poll() is None:
            night.kill()
    assert night.returncode == 2, output  # lab-nowhere: no worker reaches it, an infrastructure failure

    stored = records(url)
    counts = Counter(record.cell for record in stored)
    planned = {
        (b.name, m, v) for b in boards for m in ("distilbert-tiny", "gpt2-tiny") for v in ("xnnpack", "portable")
    }
    assert set(counts) == planned | {("lab-nowhere", "distilbert-tiny", "xnnpack")}, counts
    assert all(n == 1 for n in counts.values()), f"a cell recorded twice: {counts}"
    ok = {r.cell: r for r in stored if r.board != "lab-nowhere"}
    assert all(r.status == "ok" and r.median_ms for r in ok.values()), [(r.cell, r.status, r.error) for r in stored]
    assert {r.host for r in ok.values()} <= {"wa", "wb"}
    killed_board = killed_with[0].board
    assert any(r.host == survivor and r.board == killed_board for r in ok.values()), (
        "the killed worker's board was finished by the other worker",
        [(r.cell, r.host) for r in stored],
    )
    nowhere_record = next(r for r in stored if r.board == "lab-nowhere")
    assert nowhere_record.status == "infra" and "no worker" in (nowhere_record.error or ""), nowhere_record
    assert "lab-nowhere" in output

    # wb lowered nothing: its programs came from the store, byte for byte what wa published.
    for model in ("distilbert-tiny", "gpt2-tiny"):
        for variant in ("xnnpack", "portable"):
            fetched = ArtifactPaths.for_model(model, lab.root / "wb" / "artifacts").pte(Variant.parse(variant))
            source = ArtifactPaths.for_model(model, ARTIFACT_CACHE).pte(Variant.parse(variant))
            if any(r.host == "wb" and r.model == model and r.backend == variant for r in ok.values()):
                assert fetched.read_bytes() == source.read_bytes()
    assert "lowered xnnpack" not in output and "lowered portable" not in output, output

    # The night's report covers every cell, with the verdicts one host would give (a first night: no baseline).
    page = (tmp_path / "reports" / f"nightly-{NIGHT}.html").read_text()
    for board in boards:
        assert board.name in page


def _quietly(read: Callable[[str], list[RunRecord]], url: str) -> list[RunRecord]:
    try:
        return read(url)
    except sqlalchemy.exc.SQLAlchemyError:  # the schema is being created by the first writer
        return []
