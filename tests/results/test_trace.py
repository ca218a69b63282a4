"""analysis/trace.json, one execution's timeline in the Chrome trace-event format (orchestrator/results/trace.py), on
real runs of the native runner on the local board: distilbert-tiny's XNNPACK program (delegate calls with their
XNNPACK nodes nested inside) and smollm2-gen-tiny generating (a prefill and a decode step). The trace is checked by
an independent reader here (the keys chrome://tracing needs, every slice inside its parent on its thread, names,
args and durations equal to ops.json's rows); Perfetto's own trace processor reads it in test_trace_perfetto.py. An
ETDump without timestamps, or whose calls run across each other, writes no trace and says so once; one whose event
ends before it starts is an AnalysisError (exit 65), no traceback."""

from __future__ import annotations

import itertools
import json
import os
import statistics
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from orchestrator.boards.inventory import Board
from orchestrator.errors import AnalysisError
from orchestrator.paths import PROJECT_ROOT
from orchestrator.results.analysis import analyze_bundle
from tests.e2e.test_generation_e2e import fab
from tests.plugins.analysis import BundleCase, analyze, copy_bundle, rewrite_etdump
from tests.plugins.artifacts import ARTIFACT_CACHE

pytestmark = pytest.mark.slow  # runs real programs on the local board


def slices(trace: dict[str, Any]) -> list[dict[str, Any]]:
    """The complete events, checked as chrome://tracing and Perfetto read them."""
    assert set(trace) >= {"traceEvents"} and isinstance(trace["traceEvents"], list)
    metadata = [e for e in trace["traceEvents"] if e["ph"] == "M"]
    assert {e["name"] for e in metadata} == {"process_name", "thread_name"}
    assert all(isinstance(e["args"]["name"], str) and e["args"]["name"] for e in metadata)
    complete = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    assert len(complete) + len(metadata) == len(trace["traceEvents"])
    for event in complete:
        assert {"name", "ph", "ts", "dur", "pid", "tid", "args"} <= set(event), event
        assert isinstance(event["ts"], int | float) and isinstance(event["dur"], int | float), event
        assert event["ts"] >= 0 and event["dur"] >= 0, event
        assert isinstance(event["pid"], int) and isinstance(event["tid"], int)
    return complete


def nesting(complete: list[dict[str, Any]]) -> dict[int, int | None]:
    """Each slice's parent (index): the shortest slice on its thread that holds its interval and comes before it in
    the file (a zero-length slice at a sibling's start is that sibling's neighbour, as the file orders them). Fails
    on two slices that overlap without one holding the other."""
    slack = 0.002  # ts and dur are rounded to the nanosecond

    def holds(outer: dict[str, Any], inner: dict[str, Any]) -> bool:
        return outer["ts"] - slack <= inner["ts"] and inner["ts"] + inner["dur"] <= outer["ts"] + outer["dur"] + slack

    parents: dict[int, int | None] = {}
    for i, event in enumerate(complete):
        for other in complete[:i]:
            if other["tid"] != event["tid"]:
                continue
            disjoint = (
                other["ts"] + other["dur"] <= event["ts"] + slack or event["ts"] + event["dur"] <= other["ts"] + slack
            )
            assert disjoint or holds(other, event) or holds(event, other), (other, event)
        enclosing = [j for j, other in enumerate(complete[:i])
                     if other["tid"] == event["tid"] and other["dur"] > 0 and holds(other, event)
                     and not (other["ts"] + other["dur"] <= event["ts"] + slack)]  # fmt: skip
        parents[i] = min(enclosing, key=lambda j: complete[j]["dur"]) if enclosing else None
    return parents


