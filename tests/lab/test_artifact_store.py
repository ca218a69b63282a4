"""The lab's shared store of lowered programs: published once, fetched verified, never trusted on its word."""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import shutil
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar

import fsspec  # type: ignore[import-untyped]
import pytest
from fsspec.implementations.local import LocalFileSystem  # type: ignore[import-untyped]

from orchestrator.deploy.cells import is_link_trouble
from orchestrator.errors import BoardError
from orchestrator.fsutil import TMP_PREFIX
from orchestrator.lab.artifact_store import MANIFEST, ArtifactStore, StoreError, StoreUnreachable
from orchestrator.lowering.artifacts import Artifact, MissingArtifact, load_artifact
from orchestrator.lowering.variants import Variant
from tests.plugins.artifacts import ARTIFACT_CACHE

XNNPACK = Variant.parse("xnnpack")


@pytest.fixture
def tiny(tiny_artifacts: dict[str, Any]) -> Artifact:
    return load_artifact("distilbert-tiny", XNNPACK, ARTIFACT_CACHE)


def entry_of(store_root: Path, key: str) -> Path:
    return store_root / key[:2] / key


def rewrite_sidecar(entry: Path, sidecar: str, change: Callable[[dict[str, Any]], None]) -> None:
    """Change the stored sidecar as a hostile host would: the manifest's sha256 for it follows, so only the sidecar's
    own content can give it away."""
    document = json.loads((entry / sidecar).read_text())
    change(document)
    data = json.dumps(document).encode()
    (entry / sidecar).write_bytes(data)
    manifest = json.loads((entry / MANIFEST).read_text())
    manifest["files"][sidecar] = hashlib.sha256(data).hexdigest()
    (entry / MANIFEST).write_text(json.dumps(manifest))


def test_a_program_goes_round_the_lab_byte_for_byte(tiny: Artifact, tmp_path: Path) -> None:
    store = ArtifactStore(str(tmp_path / "store"))
    key = store.put(tiny)
    assert key == tiny.sidecar.cache_key and store.has(key)
    fetched = store.get(key, "distilbert-tiny", XNNPACK, tmp_path / "host-b")
    assert fetched.sha256 == tiny.sha256
    assert fetched.pte.read_bytes() == tiny.pte.read_bytes()
    again = load_artifact("distilbert-tiny", XNNPACK, tmp_path / "host-b")  # as the runner's side loads it
    assert again.sidecar.cache_key == key
    for record in fetched.sidecar.files.values():
        local = fetched.paths.folder / record.file
        assert local.read_bytes() == (tiny.paths.folder / record.file).read_bytes()
        # its recorded mtime: loading it trusts size and mtime instead of hashing every file again
        assert local.stat().st_mtime_ns == record.mtime_ns, record.file
    # Published again (another host lowered it too): nothing changes; fetched again: the local copy is used.
    before = sorted(p.stat().st_mtime_ns for p in entry_of(tmp_path / "store", key).iterdir())
    assert store.put(tiny) == key
    assert sorted(p.stat().st_mtime_ns for p in entry_of(tmp_path / "store", key).iterdir()) == before
    mtime = fetched.pte.stat().st_mtime_ns
    store.get(key, "distilbert-tiny", XNNPACK, tmp_path / "host-b")
    assert fetched.pte.stat().st_mtime_ns == mtime


@pytest.mark.parametrize("form", ["folder", "file", "memory"])
def test_any_fsspec_url_is_a_store(tiny: Artifact, tmp_path: Path, form: str) -> None:
    url = {
        "folder": str(tmp_path / "store"),
        "file": f"file://{tmp_path / 'store'}",
        "memory": f"memory://etlab-{secrets.token_hex(4)}/store",
    }[form]
    store = ArtifactStore(url)
    key = store.put(tiny)
    assert ArtifactStore(url).has(key)
    fetched = ArtifactStore(url).get(key, "distilbert-tiny", XNNPACK, tmp_path / "host-b")
    assert fetched.pte.read_bytes() == tiny.pte.read_bytes()
    if form == "memory":
        fsspec.filesystem("memory").rm(url.removeprefix("memory://").split("/")[0], recursive=True)


