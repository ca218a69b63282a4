"""Moving files to and from boards: content-addressed pushes and verified bundle pulls.

Push: `<workdir>/<kind>/<sha256><suffix>` plus the sidecar `<sha256><suffix>.sha256` (sha256sum format), written
last. The data goes over one exec channel (`cat > temp`), is hashed on the board, and only then renamed into
place, so a transfer that dies leaves nothing that looks complete.

Pull: the bundle folder streams as tar over an exec channel and is unpacked by our own code (regular files and
folders only, nothing outside the destination), into a temporary folder next to the destination; every file is
checked against `result_manifest.json` before the folder is renamed into place.

Transient failures (refused, reset, lost links) are retried with exponential backoff; host key and
authentication failures never are.
"""

from __future__ import annotations

import re
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import tenacity
from rich.progress import Progress, TaskID

from orchestrator import console
from orchestrator.boards.workdir import BoardWorkdir
from orchestrator.errors import EtlabError, TransferError, first_line
from orchestrator.fsutil import TMP_PREFIX, atomic_path, atomic_write_text, sha256_file
from orchestrator.transport.base import BoardConnection, CommandError, is_transient, quote

_UPLOAD_CHUNK = 4 << 20
_SHA256 = re.compile(r"[0-9a-f]{64}")
_NAME_PART = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]*")
_SUFFIX = re.compile(r"(\.[A-Za-z0-9_-]+)*")
# Exit codes of the upload script.
_HASH_MISMATCH = 12
_TEMP = '"$t"'  # the temporary, as the upload script names it
_OPENSSL_FROM = 16 << 20
_T = TypeVar("_T")


@dataclass(frozen=True)
class RetryPolicy:
    attempts: int = 5
    max_seconds: float = 300.0
    initial_wait: float = 0.5
    max_wait: float = 10.0


DEFAULT_RETRY = RetryPolicy()


@dataclass(frozen=True)
class PushResult:
    board: str
    remote_path: str
    sha256: str
    size: int
    skipped: bool  # the board already held this content
    seconds: float
    attempts: int

    @property
    def mib_per_s(self) -> float | None:
        return None if self.skipped or self.seconds <= 0 else self.size / self.seconds / (1 << 20)


# ---------------------------------------------------------------- retries


def with_retries(conn: BoardConnection, what: str, attempt: Callable[[], _T], policy: RetryPolicy) -> _T:
    def log(state: tenacity.RetryCallState) -> None:
        exc = state.outcome.exception() if state.outcome else None
        wait = state.next_action.sleep if state.next_action else 0.0
        console.warn(
            f"{conn.board.name}: {what} failed ({first_line(exc) if exc else 'unknown error'}); "
            f"retry {state.attempt_number + 1}/{policy.attempts} in {wait:.1f} s"
        )

    retrying = tenacity.Retrying(
        stop=tenacity.stop_after_attempt(policy.attempts) | tenacity.stop_after_delay(policy.max_seconds),
        wait=tenacity.wait_exponential(multiplier=policy.initial_wait, max=policy.max_wait),
        retry=tenacity.retry_if_exception(is_transient),
        before_sleep=log,
        reraise=True,
    )
    try:
        return retrying(attempt)
    except CommandError as exc:
        raise TransferError(f"{what} failed: {exc}") from exc
    except EtlabError as exc:
        if is_transient(exc):
            attempts = retrying.statistics.get("attempt_number", 1)
            raise TransferError(f"{what} failed after {attempts} attempt(s): {exc}") from exc
        raise


# ---------------------------------------------------------------- push

_hash_cache: dict[tuple[int, int, int, int], str] = {}
_hash_lock = threading.Lock()


def local_sha256(path: Path) -> str:
    """sha256 of a local file, remembered per (device, inode, size, mtime) so fan-outs hash a model once."""
    stat = path.stat()
    key = (stat.st_dev, stat.st_ino, stat.st_size, stat.st_mtime_ns)
    with _hash_lock:
        if key in _hash_cache:
            return _hash_cache[key]
    digest = sha256_file(path)
    with _hash_lock:
        _hash_cache[key] = digest
    return digest


