"""The lab's engine: Dask distributed (docs/DESIGN.md, "The lab's engine", says why).

A lab is one scheduler (`fab lab-scheduler`), workers on the hosts that reach boards (`fab worker`) and the
workstation whose `fab nightly` hands its night over (lab/lab_night.py). A worker advertises what it can do as Dask
resources, so the scheduler gives it only work it can do:
- `board:<name>` for every board of its inventory it reaches (one cell run at a time per board);
- `lowering` (one at a time: torch.export keeps module-level state) and `memory-gb` (what is free at start);
- `etlab:<revision>`: its code, so a host running another etlab (another cache key, another runner) takes nothing.

Security: with a tls:// scheduler every party proves itself with the lab's certificate (`fab lab-certs`; mutual TLS,
encryption required); tcp:// is accepted on loopback only (lab/lab_settings.py). The workstation never unpickles
what a worker returns: its client deserializes msgpack only, and tasks return plain data it checks
(lab/lab_night.py).
"""

from __future__ import annotations

import asyncio
import datetime as dt
import hashlib
import os
import socket
from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

from orchestrator import console, paths
from orchestrator.boards.inventory import Board, Inventory
from orchestrator.errors import BoardError, ExitCode, UsageError
from orchestrator.lab.lab_settings import CA_FILE, KEY_AND_CERT_FILE, LabSettings
from orchestrator.paths import PROJECT_ROOT

KEY_FILE = "lab-key.pem"
BOARD, LOWERING, MEMORY, CORES = "board:", "lowering", "memory-gb", "cores"
REVISION_SLOTS = 1_000_000  # a resource every task takes one of: never the limit
CONNECT_SECONDS = 20.0
# Dask's own HTTP server (health and metrics; no dashboard): loopback only, the lab's port is its TLS one.
HEALTH_ADDRESS = "127.0.0.1:0"
WORKER_TTL = "60s"


class LabUnreachable(BoardError):
    """The lab's scheduler does not answer (or refuses our certificate): infrastructure, exit 69."""

    exit_code = ExitCode.UNAVAILABLE


_SOURCES = (".py", ".cpp", ".h", ".txt", ".cmake", ".sh")


@cache
def revision() -> str:
    """etlab's code as a worker runs it: the orchestrator's and the board's sources (the cache key, the runner)."""
    digest = hashlib.sha256()
    for folder in ("orchestrator", "board"):
        for path in sorted((PROJECT_ROOT / folder).rglob("*")):
            if (
                path.is_file()
                and path.suffix in (".py", ".cpp", ".h", ".txt", ".cmake", ".sh")
                and "__pycache__" not in path.parts
            ):
                digest.update(path.relative_to(PROJECT_ROOT).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:12]


def revision_resource() -> str:
    return f"etlab:{revision()}"


def board_resource(name: str) -> str:
    return f"{BOARD}{name}"


def security(settings: LabSettings) -> Any:
    """Dask's Security for the lab: mutual TLS with the lab's certificate, or None for a loopback tcp:// lab."""
    if not settings.secure:
        return None
    from distributed.security import Security

    folder = settings.certificates
    assert folder is not None  # lab_settings requires it for tls://
    files = {name: folder / name for name in (CA_FILE, KEY_AND_CERT_FILE, KEY_FILE)}
    missing = [str(path) for path in files.values() if not path.is_file()]
    if missing:
        raise UsageError(
            f"the lab's certificates are missing: {', '.join(missing)}", hint="`fab lab-certs DIR` makes them"
        )
    ca, cert, key = (str(files[name]) for name in (CA_FILE, KEY_AND_CERT_FILE, KEY_FILE))
    return Security(
        require_encryption=True,
        tls_ca_file=ca,
        tls_client_cert=cert, tls_client_key=key,
        tls_scheduler_cert=cert, tls_scheduler_key=key,
        tls_worker_cert=cert, tls_worker_key=key,
    )  # fmt: skip


