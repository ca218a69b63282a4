"""Native runner vs ExecuTorch's Python runtime vs native runner with ETDump, on full-size DistilBERT (XNNPACK).

The three are interleaved round by round (native, python, native+etdump, native, ...) with the same
.pte, the same inputs and the same thread count, so drift on a shared machine hits all of them alike.
Each round runs `--warmup` untimed and `--iterations` timed executions per variant; the Python runtime
keeps its program loaded across rounds (load cost is excluded for every variant).

    .venv/bin/python bench/bench_runner.py [--rounds 10] [--iterations 10] [--warmup 3] [--threads 2]
                                           [--pte PATH] [--runner PATH]

Targets: native median <= Python median; ETDump adds <= 5%.
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

PROJECT_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(PROJECT_ROOT))

from orchestrator import console  # noqa: E402
from orchestrator.paths import state_dir  # noqa: E402
from orchestrator.tensorfile import NamedTensor, write_tensors  # noqa: E402
from orchestrator.versions import executorch_version  # noqa: E402
from tests.plugins.runner import build_runner  # noqa: E402

SEQUENCE_LENGTH = 128
COLUMN = {"native": 1, "python": 2, "native+etdump": 3}  # in the per-round rows
RATIOS = [("native / python", "native", "python", 1.0), ("etdump / native", "native+etdump", "native", 1.05)]


def lower_distilbert_xnnpack(pte: Path) -> None:
    """Full-size DistilBERT (random weights from DistilBertConfig()), inputs input_ids + attention_mask [1, 128]."""
    import torch
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.exir import to_edge_transform_and_lower
    from transformers import DistilBertConfig, DistilBertForMaskedLM

    class Logits(torch.nn.Module):
        def __init__(self, model: torch.nn.Module) -> None:
            super().__init__()
            self.model = model

        def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
            return self.model(input_ids=input_ids, attention_mask=attention_mask).logits

    torch.manual_seed(0)
    model = Logits(DistilBertForMaskedLM(DistilBertConfig()).eval()).eval()
    example = (torch.zeros(1, SEQUENCE_LENGTH, dtype=torch.int64), torch.ones(1, SEQUENCE_LENGTH, dtype=torch.int64))
    exported = torch.export.export(model, example, strict=False)
    program = to_edge_transform_and_lower(exported, partitioner=[XnnpackPartitioner()]).to_executorch()
    pte.parent.mkdir(parents=True, exist_ok=True)
    partial = pte.with_suffix(".partial")
    partial.write_bytes(program.buffer)
    partial.rename(pte)


def bench_inputs() -> list[NamedTensor]:
    ids = ((np.arange(SEQUENCE_LENGTH, dtype=np.int64) * 7 + 3) % 100).reshape(1, SEQUENCE_LENGTH)
    return [NamedTensor("input_ids", ids), NamedTensor("attention_mask", np.ones_like(ids))]


def run_native(
    runner: Path, pte: Path, inputs: Path, args: argparse.Namespace, work: Path, etdump: bool
) -> list[float]:
    timings = work / "timings.json"
    command = [
        str(runner), "--model", str(pte), "--inputs", str(inputs), "--threads", str(args.threads),
        "--warmup", str(args.warmup), "--iterations", str(args.iterations), "--timings", str(timings),
    ]  # fmt: skip
    if etdump:
        command += ["--etdump", str(work / "etdump.etdp")]
    completed = subprocess.run(command, capture_output=True, text=True, check=False)
    if completed.returncode != 0:
        raise RuntimeError(f"runner failed ({completed.returncode}): {completed.stderr.strip().splitlines()[-1:]}")
    return json.loads(timings.read_text())["iterations_ms"]


class PythonRuntime:
    """executorch.runtime with the program loaded once; each execute() call is timed, input conversion included."""

    def __init__(self, pte: Path, threads: int, inputs: list[NamedTensor]) -> None:
        import torch
        from executorch.extension.pybindings import portable_lib
        from executorch.runtime import Runtime

        portable_lib._unsafe_reset_threadpool(threads)  # before loading: XNNPACK keeps the pool it starts with
        self.threads = portable_lib._threadpool_get_thread_count()
        self.program = Runtime.get().load_program(pte)
        self.method = self.program.load_method("forward")
        self.inputs = [torch.from_numpy(tensor.array) for tensor in inputs]

    def run(self, warmup: int, iterations: int) -> list[float]:
        for _ in range(warmup):
            self.method.execute(self.inputs)
        times = []
        for _ in range(iterations):
            start = time.perf_counter()
            self.method.execute(self.inputs)
            times.append((time.perf_counter() - start) * 1000.0)
        return times


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--iterations", type=int, default=10, help="timed runs per variant per round")
    parser.add_argument("--warmup", type=int, default=3, help="untimed runs per variant per round")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--pte", type=Path, help="an existing XNNPACK DistilBERT .pte (default: lower and cache one)")
    parser.add_argument("--runner", type=Path, help="an etlab_runner binary (default: build and cache one)")
    args = parser.parse_args(argv)

    timer = console.StageTimer()
    pte = args.pte or state_dir() / "bench" / f"distilbert_xnnpack_et{executorch_version()}.pte"
    if not pte.is_file():
        if args.pte:
            parser.error(f"--pte {pte} does not exist")
        with timer.stage(f"lowering full-size DistilBERT to {pte}"):
            lower_distilbert_xnnpack(pte)
    with timer.stage("building the native runner (cached)"):
        runner = args.runner or build_runner()

    with tempfile.TemporaryDirectory(prefix="bench-runner-") as tmp:
        work = Path(tmp)
        inputs = bench_inputs()
        inputs_path = work / "inputs.etlt"
        write_tensors(inputs_path, inputs)
        with timer.stage("loading the program in the Python runtime"):
            python = PythonRuntime(pte, args.threads, inputs)
        if python.threads != args.threads:
            console.warn(f"the Python runtime uses {python.threads} threads, not {args.threads}")

        samples: dict[str, list[float]] = {"native": [], "python": [], "native+etdump": []}
        round_rows = []
        for round_index in range(1, args.rounds + 1):
            with timer.stage(f"round {round_index}/{args.rounds}", quiet=True):
                native = run_native(runner, pte, inputs_path, args, work, etdump=False)
                python_ms = python.run(args.warmup, args.iterations)
                etdump = run_native(runner, pte, inputs_path, args, work, etdump=True)
            samples["native"] += native
            samples["python"] += python_ms
            samples["native+etdump"] += etdump
            round_rows.append(
                [round_index, statistics.median(native), statistics.median(python_ms), statistics.median(etdump)]
            )
            console.info(
                f"round {round_index}: native {round_rows[-1][1]:.2f} ms, python {round_rows[-1][2]:.2f} ms, "
                f"native+etdump {round_rows[-1][3]:.2f} ms (medians)"
            )

    console.table("Per-round medians (ms)", ["round", "native", "python", "native+etdump"], round_rows)
    console.table(
        f"DistilBERT XNNPACK, {args.threads} threads, {args.rounds} rounds x {args.iterations} iterations (ms)",
        ["variant", "runs", "median", "p10", "min", "p90"],
        [
            [name, len(values), statistics.median(values), *np.percentile(values, [10, 0, 90]).tolist()]
            for name, values in samples.items()
        ],
    )
    # Paired per round: both variants of a ratio ran within seconds of each other, so load from other
    # processes on a shared machine mostly cancels out; the median over rounds drops the unlucky ones.
    ratio_rows = []
    for label, numerator, denominator, target in RATIOS:
        of_medians = statistics.median(samples[numerator]) / statistics.median(samples[denominator])
        paired = statistics.median(row[COLUMN[numerator]] / row[COLUMN[denominator]] for row in round_rows)
        of_p10 = float(np.percentile(samples[numerator], 10) / np.percentile(samples[denominator], 10))
        met = "yes" if paired <= target else "NO"
        ratio_rows.append([label, of_medians, paired, of_p10, f"<= {target:.2f}", met])
    console.table(
        "Ratios",
        ["ratio", "of medians", "median of per-round ratios", "of p10", "target", "met (per-round)"],
        ratio_rows,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
