"""Issue 39: a lab night on 1 worker against 2, and the lab's scheduling overhead per task.

Real processes on this machine (orchestrator/testing/lab.py): a TLS scheduler (`fab lab-scheduler`), `fab worker`
processes each with its own state and artifacts folders, 4 sshd boards on 127.200.0.x (orchestrator/testing/sshd.py,
provisioned once by the real setup-board), one private PostgreSQL server with a fresh database per night
(orchestrator/testing/postgres.py). The matrix: distilbert-tiny and gpt2-tiny x xnnpack, portable x 4 boards = 16
cells. The programs are lowered first into a cache folder with `fab lower`; the worker that lowers for the lab reads
that folder, so a night publishes and fetches programs but lowers nothing: the nights measure running.

- Night A: 1 worker reaching all 4 boards. Night B: 2 workers, each reaching 2 boards. Each night is a new lab
  (scheduler, store, workers) and a fresh history database, run by the real `fab nightly` with the lab section.
- Per board, its share: the seconds its line "<board>: 4 cell(s) on <host> in 12.3 s" gives; the night prints no
  seconds yet ("<board>: 4 cell(s) on <host>"), so from the moment the boards' tasks go out (the workstation prints
  the last "<model>: ... on <host>" lowering line) to the board's last cell recorded in the history (created_at, on
  the worker's clock: the same machine here).
- Lowering phase: the night's start to the last lowering reply (fab's start, the lab's client, the programs
  published from the cache folder). Lab added = wall - the longest share: that, fetching programs from the store,
  planning, the reports. The lab's start (scheduler up, workers joined) is before the night and shown apart.
- Scheduling overhead: 200 no-op tasks (with the revision resource every lab task asks for) submitted through
  orchestrator.lab.cluster.connect (mutual TLS, msgpack replies) to night B's lab, wall / 200; and one task's round
  trip (submit, result), median of 30.
- Per cell, for bench/simulate_lab.py: the board's time per cell (share / cells) and the runner's own time in it
  ((warmup + iterations) x mean_ms from the history); the rest is push, pull and analysis on the worker.

    .venv/bin/python bench/bench_lab.py [--iterations 20] [--order AB] [--json out.json]

The 4 "boards" and the workers share this machine's CPUs: more workers cannot make the boards faster here.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import yaml

PROJECT_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(PROJECT_ROOT))

from orchestrator import console  # noqa: E402
from orchestrator.boards.inventory import Board  # noqa: E402
from orchestrator.deploy import provision  # noqa: E402
from orchestrator.lab import cluster  # noqa: E402
from orchestrator.lab.history import History  # noqa: E402
from orchestrator.testing.lab import LocalLab  # noqa: E402
from orchestrator.testing.postgres import fresh_database, private_postgres  # noqa: E402
from orchestrator.testing.sshd import SshdLab  # noqa: E402
from orchestrator.transport import connect  # noqa: E402

MODELS = ("distilbert-tiny", "gpt2-tiny")
BACKENDS = ("xnnpack", "portable")
BOARDS = ("lab-b1", "lab-b2", "lab-b3", "lab-b4")
CACHE = PROJECT_ROOT / ".etlab" / "bench-cache" / "lab-artifacts"
NETWORK = 200  # 127.200.x.y: apart from the test suites' boards (127.0.x.y, 127.<1+n>.x.y)
SHARE_LINE = re.compile(r"^(\S+): (\d+) cell\(s\) on (\S+?)(?: in ([\d.]+) s)?(?::.*)?$")
LOWERING_LINE = re.compile(r"^(\S+): (?:lowered .*|from the lab's store or cache) on (\S+) \(")


@dataclass
class Night:
    name: str
    workers: int
    wall: float = 0.0
    exit_code: int = 0
    cells: int = 0
    ok_cells: int = 0
    shares: dict[str, tuple[str, int, float]] = field(default_factory=dict)  # board -> (host, cells, seconds)
    runner_seconds: float = 0.0  # the runners' own time, summed over the night's cells
    lab_start: float = 0.0  # the scheduler started and every worker joined (before the night)
    lowering_phase: float = 0.0  # the night's start to the last lowering reply (the boards' tasks go out then)
    hosts: dict[str, str] = field(default_factory=dict)

    @property
    def longest_share(self) -> float:
        return max((seconds for _, _, seconds in self.shares.values()), default=0.0)


def fab(*argv: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "fabric", *argv], cwd=PROJECT_ROOT, env=env or dict(os.environ),
        capture_output=True, text=True, timeout=1800,
    )  # fmt: skip


def lower_programs() -> float:
    """`fab lower` of the tiny models into the bench's cache folder (a cache hit after the first run)."""
    started = time.perf_counter()
    env = {**os.environ, "ETLAB_ARTIFACTS": str(CACHE)}
    for model in MODELS:
        done = fab("lower", "--model", model, "--backend", ",".join(BACKENDS), "--weights", "random", env=env)
        if done.returncode != 0:
            raise SystemExit(f"fab lower {model} failed:\n{done.stdout}\n{done.stderr}")
    return time.perf_counter() - started