def test_a_valid_local_copy_is_used_without_the_store(tiny: Artifact, tmp_path: Path) -> None:
    store = ArtifactStore(str(tmp_path / "store"))
    key = store.put(tiny)
    store.get(key, "distilbert-tiny", XNNPACK, tmp_path / "host-b")
    shutil.rmtree(tmp_path / "store")  # nothing left to copy from: the copy here is the one returned
    again = store.get(key, "distilbert-tiny", XNNPACK, tmp_path / "host-b")
    assert again.sidecar.cache_key == key


def test_a_tampered_program_is_refused_and_nothing_loads(tiny: Artifact, tmp_path: Path) -> None:
    store = ArtifactStore(str(tmp_path / "store"))
    key = store.put(tiny)
    stored = entry_of(tmp_path / "store", key) / tiny.pte.name
    data = bytearray(stored.read_bytes())
    data[len(data) // 2] ^= 0xFF
    stored.write_bytes(bytes(data))
    with pytest.raises(StoreError, match="does not match its sha256") as caught:
        store.get(key, "distilbert-tiny", XNNPACK, tmp_path / "host-b")
    assert key in str(caught.value) and tiny.pte.name in str(caught.value)
    assert caught.value.exit_code == 65 and not isinstance(caught.value, BoardError), "bad data, not a lost link"
    with pytest.raises(MissingArtifact, match="no valid xnnpack artifact"):
        load_artifact("distilbert-tiny", XNNPACK, tmp_path / "host-b")
    folder = tmp_path / "host-b" / "distilbert-tiny"
    assert not (folder / tiny.pte.name).exists(), "no file that looks complete"
    assert tiny.paths.sidecar(XNNPACK).name not in os.listdir(folder), "the sidecar comes last"
    assert not [name for name in os.listdir(folder) if name.startswith(TMP_PREFIX)], "no temporaries left"


@pytest.mark.parametrize("name", ["../escape.pte", "/etc/passwd", ".hidden", "..", "a/b", "a\\b", "x\x00y", ""])
def test_a_manifest_naming_a_path_is_refused(tiny: Artifact, tmp_path: Path, name: str) -> None:
    store = ArtifactStore(str(tmp_path / "store"))
    key = store.put(tiny)
    manifest = entry_of(tmp_path / "store", key) / MANIFEST
    document = json.loads(manifest.read_text())
    document["files"][name] = document["files"][tiny.pte.name]
    manifest.write_text(json.dumps(document))
    with pytest.raises(StoreError, match="not a plain file name"):
        store.get(key, "distilbert-tiny", XNNPACK, tmp_path / "host-b" / "artifacts")
    assert not (tmp_path / "escape.pte").exists() and not (tmp_path / "host-b" / "escape.pte").exists()


def test_a_manifest_over_its_cap_is_refused(tiny: Artifact, tmp_path: Path) -> None:
    store = ArtifactStore(str(tmp_path / "store"))
    key = store.put(tiny)
    manifest = entry_of(tmp_path / "store", key) / MANIFEST
    manifest.write_text(manifest.read_text() + " " * (2 << 20))  # still JSON, but no manifest is 2 MB
    with pytest.raises(StoreError, match=f"{MANIFEST} .* is over"):
        store.get(key, "distilbert-tiny", XNNPACK, tmp_path / "host-b")


def test_a_file_said_to_be_huge_is_refused_before_copying(tiny: Artifact, tmp_path: Path) -> None:
    store = ArtifactStore(str(tmp_path / "store"))
    key = store.put(tiny)

    def huge(document: dict[str, Any]) -> None:
        for record in document["files"].values():
            record["size"] = 1 << 50

    rewrite_sidecar(entry_of(tmp_path / "store", key), tiny.paths.sidecar(XNNPACK).name, huge)
    with pytest.raises(StoreError, match="too large"):
        store.get(key, "distilbert-tiny", XNNPACK, tmp_path / "host-b")


def test_an_interrupted_publish_is_no_entry(tiny: Artifact, tmp_path: Path) -> None:
    # A real interruption: a file that changed since it was lowered stops the publishing part-way.
    local = tmp_path / "host-a"
    shutil.copytree(tiny.paths.folder, local / "distilbert-tiny")
    copy = load_artifact("distilbert-tiny", XNNPACK, local)
    last = list(copy.sidecar.files.values())[-1]
    with open(local / "distilbert-tiny" / last.file, "r+b") as handle:
        handle.write(b"\0")
    os.utime(local / "distilbert-tiny" / last.file, ns=(last.mtime_ns, last.mtime_ns))
    store = ArtifactStore(str(tmp_path / "store"))
    key = copy.sidecar.cache_key
    with pytest.raises(StoreError, match="changed since it was lowered"):
        store.put(copy)
    assert (entry_of(tmp_path / "store", key) / next(iter(copy.sidecar.files.values())).file).is_file()
    assert not store.has(key), "files without their manifest are no entry"
    with pytest.raises(StoreError, match="no such entry"):
        store.get(key, "distilbert-tiny", XNNPACK, tmp_path / "host-b")
    assert store.put(tiny) == key and store.has(key), "published again, whole"
    store.get(key, "distilbert-tiny", XNNPACK, tmp_path / "host-b")


class WritesSeen(LocalFileSystem):
    """The local filesystem, noting each name it writes and each rename, in order (fsspec's own API, nothing faked)."""

    protocol = "etlabseen"
    log: ClassVar[list[tuple[str, str]]] = []

    def cp_file(self, path1: str, path2: str, **kwargs: Any) -> Any:
        self.log.append(("write", self._strip_protocol(path2)))
        return super().cp_file(path1, path2, **kwargs)

    def _open(self, path: str, mode: str = "rb", *args: Any, **kwargs: Any) -> Any:
        if set(mode) & set("wxa"):
            self.log.append(("write", self._strip_protocol(path)))
        return super()._open(path, mode, *args, **kwargs)

    def mv(self, path1: str, path2: str, *args: Any, **kwargs: Any) -> Any:
        self.log.append(("rename", self._strip_protocol(path2)))
        return super().mv(path1, path2, *args, **kwargs)


def test_a_publish_writes_temporaries_and_the_manifest_last(tiny: Artifact, tmp_path: Path) -> None:
    fsspec.register_implementation(WritesSeen.protocol, WritesSeen, clobber=True)
    WritesSeen.log.clear()
    key = ArtifactStore(f"etlabseen://{tmp_path / 'store'}").put(tiny)
    written = [path for op, path in WritesSeen.log if op == "write"]
    renamed = [path for op, path in WritesSeen.log if op == "rename"]
    assert written and all(TMP_PREFIX in Path(path).name for path in written), "a final name is never half-written"
    entry = str(entry_of(tmp_path / "store", key))
    assert renamed[-1] == f"{entry}/{MANIFEST}", "the manifest, whose presence says 'complete', comes last"
    assert sorted(renamed[:-1]) == sorted(
        f"{entry}/{name}" for name in [*(r.file for r in tiny.sidecar.files.values()), tiny.paths.sidecar(XNNPACK).name]
    )


def test_an_entry_for_another_program_is_refused(tiny: Artifact, tmp_path: Path) -> None:
    store = ArtifactStore(str(tmp_path / "store"))
    key = store.put(tiny)
    other = "f" * 64
    shutil.copytree(entry_of(tmp_path / "store", key), entry_of(tmp_path / "store", other))
    manifest = entry_of(tmp_path / "store", other) / MANIFEST
    manifest.write_text(manifest.read_text().replace(key, other))
    with pytest.raises(StoreError, match="another program"):
        store.get(other, "distilbert-tiny", XNNPACK, tmp_path / "host-b")
    assert not (tmp_path / "host-b" / "distilbert-tiny" / tiny.paths.sidecar(XNNPACK).name).exists()
    with pytest.raises(StoreError, match="holds distilbert-tiny/xnnpack, not gpt2-tiny/xnnpack"):
        store.get(key, "gpt2-tiny", XNNPACK, tmp_path / "host-b")
    with pytest.raises(StoreError, match="not a lowering cache key"):
        store.get("../../etc", "distilbert-tiny", XNNPACK, tmp_path / "host-b")


def test_a_sidecar_for_another_model_is_refused(tiny: Artifact, tmp_path: Path) -> None:
    store = ArtifactStore(str(tmp_path / "store"))
    key = store.put(tiny)
    entry = entry_of(tmp_path / "store", key)
    # a whole sidecar of another program (its name and its recorded program both say gpt2-tiny)
    another = {"model": "gpt2-tiny", "program": {"base": "gpt2-tiny"}}
    rewrite_sidecar(entry, tiny.paths.sidecar(XNNPACK).name, lambda document: document.update(another))
    with pytest.raises(StoreError, match=r"another program \('gpt2-tiny'/'xnnpack'"):
        store.get(key, "distilbert-tiny", XNNPACK, tmp_path / "host-b")
    # one that contradicts itself (named gpt2-tiny, recorded as distilbert-tiny) is refused when read
    rewrite_sidecar(entry, tiny.paths.sidecar(XNNPACK).name, lambda document: document.update(model="gpt2-tiny",
                    program={"base": "distilbert-tiny"}))  # fmt: skip
    with pytest.raises(StoreError, match=r"program: distilbert-tiny is not the program 'gpt2-tiny'"):
        store.get(key, "distilbert-tiny", XNNPACK, tmp_path / "host-b")


def test_two_hosts_publishing_at_once_leave_one_whole_entry(tiny: Artifact, tmp_path: Path) -> None:
    store = ArtifactStore(str(tmp_path / "store"))
    errors: list[BaseException] = []

    def publish() -> None:
        try:
            ArtifactStore(str(tmp_path / "store")).put(tiny)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=publish) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors, errors
    fetched = store.get(tiny.sidecar.cache_key, "distilbert-tiny", XNNPACK, tmp_path / "host-b")
    assert fetched.pte.read_bytes() == tiny.pte.read_bytes()
    leftovers = [p.name for p in entry_of(tmp_path / "store", tiny.sidecar.cache_key).iterdir() if "tmp" in p.name]
    assert not leftovers, leftovers


