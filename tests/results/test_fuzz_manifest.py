"""Fuzzing the bundle manifest check (results/bundle.py): random, mutated and value-replaced manifests end in a
BundleError, never another exception.

Settings and mutations: tests/plugins/fuzz.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import event, example, given
from hypothesis import strategies as st

from orchestrator.errors import BundleError
from orchestrator.results.bundle import MANIFEST, verify_bundle
from orchestrator.tensorfile import NamedTensor, write_tensors
from tests.plugins.fuzz import FUZZ, FUZZ_TIMEOUT, mutate, mutations

pytestmark = FUZZ_TIMEOUT


def manifest_folder(root: Path) -> tuple[Path, bytes]:
    """A bundle folder with real files and the manifest the agent writes for them; returns it and the manifest."""
    folder = root / "bundle"
    folder.mkdir()
    (folder / "timings.json").write_text(json.dumps({"iterations_ms": [1.5, 2.5]}))
    (folder / "runner.log").write_text("ok\n")
    write_tensors(folder / "outputs.etlt", [NamedTensor("output_0", np.arange(6, dtype=np.float32))])
    from orchestrator.results.bundle import file_digest

    files = {}
    for path in sorted(folder.iterdir()):
        digest = file_digest(path)
        files[path.name] = {"sha256": digest.sha256, "size": digest.size}
    manifest = {
        "schema": 1,
        "run_id": "20260101-000000-abcdef",
        "status": "ok",
        "error": None,
        "runner_exit_code": 0,
        "model_sha256": "0" * 64,
        "agent_version": "test",
        "created_at": "2026-01-01T00:00:00Z",
        "files": files,
    }
    text = json.dumps(manifest, indent=2).encode()
    (folder / MANIFEST).write_bytes(text)
    return folder, text


@pytest.fixture(scope="module")
def manifest_seed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, bytes]:
    folder, text = manifest_folder(tmp_path_factory.mktemp("manifest"))
    assert verify_bundle(folder)["status"] == "ok"  # the seed is valid
    return folder, text


def check_manifest(folder: Path, text: bytes) -> None:
    """verify_bundle on a folder whose manifest is `text`: a manifest dict or BundleError, nothing else."""
    (folder / MANIFEST).write_bytes(text)
    try:
        manifest = verify_bundle(folder)
    except BundleError:
        event("manifest: refused")
        return
    event("manifest: accepted")
    assert isinstance(manifest, dict)
    listed = set(manifest["files"])
    assert listed | {MANIFEST} >= {"timings.json", "runner.log", "outputs.etlt"}


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4),
    max_leaves=12,
)
MANIFEST_KEYS = st.sampled_from(["schema", "files", "run_id", "status", "size", "sha256", "timings.json", "x"])


@FUZZ
@given(data=st.binary(max_size=512))
@example(data=b"[" * 100_000)  # RecursionError escaped from json.loads
@example(data=b'{"schema": ' + b"1" * 5000 + b"}")  # ValueError (integer string too long) escaped
@example(data=b'{"files": {"a": {"sha256": "x", "size": ' + b"9" * 5000 + b"}}}")
def test_manifest_from_random_bytes(manifest_seed: tuple[Path, bytes], data: bytes) -> None:
    check_manifest(manifest_seed[0], data)


@FUZZ
@given(operations=mutations)
def test_manifest_mutated_bytes(manifest_seed: tuple[Path, bytes], operations: list[tuple]) -> None:
    folder, seed = manifest_seed
    check_manifest(folder, mutate(seed, operations))


@FUZZ
@given(
    path=st.lists(st.one_of(MANIFEST_KEYS, st.text(max_size=8)), min_size=0, max_size=3),
    value=json_values,
)
def test_manifest_with_replaced_values(manifest_seed: tuple[Path, bytes], path: list[str], value: object) -> None:
    """Valid JSON with one subtree replaced (the document, a field, a file entry or a nested field of one)."""
    folder, seed = manifest_seed
    document: object = json.loads(seed)
    if not path:
        document = value
    else:
        target = document
        for key in path[:-1]:
            target = target.get(key) if isinstance(target, dict) else None
        if isinstance(target, dict):
            target[path[-1]] = value
    check_manifest(folder, json.dumps(document).encode())


def test_the_manifest_regressions_give_clear_errors(manifest_seed: tuple[Path, bytes]) -> None:
    folder, seed = manifest_seed
    try:
        for text, problem in (
            (b"[" * 100_000, "nested more than 64 levels"),
            (b'{"schema": ' + b"1" * 5000 + b"}", "schema: a number of 5000 characters is out of range"),
        ):
            (folder / MANIFEST).write_bytes(text)
            with pytest.raises(BundleError, match=f"{MANIFEST}: {problem}"):
                verify_bundle(folder)
    finally:
        (folder / MANIFEST).write_bytes(seed)
