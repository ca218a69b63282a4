"""The board's read bandwidth as setup-board measures it (issue 55) against independent measurements on the same
machine, at the same thread counts over the same bytes, alternated for `--rounds` rounds; the best round of each
side (the least disturbed) and the ratios. Target: within 10% of the STREAM-style tool.

- likwid-bench (Debian's `likwid`): its `load` kernel for the widest vectors the CPU has (load_avx512, load_avx,
  else load), hand-written assembly streaming reads over a working set of the same size: the STREAM-style peer.
- sysbench's sequential memory read (`sysbench memory --memory-oper=read`): it reads one 4-byte int at a time into
  a volatile, which one core cannot issue fast enough to fill the memory bus, so it reads low; shown for reference.

    .venv/bin/python bench/bench_bandwidth.py [--threads 1 --threads 2] [--rounds 4] [--runner PATH]

The runner is the local board's (setup-board provisions it: the same sources every board builds).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.bench_quantize import cpu_description, load_average, local_board_runner  # noqa: E402

MIB = 1 << 20


def etlab_probe(runner: Path, threads: int, rounds: int) -> dict:
    argv = [str(runner), "--probe-bandwidth", "--threads", str(threads), "--probe-rounds", str(rounds)]
    return json.loads(subprocess.run(argv, capture_output=True, text=True, check=True).stdout)


def sysbench_read(threads: int, block_bytes: int, passes: int) -> float:
    """sysbench's sequential read of a block of `block_bytes` per thread, `passes` times each: bytes per second."""
    total = block_bytes * threads * passes
    argv = ["sysbench", "memory", f"--threads={threads}", f"--memory-block-size={block_bytes}",
            f"--memory-total-size={total}", "--memory-oper=read", "--memory-access-mode=seq", "--time=0",
            "run"]  # fmt: skip
    text = subprocess.run(argv, capture_output=True, text=True, check=True).stdout
    found = re.search(r"\(([\d.]+) MiB/sec\)", text)
    if found is None:
        raise SystemExit(f"sysbench said no rate:\n{text}")
    return float(found.group(1)) * MIB


def likwid_kernel() -> str:
    flags = next((line for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("flags")), "")
    return "load_avx512" if " avx512f" in flags else "load_avx" if " avx" in flags else "load"


def likwid_load(kernel: str, threads: int, total_bytes: int) -> float:
    """likwid-bench's load kernel over `total_bytes` on `threads` threads (its own domain N): bytes per second."""
    argv = ["likwid-bench", "-t", kernel, "-W", f"N:{total_bytes // 1024}kB:{threads}"]
    text = subprocess.run(argv, capture_output=True, text=True, check=True).stdout
    found = re.search(r"MByte/s:\s+([\d.]+)", text)
    if found is None:
        raise SystemExit(f"likwid-bench said no rate:\n{text}")
    return float(found.group(1)) * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, action="append")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--runner", type=Path)
    args = parser.parse_args()
    for tool, package in (("likwid-bench", "likwid"), ("sysbench", "sysbench")):
        if shutil.which(tool) is None:
            raise SystemExit(f"{tool} is not installed (Debian: apt-get install {package})")
    kernel = likwid_kernel()
    runner = args.runner or local_board_runner()
    print(f"machine: {cpu_description()}, {os.cpu_count()} cores; load {load_average()}", flush=True)
    for threads in args.threads or [1, os.cpu_count() or 1]:
        ours: list[float] = []
        peers: dict[str, list[float]] = {f"likwid-bench {kernel}": [], "sysbench read": []}
        buffer = 0
        for _ in range(args.rounds):  # alternated: a disturbance hits every side alike
            answer = etlab_probe(runner, threads, 4)
            buffer = answer["buffer_bytes"]
            ours.append(answer["best_bytes_per_s"])
            peers[f"likwid-bench {kernel}"].append(likwid_load(kernel, threads, buffer))
            peers["sysbench read"].append(sysbench_read(threads, buffer // threads, 4))
        line = f"{threads} thread(s), {buffer / MIB:.0f} MiB in all: etlab probe {_rounds(ours)}"
        for name, values in peers.items():
            line += f"; {name} {_rounds(values)}, ratio etlab/{name.split()[0]} {max(ours) / max(values):.3f}"
        print(line, flush=True)
    print(f"load after: {load_average()}")


def _rounds(values: list[float]) -> str:
    return f"{max(values) / 1e9:.2f} GB/s (rounds {', '.join(f'{v / 1e9:.2f}' for v in values)})"


if __name__ == "__main__":
    main()