def test_kept_programs_travel_verified(tiny: Artifact, tmp_path: Path) -> None:
    store = ArtifactStore(str(tmp_path / "store"))
    assert store.get_program(tiny.sha256, tmp_path / "b.pte") is None
    store.put_program(tiny.pte, tiny.sha256)
    assert store.get_program(tiny.sha256, tmp_path / "b.pte") == tmp_path / "b.pte"
    assert (tmp_path / "b.pte").read_bytes() == tiny.pte.read_bytes()
    (tmp_path / "store" / "programs" / f"{tiny.sha256}.pte").write_bytes(b"not the program")
    with pytest.raises(StoreError):
        store.get_program(tiny.sha256, tmp_path / "c.pte")
    assert not (tmp_path / "c.pte").exists()


def test_the_store_url_is_shown_without_credentials(tiny: Artifact) -> None:
    from orchestrator.lab.artifact_store import shown

    assert shown("s3://key:secret@bucket/etlab?token=abc") == "s3://***@bucket/etlab"
    assert shown("/srv/etlab-store") == "/srv/etlab-store"
    # A password with an unencoded '/' was printed whole (ftp://user:pa/ss@host/x): all up to the last '@' is hidden.
    assert shown("ftp://user:pa/ss@host/x") == "ftp://***@host/x"
    assert shown("s3://bucket/etlab") == "s3://bucket/etlab"
    # fsspec's own error quotes the path, credentials and all: the message etlab shows does not
    url = f"memory://etlab:hunter22@store-{secrets.token_hex(4)}/programs"
    fs = fsspec.filesystem("memory")
    fs.pipe_file(url.removeprefix("memory://"), b"a file where the store's folder should be")
    with pytest.raises(StoreUnreachable) as caught:
        ArtifactStore(url).put(tiny)
    assert "hunter22" not in str(caught.value) and "store-" in str(caught.value)
    assert "hunter22" not in repr(ArtifactStore(url))
    fs.rm(url.removeprefix("memory://"))


