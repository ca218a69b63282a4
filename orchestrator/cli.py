"""Glue between Fabric tasks and the library: turn errors into messages and meaningful exit codes."""

from __future__ import annotations

import functools
import os
import sys
import traceback
from collections.abc import Callable
from typing import Any, TypeVar

from invoke.exceptions import Exit

from . import console
from .errors import EtlabError, ExitCode

F = TypeVar("F", bound=Callable[..., Any])


def split_list(value: str | None) -> list[str] | None:
    """`--board a,b` → ["a", "b"]; None stays None."""
    if value is None:
        return None
    return [item.strip() for item in value.split(",") if item.strip()]


def handle_errors(func: F) -> F:
    """Run a task body: EtlabError → one clear message and its exit code; an int result is the exit code."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            code = func(*args, **kwargs)
        except EtlabError as exc:
            console.error(str(exc))
            raise Exit(code=exc.exit_code) from None
        except KeyboardInterrupt:
            console.error("interrupted")
            raise Exit(code=ExitCode.INTERRUPTED) from None
        except Exit:
            raise
        except Exception:
            if os.environ.get("ETLAB_DEBUG"):
                raise
            console.error("internal error (set ETLAB_DEBUG=1 for the full traceback):")
            traceback.print_exc(limit=-3, file=sys.stderr)
            raise Exit(code=ExitCode.SOFTWARE) from None
        if isinstance(code, int) and code != 0:
            raise Exit(code=code)
        return None

    return wrapper  # type: ignore[return-value]
