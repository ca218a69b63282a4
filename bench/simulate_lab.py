"""Issue 39, on paper: how long a big lab's night takes with W workers, from measured per-task times.

The lab: 200 boards, 50 models x 4 schemes (fp32 XNNPACK, int8-dynamic, int8-static, 8da4w) = 200 programs, W
workers (1, 2, 4, 8, 16, 32), each with C cores (8) and one lowering slot (the lab lowers one program at a time per
worker: cluster.LOWERING is 1), reaching 200 / W boards (board b on worker b mod W).

- Each board runs a sample of the matrix: the 4 schemes of 5 models (board b: models 5b .. 5b+4, mod 50), 20 cells,
  4000 cells in all; every model is on 20 boards.
- A lowering takes a worker's lowering slot for L s; programs are lowered model by model, each by the next worker
  with a free slot. L per program: bench/README.md "Quantized variants" (bench_quantize.py, current figures,
  2026-12-01 06:11 UTC, full size, random weights): DistilBERT 36.3 / 62.1 / 87.5 / 67.7 s and GPT-2 75.4 / 110.0 /
  176.6 / 112.7 s (fp32 XNNPACK / int8-dynamic / int8-static / 8da4w); even models take DistilBERT's, odd GPT-2's.
- A cell occupies its board for R s and one core of its worker for A s of them (push, pull, analysis; it waits for a
  core when all C are busy); a board runs one cell at a time; a cell waits for its program's lowering.
- Every task (a lowering, a board's share) costs the scheduling overhead O once.

R, A and O are measured by bench/bench_lab.py (`--json`): R = a board's share / its cells, A = R - the runner's own
time ((warmup + iterations) x mean), O = wall / 200 no-op tasks. Those are tiny-model cells on sshd boards on this
machine (a full-size model's cell is longer: give `--cell-seconds`).

Three nights per W: "per program" (a cell waits only for its own program: the model above), "lower all first" (as
lab/lab_night.py runs a night today: the boards' tasks are submitted when every lowering has replied) and "store
warm" (every program in the lab's store already: an unchanged etlab and models, nothing lowered).

    .venv/bin/python bench/simulate_lab.py [--figures bench-lab.json] [--cores 8] [--cell-seconds R] ...
"""

from __future__ import annotations

import argparse
import heapq
import json
from collections import deque
from dataclasses import dataclass
from pathlib import Path

SCHEMES = ("fp32", "int8-dynamic", "int8-static", "8da4w")
LOWERING_SECONDS = {  # bench/README.md, "Quantized variants", current figures (full size, random weights)
    "distilbert": (36.3, 62.1, 87.5, 67.7),
    "gpt2": (75.4, 110.0, 176.6, 112.7),
}
# bench/bench_lab.py's figures on this machine, 2026-12-04 (bench/README.md, "A lab night on several workers")
MEASURED = {"cell_seconds": 2.64, "runner_seconds_per_cell": 0.48, "task_overhead_seconds": 0.0016}


@dataclass(frozen=True)
class Lab:
    boards: int = 200
    models: int = 50
    models_per_board: int = 5
    workers: int = 1
    cores: int = 8
    cell_seconds: float = 3.0  # R
    worker_seconds: float = 2.5  # A
    overhead: float = 0.005  # O

    def lowering(self, program: int) -> float:
        model, scheme = divmod(program, len(SCHEMES))
        return LOWERING_SECONDS["distilbert" if model % 2 == 0 else "gpt2"][scheme]

    def cells(self, board: int) -> list[int]:
        """The programs board `board` runs: the 4 schemes of 5 models."""
        first = (board * self.models_per_board) % self.models
        models = [(first + k) % self.models for k in range(self.models_per_board)]
        return [m * len(SCHEMES) + s for m in models for s in range(len(SCHEMES))]


def lowered_at(lab: Lab, policy: str) -> list[float]:
    """When each program is in the store: model by model, each on the next free lowering slot."""
    programs = lab.models * len(SCHEMES)
    if policy == "store warm":
        return [0.0] * programs
    slots = [0.0] * lab.workers
    ready = []
    for program in range(programs):
        start = heapq.heappop(slots)
        done = start + lab.overhead + lab.lowering(program)
        heapq.heappush(slots, done)
        ready.append(done)
    if policy == "lower all first":
        return [max(ready)] * programs
    return ready


