"""Boards that check their own health (issue 55): the health job's checks on hostile answers, the service state
across health jobs, and a lab where a board fails its health job twice in a row (its verification program corrupted
on the board, then its disk full), goes out of service, is skipped by the next night as an infrastructure failure,
and comes back with `fab return-to-service` after a health job that passes."""

from __future__ import annotations

import contextlib
import datetime as dt
import hashlib
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from orchestrator.boards.inventory import Board
from orchestrator.deploy.health import CHECKS, HealthCheck, HealthReport, judge
from orchestrator.deploy.payload import verification_files
from orchestrator.lab import service
from orchestrator.lab.history import History
from orchestrator.paths import PROJECT_ROOT
from tests.lab.test_nightly import fab_nightly, nightly_section, stored
from tests.plugins.boards import SHARED_BUILD, provision_board, write_inventory

REACHABLE = HealthCheck("reachable", True, "test")
NUMERICS_OK: dict[str, Any] = {
    "schema": 1, "outputs": 1,
    "tensors": [{"index": 0, "dtype": "float32", "dims": [1, 8], "numel": 8, "nan": 0, "inf": 0, "zeros": 0,
                 "min": 0.0, "max": 3.0, "sum_squares": 20.0, "qparams": None, "kept": None,
                 "reference": {"min": 0.0, "max": 3.0, "sum_squares": 20.0, "nan": 0, "inf": 0, "noise": 1e-12,
                               "dot": 20.0, "max_abs_error": 1e-6, "pairs": 8}}],
}  # fmt: skip
HEALTHY: dict[str, Any] = {
    "disk_free_mb": 20_000, "memory_available_mb": 4000, "throttled": {"value": 0x50000}, "governors": ["performance"],
    "verification": {"exit_code": 0, "numerics": json.dumps(NUMERICS_OK), "error": None},
}  # fmt: skip


def _failed(answer: dict[str, Any], governor: str | None = None) -> dict[str, str]:
    report = judge("b", answer, governor, REACHABLE)
    assert [c.name for c in report.checks] == list(CHECKS)
    return {c.name: c.detail for c in report.checks if not c.ok}


def _noisy(noise: float) -> str:
    tensors = [{**NUMERICS_OK["tensors"][0], "reference": {**NUMERICS_OK["tensors"][0]["reference"], "noise": noise}}]
    return json.dumps({**NUMERICS_OK, "tensors": tensors})


def test_a_healthy_answer_passes_and_every_hostile_one_fails_its_own_check() -> None:
    assert _failed(HEALTHY, "performance") == {}
    # a board without vcgencmd or cpufreq passes those checks and says they were not measured
    quiet = judge("b", {**HEALTHY, "throttled": None, "governors": []}, "performance", REACHABLE)
    assert quiet.ok and "not measured" in {c.name: c.detail for c in quiet.checks}["throttling"]
    hostile: list[tuple[dict[str, Any], str, str]] = [
        ({"disk_free_mb": 120}, "disk", "120 MB free where bundles go, needs 500 MB"),
        ({"disk_free_mb": -5}, "disk", "the board answered"),
        ({"disk_free_mb": True}, "disk", "the board answered"),
        ({"disk_free_mb": "lots"}, "disk", "the board answered"),
        ({"memory_available_mb": 100}, "memory", "needs 256 MB"),
        ({"memory_available_mb": 1.5e300}, "memory", "the board answered"),
        ({"throttled": {"value": 0x50005}}, "throttling", "under-voltage, throttled now"),
        ({"throttled": {"value": -1}}, "throttling", "the board answered"),
        ({"throttled": "0x0"}, "throttling", "the board answered"),
        ({"governors": ["powersave", "performance"]}, "governor", "powersave, configured performance"),
        ({"governors": "performance"}, "governor", "the board answered"),
        ({"verification": None}, "verification", "no verification run"),
        ({"verification": {"exit_code": 4, "error": "model on board is corrupt: ..."}}, "verification", "corrupt"),
        ({"verification": {"exit_code": 7, "error": None}}, "verification", "the runner exited 7"),
        ({"verification": {"exit_code": 0, "numerics": "{not json"}}, "verification", "unusable"),
        ({"verification": {"exit_code": 0, "numerics": json.dumps({**NUMERICS_OK, "schema": 9})}}, "verification",
         "schema"),
        ({"verification": {"exit_code": 0, "numerics": _noisy(5.0)}}, "verification", "outputs differ"),
        ({"verification": {"exit_code": 0, "numerics": json.dumps({**NUMERICS_OK, "tensors": []})}}, "verification",
         "not compared"),
    ]  # fmt: skip
    for change, check, said in hostile:
        failed = _failed({**HEALTHY, **change}, "performance")
        assert set(failed) == {check} and said in failed[check], (change, failed)
    # no governor configured: whatever the board runs is fine
    assert _failed({**HEALTHY, "governors": ["powersave"]}) == {}


