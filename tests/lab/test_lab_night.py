"""A night shared by several hosts, for real: a TLS scheduler, two `fab worker` processes with their own state and
artifacts folders, three sshd boards on 127.0.0.x, one PostgreSQL history; a worker killed (-9) mid-night."""

from __future__ import annotations

import json
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
import yaml

from orchestrator.lab.cluster import lab_state
from orchestrator.lab.history import History
from orchestrator.lab.run_record import RunRecord
from orchestrator.lowering.artifacts import ArtifactPaths
from orchestrator.lowering.variants import Variant
from orchestrator.paths import PROJECT_ROOT
from orchestrator.testing.lab import LocalLab
from orchestrator.testing.pi import PiBoard
from orchestrator.testing.postgres import fresh_database
from orchestrator.testing.sshd import SshdBoard
from tests.plugins.artifacts import ARTIFACT_CACHE
from tests.plugins.boards import SHARED_BUILD, provision_board, write_inventory

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
    started = LocalLab(tmp_path / "lab", wait_seconds=45)
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
    fakes = sshd_boards(3, names=["lab-b1", "lab-b2", "lab-b3"], **SHARED_BUILD)
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
    for word in ("wa", "wb", "lab-b1", "lab-b3", "2 worker(s)", "queue: empty", f"GB free, {os.cpu_count()} cores"):
        assert word in shown.stdout, shown.stdout

    env = {**os.environ, "ETLAB_RESULTS": str(tmp_path / "results"), "ETLAB_STATE": str(tmp_path / "ws-state")}
    night = subprocess.Popen(
        [sys.executable, "-m", "fabric", "nightly", "--inventory", str(workstation), "--night", NIGHT],
        cwd=PROJECT_ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        # `fab lab` once the boards' shares are out: the board nobody reaches waits in the queue, saying for what.
        deadline = time.monotonic() + 600
        while night.poll() is None and time.monotonic() < deadline:
            if any("lab-nowhere" in task for task, _ in lab_state(lab.settings).waiting):
                break
            time.sleep(0.25)
        queued = fab("lab", "--inventory", str(workstation))
        assert queued.returncode == 0, queued.stdout + queued.stderr
        queue_table = queued.stdout.partition("queue:")[2]
        assert "board lab-nowhere" in queue_table and "board:lab-nowhere" in queue_table, queued.stdout

        # Kill (-9) a worker mid-share: one that has recorded some of a board's cells, with cells still to run. The
        # history names the host of each cell, so a share is found from the records alone (no race with how fast
        # the scheduler answers); the worker is frozen before the records are read again, so the share it is caught
        # in cannot finish between the look and the kill.
        victim, killed_board = "", ""
        cells_per_board = 4  # two models x two backends
        while night.poll() is None and time.monotonic() < deadline and not victim:
            by_board = Counter((r.board, r.host) for r in _quietly(records, url))
            for (board_name, host), count in by_board.items():
                if host in ("wa", "wb") and count < cells_per_board and not victim:
                    lab.freeze(str(host))
                    now = Counter(r.board for r in _quietly(records, url))
                    if now[board_name] < cells_per_board:
                        victim, killed_board = str(host), board_name
                        lab.kill(victim)
                    else:
                        lab.thaw(str(host))
            time.sleep(0.2)
        if not victim:
            output = night.communicate(timeout=600)[0] if night.poll() is None else ""
            pytest.fail(f"no share to kill mid-way:\n{output}\n{lab.log('wa')[-3000:]}\n{lab.log('wb')[-3000:]}")
        survivor = "wb" if victim == "wa" else "wa"
        # `fab lab` after: the survivor alone, running a board's share.
        gone = time.monotonic() + 120
        while {w.name for w in lab_state(lab.settings).workers} != {survivor} and time.monotonic() < gone:
            time.sleep(0.2)
        during = fab("lab", "--inventory", str(workstation))
        assert during.returncode == 0, during.stdout + during.stderr
        workers_table = during.stdout.partition("queue:")[0]
        assert survivor in workers_table and f"{victim} " not in workers_table, during.stdout
        assert "board lab-b" in workers_table, "the survivor's row names the board share it runs"
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
    # The cells the killed worker recorded are tonight's, not "already recorded" by an earlier run.
    assert f"{len(planned) + 1} cells run, 0 already recorded" in page, page[:2000]


def _quietly(read: Callable[[str], list[RunRecord]], url: str) -> list[RunRecord]:
    try:
        return read(url)
    except sqlalchemy.exc.SQLAlchemyError:  # the schema is being created by the first writer
        return []


def test_a_cell_runs_on_the_worker_that_reaches_its_board_an_emulated_pi(
    lab: LocalLab,
    sshd_boards: Callable[..., list[SshdBoard]],
    pi_boards: Callable[..., PiBoard],
    postgres_url: str,
    tiny_artifacts: dict[str, Any],
    tmp_path: Path,
) -> None:
    """Two hosts, each with a board only it reaches: an x86 sshd board on wx, an emulated Raspberry Pi 4 on wpi.
    Each cell lands on the host that reaches its board; the Pi runs the very program wx published."""
    (x86,) = sshd_boards(1, names=["lab-x86"], **SHARED_BUILD)
    pi = pi_boards("lab-pi4", flavour="pi4", compiler=False)  # its runner cross-built here, before the night
    for board in (x86.board, pi.board):
        provision_board(board)
    url = fresh_database(postgres_url)
    matrix = [{"models": ["distilbert-tiny"], "backends": ["xnnpack"], "boards": ["lab-x86", "lab-pi4"]}]
    nightly = {"history": url, "reports": str(tmp_path / "reports"), "iterations": 3, "warmup": 1,
               "cooldown_seconds": 0, "matrix": matrix}  # fmt: skip
    workstation = lab.with_lab(write_inventory(tmp_path / "inventory.yaml", [x86.board, pi.board], nightly=nightly))
    lab.with_lab(write_inventory(tmp_path / "wx.yaml", [x86.board]))
    lab.with_lab(write_inventory(tmp_path / "wpi.yaml", [pi.board]))
    lab.start_scheduler(workstation)
    lab.start_worker("wx", tmp_path / "wx.yaml", artifacts=ARTIFACT_CACHE)
    lab.start_worker("wpi", tmp_path / "wpi.yaml", lowering=False)
    lab.wait_workers({"wx", "wpi"})

    env = {**os.environ, "ETLAB_RESULTS": str(tmp_path / "results"), "ETLAB_STATE": str(tmp_path / "ws-state")}
    done = fab("nightly", "--inventory", str(workstation), "--night", NIGHT, env=env, timeout=1500)
    assert done.returncode == 0, done.stdout + done.stderr + lab.log("wpi")[-4000:]
    hosts = {r.board: r for r in records(url)}
    assert hosts["lab-x86"].host == "wx" and hosts["lab-pi4"].host == "wpi", hosts
    assert all(r.status == "ok" for r in hosts.values())
    bundle = Path(hosts["lab-pi4"].bundle_path or "")
    assert bundle.is_relative_to(lab.root / "wpi" / "results"), "the bundle stays on the host that ran the cell"
    facts = json.loads((bundle / "board_info_before.json").read_text())
    assert facts["arch"] == "aarch64" and facts["cpu"]["core"] == "Cortex-A72"
    fetched = ArtifactPaths.for_model("distilbert-tiny", lab.root / "wpi" / "artifacts").pte(Variant.parse("xnnpack"))
    assert fetched.read_bytes() == tiny_artifacts["distilbert-tiny"].paths.pte(Variant.parse("xnnpack")).read_bytes()
    assert "on wpi" in (tmp_path / "reports" / f"nightly-{NIGHT}.html").read_text()


def test_a_lowering_no_worker_has_the_memory_for_is_the_lab_s_failure(
    tmp_path: Path, sshd_boards: Callable[..., list[SshdBoard]], postgres_url: str
) -> None:
    """A program needs more memory than any worker has free: it is never lowered (no worker takes it), its cells are
    infrastructure failures naming what they needed, and the night says so (exit 2)."""
    lab = LocalLab(tmp_path / "lab", wait_seconds=3)
    try:
        (fake,) = sshd_boards(1, names=["lab-small"])
        url = fresh_database(postgres_url)
        matrix = [{"models": ["distilbert-tiny"], "backends": ["xnnpack"], "boards": ["lab-small"]}]
        nightly = {"history": url, "reports": str(tmp_path / "reports"), "matrix": matrix}
        workstation = lab.with_lab(write_inventory(tmp_path / "inventory.yaml", [fake.board], nightly=nightly))
        document = yaml.safe_load(workstation.read_text())
        document["lab"]["lowering_gb"] = 1 << 19  # half a petabyte
        workstation.write_text(yaml.safe_dump(document))
        lab.start_scheduler(workstation)
        lab.start_worker("w1", lab.with_lab(write_inventory(tmp_path / "w1.yaml", [fake.board])))
        lab.wait_workers({"w1"})
        done = fab("nightly", "--inventory", str(workstation), "--night", NIGHT,
                   env={**os.environ, "ETLAB_RESULTS": str(tmp_path / "results")})  # fmt: skip
        assert done.returncode == 2, done.stdout + done.stderr
        (record,) = records(url)
        assert record.status == "infra" and "memory-gb" in (record.error or ""), record
        assert not (lab.root / "w1" / "artifacts" / "distilbert-tiny").exists(), "nothing was lowered"
    finally:
        lab.close()


def test_a_baseline_program_the_store_refuses_costs_one_re_test_not_the_board() -> None:
    """A re-test whose baseline program cannot be fetched (tampered in the lab's store, the store gone) leaves that
    cell unconfirmed, saying why; the board's other cells go on."""
    from orchestrator.lab.artifact_store import StoreError
    from orchestrator.lab.board_night import retest
    from orchestrator.lab.matrix import NightlyConfig
    from orchestrator.lab.night_report import CellVerdict
    from orchestrator.results.verdicts import Kind

    def refused(sha: str | None) -> Path | None:
        raise StoreError(f"program {sha}: does not match its sha256 (changed in the store)")

    tonight = RunRecord(run_id="r2", night="2026-12-02", board="b", model="m", backend="xnnpack", status="ok",
                        pte_sha256="b" * 64)  # fmt: skip
    baseline = RunRecord(run_id="r1", night="2026-12-01", board="b", model="m", backend="xnnpack", status="ok",
                         pte_sha256="a" * 64)  # fmt: skip
    suspected = CellVerdict(tonight, Kind.UNCONFIRMED, "looks slower", suspect="slower", reference=baseline)
    settled = retest(None, suspected, None, NightlyConfig(entries=()), refused)  # type: ignore[arg-type]
    assert settled.verdict == Kind.UNCONFIRMED
    assert "the baseline's program could not be fetched" in settled.detail and "changed in the store" in settled.detail
