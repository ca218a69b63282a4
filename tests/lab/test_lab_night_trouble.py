"""A lab night in trouble, for real: a TLS scheduler, two `fab worker`s (one lowers, one reaches the sshd board and
fetches every program from the store), one PostgreSQL history. A named pipe planted in the store does not hang the
night; a scheduler killed mid-night is named, the night resumes once it is back, and every cell is recorded once."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import sqlalchemy

from orchestrator.lab.history import History
from orchestrator.lab.run_record import RunRecord
from orchestrator.lowering.artifacts import load_artifact
from orchestrator.lowering.variants import Variant
from orchestrator.paths import PROJECT_ROOT
from orchestrator.testing.lab import LocalLab
from orchestrator.testing.postgres import fresh_database
from orchestrator.testing.sshd import SshdBoard
from tests.plugins.artifacts import ARTIFACT_CACHE
from tests.plugins.boards import SHARED_BUILD, provision_board, write_inventory

MODELS, VARIANTS = ("distilbert-tiny", "gpt2-tiny"), ("xnnpack", "portable")
# A name rich would read as markup (`[@...]` is an event tag): every line that carries it shows it as it is.
RUNNER = "[@x=("


def records(url: str, night: str) -> list[RunRecord]:
    history = History(url)
    try:
        return history.runs(night=night)
    except sqlalchemy.exc.SQLAlchemyError:  # the schema is being created by the first writer
        return []
    finally:
        history.close()


def nightly(inventory: Path, night: str, env: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "fabric", "nightly", "--inventory", str(inventory), "--night", night],
        cwd=PROJECT_ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip


def finished(night: subprocess.Popen[str], timeout: float) -> str:
    """The nightly's output once it ends (killed after `timeout`)."""
    try:
        return night.communicate(timeout=timeout)[0]
    finally:
        if night.poll() is None:
            night.kill()


def test_a_pipe_in_the_store_and_a_lost_scheduler_neither_hang_nor_hide(
    tmp_path: Path,
    sshd_boards: Callable[..., list[SshdBoard]],
    postgres_url: str,
    tiny_artifacts: dict[str, Any],
) -> None:
    (fake,) = sshd_boards(1, names=["trouble-b1"], **SHARED_BUILD)
    provision_board(fake.board)
    url = fresh_database(postgres_url)
    lab = LocalLab(tmp_path / "lab", wait_seconds=120)
    try:
        matrix = [{"models": list(MODELS), "backends": list(VARIANTS), "boards": ["trouble-b1"]}]
        nightly_section = {"history": url, "reports": str(tmp_path / "reports"), "iterations": 40, "warmup": 2,
                           "cooldown_seconds": 0, "matrix": matrix}  # fmt: skip
        workstation = lab.with_lab(write_inventory(tmp_path / "inventory.yaml", [fake.board], nightly=nightly_section))
        lab.with_lab(write_inventory(tmp_path / "worker.yaml", [fake.board]))
        lab.start_scheduler(workstation)
        # "lowerer" lowers (the tests' artifact cache: it publishes) and reaches no board; RUNNER runs the board's
        # cells with an empty artifacts folder: every program it runs is read from the store.
        lab.start_worker("lowerer", tmp_path / "worker.yaml", artifacts=ARTIFACT_CACHE, boards="none")
        lab.start_worker(RUNNER, tmp_path / "worker.yaml", lowering=False, key="runner")
        lab.wait_workers({"lowerer", RUNNER})
        env = {**os.environ, "ETLAB_RESULTS": str(tmp_path / "results"), "ETLAB_STATE": str(tmp_path / "ws-state")}

        # 1. A named pipe as an entry's manifest.json, another as an entry's .pte: today's worker blocks on the
        #    read forever (the night never ends and keeps its lock). Refused as bad data, lowered, published again.
        store = Path(lab.settings.store)
        planted = {}
        for model, variant, file in (("distilbert-tiny", "xnnpack", "manifest.json"), ("gpt2-tiny", "portable", None)):
            artifact = load_artifact(model, Variant.parse(variant), ARTIFACT_CACHE)
            entry = store / artifact.sidecar.cache_key[:2] / artifact.sidecar.cache_key
            entry.mkdir(parents=True)
            name = file or artifact.paths.pte(Variant.parse(variant)).name
            if file is None:  # a sound manifest naming the files, the program a pipe
                manifest = {
                    "key": artifact.sidecar.cache_key,
                    "model": model,
                    "backend": variant,
                    "files": {name: "0" * 64},
                    "sidecar": artifact.paths.sidecar(Variant.parse(variant)).name,
                }
                (entry / "manifest.json").write_text(json.dumps(manifest))  # fmt: skip
            os.mkfifo(entry / name)
            planted[(model, variant)] = entry / name
        first = nightly(workstation, "2026-12-01", env)
        output = finished(first, 600)
        assert first.returncode == 0, output + lab.log("lowerer")[-3000:] + lab.log("runner")[-3000:]
        assert "not a regular file" in output and "published again" in output, output
        for path in planted.values():
            assert path.is_file() or not path.exists(), f"{path} is still a pipe"
        done = {r.cell: r for r in records(url, "2026-12-01")}
        assert len(done) == 4 and all(r.status == "ok" and r.host == RUNNER for r in done.values()), done
        # The worker's name shown as it is, in the night's lab line.
        assert f"{RUNNER} (boards trouble-b1)" in output, output

        # 2. The scheduler killed (-9) once a cell is recorded: today the night said "0 failures", every cell ok,
        #    exit 2, and named nothing. Named now, in an error line and the report, with how to resume.
        second = nightly(workstation, "2026-12-02", env)
        deadline = time.monotonic() + 600
        while second.poll() is None and time.monotonic() < deadline and not records(url, "2026-12-02"):
            time.sleep(0.2)
        lab.stop_scheduler(signal.SIGKILL)
        output = finished(second, 300)
        assert second.returncode == 2, output
        said = f"error: the lab's scheduler {lab.settings.scheduler} was lost mid-night"
        assert said in output and "To resume: start `fab lab-scheduler` again" in output, output
        assert "fab nightly --night 2026-12-02" in output and "Traceback" not in output, output
        page = (tmp_path / "reports" / "nightly-2026-12-02.html").read_text()
        assert "id='lost'" in page and "was lost mid-night" in page, page[:3000]

        # The scheduler back on its address: both workers join again by themselves, and the night resumes.
        lab.start_scheduler(workstation)
        lab.wait_workers({"lowerer", RUNNER}, timeout=300)
        resumed = nightly(workstation, "2026-12-02", env)
        output = finished(resumed, 600)
        assert resumed.returncode == 0, output
        stored = records(url, "2026-12-02")
        counts = Counter(record.cell for record in stored)
        assert set(counts) == {("trouble-b1", m, v) for m in MODELS for v in VARIANTS}, counts
        assert all(n == 1 for n in counts.values()) and all(r.status == "ok" for r in stored), stored
    finally:
        lab.close()
