"""How a model source's builder refuses a spec: every problem at once, each naming the spec file's line and field.

Shared by the builders (sources/builders/: huggingface.py, torchvision.py, ...); no torch here.
"""

from __future__ import annotations

from typing import Any

from orchestrator.config import did_you_mean
from orchestrator.errors import SpecError
from orchestrator.lowering.spec import SPEC_HINT, ModelSpec

FLOAT_BYTES = 4  # float32 weights


def brief(exc: BaseException) -> str:
    """An exception in one line: its class and the first line of its message, at most 300 characters."""
    text = str(exc).strip().splitlines()
    return f"{exc.__class__.__name__}: {text[0][:300] if text else ''}"


def spec_failure(problems: list[tuple[str, str]], spec: ModelSpec) -> SpecError:
    """One SpecError with every (field, message), in file order."""
    order = {name: spec.lines.get(name, 0) for name, _ in problems}
    lines = [spec.problem(name, message) for name, message in sorted(problems, key=lambda p: order[p[0]])]
    return SpecError("\n".join(lines), hint=SPEC_HINT)


def too_large(parameters: int, available: int, bound: str) -> str:
    """Why a model of `parameters` float32 weights does not fit in `available` bytes; `bound` is "" or "at least "."""
    weights = FLOAT_BYTES * parameters / 2**30
    return (
        f"the model has {bound}{parameters / 1e6:.1f}M parameters ({weights:.2f} GiB of float32 weights), more than "
        f"the {available / 2**30:.2f} GiB of available memory"
    )


def kwarg_problem(key: str, value: Any, allowed: dict[str, Any], model: str) -> str | None:
    """What is wrong with constructor keyword `key` of `model` ("torchvision's resnet18"), given the scalar
    parameters it takes and their defaults (a value must have its default's type); None if nothing."""
    if key not in allowed:
        close = did_you_mean(key, allowed)
        listing = close or f"; its parameters: {', '.join(sorted(allowed)) or 'none'}"
        return f"is not a scalar parameter of {model}{listing}"
    default = allowed[key]
    if isinstance(default, bool):
        ok = isinstance(value, bool)
    elif isinstance(default, int):
        ok = isinstance(value, int) and not isinstance(value, bool)
    elif isinstance(default, float):
        ok = isinstance(value, int | float) and not isinstance(value, bool)
    else:
        ok = isinstance(value, str)
    return None if ok else f"expected {type(default).__name__} like the default {default!r}, got {value!r}"
