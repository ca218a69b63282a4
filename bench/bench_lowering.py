"""Lowering benchmark: full-size DistilBERT and GPT-2, both backends.

For each model and backend, a fresh process lowers with --force (random weights, so no hub is needed) and
reports the wall time per stage, the process's peak RSS and the .pte size. Then a whole `fab lower` with
nothing changed is timed: the cache hit, next to the full lowering it replaces.

    .venv/bin/python bench/bench_lowering.py [--models distilbert,gpt2] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

CHILD = """
import json, resource, sys, time
started = time.perf_counter()
from orchestrator.lowering.export import lower as lowering
from orchestrator.lowering.builtins import BUILTIN_SPECS
from orchestrator.lowering.variants import Variant
variant = Variant.parse(sys.argv[2])
result = lowering.lower(BUILTIN_SPECS[sys.argv[1]], variants=[variant], weights="random", force=True)
item = result.variants[variant]
print(json.dumps({
    "stages": result.stage_seconds,
    "total_s": time.perf_counter() - started,
    "pte_mb": item.sidecar.pte_size_mb,
    "delegates": item.sidecar.delegation.delegate_call_sites,
    "kernel_calls": item.sidecar.delegation.instructions["KernelCall"],
    "delegate_calls": item.sidecar.delegation.instructions["DelegateCall"],
    "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
}))
"""


def lower_in_child(model: str, backend: str) -> dict:
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, model, backend], cwd=ROOT, capture_output=True, text=True, check=False
    )
    if proc.returncode != 0:
        raise SystemExit(f"lowering {model}/{backend} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def cache_hit_seconds(model: str) -> float:
    started = time.perf_counter()
    proc = subprocess.run(
        [str(ROOT / ".venv" / "bin" / "fab"), "lower", "--model", model, "--weights", "random"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    elapsed = time.perf_counter() - started
    if proc.returncode != 0 or "using cached artifacts" not in proc.stderr:
        raise SystemExit(f"expected a cache hit for {model}:\n{proc.stderr[-2000:]}")
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="distilbert,gpt2")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args()

    machine = f"{platform.machine()}, {os.cpu_count()} cores, {platform.python_version()}, {platform.platform()}"
    print(f"machine: {machine}")
    figures: dict = {"machine": machine, "models": {}}
    for model in args.models.split(","):
        per_backend = {backend: lower_in_child(model, backend) for backend in ("portable", "xnnpack")}
        hit = cache_hit_seconds(model)
        figures["models"][model] = {"backends": per_backend, "cache_hit_s": hit}
        for backend, row in per_backend.items():
            stages = ", ".join(f"{name} {seconds:.2f}s" for name, seconds in row["stages"].items())
            print(
                f"{model:<11} {backend:<9} total {row['total_s']:6.1f} s  peak RSS {row['peak_rss_mb']:7.0f} MB  "
                f".pte {row['pte_mb']:7.1f} MB  delegates {row['delegates']:3d}  "
                f"kernel/delegate calls {row['kernel_calls']}/{row['delegate_calls']}\n      stages: {stages}"
            )
        full = sum(row["total_s"] for row in per_backend.values())
        print(
            f"{model:<11} cache hit (whole `fab lower`, both backends): {hit:.2f} s vs {full:.1f} s full lowering "
            f"({full / hit:.0f}x faster)"
        )
    print(f"children peak RSS (max of all): {resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024:.0f} MB")
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()
