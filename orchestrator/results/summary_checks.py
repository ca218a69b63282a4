"""The value checks summary.json's readers share, and SummaryError, what they raise.

Strict checks read summary.json back: None when absent or null, SummaryError (exit 65) naming the field when anything
else is wrong (a time is a finite number >= 0, a count or a byte count an integer >= 0, never a bool). Lenient ones
read board data (results/generation.py, run.json's hashing times): a value of another kind is None.
"""

from __future__ import annotations

import math
from typing import Any

from orchestrator.errors import AnalysisError


class SummaryError(AnalysisError):
    """A summary.json field that is not what an analysis writes: the file, the field and what is wrong (exit 65)."""

    def __init__(self, field: str, problem: str, where: str = "summary.json") -> None:
        super().__init__(f"{where}: {field}: {problem}")
        self.field = field
        self.problem = problem


# Lenient value checks, for board data (generation.py, hashing_times): a value of another kind is None.
def as_float(value: Any) -> float | None:
    if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    return None


def as_int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def hashing_times(data: Any) -> dict[str, float | None] | None:
    """run.json's `hashing_ms` (model, inputs): times only (a finite number >= 0), anything else unknown."""
    if not isinstance(data, dict):
        return None
    times = {key: as_float(data.get(key)) for key in ("model", "inputs")}
    return {key: value if value is not None and value >= 0 else None for key, value in times.items()}


# Strict checks, for reading summary.json back: None when absent or null, SummaryError when anything else is wrong.
def shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else f"{text[:37]}..."


def number(value: Any, field: str, minimum: float | None = 0.0) -> float | None:
    """A finite number (a time, a rate, a ratio: >= `minimum`, None for any sign)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise SummaryError(field, f"{shown(value)} is not a finite number")
    if minimum is not None and value < minimum:
        raise SummaryError(field, f"{value!r} is below {minimum:g}")
    return float(value)


def share(value: Any, field: str) -> float | None:
    """A share between 0 and 1 (an agreement, an overlap)."""
    checked = number(value, field)
    if checked is not None and checked > 1:
        raise SummaryError(field, f"{value!r} is above 1")
    return checked


def count(value: Any, field: str) -> int | None:
    """A count or a byte count: an integer >= 0."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise SummaryError(field, f"{shown(value)} is not a count (an integer >= 0)")
    return value


def text(value: Any, field: str) -> str | None:
    if value is None or isinstance(value, str):
        return value
    raise SummaryError(field, f"{shown(value)} is not text")


def flag(value: Any, field: str) -> bool | None:
    if value is None or isinstance(value, bool):
        return value
    raise SummaryError(field, f"{shown(value)} is not true or false")


def mapping(data: Any, field: str) -> dict[str, Any]:
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise SummaryError(field, f"must be a mapping, got {type(data).__name__}")
    return data


def listing(data: Any, field: str) -> list[Any]:
    if data is None:
        return []
    if not isinstance(data, list):
        raise SummaryError(field, f"must be a list, got {type(data).__name__}")
    return data


def texts(data: Any, field: str) -> tuple[str, ...]:
    """A list of text (reasons, counter names): every item text."""
    items = listing(data, field)
    for index, item in enumerate(items):
        if not isinstance(item, str):
            raise SummaryError(f"{field}[{index}]", f"{shown(item)} is not text")
    return tuple(items)


def text_map(data: Any, field: str) -> dict[str, str]:
    checked = mapping(data, field)
    for key, value in checked.items():
        if not isinstance(value, str):
            raise SummaryError(f"{field}.{key}", f"{shown(value)} is not text")
    return dict(checked)


def numbers(data: Any, field: str, minimum: float | None = None) -> dict[str, float]:
    """A mapping of names to finite numbers (thresholds, totals); null values are left out."""
    values = {str(key): number(value, f"{field}.{key}", minimum) for key, value in mapping(data, field).items()}
    return {key: value for key, value in values.items() if value is not None}