def push_file(
    conn: BoardConnection,
    local: Path,
    *,
    kind: str = "models",
    suffix: str = ".pte",
    sha256: str | None = None,
    progress: Progress | None = None,
    retry: RetryPolicy = DEFAULT_RETRY,
) -> PushResult:
    """Put `local` on the board as `<workdir>/<kind>/<sha256><suffix>`, unless the board already holds it.

    `sha256` (e.g. from an artifact sidecar) saves hashing the file here; the board's own hash must match it.
    `progress` is a console.transfer_progress() display to add this transfer to (shows MB/s).
    """
    local = Path(local)
    if not _NAME_PART.fullmatch(kind):
        raise EtlabError(f"invalid kind {kind!r}: use letters, digits, '.', '_' or '-'")
    if not _SUFFIX.fullmatch(suffix):
        raise EtlabError(f"invalid suffix {suffix!r}: expected something like '.pte'")
    if not local.is_file():
        raise EtlabError(f"cannot push {local}: not a file")
    if sha256 is not None and not _SHA256.fullmatch(sha256):
        raise EtlabError(f"invalid sha256 {sha256!r}: expected 64 lowercase hex digits")
    digest = sha256 or local_sha256(local)
    size = local.stat().st_size
    task = progress.add_task(f"{conn.board.name}: {local.name}", total=size) if progress else None
    started = time.monotonic()
    attempts = 0
    earlier_temps: list[str] = []

    def attempt() -> PushResult:
        nonlocal attempts
        attempts += 1
        if progress is not None and task is not None:
            progress.reset(task, total=size)
        if conn.shares_filesystem:
            remote, skipped = _push_local(conn, local, kind, f"{digest}{suffix}", digest, size, progress, task)
        else:
            remote, skipped = _push_ssh(conn, local, kind, suffix, digest, size, progress, task, earlier_temps)
        if progress is not None and task is not None:
            progress.update(
                task,
                completed=size,
                description=f"{conn.board.name}: {local.name}" + (" (already there)" if skipped else ""),
            )
        return PushResult(conn.board.name, remote, digest, size, skipped, time.monotonic() - started, attempts)

    return with_retries(conn, f"push of {local.name}", attempt, retry)


def _advance(progress: Progress | None, task: TaskID | None, amount: int) -> None:
    if progress is not None and task is not None:
        progress.advance(task, amount)


def _push_local(
    conn: BoardConnection,
    local: Path,
    kind: str,
    name: str,
    digest: str,
    size: int,
    progress: Progress | None,
    task: TaskID | None,
) -> tuple[str, bool]:
    folder = Path(conn.workdir) / kind
    final, sidecar = folder / name, folder / f"{name}.sha256"
    if _sidecar_matches(sidecar, digest) and final.is_file() and final.stat().st_size == size:
        return str(final), True
    with atomic_path(final) as temp:
        with open(local, "rb") as source, open(temp, "wb") as target:
            while chunk := source.read(_UPLOAD_CHUNK):
                target.write(chunk)
                _advance(progress, task, len(chunk))
        written = sha256_file(temp)
        if written != digest:
            raise TransferError(_mismatch(conn, local, digest, written))
    atomic_write_text(sidecar, f"{digest}  {name}\n")
    return str(final), False


def _sidecar_matches(sidecar: Path, digest: str) -> bool:
    try:
        return sidecar.read_text(encoding="utf-8")[:64] == digest
    except (OSError, UnicodeDecodeError):
        return False


def _mismatch(conn: BoardConnection, local: Path, expected: str, found: str) -> str:
    return (
        f"{conn.board.name}: {local.name} arrived with sha256 {found or '(none)'} but {expected} was expected; "
        "the local file changed during the push, or the sha256 given for it is wrong"
    )


_PY_SHA256 = (
    "import hashlib,sys\nh=hashlib.sha256()\n"
    "for b in iter(lambda: sys.stdin.buffer.read(1<<20), b''): h.update(b)\nprint(h.hexdigest())"
)
# Receives stdin into argv[1] and prints its sha256: hashing while receiving, in one process with 1 MiB reads.
# It first widens its stdin pipe to 1 MiB (F_SETPIPE_SZ is 1031 on Linux): with the default 64 KiB, sshd and the
# receiver take turns on every few packets, and the whole push measured 20% slower (bench/README.md).
# Python 3.5+ (no walrus): old Raspberry Pi OS releases still ship 3.7.
_PY_RECEIVE = (
    "import fcntl,hashlib,sys\ntry: fcntl.fcntl(0,1031,1<<20)\nexcept OSError: pass\n"
    "h=hashlib.sha256()\nb=bytearray(1<<20)\nv=memoryview(b)\nr=sys.stdin.buffer.raw\n"
    "with open(sys.argv[1],'wb',buffering=0) as f:\n"
    " while True:\n  n=r.readinto(b)\n  if not n: break\n  h.update(v[:n]); w=0\n"
    "  while w<n: w+=f.write(v[w:n])\n"
    "print(h.hexdigest())"
)
# From this size a board with python3 hashes while it receives: over a real link the hash then hides behind the
# network (a Pi 4 needs about a second per 200 MB to hash afterwards); on loopback it measured as fast or faster
# than hashing afterwards. Below this size python3's start-up costs more than it saves.
RECEIVE_HASHING_FROM = 16 << 20


