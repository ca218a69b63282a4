"""The lowering cache key: what a sidecar must carry to be reused, checked before torch is imported.

It hashes the spec's identity, the rewrites it resolves to, the variant, the resolved weights, the toolchain's
versions and the code: every module of the lowering package, subpackages included, by relative path.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
from pathlib import Path

from orchestrator.lowering.artifacts import ArtifactPaths, valid_sidecar
from orchestrator.lowering.rewrites.registry import NO_REWRITES, RewriteRequest
from orchestrator.lowering.sidecar import Sidecar
from orchestrator.lowering.spec import SOURCES, ModelSpec
from orchestrator.lowering.variants import Variant
from orchestrator.versions import toolchain_versions

# Every module of the lowering package decides what lowering produces (a rewrite in a new module too): editing any
# invalidates the cache. Hashed by relative path, so a moved module is another revision.
LOWERING_PACKAGE = Path(__file__).resolve().parents[1]


def code_files(source: str | None = None) -> list[Path]:
    """The code that decides what a lowering produces: every .py of the lowering package (recursively, sorted by
    relative path), then the builder module of model source `source` when it lives outside the package (registered
    by a test or a plugin; found without importing it: a cache hit imports no torch). Only the spec's own source:
    another process may not have registered the others."""
    package = LOWERING_PACKAGE
    files = sorted(package.rglob("*.py"), key=lambda path: path.relative_to(package).as_posix())
    if source is not None and source in SOURCES:
        try:
            found = importlib.util.find_spec(SOURCES[source].builder.partition(":")[0])
        except (ImportError, ValueError):  # its package is gone: the lowering will say so, not the cache key
            found = None
        if found is not None and found.origin:
            files.append(Path(found.origin).resolve())
    return list(dict.fromkeys(files))


def code_revision(source: str | None = None) -> str:
    digest = hashlib.sha256()
    for path in code_files(source):
        name = path.relative_to(LOWERING_PACKAGE).as_posix() if path.is_relative_to(LOWERING_PACKAGE) else str(path)
        digest.update(name.encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


def cache_key(
    spec: ModelSpec,
    variant: Variant,
    weights: str,
    etrecord: bool,
    calibration: str | None = None,
    rewrites: RewriteRequest = NO_REWRITES,
) -> str:
    """The key a sidecar must carry to be reused; `weights` is the resolved mode, "pretrained" or "random".

    `calibration` (the calibration file's sha256) matters only for a calibrated scheme (int8-static); `rewrites`
    by the ones it resolves to for this spec (another set of rewrites is another program).
    """
    material = {
        "spec": spec.identity(),
        "rewrites": list(rewrites.resolve(spec)),
        "backend": variant.name,
        "weights": weights,
        "etrecord": etrecord,
        "versions": toolchain_versions(),
        "code": code_revision(spec.model_source),
    }
    if variant.scheme.calibrated:
        material["calibration"] = calibration or "generated"
    return hashlib.sha256(json.dumps(material, sort_keys=True).encode()).hexdigest()


def cached_sidecar(artifact_paths: ArtifactPaths, variant: Variant, key: str, weights: str) -> Sidecar | None:
    sidecar, _ = valid_sidecar(artifact_paths, variant)
    if sidecar is None or sidecar.cache_key != key or sidecar.weights != weights:
        return None
    return sidecar
