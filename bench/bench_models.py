"""`fab models` benchmark: a static list, timed warm the way bench_warmstart.py times a deploy.

Each round is a whole `fab models` process timed from outside, with `fab --list` timed just before it (interleaved,
so both see the same load): Python start and importing fabric, paramiko and tasks.py, the floor of any `fab` task.
etlab's own cost is the difference. One warm-up round first (file caches, bytecode); a last round runs with
`python -X importtime` and lists the heavy packages `fab models` imported (none: its inputs are recorded, its
lowered models read from their sidecars).

    .venv/bin/python bench/bench_models.py [--rounds 10] [--long] [--project PATH] [--json out.json]

ETLAB_ARTIFACTS passes through (the lowered models it lists).
Targets: median wall at most 1.0 s (issue 54); median (wall - `fab --list`) at most 0.5 s (issue 22.7's warm start).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run as a script: bench.* from the project root
from bench.bench_warmstart import HEAVY_PACKAGES, ROOT, TARGET_ABOVE_FABRIC_S, fab, fab_list

TARGET_WALL_S = 1.0


def fab_models(project: Path, long: bool) -> float:
    seconds, proc = fab(project, "models", *(["--long"] if long else []))
    if proc.returncode != 0:
        raise SystemExit(f"fab models failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    return seconds


def heavy_imports(project: Path, long: bool) -> dict[str, float]:
    _, proc = fab(project, "models", *(["--long"] if long else []), python_args=("-X", "importtime"))
    found: dict[str, float] = {}
    for line in proc.stderr.splitlines():
        match = re.match(r"import time:\s+\d+ \|\s+(\d+) \|( *)(\S+)$", line)
        if match and match.group(3) in HEAVY_PACKAGES:
            found[match.group(3)] = max(found.get(match.group(3), 0.0), int(match.group(1)) / 1e6)
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--long", action="store_true", help="time `fab models --long`")
    parser.add_argument("--project", type=Path, default=ROOT, help="the etlab checkout whose `fab` is measured")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args()
    project = args.project.resolve()
    machine = f"{platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}, {platform.platform()}"
    print(f"machine: {machine}\nproject: {project}")
    fab_list(project), fab_models(project, args.long)  # warm-up
    rounds = [(fab_list(project), fab_models(project, args.long)) for _ in range(args.rounds)]
    print(f"\n{'round':>5} {'fab --list s':>13} {'fab models s':>13} {'above fabric s':>15}")
    for index, (listing, models) in enumerate(rounds, start=1):
        print(f"{index:>5} {listing:>13.3f} {models:>13.3f} {models - listing:>15.3f}")
    listing = statistics.median(item[0] for item in rounds)
    wall = statistics.median(item[1] for item in rounds)
    above = statistics.median(item[1] - item[0] for item in rounds)
    low, high = min(item[1] for item in rounds), max(item[1] for item in rounds)
    print(f"\nfab --list: median {listing:.3f} s")
    print(f"fab models{' --long' if args.long else ''}: median {wall:.3f} s ({low:.3f}-{high:.3f}); "
          f"target <= {TARGET_WALL_S:.1f} s: {'met' if wall <= TARGET_WALL_S else 'NOT met'}")  # fmt: skip
    print(f"above fab --list: median {above:.3f} s; target <= {TARGET_ABOVE_FABRIC_S:.1f} s: "
          f"{'met' if above <= TARGET_ABOVE_FABRIC_S else 'NOT met'}")  # fmt: skip
    print(f"load average: {' '.join(f'{value:.2f}' for value in os.getloadavg())}")
    heavy = heavy_imports(project, args.long)
    listed = ", ".join(f"{name} {seconds:.2f} s" for name, seconds in sorted(heavy.items())) or "none"
    print(f"heavy packages imported (-X importtime): {listed}")
    if args.json:
        figures = {
            "machine": machine,
            "long": args.long,
            "rounds": [{"fab_list_s": listing_s, "models_s": models_s} for listing_s, models_s in rounds],
            "median": {"fab_list_s": listing, "models_s": wall, "above_fabric_s": above},
            "target_wall_s": TARGET_WALL_S,
            "target_above_fabric_s": TARGET_ABOVE_FABRIC_S,
            "load_average": os.getloadavg(),
            "heavy_imports": heavy,
        }
        args.json.write_text(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()
