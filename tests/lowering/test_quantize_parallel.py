"""Parallel lowering of the quantized variants, for real: an interrupted one leaves only valid artifacts, the schedule
keeps every variant within the memory budget, and it writes what the sequential lowering writes.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from orchestrator.fsutil import read_json
from orchestrator.lowering.artifacts import ArtifactPaths, sidecar_problem
from orchestrator.lowering.builtins import BUILTIN_SPECS
from orchestrator.lowering.sidecar import Sidecar, sidecar_data
from orchestrator.lowering.variants import VARIANTS
from orchestrator.paths import PROJECT_ROOT
from tests.plugins.processes import reaped


def test_an_interrupted_parallel_lowering_leaves_only_valid_artifacts(tmp_path: Path) -> None:
    artifacts = tmp_path / "artifacts"
    env = {**os.environ, "ETLAB_ARTIFACTS": str(artifacts)}
    process = subprocess.Popen(
        [sys.executable, "-m", "fabric", "lower", "--model", "gpt2-tiny", "--backend", "xnnpack", "--quantize",
         "none,int8-dynamic,8da4w", "--weights", "random", "--jobs", "2"],
        cwd=PROJECT_ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True,
    )  # fmt: skip
    paths = ArtifactPaths.for_model("gpt2-tiny", artifacts)
    variants = [VARIANTS["xnnpack"], VARIANTS["xnnpack-int8-dynamic"], VARIANTS["xnnpack-8da4w"]]
    with reaped(process):
        deadline = time.monotonic() + 1500
        while time.monotonic() < deadline and process.poll() is None:
            if any(paths.sidecar(v).is_file() for v in variants):
                break
            time.sleep(0.2)
        assert process.poll() is None, "the lowering ended before it could be interrupted"
        os.killpg(process.pid, signal.SIGINT)  # Ctrl+C: the parent and its workers
        output, _ = process.communicate(timeout=300)
    assert process.returncode == 130, output
    finished = [v for v in variants if paths.sidecar(v).is_file()]
    assert finished and len(finished) < len(variants), (finished, output)
    for variant in variants:
        if variant in finished:
            assert sidecar_problem(paths, variant) is None
        else:
            assert sidecar_problem(paths, variant) is not None
    # A worker stopped mid-write may leave a temporary: never an artifact, and swept by the next lowering.
    assert all(not p.name.startswith(".") or p.name.startswith(".etlab-tmp-") for p in paths.folder.iterdir())
    assert " done " in output and "/3)" in output  # progress per finished variant (its start under -v)


def test_the_parallel_schedule_keeps_every_variant_within_the_memory_budget(tmp_path: Path) -> None:
    from concurrent.futures import Future

    from orchestrator.console import StageTimer
    from orchestrator.lowering.export.parallel import ParallelLowering, VariantTask

    gb = 10**9

    def task(name: str, peak: float, seconds: float) -> VariantTask:
        return VariantTask(
            spec=BUILTIN_SPECS["distilbert-tiny"], variant=VARIANTS[name], weights="random", weights_note="random",
            parameters=1, files={}, inputs=[], outputs=[], root=tmp_path, etrecord=False, key="k", calibration=None,
            peak_bytes=int(peak * gb), expected_seconds=seconds,
        )  # fmt: skip

    tasks = [task("xnnpack", 1, 1.0), task("xnnpack-int8-dynamic", 1.5, 1.6), task("xnnpack-8da4w", 1.5, 1.9),
             task("xnnpack-int8-static", 5, 2.3)]  # fmt: skip
    # worker: never called (no pool is started), the schedule alone is under test
    schedule = ParallelLowering(tasks, 3, worker=print, main_peak=1 * gb, budget=4 * gb, timer=StageTimer())  # type: ignore[arg-type]
    # Workers get the quantized variants, longest first, as long as this process's 1 GB and theirs fit in 4 GB;
    # int8-static (5 GB) never fits beside anything.
    first = schedule._claim(main=False)
    assert first is not None and first.variant.name == "xnnpack-8da4w"
    schedule._running[Future()] = first
    second = schedule._claim(main=False)
    assert second is not None and second.variant.name == "xnnpack-int8-dynamic"
    schedule._running[Future()] = second
    assert schedule._claim(main=False) is None  # 1 + 1.5 + 1.5 + 1 > 4: wait rather than swap
    # The fp32 variant comes from the exported program: no worker takes it before the .pt2 is saved.
    schedule._running.clear()
    schedule._running[Future()] = first
    assert schedule._claim(main=False) is None
    schedule.program_saved({"file": "m.pt2", "size": 1, "mtime_ns": 1, "sha256": "0"})
    fp32 = schedule._claim(main=True)  # this process takes its own program's variant first
    assert fp32 is not None and fp32.variant.name == "xnnpack" and "exported_program" in fp32.files
    assert schedule._claim(main=True) is None  # int8-static beside a running worker: it waits
    schedule._running.clear()
    assert schedule._claim(main=False) is None  # too big for a worker beside this process
    alone = schedule._claim(main=True)  # nothing else running: this process lowers it alone, with a warning
    assert alone is not None and alone.variant.name == "xnnpack-int8-static" and not schedule.pending
    assert schedule.main_reserved == 5 * gb


def _comparable(sidecar: Sidecar | dict[str, Any]) -> dict[str, Any]:
    """A sidecar without what differs between two lowerings of the same thing: when, how long, how much memory."""
    sidecar = json.loads(json.dumps(sidecar_data(sidecar))) if isinstance(sidecar, Sidecar) else sidecar  # lists
    kept = {k: v for k, v in sidecar.items() if k not in ("lowering", "created")}
    kept["files"] = {role: {k: v for k, v in r.items() if k != "mtime_ns"} for role, r in sidecar["files"].items()}
    return kept


def test_parallel_lowering_writes_what_the_sequential_one_writes(tmp_path: Path) -> None:
    from orchestrator.lowering.export import lower as lowering

    spec = BUILTIN_SPECS["distilbert-tiny"]
    # fp32 lowers in this process from the exported program, the quantized variant in the worker from the eager
    # model: the two paths that could diverge. (Two variants only: every lowering here is done twice.)
    variants = [VARIANTS["xnnpack"], VARIANTS["xnnpack-int8-dynamic"]]
    sequential = lowering.lower(spec, variants=variants, weights="random", root=tmp_path / "seq", jobs=1)
    # One worker and this process: quantized variants in the worker from the eager model, fp32 ones here first.
    parallel = lowering.lower(spec, variants=variants, weights="random", root=tmp_path / "par", jobs=2)
    assert "lower variants (parallel)" in parallel.stage_seconds
    assert "lower variants (parallel)" not in sequential.stage_seconds
    assert list(parallel.variants) == variants
    shared = ("exported_program", "reference_inputs", "reference_outputs")
    for name in shared:
        assert getattr(sequential.paths, name).read_bytes() == getattr(parallel.paths, name).read_bytes(), name
    for variant in variants:
        one, two = sequential.variants[variant], parallel.variants[variant]
        assert not two.cached and sidecar_problem(parallel.paths, variant) is None
        assert one.pte.read_bytes() == two.pte.read_bytes(), variant
        # Same sidecar (the paths aside): same files vouched for (the .pt2 only for fp32), same reports.
        assert _comparable(read_json(parallel.paths.sidecar(variant))) == _comparable(two.sidecar)
        assert _comparable(one.sidecar) == _comparable(two.sidecar), variant
        assert ("exported_program" in two.sidecar.files) == (not variant.quantized), variant
        assert two.sidecar.lowering.peak_rss_bytes > 0 and two.sidecar.lowering.seconds > 0
    # A second parallel lowering finds every variant cached.
    again = lowering.lower(spec, variants=variants, weights="random", root=tmp_path / "par", jobs=2)
    assert again.cached


def test_without_jobs_a_lowering_leaves_the_cores_other_work_holds() -> None:
    """`--jobs` not given: this process and a worker per core the 1-minute load average leaves idle, at least one."""
    from orchestrator.lowering.export.lower import idle_cores

    assert idle_cores(2, 0.3) == 2  # an idle workstation: both cores
    assert idle_cores(2, 1.2) == 1  # another busy process holds one
    assert idle_cores(2, 3.9) == 1  # a saturated machine (a test suite's workers): this process alone
    assert idle_cores(8, 2.6) == 5
    assert idle_cores(4, None) == 4  # no load average on this system: every core