def test_an_unreachable_store_is_infrastructure(tiny: Artifact, tmp_path: Path) -> None:
    (tmp_path / "store").write_text("not a folder: the share is not mounted as it should be")
    with pytest.raises(StoreUnreachable) as caught:
        ArtifactStore(str(tmp_path / "store")).put(tiny)
    assert caught.value.exit_code == 69 and is_link_trouble(caught.value), "the night reruns it elsewhere"


@pytest.mark.parametrize("what", ["pipe", "folder"])
@pytest.mark.parametrize("where", ["manifest", "program"])
def test_a_pipe_or_a_folder_in_a_files_place_is_bad_data_and_replaced(
    tiny: Artifact, tmp_path: Path, what: str, where: str
) -> None:
    """A named pipe would block the read forever (a night that never ends, its lock held); a folder was taken for an
    unreachable store (69). Both are bad data (65), refused at once, and the next publish replaces the entry."""
    store = ArtifactStore(str(tmp_path / "store"))
    key = store.put(tiny)
    entry = entry_of(tmp_path / "store", key)
    target = entry / (MANIFEST if where == "manifest" else tiny.paths.pte(XNNPACK).name)
    target.unlink()
    os.mkfifo(target) if what == "pipe" else target.mkdir()
    for attempt in (lambda: store.has(key), lambda: store.get(key, tiny.model, XNNPACK, tmp_path / "elsewhere")):
        with pytest.raises(StoreError) as caught:
            attempt()
        assert not isinstance(caught.value, StoreUnreachable) and caught.value.exit_code == 65
        assert "is not a regular file" in str(caught.value), caught.value
    assert not (tmp_path / "elsewhere" / tiny.model / tiny.paths.pte(XNNPACK).name).exists()
    assert store.put(tiny) == key  # published again over the bad entry
    assert target.is_file() and store.has(key)
    fetched = store.get(key, tiny.model, XNNPACK, tmp_path / "elsewhere")
    assert fetched.paths.pte(XNNPACK).read_bytes() == tiny.paths.pte(XNNPACK).read_bytes()


