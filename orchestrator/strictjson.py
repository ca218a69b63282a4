"""One strict JSON reader for every file etlab reads back, and one strict writer for what it writes and serves.

A board, a bundle or an edited file can send JSON that Python's `json` takes but etlab cannot use: nesting 100,000
deep (RecursionError), integers of 400 digits (OverflowError on the first float()), NaN and Infinity (not JSON at
all: a browser's `JSON.parse` refuses them), the same key twice (which value was checked?). The reader refuses each
of them before any caller sees the data, naming the file and the field (`generation.prompt_len`), as
`JsonDataError` (exit 65). Non-finite numbers pass only in the fields a caller names. The writer never emits NaN or
Infinity: they become null, so page data and files etlab writes are always strict JSON.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Collection, Iterator
from pathlib import Path
from typing import Any

from orchestrator.errors import EtlabError, ExitCode

MAX_BYTES = 64 << 20  # the largest file etlab writes (a big model's ops.json) is a few MB
MAX_DEPTH = 64  # etlab's own documents nest 6 deep
MAX_MAGNITUDE = 2**63 - 1  # what an int64 column, a byte count or a nanosecond clock can hold

_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"')
_ONLY_BRACKETS = {code: None for code in range(128) if chr(code) not in "[]{}"}  # outside strings, JSON is ASCII
_INNERMOST = re.compile(r"\[\]|\{\}")
_DIGITS_AS_ZERO = {ord(digit): "0" for digit in "123456789"}
_LARGE_EXPONENT = re.compile(r"[eE]\+?00")
_NONFINITE = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}


class JsonDataError(EtlabError, ValueError):
    """A JSON file etlab reads back is malformed or holds values out of range: bad data (exit 65)."""

    exit_code = ExitCode.DATA

    def __init__(self, where: str, problem: str, field: str | None = None) -> None:
        super().__init__(f"{where}: {field}: {problem}" if field else f"{where}: {problem}")
        self.where = where
        self.field = field
        self.problem = problem


class _Bad:
    """A number the decoder met that is out of range or not finite; reported with its field after decoding."""

    __slots__ = ("text", "value")

    def __init__(self, text: str, value: float | None) -> None:
        self.text = text
        self.value = value  # the float it stands for when a field allows non-finite numbers, else None


def loads(
    text: str | bytes,
    *,
    where: str,
    nonfinite: Collection[str] = (),
    max_depth: int = MAX_DEPTH,
    max_magnitude: float = MAX_MAGNITUDE,
) -> Any:
    """Decode `text` strictly. `where` names the source in errors; `nonfinite` lists the keys whose value may be
    NaN or ±Infinity (the last key of the field's path); `max_magnitude` bounds every number."""
    if isinstance(text, bytes | bytearray):
        try:
            text = bytes(text).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise JsonDataError(where, f"not UTF-8 text (byte {exc.start})") from None
    outside_strings = _STRING.sub("", text)
    _check_depth(outside_strings, where, max_depth)
    try:
        if not _may_hold_odd_numbers(outside_strings):
            return json.loads(text)  # the common case at the C decoder's pace
        bad: list[_Bad] = []
        document = json.loads(
            text,
            parse_int=lambda literal: _number(int, literal, bad, max_magnitude),
            parse_float=lambda literal: _number(float, literal, bad, max_magnitude),
            parse_constant=lambda literal: _number(float, literal, bad, max_magnitude),
        )
    except RecursionError:
        raise JsonDataError(where, f"nested deeper than {max_depth} levels") from None
    except ValueError as exc:  # JSONDecodeError names the line and column
        raise JsonDataError(where, f"not valid JSON ({exc})") from None
    return _settle(document, where, frozenset(nonfinite), max_magnitude) if bad else document


def _may_hold_odd_numbers(outside_strings: str) -> bool:
    """NaN, Infinity, 19 digits or more, a positive exponent of two digits: only then are numbers decoded one by one."""
    if "N" in outside_strings or "I" in outside_strings:
        return True
    # 19 digits may pass 2**63, 20 may pass 2**64. str.translate and `in` run at C speed, a regex \d{19} does not.
    zeroed = outside_strings.translate(_DIGITS_AS_ZERO)
    return "0" * 19 in zeroed or _LARGE_EXPONENT.search(zeroed) is not None


def _number(kind: type[int] | type[float], literal: str, bad: list[_Bad], max_magnitude: float) -> Any:
    if literal in _NONFINITE:
        marker = _Bad(literal, _NONFINITE[literal])
    else:
        value = kind(literal) if len(literal) <= 40 else math.inf
        if math.isfinite(value) and abs(value) <= max_magnitude:
            return value
        marker = _Bad(literal, None)
    bad.append(marker)
    return marker


def read(
    path: Path, *, nonfinite: Collection[str] = (), max_bytes: int = MAX_BYTES, max_magnitude: float = MAX_MAGNITUDE
) -> Any:
    """Read and decode one file strictly: at most `max_bytes`, named in every error by its path."""
    with open(path, "rb") as handle:
        data = handle.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise JsonDataError(str(path), f"larger than {max_bytes:,} bytes; etlab does not read it")
    return loads(data, where=str(path), nonfinite=nonfinite, max_magnitude=max_magnitude)


def dumps(obj: Any, **kwargs: Any) -> str:
    """Strict JSON text: NaN and ±Infinity become null, so every reader (a browser's JSON.parse too) takes it."""
    try:  # the common case, no non-finite float anywhere: no copy of the document first
        return json.dumps(obj, allow_nan=False, **kwargs)
    except ValueError:
        return json.dumps(finite(obj), allow_nan=False, **kwargs)


def finite(obj: Any) -> Any:
    """`obj` with every non-finite float replaced by None (containers copied only where one is found)."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {key: finite(value) for key, value in obj.items()}
    if isinstance(obj, list | tuple):
        return [finite(value) for value in obj]
    return obj


def _check_depth(outside_strings: str, where: str, max_depth: int) -> None:
    if outside_strings.count("[") + outside_strings.count("{") <= max_depth:
        return
    brackets = outside_strings.translate(_ONLY_BRACKETS)
    for _ in range(max_depth):  # each pass takes the innermost level away
        brackets = _INNERMOST.sub("", brackets)
        if not brackets:
            return
    raise JsonDataError(where, f"nested more than {max_depth} levels deep; etlab reads at most {max_depth}")


def _settle(document: Any, where: str, nonfinite: frozenset[str], max_magnitude: float) -> Any:
    """Replace allowed non-finite markers by their float; raise for the first bad value, naming its field."""
    if isinstance(document, _Bad):
        raise JsonDataError(where, f"{document.text} is out of range")
    for path, key, container, value in _walk(document):
        if not isinstance(value, _Bad):
            continue
        last = key if isinstance(key, str) else next((p for p in reversed(path) if isinstance(p, str)), "")
        if value.value is not None and last in nonfinite:
            container[key] = value.value
            continue
        shown = value.text if len(value.text) <= 24 else f"a number of {len(value.text)} characters"
        allowed = "a finite number" if value.value is not None else f"a number within ±{max_magnitude:.3g}"
        raise JsonDataError(where, f"{shown} is out of range (expected {allowed})", _field([*path, key]) or None)
    return document


def _walk(document: Any) -> Iterator[tuple[list[str | int], str | int, Any, Any]]:
    """Every (parent path, key, container, value) below `document`, without recursion; containers before children."""
    stack: list[tuple[list[str | int], Any]] = [([], document)]
    while stack:
        path, container = stack.pop()
        items = container.items() if isinstance(container, dict) else enumerate(container)
        for key, value in list(items):
            yield path, key, container, value
            if isinstance(value, dict | list):
                stack.append(([*path, key], value))


def _field(path: list[str | int]) -> str:
    text = ""
    for part in path:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else part)
    return text
