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
import queue
import re
import secrets
import shutil
import tarfile
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import IO, Any, TypeVar

import tenacity
from rich.progress import Progress, TaskID

from orchestrator import console
from orchestrator.bundle import FileDigest, verify_manifest
from orchestrator.connection import BoardConnection, CommandError, LocalConnection, is_transient, quote
from orchestrator.errors import BundleError, EtlabError, TransferError
from orchestrator.fsutil import CHUNK, TMP_PREFIX, atomic_path, atomic_write_text, sha256_file

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
            f"{conn.board.name}: {what} failed ({_first_line(exc)}); "
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


def _first_line(exc: BaseException | None) -> str:
    text = str(exc) if exc else "unknown error"
    return text.splitlines()[0] if text else type(exc).__name__


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
        if isinstance(conn, LocalConnection):
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
    folder = f"{conn.workdir.rstrip('/')}/{kind}"
    name = f"{digest}{suffix}"
    final, sidecar = f"{folder}/{name}", f"{folder}/{name}.sha256"
    temp = f"{folder}/{TMP_PREFIX}{name}.{secrets.token_hex(6)}"
    stale = " ".join(quote(t) for t in [*earlier_temps, *(f"{t}.sha256" for t in earlier_temps)])
    stale_glob = quote(f"{TMP_PREFIX}{name}.") + "*"
    stale_name = quote(f"{TMP_PREFIX}{name}.*")
    # openssl hashes large files fastest, but starts slower than sha256sum.
    hashers = [
        f"openssl dgst -sha256 -r < {_TEMP}",
        f"sha256sum < {_TEMP}",
        f"python3 -c {quote(_PY_SHA256)} < {_TEMP}",
    ]
    if size < _OPENSSL_FROM:
        hashers[:2] = hashers[1::-1]
    # One exec does it all, with few processes (on a small board each fork counts, and fan-outs multiply them):
    # answer "have" if the board holds this content (the sidecar matches and the size is right), else "send",
    # receive into a temporary, hash it on the board, rename into place, write the sidecar last.
    script = "\n".join(
        [
            f"d={quote(folder)}; t={quote(temp)}; f={quote(final)}; s={quote(sidecar)}",
            f'if [ -f "$f" ] && [ -f "$s" ] && read -r h _ < "$s" && [ "$h" = {digest} ] && '
            f'[ "$(wc -c < "$f")" -eq {size} ]; then echo have; exit 0; fi',
            "echo send",
            '[ -d "$d" ] || mkdir -p "$d" || exit 10',
            # temporaries of this content left by pushes that died over 10 minutes ago, or by our earlier tries
            f'for x in "$d"/{stale_glob}; do [ -e "$x" ] && find "$d" -maxdepth 1 -name {stale_name} -mmin +10 '
            "-exec rm -f {} + 2>/dev/null; break; done",
            f"rm -f {stale}" if stale else ":",
            'cat > "$t" || { rm -f "$t"; exit 11; }',
            # Hashed after the upload, from the page cache: hashing while receiving (tee | openssl, or one python3
            # process) was measured slower on a CPU-bound board (bench/README.md).
            f"h=$({' 2>/dev/null || '.join(hashers)}); h=${{h%% *}}",
            f'if [ "$h" != {digest} ]; then rm -f "$t"; echo "$h"; exit {_HASH_MISMATCH}; fi',
            'mv -f "$t" "$f" || exit 13',
            f'printf "%s  %s\\n" {digest} {quote(name)} > "$t.sha256" && mv -f "$t.sha256" "$s" || exit 14',
        ]
    )
    earlier_temps.append(temp)
    with conn.open_write_stream(["sh", "-c", script], check=False) as stream:
        answer = stream.first_line()
        if answer == "send":
            with open(local, "rb") as source:
                while chunk := source.read(_UPLOAD_CHUNK):
                    stream.write(chunk)
                    _advance(progress, task, len(chunk))
    result = stream.result
    assert result is not None
    if answer == "have" and result.ok:
        earlier_temps.remove(temp)
        return final, True
    if result.exit_code == _HASH_MISMATCH:
        raise TransferError(_mismatch(conn, local, digest, result.stdout.splitlines()[-1].strip()))
    if answer != "send" or not result.ok:
        detail = result.stderr.strip().splitlines()[-1] if result.stderr.strip() else f"exit {result.exit_code}"
        raise TransferError(f"{conn.board.name}: cannot store {local.name} in {folder}: {detail}")
    earlier_temps.remove(temp)
    return final, False


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
            with conn.open_read_stream(["tar", "-C", remote, "-cf", "-", "."]) as stream:
                digests = extract_tar_stream(stream, temp)
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


