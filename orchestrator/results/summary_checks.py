"""Lenient value checks for board data (results/generation.py, run.json's hashing times): a value of another kind
is None. Reading summary.json back is strict instead: its field types say the checks (summary.py, records.py).
"""

from __future__ import annotations

import math
from typing import Any

from orchestrator.results.summary import HashingTimes


def as_float(value: Any) -> float | None:
    if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    return None


def as_int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def hashing_times(data: Any) -> HashingTimes | None:
    """run.json's `hashing_ms` (model, inputs): times only (a finite number >= 0), anything else unknown."""
    if not isinstance(data, dict):
        return None
    model, inputs = (as_float(data.get(key)) for key in ("model", "inputs"))
    return HashingTimes(
        model=model if model is not None and model >= 0 else None,
        inputs=inputs if inputs is not None and inputs >= 0 else None,
    )