def check_against_ops(trace_slices: list[dict[str, Any]], ops: dict[str, Any], top: str) -> list[dict[str, Any]]:
    """The calls of the step named `top` (its name before what it says of its choice): one slice per instruction
    that ran, named, described and timed as ops.json's row for that execution (the sample the step names)."""
    parents = nesting(trace_slices)
    (step,) = [i for i, e in enumerate(trace_slices) if e["cat"] == "step" and e["args"]["execution"] == top]
    assert parents[step] is None
    sample = trace_slices[step]["args"]["sample"]
    calls = [trace_slices[i] for i, p in parents.items() if p == step]
    rows = {row["node_id"]: row for row in ops["instructions"]}
    ran = {node for node, row in rows.items() if row["samples"]}
    assert Counter(call["args"]["node_id"] for call in calls) == Counter(ran)
    per_op = Counter(call["name"] for call in calls)
    assert per_op == Counter(rows[node]["op"] for node in ran)
    for call in calls:
        row = rows[call["args"]["node_id"]]
        assert call["args"]["operator"] == row["op"] and call["args"]["instruction"] == row["instruction"]
        assert (call["args"]["module"], call["args"]["module_type"], call["args"]["source"]) == (
            row["module"], row["module_type"], row["source"])  # fmt: skip
        assert call["dur"] / 1000 == pytest.approx(row["samples_ms"][sample], abs=2e-6), call
    starts = [call["ts"] for call in sorted(calls, key=lambda c: c["args"]["instruction"])]
    assert starts == sorted(starts)  # execution order is instruction order in one chain
    total = sum(call["dur"] for call in calls) / 1000
    assert total == pytest.approx(sum(rows[node]["samples_ms"][sample] for node in ran), abs=1e-3)
    return calls


@pytest.fixture
def xnnpack_run(runner_bundles: dict[str, BundleCase], tmp_path: Path) -> BundleCase:
    return copy_bundle(runner_bundles["runner_distilbert_xnnpack"], tmp_path / "run")


def test_a_real_xnnpack_run_has_a_timeline_with_its_nodes_inside_each_delegate_call(xnnpack_run: BundleCase) -> None:
    summary = analyze(xnnpack_run)
    path = xnnpack_run.path / "analysis" / "trace.json"
    assert path in summary.written
    trace = json.loads(path.read_text())
    ops = json.loads((xnnpack_run.path / "analysis" / "ops.json").read_text())
    complete = slices(trace)
    # The iteration nearest the median (timings.json's), not the first, named so on the timeline and in its metadata.
    times = json.loads((xnnpack_run.path / "timings.json").read_text())["iterations_ms"]
    median = statistics.median(times)
    nearest = min(range(len(times)), key=lambda i: (abs(times[i] - median), i))
    name = f"iteration {nearest + 1} of {len(times)}"
    (title,) = trace["otherData"]["steps"]
    assert title.startswith(f"{name} (nearest the median, ") and title.endswith(" ms)"), (title, times)
    assert summary.timeline == [title] and any(e["name"] == title and e["cat"] == "step" for e in complete)
    calls = check_against_ops(complete, ops, name)
    parents = nesting(complete)
    delegated = [call for call in calls if call["args"]["kind"] == "DelegateCall"]
    assert delegated and any(call["args"]["kind"] == "KernelCall" for call in calls)
    delegates = {d["node_id"]: d for d in ops["delegates"]}
    for call in delegated:
        index = complete.index(call)
        children = [complete[i] for i, p in parents.items() if p == index]
        delegate = delegates[call["args"]["node_id"]]
        assert [c["args"]["event"] for c in children] == [e["name"] for e in delegate["events"]]
        assert all(c["cat"] == "DelegateNode" and c["args"]["delegate"] == call["name"] for c in children)
        nodes = {n["node"]: n for n in delegate["nodes"]}
        for child in children:
            node = nodes.get(child["args"]["xnn_node"])
            if node is not None:  # placed on an XNNPACK node: its type and its module
                assert child["args"]["event"] in node["events"] and child["args"]["operator"] == node["type"]
                assert child["args"]["module"] == node["module"]
    named = [c for c in complete if c["cat"] == "DelegateNode" and c["args"]["module"]]
    assert any(c["args"]["module"] == "vocab_projector" for c in named)
    assert any(c["args"]["module"] == "distilbert.embeddings.LayerNorm" for c in calls)
    assert summary.notes == []
    # Asked for: the first measured iteration, its own times.
    model = xnnpack_run.model
    analyze_bundle(xnnpack_run.path, pte=model.pte, sidecar=model.sidecar, execution="first")
    first = slices(json.loads(path.read_text()))
    assert check_against_ops(first, ops, f"iteration 1 of {len(times)}")