def board_entry(board: Board) -> dict[str, Any]:
    """An inventory entry for an sshd board (as tests/plugins/boards.py writes them)."""
    return {
        "transport": "ssh", "workdir": board.workdir, "host": board.ssh.host, "port": board.ssh.port,
        "user": board.ssh.user, "key": str(board.ssh.key), "connect_timeout": board.ssh.connect_timeout,
        "keepalive": board.ssh.keepalive, "tcp_user_timeout": board.ssh.tcp_user_timeout,
    }  # fmt: skip


def write_inventory(path: Path, boards: list[Board], nightly: dict[str, Any] | None = None) -> Path:
    document: dict[str, Any] = {"defaults": {"known_hosts": str(boards[0].known_hosts)}}
    document["boards"] = {board.name: board_entry(board) for board in boards}
    if nightly:
        document["nightly"] = nightly
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    return path


def run_night(
    name: str, split: list[list[Board]], boards: list[Board], server: str, root: Path, args: argparse.Namespace
) -> tuple[Night, LocalLab]:
    """One night on a new lab whose workers reach the boards of `split` (one list per worker). The lab is returned
    running (the caller closes it)."""
    home = root / name
    home.mkdir()
    url = fresh_database(server)
    matrix = [{"models": list(MODELS), "backends": list(BACKENDS), "boards": [b.name for b in boards]}]
    nightly = {"history": url, "reports": str(home / "reports"), "iterations": args.iterations, "warmup": args.warmup,
               "cooldown_seconds": 0, "weights": "random", "matrix": matrix}  # fmt: skip
    lab = LocalLab(home / "lab")
    workstation = lab.with_lab(write_inventory(home / "inventory.yaml", boards, nightly))
    lab.start_scheduler(workstation)
    names = [f"w{i + 1}" for i in range(len(split))]
    for index, (worker, reached) in enumerate(zip(names, split, strict=True)):
        inventory = lab.with_lab(write_inventory(home / f"{worker}.yaml", reached))
        # The first worker lowers for the lab from the cache folder; the others fetch from the lab's store.
        if index == 0:
            lab.start_worker(worker, inventory, artifacts=CACHE)
        else:
            lab.start_worker(worker, inventory, lowering=False)
    lab_began = time.perf_counter()
    lab.wait_workers(set(names))

    night = Night(name, len(split), lab_start=time.perf_counter() - lab_began)
    env = {**os.environ, "ETLAB_RESULTS": str(home / "results"), "ETLAB_STATE": str(home / "ws-state"),
           "COLUMNS": "300", "NO_COLOR": "1"}  # fmt: skip
    started = time.perf_counter()
    process = subprocess.Popen(
        [sys.executable, "-m", "fabric", "nightly", "--inventory", str(workstation), "--night", args.night],
        cwd=PROJECT_ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1,
    )  # fmt: skip
    assert process.stdout is not None
    boards_submitted = time.time()  # wall clock: the history's created_at is one
    output = []
    for line in process.stdout:
        output.append(line)
        text = line.strip()
        if LOWERING_LINE.match(text):
            boards_submitted = time.time()  # the last lowering reply: the boards' tasks go out next
            night.lowering_phase = time.perf_counter() - started
        share = SHARE_LINE.match(text)
        if share and share.group(1) in {b.name for b in boards}:
            printed = share.group(4)
            night.shares[share.group(1)] = (share.group(3), int(share.group(2)), float(printed) if printed else -1.0)
    night.exit_code = process.wait()
    night.wall = time.perf_counter() - started
    (home / "night.log").write_text("".join(output))
    if night.exit_code != 0 or len(night.shares) != len(boards):
        print("".join(output[-60:]))
        raise SystemExit(f"night {name}: exit {night.exit_code}, shares {night.shares} (log: {home / 'night.log'})")

    history = History(url)
    try:
        records = history.runs(night=args.night)
    finally:
        history.close()
    night.cells = len(records)
    night.ok_cells = sum(r.status == "ok" for r in records)
    night.runner_seconds = sum((args.warmup + args.iterations) * (r.mean_ms or 0.0) / 1000 for r in records)
    night.hosts = {f"{r.board} {r.model} {r.backend}": r.host or "?" for r in records}
    for board, (host, count, seconds) in list(night.shares.items()):
        if seconds < 0:  # the night does not print it: submitted -> the board's last cell recorded (on the worker)
            last = max(r.created_at.timestamp() for r in records if r.board == board and r.created_at)
            night.shares[board] = (host, count, last - boards_submitted)
    return night, lab


