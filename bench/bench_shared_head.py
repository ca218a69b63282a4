"""The tied head stored once (issue 36 item 3): .pte sizes and decode speed of a tied model's programs with the head
reading the embedding's own table (`etlab::shared_head`) against the head quantized a second time (XNNPACK's 4-bit
Fully Connected), at 4-bit tables (`8da4w-e4`) and 8-bit ones (`8da4w`). etlab only, no llama.cpp.

    .venv/bin/python bench/bench_shared_head.py --rounds 3          # lowers four programs first (minutes each)

Each round runs every program once (1 warmup + `--generations` timed generations, P=64, N=64, 2 threads), in an
order that rotates round by round; decode tok/s is bench_llm.py's: (N - 1) / the decode steps' time, the median
over the round's generations, then the median over rounds.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.bench_llm import Generations, run_etlab
from orchestrator.lowering.builtins import BUILTIN_SPECS
from orchestrator.lowering.export import lower as lowering
from orchestrator.lowering.quantize.schemes import SCHEMES, recipe_8da4w
from orchestrator.lowering.variants import QUANTIZED_ON, Variant


def programs(bits: int) -> dict[str, Variant]:
    """The scheme with `bits` embedding tables, its head shared and not."""
    scheme = SCHEMES["8da4w-e4" if bits == 4 else "8da4w"]
    return {
        f"{bits}-bit table, head shared": Variant(
            QUANTIZED_ON, dataclasses.replace(scheme, llm=recipe_8da4w(32, bits, share_head=True))
        ),
        f"{bits}-bit table, head unshared": Variant(
            QUANTIZED_ON, dataclasses.replace(scheme, llm=recipe_8da4w(32, bits, share_head=False))
        ),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m-gen")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--generations", type=int, default=3)
    parser.add_argument("--bits", default="4,8")
    parser.add_argument("--runner", type=Path, help="an etlab_runner with etlab::shared_head (default: built here)")
    parser.add_argument("--work", type=Path, default=Path("/tmp/shared-head-bench"))
    args = parser.parse_args()
    args.threads, args.new_tokens, args.warmup = 2, 64, 1
    if args.runner is None:
        from tests.plugins.runner import build_runner

        args.runner = build_runner()
    spec = BUILTIN_SPECS[args.model]
    built: dict[str, tuple[Path, Path]] = {}  # label -> (pte, prompt)
    for bits in (int(b) for b in args.bits.split(",")):
        for label, variant in programs(bits).items():
            root = args.work / label.replace(" ", "-").replace(",", "")
            result = lowering.lower(spec, variants=[variant], weights="random", root=root, jobs=1)
            built[label] = (result.variants[variant].pte, result.paths.reference_inputs)
    speeds: dict[str, list[float]] = {label: [] for label in built}
    ids: dict[str, list[int]] = {}
    labels = list(built)
    for round_ in range(args.rounds):
        order = labels[round_ % len(labels) :] + labels[: round_ % len(labels)]
        for label in order:
            pte, prompt = built[label]
            got, _ = run_etlab(args.runner, pte, prompt, args, args.work)
            assert isinstance(got, Generations)
            speeds[label].append(got.decode_tokens_per_s())
            ids[label] = got.token_ids[0]
        print(f"round {round_ + 1}: " + ", ".join(f"{label} {speeds[label][-1]:.1f}" for label in order), flush=True)
    print("\n| program | .pte MB | decode tok/s (median of rounds) | per round |")
    print("|---|---:|---:|---|")
    for label, (pte, _) in built.items():
        per_round = ", ".join(f"{s:.1f}" for s in speeds[label])
        print(f"| {label} | {pte.stat().st_size / 1e6:.2f} | {statistics.median(speeds[label]):.1f} | {per_round} |")
    for width in {label.split("-")[0] for label in labels}:  # "4", "8": the labels' bits
        shared, unshared = ids[f"{width}-bit table, head shared"], ids[f"{width}-bit table, head unshared"]
        same = sum(a == b for a, b in zip(shared, unshared, strict=True))
        print(f"{width}-bit: shared and unshared programs' ids agree at {same}/{len(shared)} positions")
    return 0


if __name__ == "__main__":
    sys.exit(main())