@dataclass(frozen=True)
class _PushPlan:
    """Where a push puts things on the board, and the script that does it."""

    folder: str
    name: str
    temp: str

    @property
    def final(self) -> str:
        return f"{self.folder}/{self.name}"

    @property
    def sidecar(self) -> str:
        return f"{self.final}.sha256"

    def have_check(self, digest: str, size: int) -> str:
        """sh that prints "have" and exits if the board holds this content (sidecar matches, size right)."""
        return (
            f"f={quote(self.final)}; s={quote(self.sidecar)}\n"
            f'if [ -f "$f" ] && [ -f "$s" ] && read -r h _ < "$s" && [ "$h" = {digest} ] && '
            f'[ "$(wc -c < "$f")" -eq {size} ]; then echo have; exit 0; fi'
        )

    def script(self, digest: str, size: int, earlier_temps: list[str]) -> str:
        """One exec does it all, with few processes (on a small board each fork counts, and fan-outs multiply
        them): answer "have" if the board holds this content, else "send", receive into a temporary, hash it on
        the board, rename into place, write the sidecar last."""
        stale = " ".join(quote(t) for t in [*earlier_temps, *(f"{t}.sha256" for t in earlier_temps)])
        stale_glob = quote(f"{TMP_PREFIX}{self.name}.") + "*"
        stale_name = quote(f"{TMP_PREFIX}{self.name}.*")
        # openssl hashes large files fastest, but starts slower than sha256sum.
        hashers = [
            f"openssl dgst -sha256 -r < {_TEMP}",
            f"sha256sum < {_TEMP}",
            f"python3 -c {quote(_PY_SHA256)} < {_TEMP}",
        ]
        if size < _OPENSSL_FROM:
            hashers[:2] = hashers[1::-1]
        receive_then_hash = f'cat > "$t" || {{ rm -f "$t"; exit 11; }}; h=$({" 2>/dev/null || ".join(hashers)})'
        if size >= RECEIVE_HASHING_FROM:
            receive = (
                "if command -v python3 >/dev/null 2>&1; then "
                f'h=$(python3 -c {quote(_PY_RECEIVE)} "$t") || {{ rm -f "$t"; exit 11; }}; '
                f"else {receive_then_hash}; fi"
            )
        else:
            receive = receive_then_hash
        return "\n".join(
            [
                self.have_check(digest, size),
                "echo send",
                f"d={quote(self.folder)}; t={quote(self.temp)}",
                '[ -d "$d" ] || mkdir -p "$d" || exit 10',
                # temporaries of this content left by pushes that died over 10 minutes ago, or by our earlier tries
                f'for x in "$d"/{stale_glob}; do [ -e "$x" ] && find "$d" -maxdepth 1 -name {stale_name} -mmin +10 '
                "-exec rm -f {} + 2>/dev/null; break; done",
                f"rm -f {stale}" if stale else ":",
                receive,
                "h=${h%% *}",
                f'if [ "$h" != {digest} ]; then rm -f "$t"; echo "$h"; exit {_HASH_MISMATCH}; fi',
                'mv -f "$t" "$f" || exit 13',
                f'printf "%s  %s\\n" {digest} {quote(self.name)} > "$t.sha256" && mv -f "$t.sha256" "$s" || exit 14',
            ]
        )


def _push_ssh(
    conn: BoardConnection,
    local: Path,
    kind: str,
    suffix: str,
    digest: str,
    size: int,
    progress: Progress | None,
    task: TaskID | None,
    earlier_temps: list[str],
) -> tuple[str, bool]:
    folder = BoardWorkdir(conn.workdir).store(kind)
    name = f"{digest}{suffix}"
    plan = _PushPlan(folder, name, f"{folder}/{TMP_PREFIX}{name}.{secrets.token_hex(6)}")
    threshold = conn.bulk_threshold()
    bulk = threshold is not None and size >= threshold
    # A bulk stream costs a second SSH handshake: ask over the open connection first whether it is needed.
    if bulk and conn.run_shell(plan.have_check(digest, size), timeout=60).stdout.strip() == "have":
        return plan.final, True
    script = plan.script(digest, size, earlier_temps)
    earlier_temps.append(plan.temp)
    with conn.open_write_stream(["sh", "-c", script], check=False, bulk=bulk) as stream:
        answer = stream.first_line()
        if answer == "send":
            with open(local, "rb") as source:
                while chunk := source.read(_UPLOAD_CHUNK):
                    stream.write(chunk)
                    _advance(progress, task, len(chunk))
    result = stream.result
    assert result is not None
    if answer == "have" and result.ok:
        earlier_temps.remove(plan.temp)
        return plan.final, True
    if result.exit_code == _HASH_MISMATCH:
        raise TransferError(_mismatch(conn, local, digest, result.stdout.splitlines()[-1].strip()))
    if answer != "send" or not result.ok:
        detail = result.stderr.strip().splitlines()[-1] if result.stderr.strip() else f"exit {result.exit_code}"
        raise TransferError(f"{conn.board.name}: cannot store {local.name} in {folder}: {detail}")
    earlier_temps.remove(plan.temp)
    return plan.final, False
