"""Verdicts on a noisy board: false alarms, sensitivity and the cost of the interleaved A/B re-test.

    python bench/bench_verdicts.py                                   # the full run: 20 nights, 10 trials
    python bench/bench_verdicts.py --nights 6 --trials 3 --widen 1.10,1.30   # a quick check

1. False alarms: `--nights` identical nights of a small DistilBERT on the local board, with a CPU hog (busy
   loops on every core) on every `--hog-every`-th night. Target: 0 regressions.
2. Sensitivity: for each widening of the feed-forward block (hidden_dim x factor), `--trials` interleaved A/B
   re-tests of the widened program against the unwidened one, as the nightly runs them for a suspected cell.
   The smallest widening confirmed in >= 90% of the trials, and the slowdown it measures. Target <= 10%.
3. Cost: the re-test's time per suspected cell (every re-test of step 2, and any the nights ran).

Everything lives in a temporary folder, state included (kept baseline programs, history), so the project's own
`.etlab/programs` is never pruned; the wheel cache is shared, so the board's setup downloads nothing.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import yaml

PROJECT_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(PROJECT_ROOT))

from orchestrator import paths  # noqa: E402
from orchestrator.boards.inventory import Board, load_inventory  # noqa: E402
from orchestrator.deploy.abtest import ABProgram, interleave  # noqa: E402
from orchestrator.deploy.provision import setup_board  # noqa: E402
from orchestrator.deploy.runs import RunParams  # noqa: E402
from orchestrator.lab.nightly import run_nightly  # noqa: E402
from orchestrator.lowering.builtins import resolve_spec  # noqa: E402
from orchestrator.lowering.export import lower as lowering  # noqa: E402
from orchestrator.lowering.variants import Variant  # noqa: E402
from orchestrator.transport import connect  # noqa: E402

BASE_CONFIG = {"vocab_size": 1000, "dim": 384, "n_layers": 2, "n_heads": 4, "hidden_dim": 1536}
CONFIRMED_SHARE = 0.9  # "confirmed in at least 9 of 10 trials"


@dataclass
class Figures:
    verdicts: Counter[str] = field(default_factory=Counter)
    hog_nights: int = 0
    confirmed: dict[float, int] = field(default_factory=dict)
    slowdown: dict[float, float] = field(default_factory=dict)  # measured median ratio - 1, per widening
    retest_seconds: list[float] = field(default_factory=list)


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


def private_state(work: Path) -> None:
    """A state folder of our own (programs, known_hosts), sharing only the wheel and tarball caches."""
    shared = paths.state_dir()
    state = work / "state"
    state.mkdir()
    for name in ("wheels", "cache"):
        (shared / name).mkdir(parents=True, exist_ok=True)
        (state / name).symlink_to(shared / name)
    os.environ["ETLAB_STATE"] = str(state)


def spec_file(folder: Path, hidden_dim: int) -> Path:
    path = folder / f"distilbert-bench-{hidden_dim}.json"
    spec = {"name": "distilbert-bench", "model_type": "distilbert", "task": "fill-mask", "mask_token_id": 103,
            "config": {**BASE_CONFIG, "hidden_dim": hidden_dim}}  # fmt: skip
    path.write_text(json.dumps(spec))
    return path


def false_alarms(work: Path, board: Board, args: argparse.Namespace, figures: Figures) -> None:
    spec = spec_file(work, BASE_CONFIG["hidden_dim"])
    inventory = work / "inventory.yaml"
    inventory.write_text(yaml.safe_dump({
        "boards": {"local": {"transport": "local", "workdir": board.workdir}},
        "nightly": {"history": f"sqlite:///{work / 'history.sqlite'}", "reports": str(work / "reports"),
                    "iterations": args.iterations, "cooldown_seconds": args.cooldown,
                    "retest_seconds": args.retest_seconds, "retest_rounds": args.rounds,
                    "matrix": [{"models": [str(spec)], "backends": ["xnnpack"], "boards": ["local"]}]},
    }))  # fmt: skip
    for night in range(args.nights):
        date = (np.datetime64("2027-01-01") + night).astype(str)
        hog = args.hog_every > 0 and night % args.hog_every == args.hog_every - 1
        figures.hog_nights += hog
        with cpu_hog() if hog else contextlib.nullcontext():
            report = run_nightly(load_inventory(inventory), night=date, artifacts_root=work / "artifacts",
                                 results_root=work / "results")  # fmt: skip
        for item in report.verdicts:
            figures.verdicts[item.verdict.value] += 1
            if item.retest:
                figures.retest_seconds.append(float(item.retest["seconds"]))
        shown = ", ".join(f"{v.verdict.value} ({v.record.validity})" for v in report.verdicts)
        print(f"  night {night + 1:2d} {'hog ' if hog else 'idle'}: {shown}", flush=True)


def sensitivity(work: Path, board: Board, args: argparse.Namespace, figures: Figures) -> None:
    def build(hidden_dim: int) -> tuple[ABProgram, tuple[Path, str]]:
        result = lowering.lower(resolve_spec(None, spec_file(work, hidden_dim)), variants=[Variant("xnnpack")],
                                root=work / f"artifacts-{hidden_dim}")  # fmt: skip
        lowered = result.variants[Variant("xnnpack")]
        inputs = (result.paths.reference_inputs, lowered.sidecar.reference_inputs_sha256)
        return ABProgram(str(hidden_dim), lowered.pte, lowered.sidecar.sha256), inputs

    base, inputs = build(BASE_CONFIG["hidden_dim"])
    with connect(board) as conn:
        for factor in args.widen:
            wide, _ = build(round(BASE_CONFIG["hidden_dim"] * factor))
            confirmed, ratios = 0, []
            for _ in range(args.trials):
                result = interleave(
                    conn, base, wide, inputs, RunParams(warmup=3), expect="slower", rounds=args.rounds,
                    budget_seconds=args.retest_seconds, iterations_per_run=args.iterations_per_run,
                )  # fmt: skip
                state = "confirmed" if result.confirmed and result.change == "slower" else "not confirmed"
                print(f"    x{factor:.2f} trial: {state}, {result.timing}: {result.reason}", flush=True)
                figures.retest_seconds.append(result.seconds)
                ratios.append(result.ratio or math.nan)
                confirmed += int(result.confirmed and result.change == "slower")
            figures.confirmed[factor] = confirmed
            figures.slowdown[factor] = float(np.nanmedian(ratios)) - 1
            print(
                f"  widen x{factor:.2f}: {figures.slowdown[factor]:+.1%} measured, confirmed {confirmed}/{args.trials}",
                flush=True,
            )


def summary(args: argparse.Namespace, figures: Figures, seconds: float) -> list[str]:
    regressions = figures.verdicts.get("regression", 0)
    lines = [
        f"false alarms: {regressions} regression(s) in {args.nights} identical nights "
        f"({figures.hog_nights} with a CPU hog); verdicts {dict(sorted(figures.verdicts.items()))} "
        f"[target 0: {'met' if regressions == 0 else 'MISSED'}]",
    ]
    needed = math.ceil(CONFIRMED_SHARE * args.trials)
    good = [f for f in sorted(figures.confirmed) if figures.confirmed[f] >= needed]
    if good:
        slowdown = figures.slowdown[good[0]]
        verdict = "met" if slowdown <= 0.10 else "MISSED"
        lines.append(
            f"sensitivity: smallest widening confirmed in >= {needed}/{args.trials} trials: x{good[0]:.2f}, "
            f"a {slowdown:+.1%} slowdown [target <= 10%: {verdict}]"
        )
    else:
        lines.append(f"sensitivity: no widening of {args.widen} was confirmed in >= {needed}/{args.trials} trials")
    costs = figures.retest_seconds
    if costs:
        lines.append(
            f"re-test cost per suspected cell: median {np.median(costs):.1f} s, max {max(costs):.1f} s "
            f"over {len(costs)} re-tests ({args.rounds} rounds of "
            f"{args.iterations_per_run or 'about 1 s of'} iterations, "
            f"budget {args.retest_seconds:g} s)"
        )
    lines.append(f"total time {seconds:.0f} s")
    return lines


def factors(text: str) -> list[float]:
    values = sorted(float(part) for part in text.split(","))
    if not values or any(not math.isfinite(v) or v <= 1.0 for v in values):
        raise argparse.ArgumentTypeError(f"widenings must be numbers > 1, got {text!r}")
    return values


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nights", type=int, default=20, help="identical nights (default 20)")
    parser.add_argument("--hog-every", type=int, default=2, help="a CPU hog every Nth night (default 2; 0: none)")
    parser.add_argument("--iterations", type=int, default=25, help="timed iterations per night (default 25)")
    parser.add_argument("--cooldown", type=float, default=10.0, help="cool-down before a degraded night's re-run")
    parser.add_argument("--trials", type=int, default=10, help="A/B re-tests per widening (default 10)")
    parser.add_argument("--widen", type=factors, default=factors("1.05,1.10,1.15,1.20,1.30"),
                        help="feed-forward widenings (default 1.05,1.10,1.15,1.20,1.30)")  # fmt: skip
    parser.add_argument("--rounds", type=int, default=8, help="A/B rounds per re-test (default 8, as the nightly)")
    parser.add_argument(
        "--iterations-per-run",
        type=int,
        default=None,
        help="timed iterations per A/B run (default: about a second of them, as the nightly)",
    )
    parser.add_argument("--retest-seconds", type=float, default=120.0, help="budget per re-test (default 120)")
    args = parser.parse_args()
    if args.nights < 0 or args.trials < 1 or args.rounds < 5 or args.iterations < 5:
        parser.error("need --nights >= 0, --trials >= 1, --rounds >= 5 and --iterations >= 5")
    started = time.monotonic()
    figures = Figures()
    with tempfile.TemporaryDirectory(prefix="bench-verdicts-") as tmp:
        work = Path(tmp)
        private_state(work)
        board = Board(name="local", transport="local", workdir=str(work / "board"))
        with connect(board) as conn:
            setup_board(conn)
        print(f"False alarms: {args.nights} identical nights, a CPU hog on every {args.hog_every}th", flush=True)
        false_alarms(work, board, args, figures)
        print(f"Sensitivity: {args.trials} interleaved A/B re-tests per widening", flush=True)
        sensitivity(work, board, args, figures)
    print("\nFigures")
    for line in summary(args, figures, time.monotonic() - started):
        print(f"  {line}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
