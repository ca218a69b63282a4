"""The name rule for whatever becomes a file or folder name: spec names, and every name a board sends."""

from __future__ import annotations

import re

NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")


def is_valid_name(text: object) -> bool:
    """1-64 letters, digits, '.', '_' or '-', starting with a letter or digit (fullmatch: no trailing newline)."""
    return isinstance(text, str) and NAME_PATTERN.fullmatch(text) is not None
