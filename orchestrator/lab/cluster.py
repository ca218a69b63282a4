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
import contextlib
import datetime as dt
import hashlib
import logging
import os
import socket
import ssl
import time
import urllib.parse
from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

from orchestrator import console, paths
from orchestrator.boards.inventory import Board, Inventory
from orchestrator.boards.transports import SshOptions
from orchestrator.errors import BoardError, ExitCode, UsageError
from orchestrator.lab.lab_settings import CA_FILE, KEY_AND_CERT_FILE, LabSettings
from orchestrator.paths import PROJECT_ROOT

KEY_FILE = "lab-key.pem"
BOARD, LOWERING, MEMORY, CORES = "board:", "lowering", "memory-gb", "cores"
REVISION_SLOTS = 1_000_000  # a resource every task takes one of: never the limit
CONNECT_SECONDS = 20.0
# Dask always starts an HTTP server beside its TLS port (identity, info pages with a "close worker" form, metrics).
# Its routes are off (a 404 for everything, whatever the Host header), and it listens on loopback only.
HTTP_ADDRESS = "127.0.0.1:0"
HTTP_OFF: dict[str, list[str]] = {"distributed.scheduler.http.routes": [], "distributed.worker.http.routes": []}
# Dask checks its worker-ttl only every worker-ttl; etlab checks it this often, so a silent host is given up after
# worker-ttl plus at most this (60-65 s by default), not after up to twice worker-ttl.
TTL_CHECK_SECONDS = 5.0
# While the scheduler does not answer, a worker asks again after 1, 2, 4, ... seconds, then every 15 s: a few tries a
# minute, not Dask's ten a second.
REJOIN_FIRST_SECONDS, REJOIN_MAX_SECONDS = 1.0, 15.0
PROBE_SECONDS = 5.0
CERTIFICATE_HINT = "are this host's certificates the lab's? (`fab lab-certs` makes a new lab: copy its folder here)"


class LabUnreachable(BoardError):
    """The lab's scheduler does not answer (or refuses our certificate): infrastructure, exit 69."""

    exit_code = ExitCode.UNAVAILABLE


class LabLost(LabUnreachable):
    """The lab's scheduler went away while the workstation waited on it: what it had been handed is gone with it."""


class LabRefused(LabUnreachable):
    """The scheduler answers but will not have this host: another lab's certificate, a worker name already taken."""


class WorkerNameTaken(LabRefused):
    """Another worker of the lab has this worker's name."""


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

    # A scheduler lost mid-night makes the client log its failed reconnection with tracebacks; etlab says the loss
    # itself, in one line with how to resume (lab_night.py). --verbose keeps them.
    if not console.verbose():
        logging.getLogger("distributed.client").setLevel(logging.CRITICAL)
    try:
        return Client(
            settings.scheduler,
            security=security(settings),
            timeout=timeout,
            deserializers=["msgpack", "error"],
            set_as_default=False,
        )
    except (OSError, TimeoutError) as exc:
        refused = probe(settings)  # why: our certificate refused, or nobody there
        if refused is not None:
            raise refused from None
        raise LabUnreachable(
            f"the lab's scheduler {settings.scheduler} does not answer: {exc}",
            hint="is `fab lab-scheduler` running there, and are this host's certificates the lab's?",
        ) from None


def _scheduler_endpoint(settings: LabSettings) -> tuple[str, int]:
    parsed = urllib.parse.urlsplit(settings.scheduler)
    assert parsed.hostname is not None and parsed.port is not None  # lab_settings.check_address
    return parsed.hostname, parsed.port


