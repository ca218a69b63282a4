"""Issue 39: Dask distributed, Ray and Celery (Redis broker) measured for a lab night, on this machine.

None of them is an etlab dependency: run this with a separate venv that has them,

    python3 -m venv /work/peers/engines-venv
    /work/peers/engines-venv/bin/pip install 'dask[distributed]' ray celery redis
    /work/peers/engines-venv/bin/python bench/bench_engines.py [--engines dask,ray,celery] [--tasks 500] [--keep-logs]

(`redis-server` must be on PATH: `apt-get install -y redis-server`; the script starts its own on 127.0.0.1 on a
free port and stops it). Every engine gets a scheduler/head/broker and 2 worker processes with one task slot each,
all on 127.0.0.1; worker "a" advertises the resource `board:a` (Celery: it also consumes the queue `board.a`).

- overhead: N no-op tasks submitted at once, wall / N; one task's round trip, median of 50.
- placement: 20 tasks needing board:a and 20 free ones (each sleeps 50 ms); which workers ran them.
- killed worker: a task that sleeps 5 s; the whole process tree of the worker running it gets SIGKILL 1.5 s in;
  does the result arrive, from which worker, how long after the kill; starts and ends counted in a file.
  Then the worker is started again and the same is done with SIGSTOP (a host whose network is cut: its sockets stay
  open, it just goes silent); after the result the tree gets SIGCONT: does its copy of the task finish too?
  Dask's scheduler runs with worker-ttl 15 s (default 5 minutes), Ray's GCS checks nodes every 1 s with a 1 s
  timeout (defaults 3 s and 10 s), 5 misses.
- client import time (fresh interpreter, median of 3), installed size (files in the RECORDs of the engine's
  distributions and their dependencies), idle RSS of one worker's process tree, processes per cluster.

Celery runs as a lab would need it to survive a dead worker: acks_late, reject on worker lost, prefetch 1, and the
Redis transport's visibility_timeout lowered to 10 s (default 3600 s) with a restore sweep every second.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.metadata as md
import json
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from pathlib import Path

HERE = Path(__file__).resolve().parent
BIN = Path(sys.executable).parent
SLEEP_KILLED = 5.0
KILL_AFTER = 1.5
RECOVERY_TIMEOUT = 75.0
KEEP_LOGS = False


# ---------------------------------------------------------------- tasks (run on the workers, all three engines)
def worker_name() -> str:
    return os.environ.get("BENCH_ENGINES_WORKER", "?")


def noop(i: int = 0) -> int:
    return i


def where(delay: float = 0.05) -> str:
    time.sleep(delay)
    return worker_name()


def slow_with_side_effect(path: str, seconds: float = SLEEP_KILLED) -> str:
    """Appends 'start <worker> <pid>' then, after `seconds`, 'end <worker> <pid>'; returns the worker's name."""
    with open(path, "a") as f:
        f.write(f"start {worker_name()} {os.getpid()}\n")
    time.sleep(seconds)
    with open(path, "a") as f:
        f.write(f"end {worker_name()} {os.getpid()}\n")
    return worker_name()


# Celery finds its tasks by importing this module in the worker (`celery -A bench_engines:celery_app`).
celery_app = None
if os.environ.get("BENCH_ENGINES_CELERY_PORT"):
    from celery import Celery

    _port = os.environ["BENCH_ENGINES_CELERY_PORT"]
    celery_app = Celery("bench_engines", broker=f"redis://127.0.0.1:{_port}/0", backend=f"redis://127.0.0.1:{_port}/1")
    celery_app.conf.update(
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        worker_prefetch_multiplier=1,
        broker_transport_options={
            "visibility_timeout": 10,
            "unacked_restore_interval": 1,
            "unacked_restore_throttle": 1,
        },
        result_expires=600,
        broker_connection_retry_on_startup=True,
    )
    c_noop = celery_app.task(name="noop")(noop)
    c_where = celery_app.task(name="where")(where)
    c_slow = celery_app.task(name="slow")(slow_with_side_effect)


