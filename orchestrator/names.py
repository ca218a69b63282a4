"""The name rule for whatever becomes a file or folder name: spec names, every name a board sends, and nights; and
which host names are this machine's loopback (a server etlab binds, a lab's plain-TCP scheduler)."""

from __future__ import annotations

import datetime as dt
import ipaddress
import re

NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
NIGHT_PATTERN = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}")


def is_valid_name(text: object) -> bool:
    """1-64 letters, digits, '.', '_' or '-', starting with a letter or digit (fullmatch: no trailing newline)."""
    return isinstance(text, str) and NAME_PATTERN.fullmatch(text) is not None


def is_night(text: object) -> bool:
    """A nightly's night: a real date spelled YYYY-MM-DD, the one spelling. `date.fromisoformat` also takes 20310101
    and 2031-W01-3, which would make one date several nights (history rows, report names, lock files) and sort
    wrongly as text."""
    if not isinstance(text, str) or NIGHT_PATTERN.fullmatch(text) is None:
        return False
    try:
        dt.date.fromisoformat(text)
    except ValueError:  # 2031-02-30
        return False
    return True


def is_loopback(host: str) -> bool:
    """`localhost`, or an address on the loopback interface (127.0.0.0/8, ::1)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