def test_a_generation_run_has_its_prefill_and_a_decode_step(local_board: Board, tmp_path: Path) -> None:
    proc = fab(tmp_path, local_board, ARTIFACT_CACHE, "deploy-and-profile", "--model", "smollm2-gen-tiny", "--backend",
               "xnnpack", "--weights", "random", "--iterations", "2", "--warmup", "1", "--no-explore")  # fmt: skip
    said = proc.stdout + proc.stderr
    assert proc.returncode == 0, said
    (run,) = [m.parent for m in (tmp_path / "results").glob("local/smollm2-gen-tiny/xnnpack/*/result_manifest.json")]
    env = {**os.environ, "ETLAB_ARTIFACTS": str(ARTIFACT_CACHE), "ETLAB_RESULTS": str(tmp_path / "results"),
           "COLUMNS": "400", "ETLAB_WIDTH": "400"}  # fmt: skip
    analysed = subprocess.run([sys.executable, "-m", "fabric", "analyze", "--bundle", str(run)], cwd=PROJECT_ROOT,
                              env=env, capture_output=True, text=True, timeout=300)  # fmt: skip
    said = analysed.stdout + analysed.stderr
    assert analysed.returncode == 0, said
    assert "analysis/trace.json" in said and "timeline of " in said and "ui.perfetto.dev" in said
    trace = json.loads((run / "analysis" / "trace.json").read_text())
    complete = slices(trace)
    # The prefill nearest the median prefill and the decode step nearest the median step (timings.json's).
    timed = [r for r in json.loads((run / "timings.json").read_text())["generation"]["runs"] if not r["warmup"]]
    steps = [ms for r in timed for ms in r["decode_ms"]]

    def nearest(times: list[float]) -> int:
        return min(range(len(times)), key=lambda i: (abs(times[i] - statistics.median(times)), i))

    generation = nearest([r["prefill_ms"] for r in timed])
    prefill_name = "prefill" + (f" of generation {generation + 1} of {len(timed)}" if len(timed) > 1 else "")
    step_name = f"decode step {nearest(steps) + 1} of {len(steps)}"
    tops = [complete[i] for i, parent in nesting(complete).items() if parent is None]
    assert sorted(e["args"]["execution"] for e in tops) == sorted([prefill_name, step_name])
    assert trace["otherData"]["steps"] == [e["name"] for e in tops if e["args"]["execution"] == prefill_name] + [
        e["name"] for e in tops if e["args"]["execution"] == step_name
    ]  # each titled with why it was chosen
    prefill = json.loads((run / "analysis" / "ops_prefill.json").read_text())
    decode = json.loads((run / "analysis" / "ops_decode.json").read_text())
    first = check_against_ops(complete, prefill, prefill_name)
    second = check_against_ops(complete, decode, step_name)
    ends = (max(c["ts"] + c["dur"] for c in first), max(c["ts"] + c["dur"] for c in second))
    assert ends[0] <= min(c["ts"] for c in second) or ends[1] <= min(c["ts"] for c in first)  # one after the other
    assert any(str(c["args"].get("module")).startswith("model.layers.") for c in complete)


