"""Benchmark: analysis + overlay generation for a full-size GPT-2 XNNPACK bundle, next to Inspector's load time.

    .venv/bin/python bench/bench_analysis.py [--iterations 50] [--repeat 3] [--cache DIR]

The bundle is made the real way, once, and cached (default .etlab/bench-cache/gpt2-<iterations>/): GPT-2 lowered
by `fab lower` (random weights, XNNPACK; cached in artifacts/), profiled by the native runner through the agent on
the local board (warmup 3, ETDump on), pulled back. Target: the whole analysis under 5 s and no slower than
Inspector loading the same ETDump.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from orchestrator import console
from orchestrator.boards.inventory import load_inventory
from orchestrator.deploy.provision import setup_board
from orchestrator.deploy.runs import RunParams, profile, pull, push_artifact
from orchestrator.lowering.artifacts import Artifact, load_artifact
from orchestrator.lowering.builtins import BUILTIN_SPECS
from orchestrator.lowering.export import lower as lowering
from orchestrator.lowering.variants import Variant
from orchestrator.paths import state_dir
from orchestrator.results.analysis import analyze_bundle
from orchestrator.results.store import list_runs, new_run_id
from orchestrator.transport import connect

TARGET_S = 5.0


def bundle(cache: Path, iterations: int) -> tuple[Path, Artifact]:
    lowering.lower(BUILTIN_SPECS["gpt2"], variants=[Variant("xnnpack")], weights="random")
    artifact = load_artifact("gpt2", Variant("xnnpack"))
    cached = [run for run in list_runs(cache) if run.backend == "xnnpack" and run.model == "gpt2"]
    if cached and artifact.sha256 in cached[-1].path.joinpath("run.json").read_text():
        return cached[-1].path, artifact  # profiled earlier, with this very program
    board = load_inventory().boards["local"]
    with connect(board) as conn, console.StageTimer("bench: ").stage(f"profile GPT-2 ({iterations} iterations)"):
        setup_board(conn)
        params = RunParams(warmup=3, iterations=iterations, max_seconds=None)
        remote = profile(conn, artifact, push_artifact(conn, artifact), params, new_run_id())
        return pull(conn, remote, artifact, cache), artifact


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=50)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--cache", type=Path, help="where the bundle is kept (default .etlab/bench-cache/gpt2-<N>)")
    args = parser.parse_args()
    console.quiet_third_party()
    run, artifact = bundle(args.cache or state_dir() / "bench-cache" / f"gpt2-{args.iterations}", args.iterations)

    analysis_s = []
    for _ in range(args.repeat):
        shutil.rmtree(run / "analysis", ignore_errors=True)
        shutil.rmtree(run / "model_explorer", ignore_errors=True)
        started = time.perf_counter()
        summary = analyze_bundle(
            run, pte=artifact.pte, sidecar=artifact.sidecar, reference_outputs=artifact.paths.reference_outputs
        )
        analysis_s.append(time.perf_counter() - started)

    started = time.perf_counter()
    from executorch.devtools import Inspector

    import_s = time.perf_counter() - started
    inspector_s = []
    for _ in range(args.repeat):
        started = time.perf_counter()
        Inspector(etdump_path=str(run / "etdump.etdp"))
        inspector_s.append(time.perf_counter() - started)

    profile = summary.data["profile"]
    coverage = profile["overlay_coverage"]
    best, inspector_best = min(analysis_s), min(inspector_s)
    rows = [
        [
            "etlab analyze_bundle (ETDump + .pte plan + XNN matching + summary/ops/overlays)",
            best,
            statistics.median(analysis_s),
        ],
        ["Inspector(etdump_path=...) load", inspector_best, statistics.median(inspector_s)],
        ["Inspector module import (once)", import_s, None],
    ]
    met = best < TARGET_S and best <= inspector_best
    etdump_mb = (run / "etdump.etdp").stat().st_size / 1e6
    console.table(
        f"GPT-2 XNNPACK, {profile['executions']} measured executions, {etdump_mb:.1f} MB ETDump",
        ["step", "best s", "median s"],
        rows,
        caption=(
            f"{profile['instructions']} instructions, {coverage['delegates_placed']}/{coverage['delegates']} delegates "
            f"placed, {coverage['placed_share'] * 100:.1f}% of delegate time on XNN nodes; "
            f"target < {TARGET_S:.0f} s and <= Inspector: {'met' if met else 'NOT met'}"
        ),
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