# ---------------------------------------------------------------- processes
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def children_map() -> dict[int, list[int]]:
    kids: dict[int, list[int]] = {}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            stat = (d / "stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        kids.setdefault(ppid, []).append(int(d.name))
    return kids


def tree(pid: int) -> list[int]:
    kids = children_map()
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(kids.get(p, []))
    return out


def rss_mib(pids: list[int]) -> float:
    total = 0
    for p in pids:
        with contextlib.suppress(OSError):
            for line in Path(f"/proc/{p}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
    return total / 1024


def listening(pids: list[int]) -> list[str]:
    """The TCP addresses these processes listen on (from /proc/net/tcp{,6} and their fds)."""
    inodes = set()
    for p in pids:
        with contextlib.suppress(OSError):
            for fd in Path(f"/proc/{p}/fd").iterdir():
                with contextlib.suppress(OSError):
                    m = re.fullmatch(r"socket:\[(\d+)\]", os.readlink(fd))
                    if m:
                        inodes.add(m.group(1))
    out = []
    for table in ("tcp", "tcp6"):
        for line in Path(f"/proc/net/{table}").read_text().splitlines()[1:]:
            f = line.split()
            if f[3] == "0A" and f[9] in inodes:
                host, port = f[1].split(":")
                wild = set(host) == {"0"}
                out.append(f"{'*' if wild else 'lo'}:{int(port, 16)}")
    return sorted(set(out))


def kill_tree(pid: int) -> None:
    for p in tree(pid):
        with contextlib.suppress(ProcessLookupError):
            os.kill(p, signal.SIGKILL)


class Procs:
    """Processes this run started, each in a session of its own; stop() kills every tree."""

    def __init__(self, logdir: Path) -> None:
        self.logdir = logdir
        self.by_name: dict[str, subprocess.Popen] = {}
        self.argvs: dict[str, tuple[list[str], dict[str, str] | None]] = {}  # to start it again
        self.all: list[subprocess.Popen] = []

    def start(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> subprocess.Popen:
        with open(self.logdir / f"{name}.log", "w") as log:
            p = subprocess.Popen(
                argv,
                stdout=log,
                stderr=subprocess.STDOUT,
                env={**os.environ, **(env or {})},
                start_new_session=True,
                cwd=self.logdir,
            )
        self.by_name[name], self.argvs[name] = p, (argv, env)
        self.all.append(p)
        return p

    def restart(self, name: str) -> None:
        kill_tree(self.by_name[name].pid)
        self.start(name, *self.argvs[name])

    def count(self) -> int:
        return sum(len(tree(p.pid)) for p in self.by_name.values() if p.poll() is None)

    def stop(self) -> None:
        for p in self.all:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGCONT)  # a frozen tree dies only once it runs
            kill_tree(p.pid)
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(timeout=10)


def accepts(port: int) -> bool:
    """A connection to 127.0.0.1:`port` opens (and is closed again); raises while nothing listens."""
    socket.create_connection(("127.0.0.1", port), 1).close()
    return True


def wait_for(pred: Callable[[], bool], timeout: float, what: str) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        with contextlib.suppress(Exception):
            if pred():
                return
        time.sleep(0.1)
    raise RuntimeError(f"timed out waiting for {what}")


# ---------------------------------------------------------------- one engine = start, submit, result, stop
class Engine(ABC):
    name = ""
    needs = ""

    def __init__(self, work: Path) -> None:
        self.work, self.procs = work, Procs(work)

    @abstractmethod
    def up(self) -> None: ...
    @abstractmethod
    def down(self) -> None: ...
    @abstractmethod
    def many(self, n: int) -> list[int]: ...
    @abstractmethod
    def one(self) -> int: ...
    @abstractmethod
    def placed(self, board: str | None) -> Callable[[float], str]: ...
    @abstractmethod
    def slow(self, path: str) -> Callable[[float], str]: ...
    @abstractmethod
    def workers(self) -> int: ...


class Dask(Engine):
    name, needs = "Dask distributed", "a scheduler process (`dask scheduler`, same package)"

    def up(self) -> None:
        from dask.distributed import Client

        port = free_port()
        addr = f"tcp://127.0.0.1:{port}"
        http = ["--no-dashboard", "--dashboard-address", "127.0.0.1:0"]  # else /health, /metrics on 0.0.0.0
        self.procs.start(
            "scheduler",
            [str(BIN / "dask"), "scheduler", "--host", "127.0.0.1", "--port", str(port), *http],
            {"DASK_DISTRIBUTED__SCHEDULER__WORKER_TTL": "15s"},  # default 5 minutes: a silent worker's limit
        )
        for w in "ab":
            res = ["--resources", "board:a=1"] if w == "a" else []
            argv = f"worker {addr} --name {w} --nworkers 1 --nthreads 1 --host 127.0.0.1".split()
            self.procs.start(w, [str(BIN / "dask"), *argv, *http, *res], {"BENCH_ENGINES_WORKER": w})
        wait_for(lambda: accepts(port), 60, "dask scheduler")
        self.client = Client(addr, timeout=60)
        self.client.wait_for_workers(2, timeout=60)

    def down(self) -> None:
        with contextlib.suppress(Exception):
            self.client.close(timeout=5)
        self.procs.stop()

    def workers(self) -> int:
        return len(self.client.scheduler_info()["workers"])

    def many(self, n: int) -> list[int]:
        return self.client.gather(self.client.map(noop, range(n), pure=False))

    def one(self) -> int:
        return self.client.submit(noop, 1, pure=False).result()

    def placed(self, board: str | None) -> Callable[[float], str]:
        fut = self.client.submit(where, pure=False, resources={f"board:{board}": 1} if board else None)
        return lambda t: fut.result(timeout=t)

    def slow(self, path: str) -> Callable[[float], str]:
        fut = self.client.submit(slow_with_side_effect, path, pure=False)
        return lambda t: fut.result(timeout=t)


class Ray(Engine):
    name, needs = "Ray", "a head node (GCS + its raylet, dashboard agent, log monitor; `ray start --head`)"

    def up(self) -> None:
        import ray

        port = free_port()
        self.tmp = tempfile.mkdtemp(prefix="rb", dir="/tmp")  # Ray's socket paths must stay short
        common = [
            "--block",
            "--disable-usage-stats",
            "--node-ip-address",
            "127.0.0.1",
            "--object-store-memory",
            str(100 * 2**20),
        ]
        head = f"start --head --port {port} --num-cpus 0 --include-dashboard false --temp-dir {self.tmp}".split()
        # the GCS declares a silent node dead after `failure_threshold` missed checks (defaults 5, every 3 s, 10 s
        # timeout each): lowered here as Dask's worker-ttl and Celery's visibility_timeout are
        fast = {"RAY_health_check_period_ms": "1000", "RAY_health_check_timeout_ms": "1000"}
        self.procs.start(
            "head", [str(BIN / "ray"), *head, *common], {**fast, "RAY_health_check_failure_threshold": "5"}
        )
        wait_for(lambda: accepts(port), 90, "ray head")
        ray.init(address=f"127.0.0.1:{port}", log_to_driver=False, logging_level="ERROR")
        # One node after the other: two raylets starting at once on one host can pick the same free port
        # ("bind: Address already in use", seen in 1 of 3 runs); separate hosts do not share ports.
        for n, w in enumerate("ab", 1):
            res = ["--resources", json.dumps({"board:a": 1})] if w == "a" else []
            argv = ["start", "--address", f"127.0.0.1:{port}", "--num-cpus", "1", *res, *common]
            self.procs.start(w, [str(BIN / "ray"), *argv], {"BENCH_ENGINES_WORKER": w})

            def joined(n: int = n) -> bool:
                return ray.cluster_resources().get("CPU", 0) >= n

            wait_for(joined, 90, f"ray worker {w}")
        self.ray = ray
        self.r_noop, self.r_where, self.r_slow = (
            ray.remote(num_cpus=1)(f) for f in (noop, where, slow_with_side_effect)
        )

    def down(self) -> None:
        with contextlib.suppress(Exception):
            self.ray.shutdown()
        self.procs.stop()
        if not KEEP_LOGS:
            shutil.rmtree(self.tmp, ignore_errors=True)

    def workers(self) -> int:
        return sum(1 for n in self.ray.nodes() if n["Alive"] and n["Resources"].get("CPU"))

    def many(self, n: int) -> list[int]:
        return self.ray.get([self.r_noop.remote(i) for i in range(n)])

    def one(self) -> int:
        return self.ray.get(self.r_noop.remote(1))

    def placed(self, board: str | None) -> Callable[[float], str]:
        f = self.r_where.options(resources={f"board:{board}": 1}) if board else self.r_where
        ref = f.remote()
        return lambda t: self.ray.get(ref, timeout=t)

    def slow(self, path: str) -> Callable[[float], str]:
        ref = self.r_slow.remote(path)
        return lambda t: self.ray.get(ref, timeout=t)


class CeleryRedis(Engine):
    name, needs = "Celery + Redis", "a broker service (redis-server 7) that is also the result backend"

    def up(self) -> None:
        port = free_port()
        os.environ["BENCH_ENGINES_CELERY_PORT"] = str(port)
        self.procs.start(
            "redis",
            [
                shutil.which("redis-server") or "redis-server",
                "--port",
                str(port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--protected-mode",
                "yes",
            ],
        )
        wait_for(lambda: accepts(port), 30, "redis")
        env = {"BENCH_ENGINES_CELERY_PORT": str(port), "PYTHONPATH": str(HERE)}
        for w in "ab":
            queues = "board.a,celery" if w == "a" else "celery"
            self.procs.start(
                w,
                [
                    str(BIN / "celery"),
                    "-A",
                    "bench_engines:celery_app",
                    "worker",
                    "-n",
                    f"{w}@bench",
                    "-Q",
                    queues,
                    "-c",
                    "1",
                    "-P",
                    "prefork",
                    "-l",
                    "warning",
                    "--without-gossip",
                    "--without-mingle",
                ],
                {**env, "BENCH_ENGINES_WORKER": w},
            )
        import importlib

        sys.path.insert(0, str(HERE))
        self.mod = importlib.import_module("bench_engines")  # its celery_app, configured from the env
        app = self.mod.celery_app
        wait_for(lambda: len(app.control.ping(timeout=0.5)) >= 2, 60, "2 celery workers")

    def down(self) -> None:
        self.procs.stop()

    def workers(self) -> int:
        return len(self.mod.celery_app.control.ping(timeout=0.5))

    def many(self, n: int) -> list[int]:
        from celery import group

        return group(self.mod.c_noop.s(i) for i in range(n)).apply_async().get(timeout=120)

    def one(self) -> int:
        return self.mod.c_noop.delay(1).get(timeout=30)

    def placed(self, board: str | None) -> Callable[[float], str]:
        res = self.mod.c_where.apply_async(queue=f"board.{board}" if board else "celery")
        return lambda t: res.get(timeout=t)

    def slow(self, path: str) -> Callable[[float], str]:
        res = self.mod.c_slow.delay(path)
        return lambda t: res.get(timeout=t)


ENGINES: dict[str, type[Engine]] = {"dask": Dask, "ray": Ray, "celery": CeleryRedis}
IMPORTS = {
    "dask": "from dask.distributed import Client",
    "ray": "import ray",
    "celery": "from celery import Celery; import kombu.transport.redis, redis",
}
ROOTS = {"dask": ["dask", "distributed"], "ray": ["ray"], "celery": ["celery", "redis"]}


# ---------------------------------------------------------------- measures
def measure(key: str, n: int) -> dict:
    work = Path(tempfile.mkdtemp(prefix=f"bench-engines-{key}-"))
    eng = ENGINES[key](work)
    out: dict = {"engine": eng.name, "needs": eng.needs}
    t0 = time.perf_counter()
    try:
        eng.up()
        out["up_s"] = time.perf_counter() - t0
        out["processes"] = eng.procs.count()
        ports = listening([p for proc in eng.procs.by_name.values() for p in tree(proc.pid)])
        out["listen_all"] = sum(a.startswith("*") for a in ports)
        out["listen_lo"] = sum(a.startswith("lo") for a in ports)
        eng.many(20)  # warm: workers import, pools start
        t = time.perf_counter()
        assert eng.many(n) == list(range(n))
        out["per_task_ms"] = (time.perf_counter() - t) / n * 1000
        rts = []
        for _ in range(50):
            t = time.perf_counter()
            eng.one()
            rts.append(time.perf_counter() - t)
        out["round_trip_ms"] = statistics.median(rts) * 1000
        out["idle_worker_rss_mib"] = rss_mib(tree(eng.procs.by_name["a"].pid))
        need = [eng.placed("a") for _ in range(20)]
        free = [eng.placed(None) for _ in range(20)]
        out["board_a_ran_on"] = sorted({g(60) for g in need})
        out["free_ran_on"] = sorted({g(60) for g in free})
        nobody = eng.placed("z")  # no worker reaches board z
        try:
            out["board_z"] = f"ran on {nobody(3)} (wrong)"
        except Exception as e:
            out["board_z"] = f"waits ({type(e).__name__} after 3 s)"
        out["killed"] = killed_worker(eng, work)
        eng.procs.restart(out["killed"]["victim"])
        wait_for(lambda: eng.workers() == 2, 90, "the killed worker to come back")
        out["frozen"] = killed_worker(eng, work, freeze=True)
    except Exception as e:  # a failed engine is a result too
        out["error"] = f"{type(e).__name__}: {e}"
    finally:
        eng.down()
        if not KEEP_LOGS:
            shutil.rmtree(work, ignore_errors=True)
    return out


def killed_worker(eng: Engine, work: Path, freeze: bool = False) -> dict:
    """SIGKILL (or SIGSTOP: a host whose network is cut, no FIN) the tree of the worker running a 5 s task."""
    effects = work / f"effects-{freeze}.txt"
    effects.touch()
    get = eng.slow(str(effects))
    wait_for(lambda: "start" in effects.read_text(), 30, "the slow task to start")
    victim = effects.read_text().split()[1]
    time.sleep(KILL_AFTER)
    pids = tree(eng.procs.by_name[victim].pid)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGSTOP if freeze else signal.SIGKILL)
    killed_at = time.perf_counter()
    res: dict = {"victim": victim}
    try:
        res["result_from"] = get(RECOVERY_TIMEOUT)
        res["after_kill_s"] = time.perf_counter() - killed_at
    except Exception as e:
        res["error"] = f"{type(e).__name__}: {str(e)[:120]}"
        res["after_kill_s"] = time.perf_counter() - killed_at
    if freeze:  # the host comes back: does its copy of the task finish too?
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
        time.sleep(SLEEP_KILLED)
    time.sleep(0.5)
    lines = effects.read_text().split("\n")
    res["starts"] = sum(ln.startswith("start") for ln in lines)
    res["ends"] = sum(ln.startswith("end") for ln in lines)
    return res


def import_seconds(key: str) -> float:
    code = f"import time; t = time.perf_counter(); {IMPORTS[key]}; print(time.perf_counter() - t)"
    runs = [
        float(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout)
        for _ in range(3)
    ]
    return statistics.median(runs)


def norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def dist_bytes(name: str) -> int:
    files = md.distribution(name).files or []
    return sum(Path(f.locate()).stat().st_size for f in files if Path(f.locate()).is_file())


def closure(roots: list[str]) -> set[str]:
    seen, todo = set(), list(roots)
    while todo:
        n = norm(todo.pop())
        if n in seen:
            continue
        try:
            dist = md.distribution(n)
        except md.PackageNotFoundError:
            continue
        seen.add(n)
        for req in dist.requires or []:
            if "extra ==" in req:
                continue
            todo.append(re.split(r"[ ;<>=!~\[(]", req, maxsplit=1)[0])
    return seen


def sizes(key: str) -> dict:
    own = sum(dist_bytes(r) for r in ROOTS[key])
    deps = closure(ROOTS[key])
    return {
        "own_mib": own / 2**20,
        "with_deps_mib": sum(dist_bytes(d) for d in deps) / 2**20,
        "dists": len(deps),
        "versions": {r: md.version(r) for r in ROOTS[key]},
    }


# ---------------------------------------------------------------- report
def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--engines", default="dask,ray,celery")
    ap.add_argument("--tasks", type=int, default=500)
    ap.add_argument("--keep-logs", action="store_true", help="keep each engine's folder of process logs in /tmp")
    args = ap.parse_args()
    global KEEP_LOGS
    KEEP_LOGS = args.keep_logs
    keys = args.engines.split(",")
    rows = {}
    for k in keys:
        t = time.perf_counter()
        r = {"import_s": import_seconds(k), **sizes(k), **measure(k, args.tasks)}
        r["bench_s"] = time.perf_counter() - t
        rows[k] = r
        print(f"# {k}: {json.dumps(r, default=str)}", flush=True)

    def cell(r: dict, f: Callable[[dict], str]) -> str:
        try:
            return f(r)
        except (KeyError, TypeError):
            return "—"

    def killed(k: dict, what: str = "killed") -> str:
        got = f"from {k['result_from']} {k['after_kill_s']:.1f} s later" if "result_from" in k else k["error"][:40]
        return f"{k['victim']} {what}: {got}; {k['starts']} starts / {k['ends']} ends"

    lines = [
        ("cluster up (scheduler/head/broker + 2 workers ready)", lambda r: f"{r['up_s']:.1f} s"),
        ("processes in the cluster", lambda r: str(r["processes"])),
        ("TCP ports listening: all interfaces / loopback", lambda r: f"{r['listen_all']} / {r['listen_lo']}"),
        (f"per task, {args.tasks} no-ops at once", lambda r: f"{r['per_task_ms']:.2f} ms"),
        ("one task's round trip (median of 50)", lambda r: f"{r['round_trip_ms']:.2f} ms"),
        ("20 tasks needing board:a ran on", lambda r: ",".join(r["board_a_ran_on"])),
        ("20 free tasks ran on", lambda r: ",".join(r["free_ran_on"])),
        ("a task needing board:z (no worker has it)", lambda r: r["board_z"]),
        ("worker running a 5 s task SIGKILLed 1.5 s in", lambda r: killed(r["killed"])),
        ("same, SIGSTOPped (cut network), SIGCONT after the result", lambda r: killed(r["frozen"], "frozen")),
        ("client import (median of 3)", lambda r: f"{r['import_s']:.2f} s"),
        (
            "installed: engine / with its dependencies",
            lambda r: f"{r['own_mib']:.0f} / {r['with_deps_mib']:.0f} MiB ({r['dists']} dists)",
        ),
        ("idle worker's process tree RSS", lambda r: f"{r['idle_worker_rss_mib']:.0f} MiB"),
        ("versions", lambda r: ", ".join(f"{k} {v}" for k, v in r["versions"].items())),
        ("also needs", lambda r: r["needs"]),
        ("error", lambda r: r.get("error", "")),
    ]
    print("\n| measure | " + " | ".join(rows[k]["engine"] for k in keys) + " |")
    print("|---|" + "---|" * len(keys))
    for label, f in lines:
        print(f"| {label} | " + " | ".join(cell(rows[k], f) for k in keys) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
