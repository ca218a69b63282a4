"""One way to write and read back every record etlab keeps: typed dataclasses to JSON-ready data, and back.

A record is a dataclass whose field types say everything a reader checks: `Count` (an integer >= 0, never a bool),
`Duration` (a finite number >= 0), `Share` (0..1), `Literal[...]` for a closed set of words, `X | None` where absent
or null means unknown. `to_data` writes one; `from_data` reads one back through msgspec, so a document of the wrong
shape never reaches a reader as silent `None`s: RecordError (exit 65) names the file and the field
(`summary.json: latency.warm.median_ms: expected a number >= 0, got -1`). Fields a reader does not know are ignored,
so a newer etlab's extra fields do not break an older reader.

A document (a file of its own, such as summary.json) is versioned like torchao's configs: `SCHEMA` is the version
this etlab writes under `"schema"`, `UPGRADES[n]` turns a version-n document into version n+1, and a document from a
newer etlab is refused by name instead of half-read. The data must come from `strictjson` (no NaN, no huge numbers,
no duplicate keys); this module checks shapes and ranges, not JSON syntax.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Mapping
from typing import Annotated, Any, ClassVar, TypeVar

import msgspec

from orchestrator.errors import EtlabError, ExitCode

Count = Annotated[int, msgspec.Meta(ge=0, description="an integer >= 0")]
Dimension = Annotated[int, msgspec.Meta(ge=0, description="a dimension (an integer >= 0)")]
Duration = Annotated[float, msgspec.Meta(ge=0, description="a number >= 0")]
Share = Annotated[float, msgspec.Meta(ge=0, le=1, description="a share between 0 and 1")]
Sha256 = Annotated[str, msgspec.Meta(pattern="^[0-9a-f]{64}$", description="a sha256 in hex")]

RecordT = TypeVar("RecordT")

_AT = re.compile(r"^(?P<problem>.*?)(?: - at `\$(?P<path>[^`]*)`)?$", re.DOTALL)


class RecordError(EtlabError, ValueError):
    """A record read back is not what etlab writes: the file, the field and what is wrong (exit 65)."""

    exit_code = ExitCode.DATA

    def __init__(self, where: str, field: str, problem: str) -> None:
        super().__init__(f"{where}: {field}: {problem}" if field else f"{where}: {problem}")
        self.where = where
        self.field = field
        self.problem = problem


def to_data(record: Any) -> Any:
    """A record (or a list or mapping of them) as JSON-ready builtins: dicts, lists, str, int, float, bool, None."""
    return _lists(msgspec.to_builtins(record, enc_hook=_scalar))


def _scalar(value: Any) -> Any:
    """A numpy scalar (a float64 from a statistic) as the Python number it holds; anything else stays an error."""
    item = getattr(value, "item", None)
    if callable(item) and type(value).__module__ == "numpy":
        return item()
    raise TypeError(f"{type(value).__name__} is not a record field type")


def complete(record: RecordT) -> RecordT:
    """`record` (read back by from_data) with every field set on its instance, nested records too: msgspec leaves a
    field the data lacked to its class default, which `to_data` then leaves out, so a record read from a file
    without a field would write less than the same record built in code (a page reading `correctness.reason`)."""
    if dataclasses.is_dataclass(record) and not isinstance(record, type):
        for item in dataclasses.fields(record):
            object.__setattr__(record, item.name, complete(getattr(record, item.name)))
    elif isinstance(record, list | tuple):
        for value in record:
            complete(value)
    elif isinstance(record, dict):
        for value in record.values():
            complete(value)
    return record


def _lists(data: Any) -> Any:
    """msgspec keeps a tuple field a tuple: as a list, the data equals the same document read back from JSON."""
    if isinstance(data, dict):
        return {key: _lists(value) for key, value in data.items()}
    if isinstance(data, list | tuple):
        return [_lists(item) for item in data]
    return data


def from_data(data: Any, kind: type[RecordT], *, where: str, field: str = "") -> RecordT:
    """`data` (decoded JSON) checked against `kind` and built into it; RecordError names `where` and the field,
    `field` being the path of `data` inside its file ("" for the whole file)."""
    try:
        return msgspec.convert(data, kind, strict=True)
    except msgspec.ValidationError as exc:
        path, problem = _located(str(exc))
        raise RecordError(where, _join(field, path), problem) from None
    except UnicodeEncodeError:  # msgspec meets a lone surrogate, which JSON can spell ("\ud800") and UTF-8 cannot
        raise RecordError(where, field, "holds a lone surrogate, which is not text") from None


def _located(message: str) -> tuple[str, str]:
    """msgspec's "Expected `int` >= 0 - at `$.a.b[2]`" as ("a.b[2]", "expected `int` >= 0")."""
    match = _AT.match(message)
    problem, path = (match["problem"], match["path"] or "") if match else (message, "")
    missing = re.fullmatch(r"Object missing required field `([^`]*)`", problem)
    if missing:  # name the missing field itself, as every other problem does
        return _join(path.lstrip("."), missing[1]), "is missing"
    return path.lstrip("."), problem[:1].lower() + problem[1:]


def _join(base: str, path: str) -> str:
    if not base or not path:
        return base or path
    return f"{base}{path}" if path.startswith("[") else f"{base}.{path}"


class Document:
    """A record written as a file of its own, versioned: mix into the dataclass and set SCHEMA (and UPGRADES)."""

    SCHEMA: ClassVar[int] = 1
    UPGRADES: ClassVar[Mapping[int, Callable[[dict[str, Any]], dict[str, Any]]]] = {}


DocumentT = TypeVar("DocumentT", bound=Document)


def write_document(document: Document) -> dict[str, Any]:
    """The document as data, its version first under "schema"."""
    data = to_data(document)
    return {"schema": type(document).SCHEMA, **{key: value for key, value in data.items() if key != "schema"}}


def read_document(data: Any, kind: type[DocumentT], *, where: str) -> DocumentT:
    """A document read back: its version checked (absent: version 1), upgraded to `kind.SCHEMA`, then built."""
    if not isinstance(data, dict):
        raise RecordError(where, "", f"expected an object, got {type(data).__name__}")
    version = data.get("schema", 1)
    if isinstance(version, bool) or not isinstance(version, int) or version < 1:
        raise RecordError(where, "schema", f"expected a version number (an integer >= 1), got {version!r}")
    if version > kind.SCHEMA:
        raise RecordError(
            where, "schema", f"version {version} was written by a newer etlab; this one reads up to {kind.SCHEMA}"
        )
    upgraded = dict(data)
    for step in range(version, kind.SCHEMA):
        upgrade = kind.UPGRADES.get(step)
        if upgrade is not None:
            upgraded = upgrade(upgraded)
    upgraded.pop("schema", None)
    return from_data(upgraded, kind, where=where)
