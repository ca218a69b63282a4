"""Helpers shared by the board-data tests (test_board_data*.py, test_board_files.py) and
tests/commands/test_exit_codes.py: the agent on a fake board, a bundle as the agent leaves it, `fab` as a process."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import click

from orchestrator.paths import PROJECT_ROOT
from orchestrator.results.bundle import MANIFEST
from tests.plugins.agent import AGENT_DIR
from tests.plugins.sshd import SshdBoard


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def install_agent(fake: SshdBoard) -> None:
    """The agent on a fake board, as provisioning lays it out (board/agent and click in pylib); no runner needed
    to list bundles."""
    workdir = fake.workdir_path
    shutil.copytree(AGENT_DIR, workdir / "board" / "agent", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(Path(click.__file__).parent, workdir / "pylib" / "click", ignore=shutil.ignore_patterns("*.pyc"))


def board_bundle(fake: SshdBoard, run_id: str, labels: dict[str, str], files: dict[str, bytes] | None = None) -> Path:
    """A bundle as the agent leaves it: run.json with labels, the files, result_manifest.json last."""
    folder = fake.workdir_path / "bundles" / run_id
    folder.mkdir(parents=True)
    contents = {"run.json": json.dumps({"run_id": run_id, "labels": labels}).encode(), **(files or {})}
    for name, data in contents.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)  # "analysis/summary.json": a hostile board's
        (folder / name).write_bytes(data)
    listed = {name: {"sha256": sha(data), "size": len(data)} for name, data in contents.items()}
    manifest = {"schema": 1, "run_id": run_id, "status": "ok", "files": listed}
    (folder / MANIFEST).write_text(json.dumps(manifest))
    return folder


def fab(*args: str, results: Path) -> subprocess.CompletedProcess[str]:
    """`fab` as a real process, with `results` as its results folder."""
    env = {**os.environ, "ETLAB_RESULTS": str(results)}
    return subprocess.run(
        [sys.executable, "-m", "fabric", *args], cwd=PROJECT_ROOT, env=env, capture_output=True, text=True, timeout=300
    )


def files_under(folder: Path) -> set[str]:
    return {str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file()} if folder.exists() else set()
