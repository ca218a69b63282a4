"""Lowered artifacts on disk: where they live, and whether a sidecar still vouches for its files.

A `.pte` counts as an artifact only when its sidecar exists and the recorded size, mtime (or, failing
that, sha256) of every file it names still match. Lowering removes the sidecar before rewriting
anything, so an interrupted lowering never leaves a valid-looking artifact behind.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from orchestrator import paths
from orchestrator.errors import ArtifactError
from orchestrator.fsutil import read_json, sha256_file
from orchestrator.lowering.sidecar import SIDECAR_SCHEMA, FileRecord, Sidecar, sidecar_from_data
from orchestrator.lowering.variants import BACKENDS, QUANTIZED_BACKENDS, VARIANTS, Variant

# the backend names, from variants.py; the schema, from sidecar.py
__all__ = ["BACKENDS", "QUANTIZED_BACKENDS", "SIDECAR_SCHEMA", "VARIANTS"]

# The source map's role in a sidecar's files. Its absence makes the artifact incomplete (lowered again), but a
# changed map does not: the analysis checks it against this record when it reads it, and refuses it by name.
SOURCES_ROLE = "sources"


@dataclass(frozen=True)
class ArtifactPaths:
    """File names for one model under artifacts/<name>/."""

    name: str
    folder: Path

    @classmethod
    def for_model(cls, name: str, root: Path | None = None) -> ArtifactPaths:
        return cls(name, (root or paths.artifacts_dir()) / name)

    @property
    def exported_program(self) -> Path:
        return self.folder / f"{self.name}_exported.pt2"

    @property
    def reference_inputs(self) -> Path:
        return self.folder / f"{self.name}_inputs.etlt"

    @property
    def reference_outputs(self) -> Path:
        return self.folder / f"{self.name}_reference_outputs.etlt"

    def pte(self, variant: Variant) -> Path:
        return self.folder / f"{self.name}_{variant.name}.pte"

    def sidecar(self, variant: Variant) -> Path:
        return self.folder / f"{self.name}_{variant.name}.json"

    def etrecord(self, variant: Variant) -> Path:
        return self.folder / f"{self.name}_{variant.name}.etrecord"


@dataclass(frozen=True)
class Artifact:
    """One lowered variant: the .pte and what its sidecar says about it."""

    paths: ArtifactPaths
    variant: Variant
    sidecar: Sidecar

    @property
    def pte(self) -> Path:
        return self.paths.pte(self.variant)

    @property
    def sha256(self) -> str:
        return self.sidecar.sha256

    @property
    def model(self) -> str:
        return self.paths.name


def file_record(path: Path, sha256: str | None = None) -> dict[str, Any]:
    """What a sidecar stores about a file so that its validity is cheap to re-check."""
    stat = path.stat()
    return {
        "file": path.name,
        "size": stat.st_size,
        "mtime_ns": stat.st_mtime_ns,
        "sha256": sha256 or sha256_file(path),
    }


def record_still_matches(folder: Path, record: FileRecord) -> bool:
    """Size must match; a changed mtime is forgiven only if the content hash still matches."""
    path = folder / record.file
    try:
        stat = path.stat()
    except OSError:
        return False
    if stat.st_size != record.size:
        return False
    return stat.st_mtime_ns == record.mtime_ns or sha256_file(path) == record.sha256


def valid_sidecar(artifact_paths: ArtifactPaths, variant: Variant) -> tuple[Sidecar | None, str | None]:
    """The variant's sidecar when its artifact is complete and intact, else None and why it is not."""
    sidecar_path = artifact_paths.sidecar(variant)
    if not sidecar_path.is_file():
        return None, f"{sidecar_path.name} is missing"
    try:
        data = read_json(sidecar_path)
    except (OSError, ValueError):
        return None, f"{sidecar_path.name} is unreadable"
    schema = data.get("schema") if isinstance(data, dict) else None
    if not isinstance(schema, int) or schema < SIDECAR_SCHEMA:  # a newer one is refused by name when read
        return None, f"{sidecar_path.name} has an old schema"
    try:
        sidecar = sidecar_from_data(data, sidecar_path.name)
    except ArtifactError as exc:
        return None, str(exc)
    for role, record in sidecar.files.items():
        if role == SOURCES_ROLE and (artifact_paths.folder / record.file).is_file():
            continue
        if not record_still_matches(artifact_paths.folder, record):
            return None, f"{record.file} ({role}) changed or is missing since it was lowered"
    return sidecar, None


def sidecar_problem(artifact_paths: ArtifactPaths, variant: Variant) -> str | None:
    """None when the variant's artifact is complete and intact, else why it is not."""
    return valid_sidecar(artifact_paths, variant)[1]


class MissingArtifact(ArtifactError):
    """No valid artifact for a model and variant; the command layer says which `fab lower` makes it."""

    def __init__(self, model: str, variant: Variant, message: str) -> None:
        super().__init__(message)
        self.model = model
        self.variant = variant


def load_artifact(name: str, variant: Variant, root: Path | None = None) -> Artifact:
    """The artifact for `name`/`variant`, or MissingArtifact saying why there is none."""
    artifact_paths = ArtifactPaths.for_model(name, root)
    sidecar, problem = valid_sidecar(artifact_paths, variant)
    if sidecar is None:
        raise MissingArtifact(
            name, variant, f"no valid {variant} artifact for model {name!r} in {artifact_paths.folder}: {problem}"
        )
    return Artifact(artifact_paths, variant, sidecar)
