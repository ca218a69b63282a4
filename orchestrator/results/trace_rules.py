"""The rules a Chrome trace (analysis/trace.json) must keep for Perfetto to draw what it says, checked on every
trace etlab writes: a slice that breaks one would be moved, cut or dropped by Perfetto's importer without a word.

- `traceEvents` holds "M" metadata (process_name, thread_name, each with a non-empty `args.name`), "X" complete
  events and "B"/"E" begin/end pairs; every thread with slices is named;
- `ts` and `dur` are finite, non-negative microseconds, at most nanosecond resolution (three decimals);
- per thread, "B" and "E" pair up like brackets (an "E" closes the latest open "B", with its name if it has one,
  never before it), and no "B" stays open;
- per thread, "X" events nest strictly: one that starts inside another ends inside it too.

tests/results/test_trace_perfetto.py keeps these rules honest: a trace that keeps them loads into Perfetto's own
trace processor with every slice, its nesting depth and its args, and one that breaks them does not.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

EPSILON_US = 1e-6  # float noise: ts and dur are rounded to the nanosecond (0.001 us)
METADATA = ("process_name", "thread_name")


def timeline_problems(document: Any) -> list[str]:
    """Every rule `document` breaks, as readable lines (empty: Perfetto draws it as written)."""
    return list(_problems(document))


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value) and value >= 0


def _nanoseconds(value: float) -> bool:
    return abs(value * 1000 - round(value * 1000)) < 1e-3


def _problems(document: Any) -> Iterator[str]:
    events = document.get("traceEvents") if isinstance(document, dict) else None
    if not isinstance(events, list):
        yield "no traceEvents list"
        return
    named: set[tuple[Any, Any]] = set()
    slices: dict[tuple[Any, Any], list[tuple[int, dict[str, Any]]]] = {}
    for index, event in enumerate(events):
        where = f"traceEvents[{index}]"
        if not isinstance(event, dict) or event.get("ph") not in ("M", "X", "B", "E"):
            yield f"{where}: not a metadata, complete, begin or end event"
            continue
        if not isinstance(event.get("pid"), int) or not isinstance(event.get("tid"), int):
            yield f"{where}: pid and tid must be integers"
            continue
        thread = (event["pid"], event["tid"])
        if event["ph"] == "M":
            name = (event.get("args") or {}).get("name") if isinstance(event.get("args"), dict) else None
            if event.get("name") not in METADATA or not isinstance(name, str) or not name:
                yield f"{where}: metadata must be {' or '.join(METADATA)} with a non-empty args.name"
            elif event["name"] == "thread_name":
                named.add(thread)
            continue
        if not isinstance(event.get("name"), str) and event["ph"] != "E":
            yield f"{where}: a slice needs a name"
        times = [("ts", event.get("ts"))] + ([("dur", event.get("dur"))] if event["ph"] == "X" else [])
        bad = [key for key, value in times if not (_number(value) and _nanoseconds(float(value or 0)))]
        if bad:
            yield f"{where}: {' and '.join(bad)} must be non-negative microseconds with at most 3 decimals"
            continue
        slices.setdefault(thread, []).append((index, event))
    for thread, found in slices.items():
        if thread not in named:
            yield f"thread {thread[1]} of process {thread[0]} has slices but no thread_name"
        yield from _brackets(thread, [(i, e) for i, e in found if e["ph"] in ("B", "E")])
        yield from _nested(thread, [(i, e) for i, e in found if e["ph"] == "X"])


def _brackets(thread: tuple[Any, Any], events: list[tuple[int, dict[str, Any]]]) -> Iterator[str]:
    stack: list[tuple[int, dict[str, Any]]] = []
    for index, event in sorted(events, key=lambda item: (item[1]["ts"], item[0])):
        if event["ph"] == "B":
            stack.append((index, event))
            continue
        if not stack:
            yield f"traceEvents[{index}]: an end event with no begin open on thread {thread[1]}"
            continue
        opened, begin = stack.pop()
        if "name" in event and event["name"] != begin["name"]:
            open_name = f"{begin['name']!r} (traceEvents[{opened}])"
            yield f"traceEvents[{index}]: ends {event['name']!r} while {open_name} is open"
    for opened, begin in stack:
        yield f"traceEvents[{opened}]: {begin['name']!r} begins on thread {thread[1]} and never ends"


def _nested(thread: tuple[Any, Any], events: list[tuple[int, dict[str, Any]]]) -> Iterator[str]:
    """Each complete event inside the latest one still open on its thread, or after it: never across its end."""
    open_ends: list[tuple[float, int]] = []
    for index, event in sorted(events, key=lambda item: (item[1]["ts"], -item[1]["dur"], item[0])):
        start, end = float(event["ts"]), float(event["ts"]) + float(event["dur"])
        while open_ends and open_ends[-1][0] <= start + EPSILON_US:
            open_ends.pop()
        if open_ends and end > open_ends[-1][0] + EPSILON_US:
            outer = open_ends[-1][1]
            yield (
                f"traceEvents[{index}]: {event['name']!r} starts inside traceEvents[{outer}] on thread {thread[1]} "
                "but ends after it (slices must nest)"
            )
            continue
        open_ends.append((end, index))
