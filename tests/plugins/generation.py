"""A real nightly of a language model on the local board: `fab nightly` with smollm2-gen-tiny in its matrix, two
nights, so the history holds two generation runs of one cell, their bundles sit under results/ and the reports
next to them. The nightly, compare and dashboard tests of generation read it."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from orchestrator.boards.inventory import Board
from orchestrator.lab.history import History
from orchestrator.lab.run_record import RunRecord
from orchestrator.paths import PROJECT_ROOT
from tests.plugins.artifacts import ARTIFACT_CACHE
from tests.plugins.boards import write_inventory

GENERATION_MODEL = "smollm2-gen-tiny"
GENERATION_NIGHTS = ("2026-11-01", "2026-11-02")


@dataclass(frozen=True)
class GenerationNights:
    root: Path
    results: Path
    reports: Path
    history_path: Path
    outputs: dict[str, subprocess.CompletedProcess[str]]  # night -> the `fab nightly` that ran it

    @property
    def history_url(self) -> str:
        return f"sqlite:///{self.history_path}"

    def records(self) -> list[RunRecord]:
        """The nights' runs as the history reads them back, newest night first."""
        history = History(self.history_url)
        try:
            return history.runs()
        finally:
            history.close()


@pytest.fixture(scope="session")
def generation_nights(local_board: Board, tmp_path_factory: pytest.TempPathFactory) -> GenerationNights:
    root = tmp_path_factory.mktemp("generation-nights")
    section = {
        "history": f"sqlite:///{root / 'history.sqlite'}",
        "reports": str(root / "reports"),
        "iterations": 20,  # generations: a few milliseconds each
        "warmup": 2,
        "cooldown_seconds": 1,  # a degraded cell's re-measure
        "weights": "random",
        "matrix": [{"models": [GENERATION_MODEL], "backends": ["xnnpack"], "boards": ["local"]}],
    }
    inventory = write_inventory(root / "inventory.yaml", [local_board], nightly=section)
    # The shared test cache: the generation programs are lowered once per session (and kept across sessions).
    env = {**os.environ, "ETLAB_ARTIFACTS": str(ARTIFACT_CACHE), "ETLAB_RESULTS": str(root / "results"),
           "COLUMNS": "200"}  # fmt: skip
    outputs = {}
    for night in GENERATION_NIGHTS:
        outputs[night] = subprocess.run(
            [sys.executable, "-m", "fabric", "nightly", "--inventory", str(inventory), "--night", night],
            cwd=PROJECT_ROOT, env=env, capture_output=True, text=True, timeout=1200,
        )  # fmt: skip
    return GenerationNights(root, root / "results", root / "reports", root / "history.sqlite", outputs)