def night(lab: Lab, policy: str) -> float:
    """The night's length: a small discrete-event simulation (boards, worker cores, lowerings)."""
    ready = lowered_at(lab, policy)
    left = {b: lab.cells(b) for b in range(lab.boards)}
    users: dict[int, list[int]] = {}
    for board, programs in left.items():
        for program in programs:
            users.setdefault(program, []).append(board)
    free_cores = [lab.cores] * lab.workers
    waiting: list[deque[int]] = [deque() for _ in range(lab.workers)]  # boards waiting for a core
    busy: set[int] = set()  # boards running a cell or waiting for a core
    started: set[int] = set()  # boards whose share (a task) has begun: its overhead paid
    events: list[tuple[float, int, str, int]] = []  # (time, order, kind, board / program / worker)
    order = 0

    def push(at: float, kind: str, what: int) -> None:
        nonlocal order
        order += 1
        heapq.heappush(events, (at, order, kind, what))

    def begin(board: int, now: float) -> None:
        runnable = [p for p in left[board] if ready[p] <= now]
        if not runnable:
            return
        worker = board % lab.workers
        if free_cores[worker] == 0:
            busy.add(board)
            waiting[worker].append(board)
            return
        program = min(runnable, key=lambda p: ready[p])
        left[board].remove(program)
        free_cores[worker] -= 1
        start = now + (0.0 if board in started else lab.overhead)
        started.add(board)
        busy.add(board)
        push(start + lab.worker_seconds, "core", worker)
        push(start + lab.cell_seconds, "board", board)

    for program, at in enumerate(ready):
        push(at, "lowered", program)
    end = 0.0
    while events:
        now, _, kind, what = heapq.heappop(events)
        if kind == "lowered":
            for board in users.get(what, []):
                if board not in busy:
                    begin(board, now)
        elif kind == "board":
            end = max(end, now)
            busy.discard(what)
            begin(what, now)
        else:  # a core of worker `what` is free
            free_cores[what] += 1
            while waiting[what] and free_cores[what]:
                board = waiting[what].popleft()
                busy.discard(board)
                begin(board, now)
    assert not any(left.values()), "cells left unrun"
    return end


def bounds(lab: Lab) -> dict[str, float]:
    """What the night cannot be shorter than, per resource."""
    programs = lab.models * len(SCHEMES)
    lowering = sum(lab.lowering(p) for p in range(programs)) / lab.workers
    board = lab.models_per_board * len(SCHEMES) * lab.cell_seconds
    boards_per_worker = -(-lab.boards // lab.workers)
    cpu = boards_per_worker * lab.models_per_board * len(SCHEMES) * lab.worker_seconds / lab.cores
    return {"lowering": lowering, "boards": board, "worker CPU": cpu}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--figures", type=Path, default=None, help="bench_lab.py's --json output")
    parser.add_argument("--cores", type=int, default=8)
    parser.add_argument("--cell-seconds", type=float, default=None, help="R (default: measured)")
    parser.add_argument("--worker-seconds", type=float, default=None, help="A (default: measured)")
    parser.add_argument("--overhead", type=float, default=None, help="O (default: measured)")
    parser.add_argument("--workers", default="1,2,4,8,16,32")
    args = parser.parse_args()

    measured = dict(MEASURED)
    if args.figures is not None:
        measured.update(json.loads(args.figures.read_text()))
    cell = args.cell_seconds if args.cell_seconds is not None else measured["cell_seconds"]
    worker = args.worker_seconds
    if worker is None:
        worker = max(0.0, measured["cell_seconds"] - measured["runner_seconds_per_cell"])
        worker = min(worker, cell)
    overhead = args.overhead if args.overhead is not None else measured["task_overhead_seconds"]
    print(f"200 boards x 20 cells, 200 programs; R = {cell:.2f} s per cell on its board, A = {worker:.2f} s of a "
          f"worker core, O = {overhead * 1000:.1f} ms per task, C = {args.cores} cores per worker")  # fmt: skip
    print("\n| workers | per program s | lower all first s | store warm s | lowering bound s | board bound s "
          "| worker CPU bound s | bound by |")  # fmt: skip
    print("|---:|---:|---:|---:|---:|---:|---:|---|")
    for count in (int(w) for w in args.workers.split(",")):
        lab = Lab(cores=args.cores, cell_seconds=cell, worker_seconds=worker, overhead=overhead, workers=count)
        limits = bounds(lab)
        nights = [night(lab, policy) for policy in ("per program", "lower all first", "store warm")]
        cold = dict(limits)
        warm = {k: v for k, v in limits.items() if k != "lowering"}
        print(
            f"| {count} | {nights[0]:.0f} | {nights[1]:.0f} | {nights[2]:.0f} | {limits['lowering']:.0f} | "
            f"{limits['boards']:.0f} | {limits['worker CPU']:.0f} | {max(cold, key=lambda k: cold[k])} "
            f"(warm: {max(warm, key=lambda k: warm[k])}) |"
        )


if __name__ == "__main__":
    main()