def scheduling_overhead(lab: LocalLab, tasks: int, round_trips: int) -> tuple[float, float]:
    """(wall / tasks for `tasks` no-op tasks at once, the median round trip of one task), through TLS."""
    client = cluster.connect(lab.settings)
    needs = {cluster.revision_resource(): 1}
    try:
        client.submit(abs, -1, resources=needs, pure=False).result()  # warm: the function known, the link open
        trips = []
        for i in range(round_trips):
            begun = time.perf_counter()
            client.submit(abs, -i, resources=needs, pure=False).result()
            trips.append(time.perf_counter() - begun)
        begun = time.perf_counter()
        futures = [client.submit(abs, -i, resources=needs, pure=False) for i in range(tasks)]
        results = client.gather(futures)
        wall = time.perf_counter() - begun
        assert sorted(results) == list(range(tasks)), "the no-op tasks returned something else"
    finally:
        client.close()
    return wall / tasks, statistics.median(trips)


def versions() -> dict[str, str]:
    from importlib.metadata import version

    import distributed

    return {
        "python": sys.version.split()[0], "distributed": distributed.__version__,
        "dask": __import__("dask").__version__, "torch": version("torch"), "executorch": version("executorch"),
        "postgres": next(Path("/usr/lib/postgresql").iterdir()).name,
    }  # fmt: skip


def main() -> None:
    sys.stdout.reconfigure(line_buffering=True)  # type: ignore[union-attr]
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--iterations", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--order", default="ABBA", help="the nights in order, e.g. AB or ABBA (A: 1 worker, B: 2)")
    parser.add_argument("--tasks", type=int, default=200)
    parser.add_argument("--night", default="2026-12-04")
    parser.add_argument("--json", type=Path, default=None, help="write the figures here (for bench/simulate_lab.py)")
    args = parser.parse_args()

    console.info(f"load average before: {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs; {versions()}")
    lowering = lower_programs()
    console.info(f"fab lower of {', '.join(MODELS)} into {CACHE}: {lowering:.1f} s")
    root = Path(tempfile.mkdtemp(prefix="etlab-bench-lab-"))
    sshd = SshdLab(root / "sshd", network=NETWORK)
    nights: list[Night] = []
    overhead: tuple[float, float] | None = None
    try:
        with private_postgres() as server:
            boards = [sshd.board(name).board for name in BOARDS]
            began = time.perf_counter()
            for board in boards:
                with connect(board) as conn:
                    provision.setup_board(conn)
            console.info(f"4 boards provisioned in {time.perf_counter() - began:.1f} s")
            for index, which in enumerate(args.order):
                split = [boards] if which == "A" else [boards[:2], boards[2:]]
                night, lab = run_night(f"{which}{index}", split, boards, server, root, args)
                try:
                    if which == "B" and overhead is None:
                        overhead = scheduling_overhead(lab, args.tasks, 30)
                finally:
                    lab.close()
                nights.append(night)
                shares = ", ".join(f"{b} {n} on {h} {s:.1f} s" for b, (h, n, s) in sorted(night.shares.items()))
                console.info(f"night {night.name}: {night.wall:.1f} s, {night.cells} cells; {shares}")
    finally:
        sshd.close()
        shutil.rmtree(root, ignore_errors=True)
    report(nights, overhead, args)


def report(nights: list[Night], overhead: tuple[float, float] | None, args: argparse.Namespace) -> None:
    print("\n| night | workers | lab start s | wall s | cells (ok) | lowering phase s | board shares (host, s) "
          "| longest share s | lab added s |")  # fmt: skip
    print("|---|---:|---:|---:|---:|---:|---|---:|---:|")
    for night in nights:
        shares = "; ".join(f"{b}: {h} {s:.1f}" for b, (h, _, s) in sorted(night.shares.items()))
        print(
            f"| {night.name} | {night.workers} | {night.lab_start:.1f} | {night.wall:.1f} | {night.cells} "
            f"({night.ok_cells}) | {night.lowering_phase:.1f} | {shares} | {night.longest_share:.1f} | "
            f"{night.wall - night.longest_share:.1f} |"
        )
    walls = {kind: statistics.median([n.wall for n in nights if n.name[0] == kind]) for kind in "AB"
             if any(n.name[0] == kind for n in nights)}  # fmt: skip
    if len(walls) == 2:
        print(f"\nB / A (wall, medians): {walls['B'] / walls['A']:.2f}")
    cell_seconds = [s / n for night in nights for _, n, s in night.shares.values() if n]
    runner = [night.runner_seconds / night.cells for night in nights if night.cells]
    figures: dict[str, Any] = {
        "cell_seconds": statistics.median(cell_seconds),
        "runner_seconds_per_cell": statistics.median(runner),
        "iterations": args.iterations,
        "warmup": args.warmup,
        "nights": [asdict(n) | {"longest_share": n.longest_share} for n in nights],
    }
    print(f"per cell: {figures['cell_seconds']:.2f} s on its board, of which the runner's own "
          f"{figures['runner_seconds_per_cell']:.2f} s ({args.warmup} + {args.iterations} runs x mean)")  # fmt: skip
    if overhead is not None:
        per_task, trip = overhead
        figures.update(task_overhead_seconds=per_task, round_trip_seconds=trip)
        print(f"scheduling: {args.tasks} no-op tasks {per_task * 1000:.1f} ms per task (wall / {args.tasks}); "
              f"one task's round trip {trip * 1000:.1f} ms (median of 30), TLS")  # fmt: skip
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()
