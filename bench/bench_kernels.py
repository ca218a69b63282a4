"""etlab's attention kernel (board/runner/src/kernels/) on SmolLM2-135M's attention shape (9 query heads over 3 KV
heads of 64), through `etlab_kernel_check --repeat`: a decode step reading the whole filled cache and a 64-token
prompt, per layer, by instruction set and threads; the peer is PyTorch's own SDPA (grouped-query, over the same
filled rows, same threads) on the same machine in the same run.

    .venv/bin/python bench/bench_kernels.py [--repeat 200]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from orchestrator.tensorfile import NamedTensor, write_tensors
from tests.plugins.runner import KERNEL_CHECK_NAME, build_runner

QUERY_HEADS, KV_HEADS, HEAD_DIM, LAYERS = 9, 3, 64, 30


def cases() -> dict[str, tuple[int, np.ndarray]]:
    """name -> (cache rows, positions)."""
    return {
        "decode@256": (256, np.array([255])),
        "decode@1024": (1024, np.array([1023])),
        "prefill64": (256, np.arange(64)),
    }


def kernel_microseconds(binary: Path, folder: Path, threads: int, isa: str, repeat: int) -> dict[str, float]:
    rng = np.random.default_rng(0)
    tensors = []
    for n, (capacity, positions) in enumerate(cases().values()):
        query = rng.standard_normal((1, QUERY_HEADS, len(positions), HEAD_DIM)).astype(np.float32)
        keys, values = rng.standard_normal((2, 1, KV_HEADS, capacity, HEAD_DIM)).astype(np.float32)
        tensors += [
            NamedTensor(f"attend.{n}.query", query),
            NamedTensor(f"attend.{n}.key_cache", keys),
            NamedTensor(f"attend.{n}.value_cache", values),
            NamedTensor(f"attend.{n}.positions", positions.astype(np.int64)),
            NamedTensor(f"attend.{n}.scale", np.array(HEAD_DIM**-0.5)),
        ]
    write_tensors(folder / "in.etlt", tensors)
    done = subprocess.run(
        [str(binary), "--threads", str(threads), "--isa", isa, "--repeat", str(repeat), str(folder / "in.etlt"),
         str(folder / "out.etlt")],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    line = json.loads(done.stdout.strip().splitlines()[-1])
    return {name: line["microseconds"][f"attend.{n}"] for n, name in enumerate(cases())}


def torch_microseconds(threads: int, repeat: int) -> dict[str, float]:
    import torch

    torch.set_num_threads(threads)
    found = {}
    for name, (_capacity, positions) in cases().items():
        rows = int(positions.max()) + 1
        query = torch.randn(1, QUERY_HEADS, len(positions), HEAD_DIM)
        keys, values = torch.randn(2, 1, KV_HEADS, rows, HEAD_DIM)
        causal = len(positions) > 1
        times = []
        for _ in range(repeat + 1):
            start = time.perf_counter()
            torch.nn.functional.scaled_dot_product_attention(query, keys, values, is_causal=causal, enable_gqa=True)
            times.append((time.perf_counter() - start) * 1e6)
        found[name] = statistics.median(times[1:])
    return found


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=200)
    args = parser.parse_args()
    binary = build_runner().parent / KERNEL_CHECK_NAME
    print(f"µs per layer (median of {args.repeat}); a SmolLM2-135M step is {LAYERS} layers")
    print(f"{'case':<12} {'threads':>7} {'avx2':>9} {'portable':>9} {'torch sdpa':>11} {'torch/avx2':>10}")
    with tempfile.TemporaryDirectory() as scratch:
        for threads in (1, 2):
            fast = kernel_microseconds(binary, Path(scratch), threads, "avx2", args.repeat)
            plain = kernel_microseconds(binary, Path(scratch), threads, "portable", args.repeat)
            peer = torch_microseconds(threads, args.repeat)
            for name in cases():
                print(
                    f"{name:<12} {threads:>7} {fast[name]:>9.1f} {plain[name]:>9.1f} {peer[name]:>11.1f} "
                    f"{peer[name] / fast[name]:>9.2f}x"
                )


if __name__ == "__main__":
    main()
