"""The lab's shared programs: lowered once, fetched by every host that runs them (README "A lab of several hosts").

An entry is one lowered variant under its lowering cache key (Sidecar.cache_key):
`<store>/<key[:2]>/<key>/` holds the variant's files (every FileRecord of its sidecar, and the sidecar) and
`manifest.json`, written last: an entry without a manifest is incomplete (a put that was interrupted) and absent.
Kept programs (tonight's, tomorrow's baseline) are shared too, by their sha256: `<store>/programs/<sha>.pte`.

The store is any fsspec URL (a folder every host mounts, s3://, ...). What it holds was written by another host, so
it is read as untrusted data: the key and file names checked before they name a path, only regular files read (a
named pipe or a folder in a file's place is bad data, 65, never a read that blocks), every call bounded in time (a
store that stops answering is unreachable, 69, not a night that never ends), the manifest and sidecar parsed
strictly, every byte hashed while it is copied into a temporary file, renamed into place only when its sha256
matches both the manifest and the sidecar; the sidecar last, so a half-fetched artifact never loads. A bad entry is
replaced by the next host that publishes the program.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import secrets
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar
from urllib.parse import unquote

import msgspec

from orchestrator.errors import ArtifactError, BoardError, EtlabError, ExitCode
from orchestrator.fsutil import TMP_PREFIX, atomic_path, sha256_file
from orchestrator.lowering.artifacts import Artifact, ArtifactPaths, valid_sidecar
from orchestrator.lowering.sidecar import sidecar_from_data
from orchestrator.lowering.variants import Variant
from orchestrator.strictjson import JsonDataError, loads

CHUNK = 1 << 20
MAX_MANIFEST_BYTES = 1 << 20
MAX_FILE_BYTES = 64 << 30  # a 1B-parameter fp32 program and its exported program stay far below
MANIFEST = "manifest.json"
_KEY = re.compile(r"^[0-9a-f]{64}$")  # a lowering cache key, and a sha256
_PLAIN_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.+-]{0,254}$")
CALL_SECONDS = 120.0  # one call to the store (open, a 1 MiB read, a listing): longer is a store that hangs
T = TypeVar("T")


class StoreError(EtlabError):
    """The store holds an entry etlab refuses (tampered, malformed, for another program): bad data, like a bundle."""

    exit_code = ExitCode.DATA


class StoreUnreachable(StoreError, BoardError):
    """The store cannot be opened, read or written: infrastructure (69), like a lost link to a board (a BoardError,
    so deploy/cells.py's is_link_trouble counts it, and a lab night reruns the share elsewhere)."""

    exit_code = ExitCode.UNAVAILABLE


class _Absent(StoreError):
    """No such entry (its manifest missing): not an error for has(), one for get()."""


class Manifest(msgspec.Struct, forbid_unknown_fields=True):
    key: str
    model: str
    backend: str
    files: dict[str, str]  # file name -> sha256 (the sidecar included)
    sidecar: str  # the sidecar's file name


def _checked_key(key: str) -> str:
    if not isinstance(key, str) or not _KEY.fullmatch(key):
        raise StoreError(f"not a lowering cache key: {str(key)[:80]!r}")
    return key


def _plain(name: str, where: str) -> str:
    if not isinstance(name, str) or not _PLAIN_NAME.fullmatch(name) or ".." in name:
        raise StoreError(f"{where}: {str(name)[:80]!r} is not a plain file name")
    return name


def _sha(value: str, where: str) -> str:
    if not isinstance(value, str) or not _KEY.fullmatch(value):
        raise StoreError(f"{where}: {str(value)[:80]!r} is not a sha256")
    return value


def _userinfo(rest: str) -> tuple[str, str]:
    """(user:password, the rest) of a URL's part after "scheme://" and before its query. A password may hold an
    unencoded '/' (ftp://user:pa/ss@host/x): everything up to the last '@' may be a credential."""
    userinfo, at, after = rest.rpartition("@")
    return (userinfo, after) if at else ("", rest)


def shown(url: str) -> str:
    """The store's URL without credentials (user:password@ or a query's secrets)."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        return url
    userinfo, rest = _userinfo(rest.split("?", 1)[0])
    return f"{scheme}://{'***@' if userinfo else ''}{rest}"


def _secrets(url: str) -> list[str]:
    """What of `url` a message must not show: its user:password@ and query (an fsspec error may quote its path)."""
    _, sep, rest = url.partition("://")
    if not sep:
        return []
    rest, _, query = rest.partition("?")
    userinfo = _userinfo(rest)[0]
    found = [userinfo, userinfo.partition(":")[2], query, *(pair.partition("=")[2] for pair in query.split("&"))]
    found += [unquote(part) for part in found]
    return sorted({part for part in found if len(part) >= 3}, key=len, reverse=True)


class ArtifactStore:
    def __init__(self, url: str, *, call_seconds: float = CALL_SECONDS) -> None:
        import fsspec  # type: ignore[import-untyped]

        self.url = url
        self.call_seconds = call_seconds
        try:
            self.fs, root = fsspec.core.url_to_fs(url)
        except (ImportError, ValueError, OSError) as exc:
            raise self._unreachable("cannot open", exc) from None
        self.root = str(root).rstrip("/")

    def _bounded(self, what: str, call: Callable[[], T]) -> T:
        """`call()` in a thread of its own, given up after call_seconds (a hung mount, a pipe): StoreUnreachable.
        A call given up keeps its (daemon) thread; the night goes on without it."""
        box: dict[str, object] = {}

        def run() -> None:
            try:
                box["value"] = call()
            except BaseException as exc:  # handed to the caller as it is
                box["error"] = exc

        thread = threading.Thread(target=run, name="etlab-store-call", daemon=True)
        thread.start()
        thread.join(self.call_seconds)
        if thread.is_alive():
            raise StoreUnreachable(
                f"the lab's store {shown(self.url)} did not answer in {self.call_seconds:g} s ({what})"
            )
        if "error" in box:
            raise box["error"]  # type: ignore[misc]
        return box["value"]  # type: ignore[return-value]

    def _regular(self, path: str, where: str) -> int:
        """The size of `path`, a regular file (FileNotFoundError when absent); anything else is bad data."""
        try:
            info = self._bounded(f"looking at {path.rsplit('/', 1)[-1]}", lambda: self.fs.info(path))
        except FileNotFoundError:
            raise
        except OSError as exc:
            raise self._unreachable("cannot read", exc) from None
        kind = info.get("type")
        if kind != "file":
            what = {"directory": "a folder", "other": "a special file (a named pipe, a device or a socket)"}
            raise StoreError(
                f"{where}: {path.rsplit('/', 1)[-1]} is not a regular file but {what.get(kind, repr(kind)[:40])}"
            )
        return int(info.get("size") or 0)

    def _unreachable(self, what: str, exc: BaseException) -> StoreUnreachable:
        """`what` (cannot read, ...) the store, saying why without the URL's credentials, even where `exc` quotes
        them."""
        reason = str(exc)
        for secret in _secrets(self.url):
            reason = reason.replace(secret, "***")
        return StoreUnreachable(f"{what} the lab's store {shown(self.url)}: {reason}")

    def __repr__(self) -> str:
        return f"ArtifactStore({shown(self.url)!r})"

    def _entry(self, key: str) -> str:
        return f"{self.root}/{key[:2]}/{key}"

    def has(self, key: str) -> bool:
        """Whether a complete entry is there: its manifest, and every file it lists, regular files. An entry with
        anything else in their place is bad data (StoreError): refused, and replaced by the next put."""
        entry = self._entry(_checked_key(key))
        where = f"the lab's store {shown(self.url)}, entry {key}"
        try:
            manifest = self._manifest(entry, key, where)
        except _Absent:
            return False
        for name in manifest.files:
            try:
                self._regular(f"{entry}/{name}", where)
            except FileNotFoundError:
                raise StoreError(f"{where}: {name} is missing") from None
        return True

    # ------------------------------------------------------------ in

    def put(self, artifact: Artifact) -> str:
        """Publish the variant under its cache key (already there: nothing to do). Returns the key."""
        key = _checked_key(artifact.sidecar.cache_key)
        entry = self._entry(key)
        try:
            if self.has(key):
                return key
        except StoreUnreachable:
            raise
        except StoreError:  # a bad entry (a pipe, a folder, a malformed manifest): replaced whole
            try:
                self._bounded("removing a bad entry", lambda: self.fs.rm(entry, recursive=True))
            except OSError as exc:
                raise self._unreachable("could not replace a bad entry in", exc) from None
        folder = artifact.paths.folder
        sidecar_path = artifact.paths.sidecar(artifact.variant)
        files = {record.file: record.sha256 for record in artifact.sidecar.files.values()}
        files[sidecar_path.name] = sha256_file(sidecar_path)
        try:
            self.fs.makedirs(entry, exist_ok=True)
            for name, sha in files.items():
                _plain(name, "a lowered file")
                if sha256_file(folder / name) != sha:
                    raise StoreError(f"{folder / name} changed since it was lowered: not published")
                self._upload(folder / name, f"{entry}/{name}")
            manifest = Manifest(key, artifact.model, artifact.variant.name, files, sidecar_path.name)
            self._write(f"{entry}/{MANIFEST}", msgspec.json.encode(manifest))  # last: the entry is complete
        except OSError as exc:
            raise self._unreachable("could not publish to", exc) from None
        return key

    def _upload(self, source: Path, target: str) -> None:
        temporary = f"{target}.{TMP_PREFIX}{secrets.token_hex(6)}"
        self.fs.put_file(str(source), temporary)
        self.fs.mv(temporary, target)

    def _write(self, target: str, data: bytes) -> None:
        temporary = f"{target}.{TMP_PREFIX}{secrets.token_hex(6)}"
        self.fs.pipe_file(temporary, data)
        self.fs.mv(temporary, target)

    # ------------------------------------------------------------ out

    def get(self, key: str, model: str, variant: Variant, root: Path) -> Artifact:
        """The entry as a local artifact under `root/<model>/`, every file verified; one already there (same key,
        intact) is used as it is."""
        key = _checked_key(key)
        paths = ArtifactPaths.for_model(_plain(model, "a model name"), root)
        local, _ = valid_sidecar(paths, variant)
        if local is not None and local.cache_key == key:
            return Artifact(paths, variant, local)
        entry = self._entry(key)
        where = f"the lab's store {shown(self.url)}, entry {key}"
        manifest = self._manifest(entry, key, where)
        if manifest.model != model or manifest.backend != variant.name:
            raise StoreError(f"{where}: holds {manifest.model[:80]}/{manifest.backend[:80]}, not {model}/{variant}")
        sidecar_sha = manifest.files.get(manifest.sidecar)
        if sidecar_sha is None or manifest.sidecar != paths.sidecar(variant).name:
            raise StoreError(f"{where}: its manifest does not list the sidecar {paths.sidecar(variant).name}")
        sidecar_bytes = self._read_verified(f"{entry}/{manifest.sidecar}", sidecar_sha, where, MAX_MANIFEST_BYTES * 16)
        try:
            sidecar = sidecar_from_data(loads(sidecar_bytes, where=f"{where}: {manifest.sidecar}"), where)
        except (JsonDataError, ArtifactError) as exc:
            raise StoreError(str(exc)) from None
        if sidecar.cache_key != key or sidecar.model != model or sidecar.backend != variant.name:
            raise StoreError(
                f"{where}: its sidecar is for another program ({sidecar.model[:80]!r}/{sidecar.backend[:80]!r}, "
                f"cache key {sidecar.cache_key[:80]!r})"
            )
        records = {record.file: record for record in sidecar.files.values()}
        for name, record in records.items():
            if manifest.files.get(name) != record.sha256:
                raise StoreError(f"{where}: {name[:80]!r}: the manifest and the sidecar disagree")
        paths.folder.mkdir(parents=True, exist_ok=True)
        for name, record in records.items():
            target = paths.folder / _plain(name, where)
            self._fetch(f"{entry}/{name}", target, record.sha256, record.size, where)
            with contextlib.suppress(OSError):
                os.utime(target, ns=(record.mtime_ns, record.mtime_ns))  # valid_sidecar need not hash it again
        with atomic_path(paths.sidecar(variant)) as temporary:
            temporary.write_bytes(sidecar_bytes)
        checked, problem = valid_sidecar(paths, variant)
        if checked is None:
            raise StoreError(f"{where}: fetched, but not a valid artifact: {problem}")
        return Artifact(paths, variant, checked)

    def _manifest(self, entry: str, key: str, where: str) -> Manifest:
        try:
            data = self._read_capped(f"{entry}/{MANIFEST}", MAX_MANIFEST_BYTES, where)
        except FileNotFoundError:
            raise _Absent(f"{where}: no such entry (never published, or its publishing was interrupted)") from None
        try:
            manifest = msgspec.convert(loads(data, where=f"{where}: {MANIFEST}"), Manifest)
        except (JsonDataError, msgspec.ValidationError) as exc:
            raise StoreError(f"{where}: {MANIFEST} is malformed: {exc}") from None
        if manifest.key != key:
            raise StoreError(f"{where}: its manifest names another key")
        for name, sha in manifest.files.items():
            _plain(name, f"{where}: {MANIFEST}")
            _sha(sha, f"{where}: {MANIFEST}: {name}")
        return manifest

    def _read_capped(self, path: str, cap: int, where: str) -> bytes:
        def read() -> bytes:
            with self.fs.open(path, "rb") as handle:
                return bytes(handle.read(cap + 1))

        self._regular(path, where)
        try:
            data = self._bounded(f"reading {path.rsplit('/', 1)[-1]}", read)
        except FileNotFoundError:
            raise
        except OSError as exc:
            raise self._unreachable("cannot read", exc) from None
        if len(data) > cap:
            raise StoreError(f"{path.rsplit('/', 1)[-1]} in the lab's store {shown(self.url)} is over {cap} bytes")
        return data

    def _read_verified(self, path: str, sha: str, where: str, cap: int) -> bytes:
        try:
            data = self._read_capped(path, cap, where)
        except FileNotFoundError:
            raise StoreError(f"{where}: {path.rsplit('/', 1)[-1]} is missing") from None
        if hashlib.sha256(data).hexdigest() != sha:
            raise StoreError(f"{where}: {path.rsplit('/', 1)[-1]} does not match its sha256 (changed in the store)")
        return data

    def _fetch(self, source: str, target: Path, sha: str, size: int, where: str) -> None:
        """Copy, hashing as it goes, into a temporary beside `target`; renamed into place only when it matches."""
        if size > MAX_FILE_BYTES:
            raise StoreError(f"{where}: {target.name} is said to be {size} bytes: too large")
        if target.is_file() and target.stat().st_size == size and sha256_file(target) == sha:
            return  # shared with another variant of the model (its inputs), already here
        digest, copied = hashlib.sha256(), 0
        try:
            self._regular(source, where)
            handle = self._bounded(f"opening {target.name}", lambda: self.fs.open(source, "rb"))
            with atomic_path(target) as temporary, handle, open(temporary, "wb") as out:
                while chunk := self._bounded(f"reading {target.name}", lambda: handle.read(CHUNK)):
                    copied += len(chunk)
                    if copied > size:
                        raise StoreError(f"{where}: {target.name} is larger than its record says")
                    digest.update(chunk)
                    out.write(chunk)
                out.flush()
                if copied != size or digest.hexdigest() != sha:
                    raise StoreError(f"{where}: {target.name} does not match its sha256 (changed in the store)")
        except FileNotFoundError:
            raise StoreError(f"{where}: {target.name} is missing") from None
        except OSError as exc:
            raise self._unreachable(f"{target.name} could not be fetched from", exc) from None

    # ------------------------------------------------------------ kept programs (baselines)

    def _program_where(self, sha: str) -> str:
        return f"the lab's store {shown(self.url)}, program {sha[:12]}"

    def put_program(self, pte: Path, sha: str) -> None:
        target = f"{self.root}/programs/{_checked_key(sha)}.pte"
        try:
            try:
                self._regular(target, self._program_where(sha))
                return  # there already (verified by sha256 when fetched)
            except FileNotFoundError:
                pass
            except StoreUnreachable:
                raise
            except StoreError:  # something else in its place: replaced
                self._bounded("removing a bad program", lambda: self.fs.rm(target, recursive=True))
            self.fs.makedirs(f"{self.root}/programs", exist_ok=True)
            self._upload(pte, target)
        except OSError as exc:
            raise self._unreachable("could not publish to", exc) from None

    def get_program(self, sha: str, target: Path) -> Path | None:
        """The kept program `sha` fetched to `target` (verified), None when the store does not hold it."""
        source = f"{self.root}/programs/{_checked_key(sha)}.pte"
        where = self._program_where(sha)
        try:
            size = self._regular(source, where)
        except FileNotFoundError:
            return None
        self._fetch(source, target, sha, size, where)
        return target
