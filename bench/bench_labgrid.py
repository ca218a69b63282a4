"""labgrid's cost: reserve + lock + release per board job against a plain SSH board, and fan-out on N places vs 1.

A real labgrid coordinator and exporter on 127.0.0.1 (orchestrator/testing/labgrid.py) publish private loopback
sshd boards (orchestrator/testing/sshd.py) as places. Each board job is bench_transfer's: connect, push a 1 KiB
payload, run a command, pull a tiny bundle. The same fake board is reached once as a plain SSH board and once as
a labgrid place (resolved through its NetworkService, reserved, locked, released), alternating round by round so
drift on a shared machine hits both alike.

    .venv/bin/python bench/bench_labgrid.py [--rounds 10] [--boards 8] [--fanout-rounds 3]

- hold only: reserve + lock + release around a job that does nothing (the labgrid session already open).
- per board job: the job on a place minus the same job on the plain board (medians).
- first job of a process: opening the session with the coordinator (once per coordinator and process).
- fan-out: the job with the command busy 0.5 s on the board (a real run is longer), on N places vs 1 place, and
  on N plain boards vs 1 for reference.

Targets: reserve + lock + release < 0.5 s per board job; fan-out on N places about as parallel as on plain boards.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(PROJECT_ROOT))

from bench.bench_transfer import fanout_job  # noqa: E402
from orchestrator import console  # noqa: E402
from orchestrator.boards import labgrid  # noqa: E402
from orchestrator.boards.fanout import exit_code, fan_out  # noqa: E402
from orchestrator.boards.inventory import Board, LabgridPlace  # noqa: E402
from orchestrator.testing.labgrid import LabgridLab  # noqa: E402
from orchestrator.testing.sshd import SshdLab  # noqa: E402


def as_place(board: Board, coordinator: str) -> Board:
    """The same fake board as a labgrid place: no address of its own, it comes from the NetworkService."""
    return board.replace(host=None, port=22, labgrid=LabgridPlace(coordinator=coordinator, place=board.name))


def run(boards: list[Board], job: Callable[[Board], None]) -> float:
    started = time.perf_counter()
    outcomes = fan_out(boards, job)
    elapsed = time.perf_counter() - started
    if exit_code(outcomes) != 0:
        raise SystemExit(f"board job failed: {[o.error for o in outcomes if not o.ok]}")
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--boards", type=int, default=8)
    parser.add_argument("--fanout-rounds", type=int, default=3)
    args = parser.parse_args()

    root = Path(tempfile.mkdtemp(prefix="etlab-bench-labgrid-"))
    lab = SshdLab(root / "sshd")
    lg = LabgridLab(root / "labgrid")
    try:
        console.info(f"load average before: {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs")
        fakes = [lab.board(f"place-{i}") for i in range(args.boards)]
        exporter = lg.publish_boards(fakes)
        lg.add_places(exporter, {fake.name: {"bench": "yes"} for fake in fakes})
        plain = [fake.board for fake in fakes]
        places = [as_place(board, lg.address) for board in plain]
        work = root / "work"
        work.mkdir()

        started = time.perf_counter()
        run(places[:1], fanout_job(work, "first", 0))  # opens the session; pins the host key
        first = time.perf_counter() - started
        run(plain[:1], fanout_job(work, "warm", 0))

        hold: list[float] = []
        on_place: list[float] = []
        on_plain: list[float] = []
        for n in range(args.rounds):
            pair = [("place", places[:1], on_place), ("plain", plain[:1], on_plain)]
            for label, boards, sink in pair if n % 2 == 0 else reversed(pair):
                sink.append(run(boards, fanout_job(work, f"r{n}-{label}", 0)))
            hold.append(run(places[:1], lambda board: None))

        fan: dict[str, tuple[float, float]] = {}
        for label, boards in (("places", places), ("plain boards", plain)):
            single: list[float] = []
            many: list[float] = []
            tag = label.replace(" ", "-")  # the job puts it in a shell command unquoted
            for n in range(args.fanout_rounds):
                single.append(run(boards[:1], fanout_job(work, f"f{n}-{tag}-1", 0.5)))
                many.append(run(boards, fanout_job(work, f"f{n}-{tag}-n", 0.5)))
            fan[label] = (statistics.median(many), statistics.median(single))
        console.info(f"load average after: {os.getloadavg()[0]:.2f}")
    finally:
        labgrid.close_sessions()
        lg.close()
        lab.close()
        shutil.rmtree(root, ignore_errors=True)

    overhead = statistics.median(on_place) - statistics.median(on_plain)
    rows = [
        (f"hold only: reserve + lock + release (s, median of {args.rounds})", statistics.median(hold), None, None,
         "< 0.5 s"),
        ("board job on a place (s)", statistics.median(on_place), statistics.median(on_plain), overhead, "< 0.5 s"),
        ("first job of a process, session opened (s)", first, None, None, "—"),
    ]  # fmt: skip
    for label, (on_all, on_one) in fan.items():
        rows.append((f"fan-out, run busy 0.5 s, {args.boards} {label} vs 1 (s)", on_all, on_one, on_all / on_one, "—"))
    columns = ["measure", "labgrid", "plain SSH / one", "difference / ratio", "target"]
    console.table("labgrid reserve + lock + release (loopback coordinator and sshd)", columns, rows)


if __name__ == "__main__":
    main()
