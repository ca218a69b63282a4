"""Counters pass overhead against the timing pass, and memory accounting overhead on the timing pass.

1. Counters pass vs timing pass, same thread count (1, the counters pass's own): the native runner with ETDump, and
   the same with `--counters` (the software set this machine opens: task-clock, page-faults, context-switches),
   interleaved round by round on the same .pte and inputs. Reported: the ratio of median iteration times per model.
2. Memory accounting: the runner reads its memory at 5 phase boundaries (never inside the timed loop, so timed
   iterations cannot see it); `memory_probe_cost.cpp` times one mark (/proc/self/status, getrusage, clear_refs) in a
   process holding --rss-mb of resident memory, and the overhead is 5 marks against one run's wall time.

    .venv/bin/python bench/bench_counters.py [--rounds 8] [--iterations 10] [--warmup 2] [--rss-mb 512]
                                             [--models distilbert-tiny,gpt2-tiny] [--full]

`--full` adds full-size DistilBERT (XNNPACK, lowered by `fab lower`, random weights). Targets: memory accounting
<= 1% of the timing pass.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(PROJECT_ROOT))

from orchestrator import console  # noqa: E402

SOFTWARE = "task_clock,page_faults,context_switches"
PHASE_MARKS = 5


def runner_binary() -> Path:
    """The runner built from this tree's sources (the test suite's cache, keyed on the sources)."""
    from tests.plugins.runner import build_runner

    return build_runner()


def artifacts(models: list[str], full: bool) -> list[tuple[str, Path, Path]]:
    from orchestrator.lowering.artifacts import load_artifact
    from orchestrator.lowering.builtins import BUILTIN_SPECS
    from orchestrator.lowering.export import lower as lowering
    from orchestrator.lowering.variants import Variant
    from tests.plugins.artifacts import ARTIFACT_CACHE

    found = []
    names = [*models, *(["distilbert"] if full else [])]
    for name in names:
        for backend in ("xnnpack", "portable") if name.endswith("-tiny") else ("xnnpack",):
            root = ARTIFACT_CACHE if name.endswith("-tiny") else None  # the tiny ones the tests lowered
            lowering.lower(BUILTIN_SPECS[name], variants=[Variant(backend)], weights="random", root=root)
            artifact = load_artifact(name, Variant(backend), root)
            found.append((f"{name} {backend}", artifact.pte, artifact.paths.reference_inputs))
    return found


def one_run(runner: Path, pte: Path, inputs: Path, work: Path, args: argparse.Namespace, counters: bool) -> dict:
    argv = [str(runner), "--model", str(pte), "--inputs", str(inputs), "--threads", "1",
            "--warmup", str(args.warmup), "--iterations", str(args.iterations),
            "--etdump", str(work / "e.etdp"), "--timings", str(work / "t.json")]  # fmt: skip
    if counters:
        argv += ["--counters", SOFTWARE, "--counters-out", str(work / "c.json")]
    subprocess.run(argv, check=True, capture_output=True)
    return json.loads((work / "t.json").read_text())


def counters_overhead(runner: Path, cases: list[tuple[str, Path, Path]], args: argparse.Namespace) -> list[list]:
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        work = Path(folder)
        for label, pte, inputs in cases:
            samples: dict[bool, list[float]] = {False: [], True: []}
            for _ in range(args.rounds):
                for counters in (False, True):
                    samples[counters] += one_run(runner, pte, inputs, work, args, counters)["iterations_ms"]
            timing, counting = statistics.median(samples[False]), statistics.median(samples[True])
            rows.append([label, round(timing, 3), round(counting, 3), round(counting / timing, 3)])
    return rows


def memory_overhead(runner: Path, cases: list[tuple[str, Path, Path]], args: argparse.Namespace) -> list[list]:
    source = PROJECT_ROOT / "board" / "runner" / "src"
    with tempfile.TemporaryDirectory() as folder:
        binary = Path(folder) / "memory_probe_cost"
        harness = Path(__file__).with_name("memory_probe_cost.cpp")
        subprocess.run(["g++", "-O2", "-std=c++17", f"-I{source}", str(harness), str(source / "memory_probe.cpp"),
                        str(source / "json.cpp"), "-o", str(binary)], check=True)  # fmt: skip
        cost = json.loads(subprocess.run([str(binary), str(args.rss_mb), "200"], check=True, capture_output=True,
                                         text=True).stdout)  # fmt: skip
        rows = []
        work = Path(folder)
        for label, pte, inputs in cases:
            timings = one_run(runner, pte, inputs, work, args, False)
            run_ms = timings["load_ms"] + timings["method_init_ms"] + sum(timings["warmup_ms"])
            run_ms += sum(timings["iterations_ms"])
            added_ms = PHASE_MARKS * cost["us_per_mark"] / 1000.0
            rows.append([label, round(run_ms, 1), round(added_ms, 3), f"{added_ms / run_ms * 100:.3f}%"])
    return [[f"1 mark at {cost['rss_mb']} MB RSS", cost["us_per_mark"], cost["peak_reset"]], *rows]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--iterations", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--rss-mb", type=int, default=512)
    parser.add_argument("--models", default="distilbert-tiny,gpt2-tiny")
    parser.add_argument("--full", action="store_true")
    args = parser.parse_args()
    runner = runner_binary()
    cases = artifacts([m for m in args.models.split(",") if m], args.full)
    rows = counters_overhead(runner, cases, args)
    console.table("Counters pass vs timing pass (1 thread, median ms per iteration)",
                  ["model", "timing pass", "counters pass", "ratio"], rows)  # fmt: skip
    cost, *memory = memory_overhead(runner, cases, args)
    console.table("Memory accounting on the timing pass", ["model", "run ms", "5 marks ms", "overhead"], memory,
                  caption=f"{cost[0]}: {cost[1]:.1f} µs (peak reset works: {cost[2]})")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