def probe(settings: LabSettings, timeout: float = PROBE_SECONDS) -> LabRefused | None:
    """Whether the scheduler's port refuses this host's certificate (a LabRefused saying so), None when it accepts
    it or nobody answers there (`scheduler_answers` tells which). One TLS handshake, as Dask's own would be."""
    if not settings.secure or settings.certificates is None:
        return None
    host, port = _scheduler_endpoint(settings)
    try:
        raw = socket.create_connection((host, port), timeout=timeout)
    except OSError:
        return None
    folder = settings.certificates
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False  # Dask's lab certificate names no host; the lab's CA is what is checked
    context.verify_mode = ssl.CERT_REQUIRED
    try:
        context.load_verify_locations(str(folder / CA_FILE))
        context.load_cert_chain(str(folder / KEY_AND_CERT_FILE), str(folder / KEY_FILE))
    except (OSError, ssl.SSLError) as exc:
        raw.close()
        return LabRefused(f"the lab's certificates in {folder} cannot be used: {exc}", hint=CERTIFICATE_HINT)
    try:
        with context.wrap_socket(raw, server_hostname=host) as tls:
            # TLS 1.3: the scheduler checks our certificate after the handshake; a refusal arrives as an alert.
            tls.settimeout(min(timeout, 2.0))
            with contextlib.suppress(TimeoutError):  # accepted: Dask waits for our first message
                tls.recv(1)
    except ssl.SSLCertVerificationError as exc:
        return LabRefused(
            f"TLS certificate does not match: the lab's scheduler {settings.scheduler} presents a certificate this "
            f"host's lab CA did not sign ({exc.verify_message})",
            hint=CERTIFICATE_HINT,
        )
    except ssl.SSLError as exc:
        return LabRefused(
            f"TLS certificate does not match: the lab's scheduler {settings.scheduler} refuses this host's "
            f"certificate ({exc.reason or exc})",
            hint=CERTIFICATE_HINT,
        )
    except OSError:
        return None  # reset while it starts or stops: not an answer
    return None


def scheduler_answers(settings: LabSettings, timeout: float = PROBE_SECONDS) -> bool:
    """Whether anything listens on the scheduler's address."""
    try:
        with socket.create_connection(_scheduler_endpoint(settings), timeout=timeout):
            return True
    except OSError:
        return False


# ---------------------------------------------------------------- what a worker offers


def reachable(board: Board, timeout: float = 3.0) -> bool:
    """Whether the board's SSH port answers from this host (a labgrid board: its place is found when a cell runs)."""
    if board.labgrid is not None:
        return True
    link = board.link
    if not isinstance(link, SshOptions) or link.host is None:
        return False  # the local board is every host's own machine: not a board another host can name
    try:
        with socket.create_connection((link.host, link.port), timeout=timeout):
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


_CLOSE_REASONS = {
    "worker-handle-scheduler-connection-broken": "lost the lab's scheduler (it stopped, restarted, or the network "
    "broke)",
    "worker-heartbeat-missing": "the lab's scheduler had given this worker up (silent too long: a frozen host or a "
    "cut network)",
    "scheduler-remove-worker": "the lab's scheduler had given this worker up (silent too long: a frozen host or a "
    "cut network; or removed on purpose)",
}


def run_worker(settings: LabSettings, inventory: Inventory, what: WorkerOffer) -> int:
    """`fab worker`: be a member of the lab until stopped (Ctrl+C, SIGTERM; the scheduler reschedules what it held).
    Closed by Dask (its scheduler restarted, or it gave this host up while it was frozen), it joins again once the
    scheduler answers; refused (another lab's certificate, its name taken), it exits 69 saying why."""
    import dask
    from distributed import Worker

    global _worker_inventory
    _worker_inventory = inventory
    # Dask's sampling profiler (sys._current_frames() every 10 ms) can freeze a worker on CPython 3.11: a garbage
    # collection inside it frees a threading.local while the interpreter lock is held (gh-106883; bench/README.md,
    # "A lab night on several workers"). etlab times its cells itself: off.
    dask.config.set({"distributed.worker.profile.enabled": False, **HTTP_OFF})
    os.environ["ETLAB_HOST"] = what.name  # the host its records name
    listen = listen_host(settings)

    class Member(Worker):
        """A Dask worker that remembers why it was closed."""

        close_reason: str | None = None

        async def close(self, *args: Any, **kwargs: Any) -> Any:
            if self.close_reason is None:
                self.close_reason = str(kwargs.get("reason", "worker-close"))
            return await super().close(*args, **kwargs)

    async def serve() -> str:
        # Threads: a cell per board at once, plus a lowering; the resources keep each to what it may run.
        threads = max(2, len(what.boards) + 1)
        async with Member(
            settings.scheduler,
            security=security(settings),
            name=what.name,
            nthreads=threads,
            resources=what.resources(),
            dashboard=False,
            dashboard_address=HTTP_ADDRESS,
            host=listen,
            local_directory=str(paths.state_dir() / "dask"),
            death_timeout=CONNECT_SECONDS * 3,  # gone again between our knock and Dask's: back to waiting
        ) as worker:
            joined = f"worker {what.name} joined the lab at {settings.scheduler} as {worker.address}"
            console.info(console.escape(joined))
            await worker.finished()
        reason = worker.close_reason or "closed"
        return _CLOSE_REASONS.get(reason, f"closed by Dask ({reason})")

    console.info(console.escape(f"worker {what.name}: joining the lab at {settings.scheduler}"))
    while True:
        wait_for_scheduler(settings, what.name)
        try:
            why = asyncio.run(serve())
        except (ValueError, RuntimeError, OSError, TimeoutError) as exc:
            # Dask wraps what stopped its start ("Member failed to start") around the cause.
            cause = exc.__cause__ if isinstance(exc, RuntimeError) and exc.__cause__ is not None else exc
            if isinstance(cause, ValueError):  # register-worker answered with an error: e.g. the name is taken
                said = f"the lab's scheduler {settings.scheduler} refuses worker {what.name}"
                if "name taken" in str(cause):
                    raise WorkerNameTaken(f"{said}: another worker of the lab is named {what.name!r}") from None
                raise LabRefused(f"{said}: {str(cause)[:300]}") from None
            if not isinstance(cause, OSError | TimeoutError):
                raise
            # the scheduler went before this worker registered: wait for it again
            console.warn(f"worker {what.name}: could not join the lab at {settings.scheduler}: {cause}: trying again")
            continue
        console.warn(f"worker {what.name}: {why}: joining the lab again when it answers")