class _DiskWriter(threading.Thread):
    """Hashes and writes unpacked files in order from a queue, so receiving the next chunk overlaps with
    hashing and writing this one (hashlib and os.write release the GIL)."""

    def __init__(self) -> None:
        super().__init__(daemon=True, name="etlab-bundle-writer")
        self.queue: queue.Queue[tuple[str, int, bytes | None] | None] = queue.Queue(maxsize=8)
        self.error: OSError | None = None
        self.digests: dict[str, FileDigest] = {}
        self._open: dict[str, tuple[Any, int]] = {}

    def run(self) -> None:
        while (item := self.queue.get()) is not None:
            name, fd, chunk = item
            digest, size = self._open.setdefault(name, (hashlib.sha256(), 0))
            try:
                if chunk is None:
                    del self._open[name]
                    self.digests[name] = FileDigest(digest.hexdigest(), size)
                    os.close(fd)
                elif self.error is None:
                    digest.update(chunk)
                    self._open[name] = (digest, size + len(chunk))
                    view = memoryview(chunk)
                    while view:
                        view = view[os.write(fd, view) :]
            except OSError as exc:
                self.error = self.error or exc

    def write(self, name: str, fd: int, chunk: bytes) -> None:
        self._raise_error()
        self.queue.put((name, fd, chunk))

    def close(self, name: str, fd: int) -> None:
        self.queue.put((name, fd, None))

    def finish(self) -> dict[str, FileDigest]:
        self.queue.put(None)
        self.join()
        self._raise_error()
        return self.digests

    def _raise_error(self) -> None:
        if self.error is not None:
            raise BundleError(f"cannot write the bundle: {self.error}")


def extract_tar_stream(stream: IO[bytes], dest: Path) -> dict[str, FileDigest]:
    """Unpack a tar stream into the existing empty folder `dest`; returns each file's sha256 and size.

    Only regular files and folders are accepted: links (symbolic or hard), devices and FIFOs, absolute
    paths, `..` and duplicate entries raise BundleError, and nothing is ever written outside `dest`.
    """
    writer = _DiskWriter()
    writer.start()
    try:
        with tarfile.open(fileobj=stream, mode="r|", bufsize=CHUNK) as archive:
            for member in archive:
                parts = _member_path(member.name)
                if not parts:
                    if member.isdir():
                        continue
                    raise BundleError(f"archive entry {member.name!r} has no name")
                relative = "/".join(parts)
                target = dest.joinpath(*parts)
                if member.issym() or member.islnk():
                    raise BundleError(
                        f"archive entry {relative!r} is a {'symbolic' if member.issym() else 'hard'} link "
                        f"(to {member.linkname!r}); bundles hold only files and folders"
                    )
                if member.isdir():
                    _make_folder(dest, parts)
                elif member.isreg():
                    _make_folder(dest, parts[:-1])
                    _write_member(archive, member, target, relative, writer)
                else:
                    raise BundleError(f"archive entry {relative!r} is a device, FIFO or other special file")
    except (tarfile.TarError, EOFError) as exc:
        raise BundleError(f"the bundle archive is corrupt or truncated: {exc}") from exc
    finally:
        digests = writer.finish()  # every file written and closed before anyone looks at them
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


def _write_member(
    archive: tarfile.TarFile, member: tarfile.TarInfo, target: Path, relative: str, writer: _DiskWriter
) -> None:
    source = archive.extractfile(member)
    assert source is not None
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        fd = os.open(target, flags, 0o644)
    except FileExistsError:
        raise BundleError(f"archive entry {relative!r} appears twice") from None
    try:
        while chunk := source.read(CHUNK):
            writer.write(relative, fd, chunk)
    finally:
        # Not fsynced (scp does not either): a bundle can be pulled again, and analysis re-checks the manifest.
        writer.close(relative, fd)