def make_certificates(folder: Path, *, days: int = 3650) -> list[Path]:
    """The lab's CA and the one key and certificate every lab member presents (copy the folder to each host)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    folder.mkdir(parents=True, exist_ok=True)
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "etlab lab")])
    now = dt.datetime.now(dt.timezone.utc)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    pem = cert.public_bytes(serialization.Encoding.PEM)
    key_pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    written = []
    for file_name, data, mode in ((CA_FILE, pem, 0o644), (KEY_AND_CERT_FILE, pem, 0o644), (KEY_FILE, key_pem, 0o600)):
        path = folder / file_name
        descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
        with os.fdopen(descriptor, "wb") as out:
            out.write(data)
        os.chmod(path, mode)
        written.append(path)
    return written


def connect(settings: LabSettings, *, timeout: float = CONNECT_SECONDS) -> Any:
    """A client of the lab that deserializes msgpack only: nothing a worker returns can run code here."""
    from distributed import Client

    try:
        return Client(
            settings.scheduler,
            security=security(settings),
            timeout=timeout,
            deserializers=["msgpack", "error"],
            set_as_default=False,
        )
    except (OSError, TimeoutError) as exc:
        raise LabUnreachable(
            f"the lab's scheduler {settings.scheduler} does not answer: {exc}",
            hint="is `fab lab-scheduler` running there, and are this host's certificates the lab's?",
        ) from None


# ---------------------------------------------------------------- what a worker offers


def reachable(board: Board, timeout: float = 3.0) -> bool:
    """Whether the board's SSH port answers from this host (a labgrid board: its place is found when a cell runs)."""
    if board.labgrid is not None:
        return True
    if board.transport == "local":
        return False  # every host's own machine: not a board another host can name
    try:
        with socket.create_connection((board.host, board.port), timeout=timeout):
            return True
    except OSError:
        return False


def free_memory_gb() -> float:
    from orchestrator.lowering.export.lower import available_memory  # the lowering's own reading; `fab lab` needs none

    available = available_memory()
    return round(available / 2**30, 1) if available is not None else 0.0


@dataclass(frozen=True)
class WorkerOffer:
    name: str
    boards: tuple[str, ...]
    memory_gb: float
    cores: int = 1
    lowering: bool = True
    unreachable: tuple[str, ...] = field(default=())

    def resources(self) -> dict[str, float]:
        resources: dict[str, float] = {revision_resource(): REVISION_SLOTS}
        resources.update({board_resource(name): 1 for name in self.boards})
        if self.lowering:
            resources.update({LOWERING: 1, MEMORY: self.memory_gb, CORES: self.cores})  # cores: said, not asked
        return resources


def offer(inventory: Inventory, name: str, *, boards: Iterable[str] | None, lowering: bool) -> WorkerOffer:
    """What this host offers the lab: the boards of its inventory it reaches (or those named), memory, lowering."""
    names = list(boards) if boards is not None else list(inventory.boards)
    unknown = [board for board in names if board not in inventory.boards]
    if unknown:
        raise UsageError(f"no board {', '.join(map(repr, unknown))} in {inventory.path}")
    answering = {board: reachable(inventory.boards[board]) for board in names}
    return WorkerOffer(
        name=name,
        boards=tuple(board for board, ok in answering.items() if ok),
        memory_gb=free_memory_gb(),
        cores=os.cpu_count() or 1,
        lowering=lowering,
        unreachable=tuple(board for board, ok in answering.items() if not ok),
    )


# The worker process's own inventory: the tasks it runs find their boards (by name) in it.
_worker_inventory: Inventory | None = None


def worker_inventory() -> Inventory:
    if _worker_inventory is None:
        raise RuntimeError("not a lab worker: no inventory")
    return _worker_inventory


def run_worker(settings: LabSettings, inventory: Inventory, what: WorkerOffer) -> int:
    """`fab worker`: join the lab until stopped (Ctrl+C, SIGTERM); the scheduler reschedules what it held."""
    import dask
    from distributed import Worker

    global _worker_inventory
    _worker_inventory = inventory
    # Dask's sampling profiler (sys._current_frames() every 10 ms) can freeze a worker on CPython 3.11: a garbage
    # collection inside it frees a threading.local while the interpreter lock is held (gh-106883; bench/README.md,
    # "A lab night on several workers"). etlab times its cells itself: off.
    dask.config.set({"distributed.worker.profile.enabled": False})
    os.environ["ETLAB_HOST"] = what.name  # the host its records name

    async def serve() -> None:
        # Threads: a cell per board at once, plus a lowering; the resources keep each to what it may run.
        threads = max(2, len(what.boards) + 1)
        console.info(f"worker {what.name}: joining the lab at {settings.scheduler} (waits for its scheduler to answer)")
        async with Worker(
            settings.scheduler,
            security=security(settings),
            name=what.name,
            nthreads=threads,
            resources=what.resources(),
            dashboard=False,
            dashboard_address=HEALTH_ADDRESS,
            host=_listen_host(settings),
            local_directory=str(paths.state_dir() / "dask"),
        ) as worker:
            console.info(f"worker {what.name} joined the lab at {settings.scheduler} as {worker.address}")
            await worker.finished()

    try:
        asyncio.run(serve())
    except (OSError, TimeoutError) as exc:
        raise LabUnreachable(f"the lab's scheduler {settings.scheduler} does not answer: {exc}") from None
    return ExitCode.OK


