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

import hashlib
import os
import re
import secrets
import shutil
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import IO, TypeVar

import tenacity
from rich.progress import Progress, TaskID

from orchestrator import console
from orchestrator.boards.workdir import BoardWorkdir
from orchestrator.errors import BundleError, EtlabError, TransferError, first_line
from orchestrator.fsutil import TMP_PREFIX, atomic_path, atomic_write_text, sha256_file
from orchestrator.results.bundle import (
    MANIFEST,
    MANIFEST_MAX_BYTES,
    FileDigest,
    file_digest,
    is_bundle_path,
    parse_manifest,
    verify_manifest,
)
from orchestrator.transport.base import BoardConnection, CommandError, is_transient, quote
from orchestrator.transport.tarstream import Member, TarFormatError, TarReader

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


def _with_retries(conn: BoardConnection, what: str, attempt: Callable[[], _T], policy: RetryPolicy) -> _T:
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

    return _with_retries(conn, f"push of {local.name}", attempt, retry)


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


# ---------------------------------------------------------------- pull


def pull_bundle(
    conn: BoardConnection, remote_bundle_dir: str, dest: Path, *, retry: RetryPolicy = DEFAULT_RETRY
) -> Path:
    """Copy a bundle folder from the board to `dest` (which must not exist), verified against its manifest."""
    dest = Path(dest)
    if dest.exists() or dest.is_symlink():
        raise EtlabError(f"{dest} already exists; a pulled bundle never overwrites anything")
    dest.parent.mkdir(parents=True, exist_ok=True)

    def attempt() -> Path:
        remote = conn.resolve_path(remote_bundle_dir)
        temp = Path(tempfile.mkdtemp(prefix=f"{TMP_PREFIX}{dest.name}.", dir=dest.parent))
        try:
            digests = _unpack_remote_folder(conn, remote, temp)
            verify_manifest(temp, digests, origin=f"{conn.board.name}:{remote}")
            try:
                os.rename(temp, dest)
            except OSError as exc:
                raise EtlabError(f"{dest} already exists; a pulled bundle never overwrites anything") from exc
        except BaseException:
            shutil.rmtree(temp, ignore_errors=True)
            raise
        return dest

    return _with_retries(conn, f"pull of {remote_bundle_dir}", attempt, retry)


def _tar_script(remote: str, bulk_from: int | None) -> str:
    """sh that streams the folder `remote` as tar, result_manifest.json first, so the workstation knows every
    file's declared size before its data arrives. With `bulk_from`, it first prints "bulk" (and stops) when the
    folder holds at least that many bytes, else "tar" before the archive."""
    lines = [
        f"d={quote(remote)}",
        'if ! cd "$d" 2>/dev/null; then '
        '[ -e "$d" ] && echo "$d: cannot enter" >&2 || echo "$d: No such file or directory" >&2; exit 1; fi',
    ]
    if bulk_from is not None:
        # du's figure only picks the transport; what is accepted is bounded by the manifest on the workstation.
        lines += [
            "set -- $(du -sk . 2>/dev/null)",
            'case "$1" in ""|*[!0-9]*) set -- 0 ;; esac',
            f'if [ "$1" -ge {bulk_from >> 10} ]; then echo bulk; exit 0; fi',
            "echo tar",
        ]
    # A missing manifest must not fail tar (a failed command hides the reason): the reader reports it instead.
    lines += [
        "set --",
        'for f in * .[!.]* ..?*; do { [ -e "$f" ] || [ -L "$f" ]; } && '
        f'[ "$f" != {MANIFEST} ] && set -- "$@" "./$f"; done',
        f'if [ -f {MANIFEST} ] && [ ! -L {MANIFEST} ]; then set -- ./{MANIFEST} "$@"; fi',
        "[ $# -gt 0 ] || set -- .",
        'exec tar -cf - "$@"',
    ]
    return "\n".join(lines)


def _unpack_remote_folder(conn: BoardConnection, remote: str, dest: Path) -> dict[str, FileDigest]:
    """Stream the board folder `remote` as tar into `dest`; large folders through the bulk path."""
    origin = f"{conn.board.name}:{remote}"
    threshold = conn.bulk_threshold()
    if threshold:
        # Ask the board how large the folder is, and start the tar right away on this channel when it is small:
        # no second handshake and no extra round trip for the usual few-MB bundle.
        with conn.open_read_stream(["sh", "-c", _tar_script(remote, threshold)]) as stream:
            answer = _read_line(stream)
            if answer == "tar":
                return extract_tar_stream(stream, dest, manifest_first=True, origin=origin)
            if answer != "bulk":
                raise BundleError(f"{conn.board.name}: unexpected answer {answer!r} when asked the size of {remote}")
    with conn.open_read_stream(["sh", "-c", _tar_script(remote, None)], bulk=threshold is not None) as stream:
        return extract_tar_stream(stream, dest, manifest_first=True, origin=origin)


def _read_line(stream: IO[bytes], limit: int = 64) -> str:
    line = bytearray()
    while len(line) < limit and (byte := stream.read(1)) and byte != b"\n":
        line += byte
    return line.decode("ascii", errors="replace")


def _member_path(name: str) -> tuple[str, ...]:
    """The safe relative parts of an archive member name; refuses absolute paths and `..`."""
    if "\0" in name:
        raise BundleError(f"archive entry {name!r} has a NUL byte")
    if name.startswith("/"):
        raise BundleError(f"archive entry {name!r} is an absolute path")
    parts = tuple(part for part in PurePosixPath(name).parts if part != ".")
    if ".." in parts:
        raise BundleError(f"archive entry {name!r} points outside the bundle ('..')")
    return parts