def test_a_kept_program_that_is_a_pipe_is_refused_and_replaced(tiny: Artifact, tmp_path: Path) -> None:
    store = ArtifactStore(str(tmp_path / "store"))
    sha = tiny.sha256
    (tmp_path / "store" / "programs").mkdir(parents=True)
    os.mkfifo(tmp_path / "store" / "programs" / f"{sha}.pte")
    with pytest.raises(StoreError, match="is not a regular file"):
        store.get_program(sha, tmp_path / "fetched.pte")
    store.put_program(tiny.pte, sha)
    assert store.get_program(sha, tmp_path / "fetched.pte") is not None
    assert (tmp_path / "fetched.pte").read_bytes() == tiny.pte.read_bytes()


def test_a_store_call_that_never_returns_is_given_up(tiny: Artifact, tmp_path: Path, monkeypatch: Any) -> None:
    """Every call to the store is bounded in time: here a pipe that a (lying, or racing) store calls a file, whose
    open blocks forever. Given up as an unreachable store (69), never a night that hangs."""
    store = ArtifactStore(str(tmp_path / "store"), call_seconds=0.5)
    key = store.put(tiny)
    manifest = entry_of(tmp_path / "store", key) / MANIFEST
    manifest.unlink()
    os.mkfifo(manifest)
    real_info = store.fs.info
    monkeypatch.setattr(store.fs, "info", lambda path, **kw: {**real_info(path, **kw), "type": "file"})
    done = threading.Event()
    problem: list[BaseException] = []

    def fetch() -> None:
        try:
            store.get(key, tiny.model, XNNPACK, tmp_path / "elsewhere")
        except BaseException as exc:
            problem.append(exc)
        done.set()

    threading.Thread(target=fetch, daemon=True).start()
    assert done.wait(60), "the read of a pipe was not given up"
    (caught,) = problem
    assert isinstance(caught, StoreUnreachable) and "did not answer in 0.5 s" in str(caught), caught
    with open(manifest, "wb"):  # release the blocked open, so its thread ends
        pass