def wait_for_scheduler(settings: LabSettings, name: str) -> None:
    """Until the scheduler answers, asking a few times a minute; LabRefused when it refuses this host's certificate."""
    delay, said = REJOIN_FIRST_SECONDS, False
    while True:
        refused = probe(settings)
        if refused is not None:
            raise refused
        if scheduler_answers(settings):
            return
        if not said:
            console.info(console.escape(f"worker {name}: the lab's scheduler {settings.scheduler} does not answer "
                                        f"yet: asking again every {REJOIN_MAX_SECONDS:g} s at most"))  # fmt: skip
            said = True
        time.sleep(delay)
        delay = min(delay * 2, REJOIN_MAX_SECONDS)


def listen_host(settings: LabSettings) -> str:
    """Where a worker listens for its peers: `lab.listen`, else the address of this host's interface that reaches the
    scheduler (127.0.0.1 for a lab on loopback), never every interface."""
    if settings.listen is not None:
        return settings.listen
    host, port = _scheduler_endpoint(settings)
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_DGRAM)[0]
        with socket.socket(family, kind, proto) as probe_socket:
            probe_socket.connect(address)  # UDP: chooses the route, sends nothing
            return str(probe_socket.getsockname()[0])
    except OSError as exc:
        raise LabUnreachable(
            f"no interface of this host reaches the lab's scheduler {settings.scheduler}: {exc}",
            hint="set `lab.listen` to the address workers should listen on",
        ) from None


def run_scheduler(settings: LabSettings) -> int:
    """`fab lab-scheduler`: the lab's scheduler on the address of `lab.scheduler`, without Dask's web endpoints."""
    import dask
    from distributed import Scheduler
    from tornado.ioloop import PeriodicCallback

    parsed = urllib.parse.urlsplit(settings.scheduler)
    # A worker silent for worker_ttl_seconds (a cut network, a frozen host) is given up: its share goes to another
    # worker. Dask itself checks only every worker-ttl; the callback below checks every few seconds.
    dask.config.set({"distributed.scheduler.worker-ttl": f"{settings.worker_ttl_seconds}s", **HTTP_OFF})

    async def serve() -> None:
        async with Scheduler(
            host=parsed.hostname,
            port=parsed.port or 0,
            protocol=parsed.scheme,
            security=security(settings),
            dashboard=False,
            dashboard_address=HTTP_ADDRESS,
        ) as scheduler:
            every = min(TTL_CHECK_SECONDS, settings.worker_ttl_seconds / 4)
            ttl_check = PeriodicCallback(scheduler.check_worker_ttl, every * 1000)
            scheduler.periodic_callbacks["etlab-worker-ttl"] = ttl_check  # stopped with the scheduler's own
            ttl_check.start()
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