def extract_tar_stream(
    stream: IO[bytes], dest: Path, *, manifest_first: bool = False, origin: str = ""
) -> dict[str, FileDigest]:
    """Unpack a tar stream into the existing empty folder `dest`; returns each file's sha256 and size.

    Only regular files and folders are accepted: links (symbolic or hard), devices and FIFOs, absolute
    paths, `..` and duplicate entries raise BundleError, and nothing is ever written outside `dest`.
    With `manifest_first` (pulls), the first member must be result_manifest.json: every later file must be
    listed in it and is cut off as soon as it exceeds its declared size, so a board cannot fill this disk.
    """
    digests: dict[str, FileDigest] = {}
    declared: dict[str, FileDigest] | None = None
    where = f"bundle {origin or dest}"
    try:
        archive = TarReader(stream)
        for member in archive:
            if manifest_first and declared is None:
                declared = _read_manifest_member(archive, member, dest, where)
                digests[MANIFEST] = file_digest(dest / MANIFEST)
                continue
            parts = _member_path(member.name)
            if not parts:
                if member.kind == "dir":
                    continue
                raise BundleError(f"archive entry {member.name!r} has no name")
            relative = "/".join(parts)
            if member.kind in ("symlink", "hardlink"):
                raise BundleError(
                    f"archive entry {relative!r} is a {'symbolic' if member.kind == 'symlink' else 'hard'} link "
                    f"(to {member.linkname!r}); bundles hold only files and folders"
                )
            if declared is not None and not is_bundle_path(relative):
                raise BundleError(f"{where}: archive entry {relative!r} is not a valid name")
            limit = None
            if declared is not None and member.kind == "file":
                if relative not in declared:
                    raise BundleError(f"{where}: {relative}: not listed in the manifest")
                limit = declared[relative].size
                if member.size > limit:
                    raise BundleError(f"{where}: {relative}: size {member.size}, the manifest says {limit}")
            if member.kind == "dir":
                _make_folder(dest, parts)
            elif member.kind == "file":
                _make_folder(dest, parts[:-1])
                digests[relative] = _write_member(archive, dest.joinpath(*parts), relative, limit)
            else:
                raise BundleError(f"archive entry {relative!r} is a device, FIFO or other special file")
    except TarFormatError as exc:
        raise BundleError(f"the bundle archive is corrupt or truncated: {exc}") from exc
    return digests


def _make_folder(dest: Path, parts: tuple[str, ...]) -> None:
    current = dest
    for part in parts:
        current = current / part
        try:
            current.mkdir(mode=0o755)
        except FileExistsError:
            if current.is_symlink() or not current.is_dir():
                raise BundleError(f"archive entry {'/'.join(parts)!r} collides with a file") from None
        except OSError as exc:  # e.g. a name too long for the file system
            raise BundleError(f"cannot create folder {'/'.join(parts)!r} of the bundle: {exc.strerror}") from None


def _read_manifest_member(archive: TarReader, member: Member, dest: Path, where: str) -> dict[str, FileDigest]:
    """The first member of a pulled bundle: its manifest, size-capped, written and parsed before anything else."""
    if member.kind != "file" or "/".join(_member_path(member.name)) != MANIFEST:
        raise BundleError(f"{where} has no {MANIFEST}: it is incomplete (the agent writes the manifest last)")
    if member.size > MANIFEST_MAX_BYTES:
        raise BundleError(f"{where}: {MANIFEST} is larger than {MANIFEST_MAX_BYTES} bytes")
    _write_member(archive, dest / MANIFEST, MANIFEST, MANIFEST_MAX_BYTES)
    _, declared = parse_manifest((dest / MANIFEST).read_bytes(), where)
    total = sum(entry.size for entry in declared.values())
    free = shutil.disk_usage(dest).free
    if total > free:
        raise BundleError(f"{where} declares {total} bytes of files; only {free} bytes are free in {dest.parent}")
    return declared


def _write_member(archive: TarReader, target: Path, relative: str, limit: int | None = None) -> FileDigest:
    """Write one file member, hashing it on the way (hashlib and os.write release the GIL, so paramiko's
    transport thread decrypts the next packets meanwhile); never more than `limit` bytes."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        fd = os.open(target, flags, 0o644)
    except FileExistsError:
        raise BundleError(f"archive entry {relative!r} appears twice") from None
    except OSError as exc:  # e.g. a name too long for the file system
        raise BundleError(f"cannot create {relative!r} of the bundle: {exc.strerror}") from None
    digest, size = hashlib.sha256(), 0
    try:
        for chunk in archive.chunks():
            digest.update(chunk)
            size += len(chunk)
            if limit is not None and size > limit:
                raise BundleError(f"archive entry {relative!r} is larger than the {limit} bytes declared for it")
            view = memoryview(chunk)
            while view:
                view = view[os.write(fd, view) :]
    except OSError as exc:
        raise BundleError(f"cannot write {relative!r} of the bundle: {exc.strerror or exc}") from exc
    finally:
        # Not fsynced (scp does not either): a bundle can be pulled again, and analysis re-checks the manifest.
        os.close(fd)
    return FileDigest(digest.hexdigest(), size)
