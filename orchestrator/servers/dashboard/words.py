"""What the dashboard says in words rather than as a record's raw keys: the board's conditions around a run."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def conditions_in_words(conditions: Mapping[str, Any]) -> list[str]:
    """The board's conditions around the run (results/validity.py's `board_conditions`), one sentence each."""
    said = []
    machine = [str(conditions[key]) for key in ("board_model", "arch") if conditions.get(key)]
    if conditions.get("cores_online"):
        machine.append(f"{conditions['cores_online']} cores online")
    if conditions.get("hostname"):
        machine.append(f"host {conditions['hostname']}")
    if machine:
        said.append("Board: " + " · ".join(machine) + ".")
    before, after = conditions.get("governor_before"), conditions.get("governor_after")
    if before and after and before != after:
        said.append(f"CPU governor: {before} before the run, {after} after it (it changed while measuring).")
    elif before or after:
        said.append(f"CPU governor: {before or after}" + (" before and after the run." if before == after else "."))
    hot = {when: _number(conditions.get(f"temperature_c_{when}")) for when in ("before", "after")}
    known = {when: t for when, t in hot.items() if t is not None}
    if known:
        shown = ", ".join(f"{t:.1f} °C {when}" for when, t in known.items())
        rise = f" ({known['after'] - known['before']:+.1f} °C)" if len(known) == 2 else ""
        said.append(f"Temperature: {shown}{rise}.")
    if "throttling_during_run" in conditions:
        throttled = [str(flag) for flag in conditions.get("throttling_during_run") or []]
        said.append("Throttling during the run: " + (", ".join(throttled) if throttled else "none") + ".")
    return said
