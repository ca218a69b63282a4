"""Quantized variants on full-size DistilBERT and GPT-2: lowering cost, parallel lowering, latency and size.

1. Lowering per scheme: each variant's lowering seconds and peak RSS (as its sidecar records them), cold, into a
   fresh artifacts folder.
2. Cold lowering of fp32 XNNPACK + two schemes (int8-dynamic, 8da4w), sequential (`--jobs 1`) vs parallel
   (`--jobs 2`), each a whole `fab lower` process into its own fresh folder. Target: parallel <= 0.7x sequential.
3. Latency on the local board's native runner (as `setup-board` built it), every scheme interleaved with fp32
   XNNPACK round by round, same inputs and threads: the speedup of each scheme over fp32.
4. .pte size ratios against fp32 XNNPACK.

    .venv/bin/python bench/bench_quantize.py [--models distilbert,gpt2] [--rounds 5] [--iterations 10]
                                             [--threads 2] [--skip-parallel]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(PROJECT_ROOT))

from orchestrator import console  # noqa: E402
from orchestrator.lowering.quantize.schemes import QUANTIZED  # noqa: E402
from orchestrator.lowering.sidecar import read_sidecar  # noqa: E402
from orchestrator.lowering.variants import Variant  # noqa: E402

SCHEMES = tuple(scheme.name for scheme in QUANTIZED)  # every quantized scheme of the registry
PARALLEL_SET = "none,int8-dynamic,8da4w"


def fab_lower(model: str, quantize: str, jobs: int, artifacts: Path, backends: str = "xnnpack") -> float:
    """A whole cold `fab lower` process; returns its wall time in seconds."""
    env = {**os.environ, "ETLAB_ARTIFACTS": str(artifacts)}
    command = [sys.executable, "-m", "fabric", "lower", "--model", model, "--backend", backends, "--quantize",
               quantize, "--weights", "random", "--jobs", str(jobs)]  # fmt: skip
    started = time.perf_counter()
    completed = subprocess.run(command, cwd=PROJECT_ROOT, env=env, capture_output=True, text=True, check=False)
    elapsed = time.perf_counter() - started
    if completed.returncode != 0:
        raise RuntimeError(f"fab lower failed ({completed.returncode}): {completed.stderr[-2000:]}")
    return elapsed


def run_native(runner: Path, pte: Path, inputs: Path, args: argparse.Namespace, work: Path) -> list[float]:
    timings = work / "timings.json"
    command = [
        str(runner), "--model", str(pte), "--inputs", str(inputs), "--threads", str(args.threads),
        "--warmup", str(args.warmup), "--iterations", str(args.iterations), "--timings", str(timings),
    ]  # fmt: skip
    completed = subprocess.run(command, capture_output=True, text=True, check=False)
    if completed.returncode != 0:
        raise RuntimeError(f"runner failed ({completed.returncode}): {completed.stderr.strip().splitlines()[-1:]}")
    return json.loads(timings.read_text())["iterations_ms"]


def local_board_runner() -> Path:
    from orchestrator.boards.inventory import load_inventory
    from orchestrator.deploy.provision import setup_board
    from orchestrator.transport import connect

    with connect(load_inventory().boards["local"]) as conn:
        setup_board(conn)
        return Path(json.loads(Path(conn.workdir, "state.json").read_text())["runner_path"])


def load_average() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def cpu_description() -> str:
    """The CPU and the SIMD extensions XNNPACK's int8 kernels pick from: int8 speedups depend on them (VNNI)."""
    model, flags = "unknown CPU", set()
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "model name":
            model = value.strip()
        elif key.strip() == "flags":
            flags = set(value.split())
            break
    simd = [flag for flag in ("avx2", "fma", "avx512f", "avx512_vnni", "avx_vnni", "amx_int8") if flag in flags]
    return f"{model}, {os.cpu_count()} CPUs, {' '.join(simd) or 'no AVX2'}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="distilbert,gpt2")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--iterations", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--skip-parallel", action="store_true", help="skip the sequential vs parallel lowering")
    args = parser.parse_args(argv)
    console.info(f"machine: {cpu_description()}")
    console.info(f"load average before: {load_average()}")
    runner = local_board_runner()
    with tempfile.TemporaryDirectory(prefix="bench-quantize-") as tmp:
        work = Path(tmp)
        for model in args.models.split(","):
            # 1. every scheme, one cold lowering (parallel workers; the sidecars record each variant's own cost).
            artifacts = work / f"all-{model}"
            wall = fab_lower(model, "none," + ",".join(SCHEMES), 2, artifacts)
            folder = artifacts / model
            sidecars = {
                backend: read_sidecar(folder / f"{model}_{backend}.json")
                for backend in ["xnnpack", *(Variant("xnnpack", s).name for s in QUANTIZED)]
            }
            fp32_size = sidecars["xnnpack"].files["pte"].size
            console.info(f"\n{model}: every scheme lowered in {wall:.1f} s (2 workers), load {load_average()}")
            print(f"| {model} | scheme | lowering s | peak RSS GB | .pte MB | size vs fp32 | FC nodes |")
            for backend, sidecar in sidecars.items():
                size = sidecar.files["pte"].size
                nodes = sidecar.quantization.fully_connected if sidecar.quantization else None
                print(
                    f"| | {backend} | {sidecar.lowering.seconds:.1f} | "
                    f"{sidecar.lowering.peak_rss_bytes / 1e9:.2f} | {size / 1e6:.1f} | "
                    f"{size / fp32_size:.2f} | {nodes or 'fp32'} |"
                )

            # 2. sequential vs parallel cold lowering of fp32 + two schemes.
            if not args.skip_parallel:
                sequential = fab_lower(model, PARALLEL_SET, 1, work / f"seq-{model}")
                parallel = fab_lower(model, PARALLEL_SET, 2, work / f"par-{model}")
                verdict = "✓" if parallel <= 0.7 * sequential else "✗"
                print(
                    f"{model}: cold lowering of {PARALLEL_SET}: sequential {sequential:.1f} s, parallel "
                    f"{parallel:.1f} s = {parallel / sequential:.2f}x (target <= 0.7x) {verdict}; "
                    f"load {load_average()}"
                )

            # 3. latency, interleaved round by round.
            inputs = folder / f"{model}_inputs.etlt"
            samples: dict[str, list[float]] = {backend: [] for backend in sidecars}
            for _ in range(args.rounds):
                for backend in sidecars:
                    samples[backend] += run_native(runner, folder / f"{model}_{backend}.pte", inputs, args, work)
            fp32 = statistics.median(samples["xnnpack"])
            print(f"| {model} | backend | median ms | p10 | p90 | speedup vs fp32 XNNPACK |")
            for backend, values in samples.items():
                median = statistics.median(values)
                deciles = statistics.quantiles(values, n=10)
                print(f"| | {backend} | {median:.1f} | {deciles[0]:.1f} | {deciles[-1]:.1f} | {fp32 / median:.2f}x |")
    console.info(f"load average after: {load_average()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
