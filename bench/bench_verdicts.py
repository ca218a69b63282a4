"""Verdicts on a noisy board: false alarms, sensitivity and the cost of the interleaved A/B re-test.

    python bench/bench_verdicts.py [--nights 20] [--trials 10] [--widen 1.05,1.10,1.20] [--iterations 25]

1. False alarms: `--nights` identical nights of a small DistilBERT on the local board, a CPU hog (busy loops on
   every core) on every other night. Target: 0 regressions.
2. Sensitivity: for each widening of the feed-forward block (hidden_dim x factor), `--trials` interleaved A/B
   re-tests against the unwidened program; the smallest widening confirmed in >= 90% of trials. Target <= 10%.
3. Cost: the re-test's time per suspected cell (the A/B runs of step 2, and any re-test the nights ran).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from orchestrator.boards.inventory import Board, load_inventory
from orchestrator.deploy.abtest import Program, interleave
from orchestrator.deploy.provision import setup_board
from orchestrator.deploy.runs import RunParams
from orchestrator.lab.nightly import run_nightly
from orchestrator.lowering import lower as lowering
from orchestrator.lowering.spec import resolve_spec
from orchestrator.transport import connect

BASE_CONFIG = {"vocab_size": 1000, "dim": 384, "n_layers": 2, "n_heads": 4, "hidden_dim": 1536}


@contextlib.contextmanager
def cpu_hog() -> Iterator[None]:
    hogs = [
        subprocess.Popen([sys.executable, "-c", "while True: pass"], start_new_session=True)
        for _ in range(os.cpu_count() or 2)
    ]
    try:
        yield
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()


def spec_file(folder: Path, hidden_dim: int) -> Path:
    path = folder / f"distilbert-bench-{hidden_dim}.json"
    spec = {"name": "distilbert-bench", "model_type": "distilbert", "task": "fill-mask", "mask_token_id": 103,
            "config": {**BASE_CONFIG, "hidden_dim": hidden_dim}}  # fmt: skip
    path.write_text(json.dumps(spec))
    return path


def false_alarms(work: Path, board: Board, nights: int, iterations: int) -> tuple[Counter[str], list[float]]:
    spec = spec_file(work, BASE_CONFIG["hidden_dim"])
    inventory = work / "inventory.yaml"
    inventory.write_text(yaml.safe_dump({
        "boards": {"local": {"transport": "local", "workdir": board.workdir}},
        "nightly": {"history": f"sqlite:///{work / 'history.sqlite'}", "reports": str(work / "reports"),
                    "iterations": iterations, "cooldown_seconds": 10, "retest_seconds": 60,
                    "matrix": [{"models": [str(spec)], "backends": ["xnnpack"], "boards": ["local"]}]},
    }))  # fmt: skip
    verdicts: Counter[str] = Counter()
    retest_seconds = []
    for night in range(nights):
        date = f"2027-01-{night + 1:02d}"
        with cpu_hog() if night % 2 else contextlib.nullcontext():
            report = run_nightly(load_inventory(inventory), night=date, artifacts_root=work / "artifacts",
                                 results_root=work / "results")  # fmt: skip
        for item in report.verdicts:
            verdicts[item.verdict.value] += 1
            if item.retest:
                retest_seconds.append(float(item.retest["seconds"]))
        print(f"  night {night + 1:2d} {'hog ' if night % 2 else 'idle'}: {[v.verdict.value for v in report.verdicts]}")
    return verdicts, retest_seconds


def sensitivity(work: Path, board: Board, factors: list[float], trials: int) -> tuple[dict[float, int], list[float]]:
    def build(hidden_dim: int) -> tuple[Program, tuple[Path, str]]:
        result = lowering.lower(resolve_spec(None, spec_file(work, hidden_dim)), backends=["xnnpack"],
                                root=work / f"artifacts-{hidden_dim}")  # fmt: skip
        backend = result.backends["xnnpack"]
        inputs = (result.paths.reference_inputs, backend.sidecar["files"]["reference_inputs"]["sha256"])
        return Program(str(hidden_dim), backend.pte, backend.sidecar["sha256"]), inputs

    base, inputs = build(BASE_CONFIG["hidden_dim"])
    confirmed: dict[float, int] = {}
    seconds = []
    with connect(board) as conn:
        for factor in factors:
            wide, _ = build(int(BASE_CONFIG["hidden_dim"] * factor))
            confirmed[factor] = 0
            ratios = []
            for _ in range(trials):
                result = interleave(conn, base, wide, inputs, RunParams(warmup=3), expect="slower", rounds=8,
                                    budget_seconds=120, iterations_per_run=8)  # fmt: skip
                seconds.append(result.seconds)
                ratios.append(result.ratio or float("nan"))
                confirmed[factor] += int(result.confirmed and result.change == "slower")
            slowdown = float(np.nanmedian(ratios)) - 1
            print(f"  widen x{factor:.2f} ({slowdown:+.1%} measured): confirmed {confirmed[factor]}/{trials}")
    return confirmed, seconds


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nights", type=int, default=20)
    parser.add_argument("--trials", type=int, default=10)
    parser.add_argument("--widen", default="1.05,1.10,1.20")
    parser.add_argument("--iterations", type=int, default=25)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-verdicts-") as tmp:
        work = Path(tmp)
        board = Board(name="local", transport="local", workdir=str(work / "board"))
        with connect(board) as conn:
            setup_board(conn)
        started = time.monotonic()
        print(f"False alarms: {args.nights} identical nights, a CPU hog on every other night")
        verdicts, night_retests = false_alarms(work, board, args.nights, args.iterations)
        print(f"  verdicts: {dict(verdicts)}; regressions: {verdicts.get('regression', 0)} (target 0)")
        factors = [float(f) for f in args.widen.split(",")]
        print(f"Sensitivity: {args.trials} interleaved A/B trials per widening")
        confirmed, ab_seconds = sensitivity(work, board, factors, args.trials)
        good = [f for f in factors if confirmed[f] >= 0.9 * args.trials]
        print(f"  smallest widening confirmed in >= 90% of trials: {f'x{min(good):.2f}' if good else 'none'}")
        costs = night_retests + ab_seconds
        if costs:
            print(f"Cost of a re-test per suspected cell: median {np.median(costs):.1f} s, max {max(costs):.1f} s")
        print(f"(total {time.monotonic() - started:.0f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