def test_an_etdump_without_timestamps_writes_no_trace_and_says_so_once(xnnpack_run: BundleCase) -> None:
    def zero(etdump: Any) -> None:
        for run in etdump.run_data:
            for event in run.events or []:
                if event.profile_event is not None:
                    event.profile_event.start_time = event.profile_event.end_time = 0

    rewrite_etdump(xnnpack_run.path, zero)
    summary = analyze(xnnpack_run)
    assert not (xnnpack_run.path / "analysis" / "trace.json").exists()
    assert [note for note in summary.notes if "timeline" in note] == [
        "the ETDump's events carry no timestamps (an older runner): no timeline (analysis/trace.json)"
    ]
    assert (xnnpack_run.path / "analysis" / "ops.json").is_file()


def test_an_event_ending_before_it_starts_is_an_analysis_error(xnnpack_run: BundleCase) -> None:
    def backwards(etdump: Any) -> None:
        for run in (r for r in etdump.run_data if r.name == "Execute"):
            for event in run.events or []:
                profile = event.profile_event
                if profile is not None and profile.name == "DELEGATE_CALL":
                    profile.end_time = profile.start_time - 1000

    rewrite_etdump(xnnpack_run.path, backwards)
    with pytest.raises(AnalysisError, match="ends before it starts"):
        analyze(xnnpack_run)


def test_calls_that_run_across_each_other_draw_no_timeline_and_say_why(xnnpack_run: BundleCase) -> None:
    """A board's ETDump whose kernel call ends inside the next one: no execution runs so, and Perfetto would drop one
    of them silently (results/trace_rules.py). No timeline is written, the analysis says why once, the rest stands."""

    def across(etdump: Any) -> None:
        for run in (r for r in etdump.run_data if r.name == "Execute"):
            calls = [
                e.profile_event
                for e in run.events or []
                if e.profile_event is not None and e.profile_event.name in ("OPERATOR_CALL", "DELEGATE_CALL")
            ]
            first, second = next((a, b) for a, b in itertools.pairwise(calls) if b.end_time - b.start_time > 10)
            first.end_time = second.start_time + (second.end_time - second.start_time) // 2

    rewrite_etdump(xnnpack_run.path, across)
    summary = analyze(xnnpack_run)
    assert not (xnnpack_run.path / "analysis" / "trace.json").exists()
    (note,) = [note for note in summary.notes if "timeline" in note]
    assert "break" in note and "slices must nest" in note, note
    assert (xnnpack_run.path / "analysis" / "ops.json").is_file()


def test_xnnpack_events_with_durations_only_are_laid_out_inside_their_call(xnnpack_run: BundleCase) -> None:
    def durations_only(etdump: Any) -> None:  # a backend that says how long, not when
        for run in etdump.run_data:
            for event in run.events or []:
                profile = event.profile_event
                if profile is not None and profile.delegate_debug_id_str:
                    profile.start_time, profile.end_time = 0, profile.end_time - profile.start_time

    rewrite_etdump(xnnpack_run.path, durations_only)
    analyze(xnnpack_run)
    complete = slices(json.loads((xnnpack_run.path / "analysis" / "trace.json").read_text()))
    ops = json.loads((xnnpack_run.path / "analysis" / "ops.json").read_text())
    parents = nesting(complete)
    delegates = {d["node_id"]: d for d in ops["delegates"]}
    calls = [(i, e) for i, e in enumerate(complete) if e["cat"] == "DelegateCall"]
    assert calls
    for index, call in calls:
        children = [complete[i] for i, p in parents.items() if p == index]
        events = delegates[call["args"]["node_id"]]["events"]
        assert [c["args"]["event"] for c in children] == [e["name"] for e in events]
        assert all("duration only" in c["args"]["layout"] for c in children)
        assert [c["ts"] for c in children] == sorted(c["ts"] for c in children)
        assert children[0]["ts"] == call["ts"]  # from the call's start, on the clock of the rest
        assert all(a["ts"] + a["dur"] <= b["ts"] + 0.002 for a, b in itertools.pairwise(children))
