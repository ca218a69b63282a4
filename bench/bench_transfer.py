"""Transfers to and from a real loopback sshd: etlab's push/pull vs OpenSSH's scp, re-push cost, and fan-out.

Everything runs against private sshd servers started with the test suite's lab (tests/plugins/sshd.py), in one
run, with our transfer and scp interleaved round by round (alternating who goes first, after a sync) so drift
on a shared machine hits both alike.

    .venv/bin/python bench/bench_transfer.py [--size-mib 256] [--rounds 5] [--boards 8] [--fanout-rounds 3]

- push: connect + push_file() of a fresh file (sha256 known, as from an artifact sidecar): upload through
  OpenSSH's ssh client (the default `bulk_transfer: auto` for large files), hashed on the board while it
  arrives, rename, sidecar. scp: `scp FILE board:PATH` (OpenSSH 9 scp speaks SFTP).
- pull: connect + pull_bundle() of a bundle holding the file: tar stream through ssh, unpack and hash, verify
  against the manifest. scp: `scp board:FILE LOCAL`.
- both again with `bulk_transfer: paramiko` (everything over paramiko's exec channels), for comparison.
  etlab's transfers pay one paramiko handshake (plus one OpenSSH handshake for bulk); scp pays one.
- re-push: push_file() of content the board already holds, on an open connection.
- fan-out: connect + push a tiny payload + a trivial command + pull a tiny bundle, on N boards vs 1 board;
  again with the command busy for 0.5 s on the board, as a real run is. The fake boards' CPU is this machine's,
  so the bench also prints the CPU each board job costs here and on the "board", and the floor that puts
  on the tiny fan-out.

Targets: push and pull >= 0.95 x scp; re-push < 0.2 s; fan-out on N boards < 1.5 x one board.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(PROJECT_ROOT))

from orchestrator import console  # noqa: E402
from orchestrator.boards.fanout import exit_code, fan_out  # noqa: E402
from orchestrator.boards.inventory import Board  # noqa: E402
from orchestrator.results.bundle import MANIFEST  # noqa: E402
from orchestrator.testing.sshd import SshdBoard, SshdLab  # noqa: E402
from orchestrator.transport import connect  # noqa: E402
from orchestrator.transport.pull import pull_bundle  # noqa: E402
from orchestrator.transport.transfer import push_file  # noqa: E402

MIB = 1 << 20


def timed(action: Callable[[], object]) -> float:
    started = time.perf_counter()
    action()
    return time.perf_counter() - started


def busy_cpu_seconds() -> float:
    """CPU time used so far by the whole machine (both "board" and workstation), from /proc/stat."""
    with open("/proc/stat") as stat:
        ticks = [int(field) for field in stat.readline().split()[1:]]
    return (sum(ticks) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK")  # all but idle and iowait


def scp(fake: SshdBoard, source: str, target: str) -> None:
    subprocess.run(["scp", "-q", "-P", str(fake.port), *fake.ssh_options(), source, target], check=True)


def write_bundle(folder: Path, files: dict[str, Path]) -> None:
    folder.mkdir(parents=True)
    listed = {}
    for name, source in files.items():
        os.link(source, folder / name)
        data = (folder / name).read_bytes()
        listed[name] = {"sha256": hashlib.sha256(data).hexdigest(), "size": len(data)}
    (folder / MANIFEST).write_text(json.dumps({"schema": 1, "status": "ok", "files": listed}))


def bench_bulk(lab: SshdLab, size_mib: int, rounds: int) -> list[tuple[str, float, float, float]]:
    fake = lab.board("bulk")
    payload = lab.root / "payload.bin"
    with open(payload, "wb") as handle:
        for _ in range(size_mib):
            handle.write(os.urandom(MIB))
    digest = hashlib.sha256(payload.read_bytes()).hexdigest()
    remote_bundle = fake.workdir_path / "bundles" / "bench"
    write_bundle(remote_bundle, {"payload.bin": payload})
    pulled = lab.root / "pulled"
    pulled.mkdir()
    names = ["push", "push (paramiko only)", "scp push", "pull", "pull (paramiko only)", "scp pull"]
    times: dict[str, list[float]] = {name: [] for name in names}
    cpu: dict[str, list[float]] = {name: [] for name in names}

    def ours_push(kind: str, bulk: str) -> None:
        with connect(fake.board.replace(bulk_transfer=bulk)) as conn:  # a fresh connection, as scp makes one
            push_file(conn, payload, kind=kind, sha256=digest)

    def ours_pull(dest: Path, bulk: str) -> None:
        with connect(fake.board.replace(bulk_transfer=bulk)) as conn:
            pull_bundle(conn, str(remote_bundle), dest)

    remote_file = f"root@{fake.address}:{remote_bundle / 'payload.bin'}"
    for number in range(rounds):
        scp_target, scp_dest = fake.workdir_path / f"scp{number}.bin", pulled / "scp"
        transfers: dict[str, Callable[[], object]] = {
            "push": partial(ours_push, f"round{number}", "auto"),
            "push (paramiko only)": partial(ours_push, f"round{number}-paramiko", "paramiko"),
            "scp push": partial(scp, fake, str(payload), f"root@{fake.address}:{scp_target}"),
            "pull": partial(ours_pull, pulled / f"ours{number}", "auto"),
            "pull (paramiko only)": partial(ours_pull, pulled / f"ours{number}-paramiko", "paramiko"),
            "scp pull": partial(scp, fake, remote_file, str(scp_dest)),
        }
        # The order rotates every round, and each transfer starts with no dirty pages left by the one before:
        # otherwise whoever goes second pays for the first one's disk writeback.
        pushes, pulls = names[:3], names[3:]
        shift = number % 3
        for name in pushes[shift:] + pushes[:shift] + pulls[shift:] + pulls[:shift]:
            os.sync()
            cpu_before = busy_cpu_seconds()
            times[name].append(timed(transfers[name]))
            cpu[name].append(busy_cpu_seconds() - cpu_before)
        for leftover in [*fake.workdir_path.glob("round*"), *pulled.glob("ours*")]:
            shutil.rmtree(leftover)
        scp_target.unlink()
        scp_dest.unlink()
    rows = []
    for ours, theirs in [(name, f"scp {name.split()[0]}") for name in names if not name.startswith("scp")]:
        ours_rate = size_mib / statistics.median(times[ours])
        scp_rate = size_mib / statistics.median(times[theirs])
        rows.append((ours, ours_rate, scp_rate, ours_rate / scp_rate))
        console.info(
            f"{ours}: ours {[round(size_mib / t) for t in times[ours]]} MiB/s, "
            f"scp {[round(size_mib / t) for t in times[theirs]]} MiB/s; machine CPU per transfer (median): "
            f"ours {statistics.median(cpu[ours]):.2f} s, scp {statistics.median(cpu[theirs]):.2f} s"
        )
    return rows


def bench_repush(lab: SshdLab, size_mib: int) -> tuple[float, float]:
    fake = lab.board("repush")
    model = lab.root / "payload.bin"
    digest = hashlib.sha256(model.read_bytes()).hexdigest()
    with connect(fake.board) as conn:
        push_file(conn, model, sha256=digest)
        with_sha = [timed(lambda: push_file(conn, model, sha256=digest)) for _ in range(10)]
        without_sha = [timed(lambda: push_file(conn, model)) for _ in range(10)]  # hashed here once, then memoised
    return statistics.median(with_sha), statistics.median(without_sha)


def fanout_job(root: Path, round_tag: str, remote_seconds: float) -> Callable[[Board], None]:
    """connect, push a new 1 KiB payload, run a command (optionally busy for a while), pull a tiny bundle."""

    def job(board: Board) -> None:
        tiny = root / f"tiny-{board.name}-{round_tag}.bin"
        tiny.write_bytes(os.urandom(1024))
        with connect(board) as conn:
            push_file(conn, tiny, kind="inputs", suffix=".bin")
            bundle = f"{conn.workdir}/bundles/{round_tag}"
            busy = f"sleep {remote_seconds} && " if remote_seconds else ""
            conn.run_shell(
                f"{busy}mkdir -p {bundle} && echo ok > {bundle}/out.txt && "
                f'printf \'{{"schema": 1, "files": {{"out.txt": {{"sha256": "%s", "size": 3}}}}}}\' '
                f'"$(sha256sum {bundle}/out.txt | cut -c1-64)" > {bundle}/{MANIFEST}'
            )
            pull_bundle(conn, bundle, root / "pulled" / board.name / round_tag)

    return job


@dataclass
class FanOut:
    single: float  # median wall time, one board
    many: float  # median wall time, all boards
    client_cpu_ms: float  # CPU of this process per board job
    server_cpu_ms: float  # CPU of sshd and everything it ran, per board job

    @property
    def ratio(self) -> float:
        return self.many / self.single


def bench_fanout(lab: SshdLab, count: int, rounds: int, remote_seconds: float) -> FanOut:
    server_before = resource.getrusage(resource.RUSAGE_CHILDREN)
    fakes = [lab.board(f"fan{i}-{remote_seconds}") for i in range(count)]
    root = lab.root / f"fanout-{remote_seconds}"
    root.mkdir()
    single: list[float] = []
    many: list[float] = []
    client_cpu, jobs = 0.0, 0
    for round_number in range(rounds + 1):  # round 0 pins host keys and warms up; not counted
        for label, boards, sink in (("one", fakes[:1], single), ("all", fakes, many)):
            tag = f"r{round_number}-{label}"
            started, cpu_started = time.perf_counter(), time.process_time()
            outcomes = fan_out([f.board for f in boards], fanout_job(root, tag, remote_seconds))
            elapsed = time.perf_counter() - started
            if exit_code(outcomes) != 0:
                raise SystemExit(f"fan-out failed: {[o.error for o in outcomes if not o.ok]}")
            if round_number:
                sink.append(elapsed)
                client_cpu += time.process_time() - cpu_started
                jobs += len(boards)
    for fake in fakes:
        lab.discard(fake)  # reaping the servers adds their CPU (and their sessions') to RUSAGE_CHILDREN
    server_after = resource.getrusage(resource.RUSAGE_CHILDREN)
    server_cpu = (server_after.ru_utime + server_after.ru_stime) - (server_before.ru_utime + server_before.ru_stime)
    all_jobs = jobs * (rounds + 1) / rounds  # the warm-up round ran on the servers too
    return FanOut(
        statistics.median(single), statistics.median(many), 1000 * client_cpu / jobs, 1000 * server_cpu / all_jobs
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size-mib", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--boards", type=int, default=8)
    parser.add_argument("--fanout-rounds", type=int, default=3)
    args = parser.parse_args()

    lab = SshdLab(Path(tempfile.mkdtemp(prefix="etlab-bench-transfer-")))
    try:
        console.info(f"load average before: {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs")
        bulk = bench_bulk(lab, args.size_mib, args.rounds)
        with_sha, without_sha = bench_repush(lab, args.size_mib)
        tiny = bench_fanout(lab, args.boards, args.fanout_rounds, 0)
        busy = bench_fanout(lab, args.boards, args.fanout_rounds, 0.5)
        console.info(f"load average after: {os.getloadavg()[0]:.2f}")
    finally:
        lab.close()
        shutil.rmtree(lab.root, ignore_errors=True)

    rows: list[tuple[str, float, float | None, float | None, str]] = [
        (f"{name} {args.size_mib} MiB (MiB/s, median of {args.rounds})", ours, theirs, ratio, ">= 0.95 x scp")
        for name, ours, theirs, ratio in bulk
    ]
    rows += [
        ("re-push unchanged, sha256 given (s)", with_sha, None, None, "< 0.2 s"),
        ("re-push unchanged, sha256 memoised (s)", without_sha, None, None, "< 0.2 s"),
        (f"fan-out push+run+pull, {args.boards} boards vs 1 (s)", tiny.many, tiny.single, tiny.ratio, "< 1.5 x"),
        ("  same, run busy 0.5 s on the board (s)", busy.many, busy.single, busy.ratio, "< 1.5 x"),
    ]
    columns = ["measure", "etlab", "reference", "ratio", "target"]
    console.table("etlab transfers vs OpenSSH (loopback sshd)", columns, rows)
    cores = os.cpu_count() or 1
    floor = args.boards * (tiny.client_cpu_ms + tiny.server_cpu_ms) / cores / (1000 * tiny.single)
    console.info(
        f"CPU per board job: {tiny.client_cpu_ms:.1f} ms here + {tiny.server_cpu_ms:.1f} ms in sshd and its commands. "
        f"The fake boards share this machine's {cores} CPUs, so {args.boards} tiny jobs cannot take less than "
        f"{floor:.1f} x one job's wall time here, however parallel the fan-out is."
    )


if __name__ == "__main__":
    main()
