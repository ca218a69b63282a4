"""ONNX Runtime's side of bench_peers.py: one process per round, so a round can run under bench/deny_amx.c (a
process-wide seccomp filter) as LiteRT's and etlab's runner do.

    peers_ort.py MODEL.onnx INPUTS.npz OUTPUTS.npz THREADS WARMUP ITERATIONS SPIN
        the CPU execution provider, graph optimizations ORT_ENABLE_ALL, THREADS intra-op threads, its pool's threads
        spinning between operators (SPIN 1, ORT's default) or not (0); WARMUP untimed runs, then ITERATIONS timed
        `run`s; prints the times (ms) as a JSON list, writes the outputs.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np


def time_model(
    model: Path, inputs: Path, outputs: Path, threads: int, warmup: int, iterations: int, spinning: bool
) -> None:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.add_session_config_entry("session.intra_op.allow_spinning", "1" if spinning else "0")
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    session = ort.InferenceSession(str(model), options, providers=["CPUExecutionProvider"])
    arrays = np.load(inputs)
    feed = {node.name: arrays[node.name] for node in session.get_inputs()}
    for _ in range(warmup):
        session.run(None, feed)
    times = []
    for _ in range(iterations):
        started = time.perf_counter()
        result = session.run(None, feed)
        times.append((time.perf_counter() - started) * 1000.0)
    # Any: mypy would match the arrays against savez's allow_pickle too
    named: dict[str, Any] = {f"output_{i}": np.asarray(array) for i, array in enumerate(result)}
    np.savez(outputs, **named)
    print(json.dumps(times))


if __name__ == "__main__":
    model, inputs, outputs, threads, warmup, iterations, spin = sys.argv[1:]
    time_model(Path(model), Path(inputs), Path(outputs), int(threads), int(warmup), int(iterations), spin == "1")
