"""The board's peak arithmetic rate as setup-board measures it (issue 55): XNNPACK's fp32 GEMM and its int8 GEMM
(8-bit weights per channel, activations quantized per row at run time), each the lowered Linear program of
deploy/board_limits.py that the local board's runner times, against PyTorch's own kernels for the same GEMM on the
same machine and threads, alternated for `--rounds` rounds; the best of each side and the ratios.

- fp32: `torch.nn.functional.linear` on the same M x K x N (oneDNN/MKL's sgemm on x86).
- int8: `torch.ao.nn.quantized.dynamic.Linear` (FBGEMM's dynamic int8 Linear: the same quantization as the probe's).

A ratio near 1 says the probe measures what the CPU's best GEMM kernels reach, so "compute-bound at N% of peak"
is against a peak a kernel really reaches, not a datasheet's.

    .venv/bin/python bench/bench_compute.py [--threads 1 --threads 2] [--rounds 3] [--runner PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.bench_quantize import cpu_description, load_average, local_board_runner  # noqa: E402
from orchestrator.deploy.board_limits import GEMM, ITERATIONS, WARMUP, probe_programs  # noqa: E402

M, K, N = GEMM
OPS = 2.0 * M * K * N


def etlab_rate(runner: Path, program: Path, threads: int) -> float:
    with tempfile.TemporaryDirectory() as scratch:
        timings = Path(scratch) / "timings.json"
        argv = [str(runner), "--model", str(program), "--threads", str(threads), "--iterations", str(ITERATIONS),
                "--warmup", str(WARMUP), "--timings", str(timings)]  # fmt: skip
        subprocess.run(argv, capture_output=True, check=True)
        best_ms = min(json.loads(timings.read_text())["iterations_ms"])
    return OPS / (best_ms / 1000.0)


def torch_rate(kind: str, threads: int) -> float:
    import torch

    torch.set_num_threads(threads)
    torch.manual_seed(0)
    x, linear = torch.randn(M, K), torch.nn.Linear(K, N, bias=False).eval()
    if kind == "int8":
        linear = torch.ao.quantization.quantize_dynamic(torch.nn.Sequential(linear), {torch.nn.Linear}, torch.qint8)
    best = float("inf")
    with torch.no_grad():
        for index in range(ITERATIONS + WARMUP):
            started = time.perf_counter()
            linear(x)
            if index >= WARMUP:
                best = min(best, time.perf_counter() - started)
    return OPS / best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, action="append")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--runner", type=Path)
    args = parser.parse_args()
    runner = args.runner or local_board_runner()
    programs = probe_programs()
    print(f"machine: {cpu_description()}, {os.cpu_count()} cores; load {load_average()}", flush=True)
    print(f"GEMM {M}x{K}x{N} ({OPS / 1e9:.3f} G ops), best of {ITERATIONS} runs after {WARMUP} warm-up", flush=True)
    for threads in args.threads or [1, os.cpu_count() or 1]:
        for kind, peer in (("fp32", "torch linear (oneDNN)"), ("int8", "torch dynamic int8 Linear (FBGEMM)")):
            ours, theirs = [], []
            for _ in range(args.rounds):  # alternated: a disturbance hits both sides alike
                ours.append(etlab_rate(runner, programs[kind], threads))
                theirs.append(torch_rate(kind, threads))
            print(f"{threads} thread(s) {kind}: etlab probe (XNNPACK) {_rounds(ours)}; {peer} {_rounds(theirs)}; "
                  f"ratio {max(ours) / max(theirs):.3f}", flush=True)  # fmt: skip
    print(f"load after: {load_average()}")


def _rounds(values: list[float]) -> str:
    return f"{max(values) / 1e9:.1f} G/s (rounds {', '.join(f'{v / 1e9:.1f}' for v in values)})"


if __name__ == "__main__":
    main()
