"""The numerics pass's cost against the timing pass (issue 53): for each model and variant, on one board,

- making the numerics program (once; cached after): seconds, taps, its reference file's size;
- a `fab run` of the timing pass alone and one with `--numerics` (statistics) and `--numerics=full`, alternated for
  `--rounds` rounds, each a whole process timed from outside; the pass's own runner time from run.json;
- the bundle's size each way (what travels back from the board).

Then `fab analyze` of the last numerics run and its outputs' SQNR (the numerics program's against fp32 eager) next to
the timing pass's (the accuracy check's), which must agree: the taps did not change the program. A text-generation
model (`--model smollm2-135m-gen`) times its generate loop; its numerics pass is one prefill call of the prompt, and
its timing pass is checked by its ids against eager greedy generation.

    .venv/bin/python bench/bench_numerics.py [--model distilbert --model mobilenet-v2] [--quantize int8-dynamic]
        [--board local] [--rounds 3] [--json out.json]

ETLAB_* variables pass through; results go to a temporary ETLAB_RESULTS unless it is set.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def fab(*args: str, env: dict[str, str], check: bool = True) -> tuple[float, str]:
    started = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "fabric", *args], cwd=ROOT, env=env, capture_output=True, text=True)
    elapsed = time.perf_counter() - started
    if check and proc.returncode not in (0, 1):  # 1: an accuracy gate, which a random-weight int8 run may fail
        raise SystemExit(f"fab {' '.join(args)} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return elapsed, proc.stdout + proc.stderr


def newest_run(results: Path, board: str, model: str, backend: str) -> Path:
    runs = sorted((results / board / model / backend).glob("*/result_manifest.json"))
    return runs[-1].parent


def bundle_bytes(run: Path) -> int:
    return sum(path.stat().st_size for path in run.iterdir() if path.is_file())


def cpu_name() -> str:
    """The CPU as /proc/cpuinfo names it, with the int8 instructions that decide whether quantizing pays."""
    name, flags = platform.processor(), set()
    family = model = ""
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        key, _, value = line.partition(":")
        key, value = key.strip(), value.strip()
        if key == "model name":
            name = value
        elif key == "cpu family":
            family = value
        elif key == "model":
            model = value
        elif key == "flags":
            flags = set(value.split())
    int8 = [flag for flag in ("avx2", "avx512f", "avx512_vnni", "avx_vnni", "amx_int8") if flag in flags]
    return f"{name} (family {family} model {model}; {', '.join(int8) or 'no AVX2'})"


def measure(model: str, variant: str, quantize: str, board: str, rounds: int, env: dict[str, str]) -> dict[str, Any]:
    results = Path(env["ETLAB_RESULTS"])
    chosen = ["--model", model, "--board", board, "--backend", "xnnpack", "--quantize", quantize]
    fab("lower", "--model", model, "--backend", "xnnpack", "--quantize", quantize, env=env)
    sys.path.insert(0, str(ROOT))
    from orchestrator.lowering.artifacts import load_artifact
    from orchestrator.lowering.export.numerics import cached_numerics, make_numerics
    from orchestrator.lowering.variants import VARIANTS

    artifact = load_artifact(
        model, VARIANTS[variant], Path(env["ETLAB_ARTIFACTS"]) if "ETLAB_ARTIFACTS" in env else None
    )
    started = time.perf_counter()
    cached = cached_numerics(artifact) is not None
    numerics = make_numerics(artifact)
    made_s = time.perf_counter() - started
    fab("run", *chosen, "--iterations", "3", "--warmup", "1", env=env)  # pushes and warms the board once
    walls: dict[str, list[float]] = {"timing": [], "stats": [], "full": []}
    passes: dict[str, list[float]] = {"stats": [], "full": []}
    sizes: dict[str, int] = {}
    for _ in range(rounds):
        for mode, extra in (("timing", ()), ("stats", ("--numerics",)), ("full", ("--numerics=full",))):
            wall, _ = fab("run", *chosen, "--iterations", "10", "--warmup", "2", *extra, env=env)
            walls[mode].append(wall)
            fab("pull", "--board", board, "--latest", env=env)
            run = newest_run(results, board, model, variant)
            sizes[mode] = bundle_bytes(run)
            record = json.loads((run / "run.json").read_text())
            if mode != "timing":
                numerics_pass = record["numerics_pass"]
                assert numerics_pass["status"] == "ok", numerics_pass
                passes[mode].append(numerics_pass["duration_s"])
    fab("analyze", "--bundle", str(run), env=env)
    summary = json.loads((run / "analysis" / "summary.json").read_text())
    correctness = summary["correctness"]
    return {
        "model": model,
        "variant": variant,
        "taps": len(numerics.record.taps),
        "numerics_program_s": None if cached else round(made_s, 1),
        "reference_mb": round(numerics.reference.stat().st_size / 1e6, 2),
        "numerics_pte_mb": round(numerics.pte.stat().st_size / 1e6, 2),
        "timed_pte_mb": round(artifact.pte.stat().st_size / 1e6, 2),
        "wall_s": {mode: round(statistics.median(values), 2) for mode, values in walls.items()},
        "numerics_pass_s": {mode: round(statistics.median(values), 3) for mode, values in passes.items()},
        "bundle_mb": {mode: round(size / 1e6, 3) for mode, size in sizes.items()},
        "outputs_sqnr_db": {
            "numerics program": summary["numerics"]["output_sqnr_db"],
            # a generation's timing pass is checked by its ids against eager greedy generation, not by SQNR
            "timing pass": [output.get("sqnr_db") for output in correctness.get("outputs") or []]
            or (summary.get("generation") or {}).get("tokens"),
        },
        "losing_most": [
            (row["op"], row["module"], row["sqnr_db"], row["introduced_db"])
            for row in summary["numerics"]["losing_most"][:3]
        ],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", action="append", help="default: distilbert and mobilenet-v2")
    parser.add_argument("--quantize", default="none", help="none (fp32) or a scheme: the variant measured")
    parser.add_argument("--board", default="local")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    env = dict(os.environ)
    env.setdefault("ETLAB_RESULTS", tempfile.mkdtemp(prefix="bench-numerics-"))
    variant = "xnnpack" if args.quantize == "none" else f"xnnpack-{args.quantize}"
    print(f"machine: {cpu_name()}, {os.cpu_count()} cores; board {args.board}; variant {variant}", flush=True)
    found = []
    for model in args.model or ["distilbert", "mobilenet-v2"]:
        row = measure(model, variant, args.quantize, args.board, args.rounds, env)
        found.append(row)
        wall = row["wall_s"]
        print(
            f"{model} {variant}: {row['taps']} taps; numerics program "
            f"{row['numerics_program_s'] if row['numerics_program_s'] is not None else 'cached'} s, "
            f"{row['numerics_pte_mb']} MB (timed {row['timed_pte_mb']} MB), reference {row['reference_mb']} MB\n"
            f"  fab run: timing {wall['timing']} s, + numerics {wall['stats']} s "
            f"(ratio {wall['stats'] / wall['timing']:.2f}), + numerics full {wall['full']} s "
            f"(ratio {wall['full'] / wall['timing']:.2f}); the pass itself {row['numerics_pass_s']} s\n"
            f"  bundle: {row['bundle_mb']} MB; outputs' SQNR {row['outputs_sqnr_db']}\n"
            f"  losing most: {row['losing_most']}",
            flush=True,
        )
    if args.json:
        args.json.write_text(json.dumps({"machine": cpu_name(), "rows": found}, indent=1))


if __name__ == "__main__":
    main()