def _report(ok: bool, at: int) -> HealthReport:
    check = HealthCheck("disk", ok, "20000 MB free" if ok else "120 MB free where bundles go, needs 500 MB")
    return HealthReport("pi-1", (REACHABLE, check), dt.datetime(2026, 12, 1, at, tzinfo=dt.timezone.utc))


def test_two_failed_health_jobs_in_a_row_take_a_board_out_until_it_is_brought_back(tmp_path: Path) -> None:
    history = History(f"sqlite:///{tmp_path / 'history.sqlite'}")
    try:
        assert service.state(history, "pi-1").in_service  # never checked: in service
        once = service.record_health(history, _report(False, 1))
        assert once.in_service and once.failures == 1
        assert service.record_health(history, _report(True, 2)).failures == 0  # a pass resets the streak
        service.record_health(history, _report(False, 3))
        out = service.record_health(history, _report(False, 4))
        assert not out.in_service and out.out_since == dt.datetime(2026, 12, 1, 4, tzinfo=dt.timezone.utc)
        assert out.reason == "disk: 120 MB free where bundles go, needs 500 MB"
        # a passing health job does not bring it back by itself; a third failure keeps the first date
        assert not service.record_health(history, _report(True, 5)).in_service
        assert service.record_health(history, _report(False, 6)).out_since == out.out_since
        still = service.return_to_service(history, _report(False, 7))
        assert not still.in_service and still.failures == 2
        back = service.return_to_service(history, _report(True, 8))
        assert back.in_service and back.failures == 0 and back.reason is None
        assert service.states(history)["pi-1"] == service.state(history, "pi-1")
        assert service.state(history, "pi-1").checks[1] == {"name": "disk", "ok": True, "detail": "20000 MB free"}
    finally:
        history.close()


def _fab(inventory: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "fabric", *argv, "--inventory", str(inventory)],
        cwd=PROJECT_ROOT, env={**os.environ, "ETLAB_WIDTH": "400"}, capture_output=True, text=True, timeout=600,
    )  # fmt: skip


def _corrupt_verification_program(board: Board, home: Path) -> None:
    """The board's copy of the verification program with one byte flipped, its name and sidecar still promising the
    content: what a failing SD card does to a file between two nights."""
    program = verification_files().program.read_bytes()
    sha = hashlib.sha256(program).hexdigest()
    models = home / board.workdir.removeprefix("~/") / "models"
    models.mkdir(parents=True, exist_ok=True)
    flipped = bytearray(program)
    flipped[len(flipped) // 2] ^= 0xFF
    (models / f"{sha}.pte").write_bytes(bytes(flipped))
    (models / f"{sha}.pte.sha256").write_text(f"{sha}  {sha}.pte\n")


@contextlib.contextmanager
def _full_disk(folder: Path) -> Iterator[None]:
    """A 1 MiB tmpfs over the board's bundles folder: no room for a night's results."""
    folder.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(folder)], capture_output=True)
    assert done.returncode == 0, f"cannot mount a tmpfs here: {done.stderr!r}"
    try:
        yield
    finally:
        subprocess.run(["umount", str(folder)], check=True)


def _row(listing: str, board: str) -> str:
    return next(line for line in listing.splitlines() if f" {board} " in line)