def _listen_host(settings: LabSettings) -> str | None:
    """Workers listen for their peers; on a loopback lab only on loopback."""
    return None if settings.secure else "127.0.0.1"


def run_scheduler(settings: LabSettings) -> int:
    """`fab lab-scheduler`: the lab's scheduler on the address of `lab.scheduler`, without Dask's web dashboard."""
    import urllib.parse

    import dask
    from distributed import Scheduler

    parsed = urllib.parse.urlsplit(settings.scheduler)
    # A worker silent for a minute (a cut network, a frozen host) is given up: its share goes to another worker.
    dask.config.set({"distributed.scheduler.worker-ttl": WORKER_TTL})

    async def serve() -> None:
        async with Scheduler(
            host=parsed.hostname,
            port=parsed.port or 0,
            protocol=parsed.scheme,
            security=security(settings),
            dashboard=False,
            dashboard_address=HEALTH_ADDRESS,
        ) as scheduler:
            console.info(f"the lab's scheduler listens at {scheduler.address}")
            await scheduler.finished()

    asyncio.run(serve())
    return ExitCode.OK


# ---------------------------------------------------------------- what the lab does now (`fab lab`)


@dataclass(frozen=True)
class WorkerState:
    name: str
    address: str
    boards: tuple[str, ...]
    memory_gb: float | None
    cores: int | None
    same_etlab: bool  # runs this etlab: it takes this workstation's work
    running: tuple[str, ...]  # task names


@dataclass(frozen=True)
class LabState:
    scheduler: str
    workers: tuple[WorkerState, ...]
    waiting: tuple[tuple[str, str], ...]  # (task, what it waits for)


def _scheduler_view(dask_scheduler: Any) -> dict[str, Any]:
    """Runs on the scheduler: plain data only (the client reads msgpack)."""
    running = {str(ws.address): [str(ts.key) for ts in ws.processing] for ws in dask_scheduler.workers.values()}
    waiting = []
    for ts in list(dask_scheduler.unrunnable) + list(getattr(dask_scheduler, "queued", ())):
        needs = ", ".join(sorted(str(name) for name in (ts.resource_restrictions or {})))
        waiting.append([str(ts.key), needs or "a free worker"])
    for ts in dask_scheduler.tasks.values():
        if ts.state == "no-worker" and all(str(ts.key) != key for key, _ in waiting):
            needs = ", ".join(sorted(str(name) for name in (ts.resource_restrictions or {})))
            waiting.append([str(ts.key), needs or "a free worker"])
    return {"running": running, "waiting": waiting}


def lab_state(settings: LabSettings) -> LabState:
    """The lab's workers, what each runs now, and the tasks that wait."""
    client = connect(settings)
    try:
        info = client.scheduler_info(n_workers=-1)
        view = client.run_on_scheduler(_scheduler_view)
    finally:
        client.close()
    mine = revision_resource()
    workers = []
    for address, worker in sorted(info.get("workers", {}).items(), key=lambda item: str(item[1].get("name"))):
        resources = worker.get("resources") or {}
        boards = tuple(sorted(str(n).removeprefix(BOARD) for n in resources if str(n).startswith(BOARD)))
        memory = resources.get(MEMORY)
        workers.append(
            WorkerState(
                name=str(worker.get("name")),
                address=str(address),
                boards=boards,
                memory_gb=float(memory) if isinstance(memory, int | float) else None,
                cores=int(resources[CORES]) if isinstance(resources.get(CORES), int | float) else None,
                same_etlab=mine in resources,
                running=tuple(str(key) for key in view.get("running", {}).get(address, [])),
            )
        )
    waiting = tuple((str(key), str(needs)) for key, needs in view.get("waiting", []))
    return LabState(settings.scheduler, tuple(workers), waiting)
