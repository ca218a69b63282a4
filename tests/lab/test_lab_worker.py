"""A `fab worker` as it runs in a lab: a real scheduler and worker process (orchestrator/testing/lab.py)."""

from __future__ import annotations

from pathlib import Path

import yaml

from orchestrator.lab import cluster
from orchestrator.testing.lab import LocalLab


def test_a_worker_runs_without_dasks_profiler(tmp_path: Path) -> None:
    """Dask's profiler (sys._current_frames() every 10 ms) can deadlock a worker on CPython 3.11 (gh-106883): a
    `fab worker` runs without it."""
    lab = LocalLab(tmp_path / "lab")
    try:
        inventory = tmp_path / "inventory.yaml"
        inventory.write_text(yaml.safe_dump({"boards": {"local": {"transport": "local", "workdir": str(tmp_path)}}}))
        lab.with_lab(inventory)
        lab.start_scheduler(inventory)
        lab.start_worker("w1", inventory, lowering=False)
        lab.wait_workers({"w1"})
        client = cluster.connect(lab.settings)
        try:
            profiling = client.run(lambda dask_worker: "profile" in dask_worker.periodic_callbacks)
        finally:
            client.close()
    finally:
        lab.close()
    assert list(profiling.values()) == [False], profiling