@pytest.mark.timeout(900)
def test_a_board_that_keeps_failing_its_health_job_goes_out_of_service(
    local_board: Board, sshd_board: Any, tmp_path: Path
) -> None:
    remote = sshd_board.board.replace(name="pi-lab-2", **SHARED_BUILD)
    provision_board(remote)
    matrix = [{"models": ["distilbert-tiny"], "backends": ["xnnpack"], "boards": ["local", "pi-lab-2"]}]
    section = nightly_section(tmp_path, matrix, iterations=5, warmup=1)
    inventory = write_inventory(tmp_path / "inventory.yaml", [local_board, remote], nightly=section)
    home = sshd_board.local_path("~")

    # Night 1: the board's verification program is corrupt. Its cells are infrastructure failures, the other
    # board's run; the agent removed the corrupt copy.
    _corrupt_verification_program(remote, home)
    first = fab_nightly(inventory, "2026-12-01", tmp_path)
    said = first.stdout + first.stderr
    assert first.returncode == 2, said
    records = {r.board: r for r in stored(tmp_path, "2026-12-01")}
    assert records["local"].status == "ok" and records["local"].latencies_ms
    assert records["pi-lab-2"].status == "infra" and records["pi-lab-2"].stage == "health", records["pi-lab-2"]
    assert "verification program on board is corrupt" in (records["pi-lab-2"].error or "")
    assert "pi-lab-2: health job failed (1 of 2 in a row" in said

    # Night 2: corrupt again, as a failing card does: the second failure in a row takes it out of service.
    _corrupt_verification_program(remote, home)
    second = fab_nightly(inventory, "2026-12-02", tmp_path)
    assert second.returncode == 2, second.stdout + second.stderr
    assert "pi-lab-2: out of service: verification:" in second.stderr
    listing = _fab(inventory, "boards")
    assert listing.returncode == 0, listing.stdout + listing.stderr
    assert "OUT since" in _row(listing.stdout, "pi-lab-2") and "in service" in _row(listing.stdout, "local")
    assert "pi-lab-2: out of service since 20" in listing.stderr and "corrupt" in listing.stderr, listing.stderr

    # Night 3: skipped without a run, said as an infrastructure failure (never a regression), in the report too.
    third = fab_nightly(inventory, "2026-12-03", tmp_path)
    assert third.returncode == 2, third.stdout + third.stderr
    skipped = {r.board: r for r in stored(tmp_path, "2026-12-03")}["pi-lab-2"]
    assert skipped.status == "infra" and skipped.stage == "out of service" and skipped.bundle_path is None
    assert (skipped.error or "").startswith("out of service since ")
    assert "fab return-to-service --board pi-lab-2" in third.stderr and "REGRESSION" not in third.stderr
    assert "out of service since" in (tmp_path / "reports" / "nightly-2026-12-03.md").read_text()

    # Its disk fills up: the health job `return-to-service` runs fails, and it stays out.
    with _full_disk(home / remote.workdir.removeprefix("~/") / "bundles"):
        refused = _fab(inventory, "return-to-service", "--board", "pi-lab-2")
        assert refused.returncode == 1, refused.stdout + refused.stderr
        assert "disk: 1 MB free where bundles go, needs 500 MB" in refused.stderr, refused.stderr
        health = _fab(inventory, "boards", "--health")
        assert health.returncode == 1, health.stdout + health.stderr
        row = _row(health.stdout, "pi-lab-2").split("│")[1:-1]
        assert [cell.strip() for cell in row[1:4]] == ["FAILED", "ok", "FAILED"] and "OUT since" in row[-1], row
        assert "pi-lab-2: health job failed: disk: 1 MB free" in health.stderr, health.stderr
    # Mended: a health job that passes brings it back, and the next night runs it again.
    back = _fab(inventory, "return-to-service", "--board", "pi-lab-2")
    assert back.returncode == 0 and "pi-lab-2: back in service" in back.stderr + back.stdout, back.stderr
    healthy = _fab(inventory, "boards", "--health")
    assert healthy.returncode == 0, healthy.stdout + healthy.stderr
    assert "FAILED" not in healthy.stdout and "in service" in _row(healthy.stdout, "pi-lab-2"), healthy.stdout
    fourth = fab_nightly(inventory, "2026-12-04", tmp_path)
    assert fourth.returncode == 0, fourth.stdout + fourth.stderr
    assert {r.board: r.status for r in stored(tmp_path, "2026-12-04")} == {"local": "ok", "pi-lab-2": "ok"}


def test_a_missing_board_name_is_refused_before_anything_runs(tmp_path: Path, local_board: Board) -> None:
    inventory = write_inventory(tmp_path / "inventory.yaml", [local_board])
    refused = _fab(inventory, "return-to-service")
    assert refused.returncode == 64 and "--board NAME" in refused.stderr, refused.stderr
