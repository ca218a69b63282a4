"""Native runner vs ExecuTorch's Python runtime vs native runner with ETDump, on full-size DistilBERT (XNNPACK).

The three are interleaved round by round (native, python, native+etdump, native, ...) with the same
.pte, the same inputs and the same thread count, so drift on a shared machine hits all of them alike.
Each round runs `--warmup` untimed and `--iterations` timed executions per variant; the Python runtime
keeps its program loaded across rounds (load cost is excluded for every variant).

    .venv/bin/python bench/bench_runner.py [--rounds 10] [--iterations 10] [--warmup 3] [--threads 2]
                                           [--pte PATH --inputs PATH] [--runner PATH]

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
from orchestrator.tensorfile import NamedTensor, read_tensors  # noqa: E402

COLUMN = {"native": 1, "python": 2, "native+etdump": 3}  # in the per-round rows
RATIOS = [("native / python", "native", "python", 1.0), ("etdump / native", "native+etdump", "native", 1.05)]


def distilbert_xnnpack() -> tuple[Path, Path]:
    """Full-size DistilBERT (random weights) lowered by `fab lower` (cached in artifacts/): .pte and its inputs."""
    from orchestrator.lowering.artifacts import load_artifact
    from orchestrator.lowering.builtins import BUILTIN_SPECS
    from orchestrator.lowering.export import lower as lowering
    from orchestrator.lowering.variants import Variant

    lowering.lower(BUILTIN_SPECS["distilbert"], variants=[Variant("xnnpack")], weights="random")
    artifact = load_artifact("distilbert", Variant("xnnpack"))
    return artifact.pte, artifact.paths.reference_inputs


def local_board_runner() -> Path:
    """The runner `setup-board` built for the local board (provisioned if needed)."""
    from orchestrator.boards.inventory import load_inventory
    from orchestrator.deploy.provision import setup_board
    from orchestrator.transport import connect

    with connect(load_inventory().boards["local"]) as conn:
        setup_board(conn)
        return Path(json.loads(Path(conn.workdir, "state.json").read_text())["runner_path"])


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
    parser.add_argument("--pte", type=Path, help="another XNNPACK .pte (default: fab lower's full DistilBERT)")
    parser.add_argument("--inputs", type=Path, help="ETLT inputs for --pte (default: its reference inputs)")
    parser.add_argument("--runner", type=Path, help="an etlab_runner binary (default: the local board's)")
    args = parser.parse_args(argv)

    console.quiet_third_party()
    timer = console.StageTimer()
    with timer.stage("full-size DistilBERT, XNNPACK (fab lower, cached)"):
        pte, inputs_path = (args.pte, args.inputs) if args.pte else distilbert_xnnpack()
    if args.pte and not (pte.is_file() and inputs_path and inputs_path.is_file()):
        parser.error("--pte needs an existing .pte and --inputs an existing ETLT file")
    with timer.stage("the local board's native runner (setup-board)"):
        runner = args.runner or local_board_runner()

    with tempfile.TemporaryDirectory(prefix="bench-runner-") as tmp:
        work = Path(tmp)
        inputs = read_tensors(inputs_path)
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
        met = "yes" if of_medians <= target else "NO"  # the target is stated on the medians
        ratio_rows.append([label, of_medians, paired, of_p10, f"<= {target:.2f}", met])
    console.table(
        "Ratios",
        ["ratio", "of medians", "median of per-round ratios", "of p10", "target", "met (medians)"],
        ratio_rows,
        caption="per-round ratios pair variants that ran seconds apart; within ±1% they are a tie",
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
