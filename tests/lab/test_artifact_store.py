"""The lab's shared store of lowered programs: published once, fetched verified, never trusted on its word."""

from __future__ import annotations

import json
import shutil
import threading
from pathlib import Path
from typing import Any

import pytest

from orchestrator.lab.artifact_store import MANIFEST, ArtifactStore, StoreError
from orchestrator.lowering.artifacts import Artifact, load_artifact
from orchestrator.lowering.variants import Variant
from tests.plugins.artifacts import ARTIFACT_CACHE

XNNPACK = Variant.parse("xnnpack")


@pytest.fixture
def tiny(tiny_artifacts: dict[str, Any]) -> Artifact:
    return load_artifact("distilbert-tiny", XNNPACK, ARTIFACT_CACHE)


def entry_of(store_root: Path, key: str) -> Path:
    return store_root / key[:2] / key


def test_a_program_goes_round_the_lab_byte_for_byte(tiny: Artifact, tmp_path: Path) -> None:
    store = ArtifactStore(str(tmp_path / "store"))
    key = store.put(tiny)
    assert key == tiny.sidecar.cache_key and store.has(key)
    fetched = store.get(key, "distilbert-tiny", XNNPACK, tmp_path / "host-b")
    assert fetched.sha256 == tiny.sha256
    assert fetched.pte.read_bytes() == tiny.pte.read_bytes()
    again = load_artifact("distilbert-tiny", XNNPACK, tmp_path / "host-b")  # as the runner's side loads it
    assert again.sidecar.cache_key == key
    # Published again (another host lowered it too): nothing changes; fetched again: the local copy is used.
    before = sorted(p.stat().st_mtime_ns for p in entry_of(tmp_path / "store", key).iterdir())
    assert store.put(tiny) == key
    assert sorted(p.stat().st_mtime_ns for p in entry_of(tmp_path / "store", key).iterdir()) == before
    mtime = fetched.pte.stat().st_mtime_ns
    store.get(key, "distilbert-tiny", XNNPACK, tmp_path / "host-b")
    assert fetched.pte.stat().st_mtime_ns == mtime


def test_a_tampered_program_is_refused_and_nothing_loads(tiny: Artifact, tmp_path: Path) -> None:
    store = ArtifactStore(str(tmp_path / "store"))
    key = store.put(tiny)
    stored = entry_of(tmp_path / "store", key) / tiny.pte.name
    data = bytearray(stored.read_bytes())
    data[len(data) // 2] ^= 0xFF
    stored.write_bytes(bytes(data))
    with pytest.raises(StoreError, match="does not match its sha256") as caught:
        store.get(key, "distilbert-tiny", XNNPACK, tmp_path / "host-b")
    assert caught.value.exit_code == 65
    with pytest.raises(Exception, match="no valid xnnpack artifact"):
        load_artifact("distilbert-tiny", XNNPACK, tmp_path / "host-b")
    assert not (tmp_path / "host-b" / "distilbert-tiny" / tiny.pte.name).exists(), "no file that looks complete"


@pytest.mark.parametrize("name", ["../escape.pte", "/etc/passwd", ".hidden", "a/b", "x\x00y"])
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


def test_an_interrupted_publish_is_no_entry(tiny: Artifact, tmp_path: Path) -> None:
    store = ArtifactStore(str(tmp_path / "store"))
    key = store.put(tiny)
    (entry_of(tmp_path / "store", key) / MANIFEST).unlink()  # as if the host died before its last write
    assert not store.has(key)
    with pytest.raises(StoreError, match="no such entry"):
        store.get(key, "distilbert-tiny", XNNPACK, tmp_path / "host-b")
    assert store.put(tiny) == key and store.has(key), "published again, whole"


def test_an_entry_for_another_program_is_refused(tiny: Artifact, tmp_path: Path) -> None:
    store = ArtifactStore(str(tmp_path / "store"))
    key = store.put(tiny)
    other = "f" * 64
    shutil.copytree(entry_of(tmp_path / "store", key), entry_of(tmp_path / "store", other))
    manifest = entry_of(tmp_path / "store", other) / MANIFEST
    manifest.write_text(manifest.read_text().replace(key, other))
    with pytest.raises(StoreError, match="another program"):
        store.get(other, "distilbert-tiny", XNNPACK, tmp_path / "host-b")
    with pytest.raises(StoreError, match="holds distilbert-tiny/xnnpack, not gpt2-tiny/xnnpack"):
        store.get(key, "gpt2-tiny", XNNPACK, tmp_path / "host-b")
    with pytest.raises(StoreError, match="not a lowering cache key"):
        store.get("../../etc", "distilbert-tiny", XNNPACK, tmp_path / "host-b")


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


def test_the_store_url_is_shown_without_credentials() -> None:
    from orchestrator.lab.artifact_store import shown

    assert shown("s3://key:secret@bucket/etlab?token=abc") == "s3://bucket/etlab"
    assert shown("/srv/etlab-store") == "/srv/etlab-store"
