"""The `factory` model source, spec side (no torch): a user's function (`path/to/file.py:function` or
`package.module:function`) that returns a module and its example inputs, with keyword arguments.

Nothing of it runs without the command line's `--trust-code`; its file is part of the identity (an edited factory is
another program). The build side is `builders/factory.py`'s `FACTORY`; it brings its own weights.
"""

from __future__ import annotations

import hashlib
import importlib.util
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from yaml.nodes import Node

from orchestrator.config import Check, Invalid, string
from orchestrator.lowering.spec import FACTORY_TASK, ModelSource, ModelSpec, SourceOptions, register_source
from orchestrator.lowering.spec_fields import mapping

# `pkg.mod:build` or `path/to/file.py:build`: where a factory is, and the function in it.
_FACTORY = re.compile(r"^(?P<where>[^:]+\.py|[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*):(?P<object>[A-Za-z_]\w*)$")


@dataclass(frozen=True)
class FactoryOptions(SourceOptions):
    """A factory spec's own fields: where its function is ("module:function", or "/absolute/file.py:function": a
    relative file is resolved against the spec file's folder when it is read) and its keyword arguments."""

    factory: str
    kwargs: dict[str, Any] = field(default_factory=dict)


def _factory_reference(node: Node, _field: str) -> str:
    value = string(node)
    if not _FACTORY.match(value):
        raise Invalid(f"{value!r} is not 'path/to/file.py:function' or 'package.module:function'")
    return value


_FACTORY_FIELDS: dict[str, Check] = {
    "factory": _factory_reference,
    "kwargs": mapping,  # passed to the factory function as keyword arguments
}


def _resolved_factory(reference: str, folder: Path) -> str:
    """`file.py:function` with the file made absolute (against `folder`); a module path as it is."""
    where, _, name = reference.rpartition(":")
    if not where.endswith(".py"):
        return reference
    return f"{(folder / where).resolve()}:{name}"


def factory_file(reference: str) -> Path | None:
    """The file a factory reference names, found without running anything (no package is imported), or None."""
    where = reference.rpartition(":")[0]
    if where.endswith(".py"):
        return Path(where)
    top, *rest = where.split(".")
    try:
        found = importlib.util.find_spec(top)  # a top-level name: found, never imported
    except (ImportError, ValueError):
        return None
    if found is None:
        return None
    path = Path(found.origin) if found.origin and found.origin not in ("built-in", "frozen") else None
    folders = [Path(folder) for folder in found.submodule_search_locations or ()]
    for part in rest:
        candidates = [c for f in folders for c in (f / f"{part}.py", f / part / "__init__.py") if c.is_file()]
        if not candidates:
            return None
        path, folders = candidates[0], [candidates[0].parent] if candidates[0].name == "__init__.py" else []
    return path


def factory_digest(reference: str) -> str:
    """sha256 of the factory's file (the one file it names; what it imports is not followed), "missing" if none."""
    path = factory_file(reference)
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest() if path is not None else "missing"
    except OSError:
        return "missing"


def _complete(given: dict[str, Any], data: dict[str, Any], folder: Path) -> dict[str, Any]:
    """A relative file is relative to the spec file's folder."""
    given["factory"] = _resolved_factory(given["factory"], folder)
    return given


def _identity(spec: ModelSpec) -> dict[str, Any]:
    """An edited factory is another program."""
    return {"factory_sha256": factory_digest(spec.options_of(FactoryOptions).factory)}


FACTORY = register_source(
    ModelSource(
        "factory",
        "orchestrator.lowering.sources.builders.factory:FACTORY",
        _FACTORY_FIELDS,
        ("factory",),
        fixed={"task": FACTORY_TASK, "model_type": "factory"},
        complete=_complete,
        identity=_identity,
        options=FactoryOptions,
    )
)
