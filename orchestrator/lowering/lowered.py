"""Models found by their artifacts: `--model NAME` for a model lowered earlier from a spec file or a user's file.

A sidecar records the spec it was lowered from (`spec`, with `source`: the spec file). When NAME is no built-in
but `artifacts/NAME/` holds a valid lowering, the spec comes from there: the spec file as it is now when it still
says the same, else the spec as it was lowered (the artifacts are from it), with a warning naming the file.
A program the user lowered or exported themselves has no spec to lower again: only its artifacts are used.
A rewritten program (`artifacts/<model>.<rewrites>/`, lowering/program.py), of a built-in model or of
a spec file, is found the same way, with the rewrites its sidecar records: lowered again, it gets them again.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

from orchestrator import paths
from orchestrator.errors import SpecError
from orchestrator.lowering.artifacts import ArtifactPaths, valid_sidecar
from orchestrator.lowering.builtins import BUILTIN_SPECS
from orchestrator.lowering.sidecar import Sidecar
from orchestrator.lowering.spec import (
    DEFAULT_SOURCE,
    SOURCES,
    ModelSource,
    ModelSpec,
    SourceOptions,
    is_user_program,
    load_spec_file,
)
from orchestrator.lowering.variants import VARIANTS
from orchestrator.names import is_valid_name
from orchestrator.records import from_data

# Spec fields that do not decide the program: where it was read, its description, and what only the command line
# switches on.
_NOT_IDENTITY = ("source", "description", "trust_remote_code", "trust_code", "lines")
# What only the command line says, never a sidecar: the permission to run code (a model folder's, a factory's) holds
# for the command that gave it, not for every later command that finds the model by its name.
_COMMAND_LINE_ONLY = ("trust_remote_code", "trust_code")


@dataclass(frozen=True)
class LoweredModel:
    """A model known by its artifacts: its newest valid sidecar, and the spec it was lowered from (if any)."""

    name: str
    sidecar: Sidecar

    @property
    def user_file(self) -> bool:
        """A program the user lowered (.pte) or exported (.pt2) themselves: no spec to lower again."""
        return is_user_program(self.sidecar.origin.model_source)

    @property
    def rewrites(self) -> tuple[str, ...]:
        """The rewrites its program was lowered with (a rewritten program's): lowering it again must repeat them."""
        return self.sidecar.applied_rewrites

    @property
    def keep_float(self) -> tuple[str, ...]:
        """The layers its quantized variants keep in float (a mixed-precision program's)."""
        kept = self.sidecar.spec.get("keep_float")
        return tuple(str(name) for name in kept) if isinstance(kept, list) else ()

    @property
    def chosen(self) -> bool:
        """A program made of a model by lowering choices (rewrites, layers kept in float), not the model itself."""
        return bool(self.rewrites or self.keep_float)

    @property
    def spec_file(self) -> str | None:
        source = self.sidecar.origin.source
        return None if self.user_file or source is None or source == "built-in" else source


def find_lowered(name: str, root: Path | None = None) -> LoweredModel | None:
    """The newest valid lowering in artifacts/NAME/ of a spec file or a user's file; None if there is none."""
    if not is_valid_name(name) or name in BUILTIN_SPECS:
        return None
    artifact_paths = ArtifactPaths.for_model(name, root)
    if not artifact_paths.folder.is_dir():
        return None
    found = []
    for variant in VARIANTS.values():
        sidecar, _ = valid_sidecar(artifact_paths, variant)
        if sidecar is not None and sidecar.model == name:
            found.append(sidecar)
    found.sort(key=lambda sidecar: sidecar.created, reverse=True)
    model = next((LoweredModel(name, sidecar) for sidecar in found), None)
    if model is None or (model.spec_file is None and not model.user_file and not model.chosen):
        return None
    return model


def recorded_rewrites(name: str, root: Path | None = None) -> tuple[str, ...]:
    """The rewrites of the rewritten program `name` found by its artifacts; () for any other name."""
    found = find_lowered(name, root)
    return found.rewrites if found is not None and not found.user_file else ()


def lowered_names(root: Path | None = None) -> list[str]:
    """The names `find_lowered` knows, for the list of known models."""
    folder = root or paths.artifacts_dir()
    if not folder.is_dir():
        return []
    return sorted(entry.name for entry in folder.iterdir() if entry.is_dir() and find_lowered(entry.name, root))


def _identity(data: dict[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in data.items() if key not in _NOT_IDENTITY}


def recorded_options(source: ModelSource, record: Mapping[str, Any], where: str) -> SourceOptions:
    """The options of `source` from a spec as ModelSpec.to_dict recorded it (at the top level, or under
    "source_options"); RecordError (exit 65) names `where` and the field. The command line's own
    (`trust_remote_code`) are never read back: a record cannot grant them."""
    own = {**record, **(record.get("source_options") or {})}
    names = [f.name for f in fields(source.options) if f.name != "trust_remote_code"]
    return from_data({name: own[name] for name in names if name in own}, source.options, where=where, field="spec")


def spec_from_record(record: dict[str, Any], where: str) -> ModelSpec:
    """The spec as a sidecar recorded it (ModelSpec.to_dict), back as a ModelSpec; no permission to run code."""
    known = {f.name for f in fields(ModelSpec)} - {"lines", "options", *_COMMAND_LINE_ONLY}
    given: dict[str, Any] = {key: value for key, value in record.items() if key in known}
    named = record.get("model_source", DEFAULT_SOURCE)
    source = SOURCES.get(named) if isinstance(named, str) else None
    try:
        if source is not None:  # a source not registered in this process: its options are unknown here
            given["options"] = recorded_options(source, record, where)
        spec = ModelSpec(**given)
    except (TypeError, ValueError) as exc:
        raise SpecError(f"{where}: the recorded spec cannot be read back ({exc})") from None
    for key, value in record.items():  # fields that became tuples in the dataclass are lists in JSON
        current = getattr(spec, key, None)
        if isinstance(current, tuple) and isinstance(value, list):
            as_tuple: dict[str, Any] = {key: tuple(value)}  # a field named by the record: checked by ModelSpec
            with contextlib.suppress(TypeError, ValueError):
                spec = replace(spec, **as_tuple)
    return spec


@dataclass(frozen=True)
class LoweredSpec:
    spec: ModelSpec
    spec_file: str  # "built-in" for a built-in model's rewritten program
    stale: str | None  # why the spec file no longer gives these artifacts (gone, changed, invalid), else None


def spec_of_lowered(model: LoweredModel, *, trust_remote_code: bool = False, trust_code: bool = False) -> LoweredSpec:
    """The spec of a model lowered from a spec file: the file as it is, if it still says the same; else the spec
    as it was lowered (the artifacts are from it), with the reason. The permissions to run code are this command
    line's (`trust_remote_code`, `trust_code`), whatever the lowering that made the sidecar was allowed."""
    recorded = model.sidecar.spec
    where = f"{model.name}'s sidecar ({model.sidecar.variant})"

    def allowed(spec: ModelSpec) -> ModelSpec:
        return spec.allowed(trust_remote_code=trust_remote_code, trust_code=trust_code)

    spec_file = model.spec_file
    if spec_file is None:  # a built-in model's rewritten program: the spec it was lowered from, as recorded
        assert model.chosen and not model.user_file, "user programs have no spec"
        return LoweredSpec(allowed(spec_from_record(recorded, where)), "built-in", None)
    current = None
    with contextlib.suppress(SpecError):
        current = load_spec_file(Path(spec_file))
    if current is not None and model.chosen:  # the file names the model as exported, not its chosen program
        current = replace(current, name=model.name, keep_float=model.keep_float)
    if current is not None and _identity(current.to_dict()) == _identity(recorded):
        return LoweredSpec(allowed(current), spec_file, None)
    stale = "is gone" if not Path(spec_file).is_file() else ("changed since" if current else "is no longer valid")
    spec = spec_from_record(recorded, where)
    return LoweredSpec(allowed(spec), spec_file, stale)
