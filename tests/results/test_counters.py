"""Issue 13: memory footprint on every run and the opt-in hardware counters pass, for real.

This machine has no hardware PMU (`cycles` gives ENOENT) and opens the software counters, so the counters pass runs
end to end with task-clock, page-faults and context-switches, and a requested hardware counter shows up as missing.
"""

from __future__ import annotations

import csv
import dataclasses
import json
import re
from pathlib import Path
from typing import Any

import pytest

from orchestrator.counters import COUNTERS, DEFAULT_COUNTERS, SOFTWARE_COUNTERS, parse_counters, perf_event
from orchestrator.errors import UsageError
from orchestrator.lowering.artifacts import load_artifact
from orchestrator.lowering.builtins import BUILTIN_SPECS
from orchestrator.lowering.export import lower as lowering
from orchestrator.lowering.variants import VARIANTS
from orchestrator.paths import PROJECT_ROOT
from orchestrator.programs.memory import read_program_memory
from orchestrator.programs.plan import read_program_plan
from orchestrator.records import from_data, to_data
from orchestrator.results.analysis import analyze_bundle
from orchestrator.results.bundle import BOARD_FILES, ENERGY_FILES, NUMERICS_FILES
from orchestrator.results.etdump import read_etdump
from tests.e2e.test_e2e import bundles, fab
from tests.plugins.analysis import adapter_graphs
from tests.plugins.artifacts import ARTIFACT_CACHE
from tests.plugins.boards import SHARED_BUILD, write_inventory

SOFTWARE = "task_clock,page_faults,context_switches"
SAMPLES = PROJECT_ROOT / "tests" / "data" / "board_samples"


def _profile(agent: Any, artifact: Any, run_id: str, *extra: str) -> Path:
    result = agent.run(
        "profile", "--model", artifact.pte, "--inputs", artifact.paths.reference_inputs, "--run-id", run_id,
        "--warmup", "1", "--iterations", "3", *extra,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    return agent.bundle(run_id)


def _assert_overlay_on_real_nodes(overlay: Path, graphs: dict[str, set[str]]) -> int:
    """Every graph id of the overlay is one the PTE adapter draws, and every node id is a node of it."""
    document = json.loads(overlay.read_text())
    painted = 0
    for graph_id, data in document.items():
        assert graph_id in graphs, (overlay.name, graph_id)
        stray = set(data["results"]) - graphs[graph_id]
        assert not stray, (overlay.name, sorted(stray)[:5])
        painted += len(data["results"])
    return painted


# ---------------------------------------------------------------- runner and agent


def test_counters_pass_writes_deltas_keyed_by_its_own_etdump(provisioned_agent: Any, tiny_artifacts: dict) -> None:
    artifact = load_artifact("distilbert-tiny", VARIANTS["xnnpack"], ARTIFACT_CACHE)
    bundle = _profile(provisioned_agent, artifact, "counters-1", "--counters", f"{SOFTWARE},cycles", "--threads", "2")
    run = json.loads((bundle / "run.json").read_text())
    assert run["counters_pass"]["status"] == "ok", run["counters_pass"]
    # A run with a counters pass leaves every file a board writes and nothing else: what a pull accepts (issue 34.3).
    # the numerics pass's and a PMIC's: their own tests
    assert {path.name for path in bundle.iterdir()} == BOARD_FILES - NUMERICS_FILES - ENERGY_FILES
    argv = run["counters_pass"]["argv"]
    assert argv[argv.index("--threads") + 1] == "1"  # the counters pass is single-threaded
    timing = json.loads((bundle / "timings.json").read_text())
    assert timing["threads"] == 2  # the timing pass keeps its own thread count

    counters = json.loads((bundle / "counters.json").read_text())
    assert counters["captured"] == ["task_clock", "page_faults", "context_switches"]
    assert [(m["name"], m["error"]) for m in counters["missing"]] == [("cycles", "ENOENT")]
    assert "PMU" in counters["missing"][0]["reason"]
    assert counters["threads"] == 1 and "thread that runs the operators" in counters["scope"]
    assert counters["multiplexed"] is False and counters["failed_reads"] == 0
    etdump = read_etdump(bundle / "counters_etdump.etdp")
    blocks = etdump.execute_blocks
    assert len(counters["executions"]) == len(blocks) == 4  # 1 warmup + 3
    plan = read_program_plan(artifact.pte)
    calls = {(i.chain, i.index) for i in plan.instructions if i.kind in ("KernelCall", "DelegateCall")}
    for rows, block in zip(counters["executions"], blocks, strict=True):
        assert {(r[1], r[2]) for r in rows} == calls  # every kernel and delegate call, once
        for event, chain, instruction, task_clock, *_ in rows:
            assert block.event_names[event] in ("OPERATOR_CALL", "DELEGATE_CALL")
            assert (int(block.chain[event]), int(block.instruction[event])) == (chain, instruction)
            assert task_clock > 0
    # The wrapped ETDumpGen records what a plain one does: same blocks, same events, in the same order.
    plain = read_etdump(bundle / "etdump.etdp")
    assert [b.event_names for b in plain.execute_blocks] == [b.event_names for b in blocks]
    from executorch.devtools import Inspector

    inspector = Inspector(etdump_path=str(bundle / "counters_etdump.etdp"))
    assert [block.name for block in inspector.event_blocks] == ["Default", "Execute"]
    frame = inspector.to_dataframe()
    assert (frame["event_name"] == "DELEGATE_CALL").any() and frame["p50 (ms)"].notna().all()


def test_derived_metrics_and_untrusted_rows(provisioned_agent: Any, tiny_artifacts: dict) -> None:
    """IPC and MPKI come from captured counters only; rows a board made up are dropped, never painted."""
    from orchestrator.results.counters_profile import read_counter_profile

    artifact = load_artifact("distilbert-tiny", VARIANTS["xnnpack"], ARTIFACT_CACHE)
    bundle = _profile(provisioned_agent, artifact, "derived-1", "--counters", "task_clock")
    path = bundle / "counters.json"
    document = json.loads(path.read_text())
    # As a board with a PMU would write it: cycles and instructions next to task-clock (3 and 2 per ns here).
    document["captured"] = ["task_clock", "cycles", "instructions", "not_a_counter"]
    document["columns"] += ["cycles", "instructions", "not_a_counter"]
    document["executions"] = [[[*r, 3 * r[3], 2 * r[3], 7] for r in rows] for rows in document["executions"]]
    first = document["executions"][1][0]
    document["executions"][1] += [[first[0] + 1, *first[1:]], ["x", 0, 0, 1, 1, 1, 1]]  # wrong event, not a number
    path.write_text(json.dumps(document))
    profile = read_counter_profile(bundle)
    assert profile is not None
    assert profile.captured == ["task_clock", "cycles", "instructions"]  # an unknown name is not a column
    assert profile.derived == ["ipc"] and profile.dropped_rows == 2
    assert profile.values["ipc"] and all(v == pytest.approx(2 / 3) for v in profile.values["ipc"].values())
    assert profile.totals["ipc"] == pytest.approx(2 / 3)


def test_every_run_records_memory_per_phase(provisioned_agent: Any, tiny_artifacts: dict) -> None:
    artifact = load_artifact("gpt2-tiny", VARIANTS["portable"], ARTIFACT_CACHE)
    bundle = _profile(provisioned_agent, artifact, "memory-1")
    timings = json.loads((bundle / "timings.json").read_text())
    memory = timings["memory"]
    assert [p["phase"] for p in memory["phases"]] == ["start", "load", "method_init", "first_execution", "end"]
    assert memory["peak_reset"] is True  # clear_refs works here (we are root on Linux)
    for phase in memory["phases"]:
        assert phase["peak_rss_bytes"] >= phase["rss_bytes"] > 0
    assert not (bundle / "counters.json").exists()  # no counters pass unless asked
    program = read_program_memory(artifact.pte)
    assert timings["program_memory"] == {
        "planned_arenas": program.planned_arenas,
        "constants_bytes": program.constants_bytes,
        "pte_bytes": program.pte_bytes,
    }

    summary = analyze_bundle(bundle, pte=artifact.pte, sidecar=artifact.sidecar)
    section = summary.run.memory
    assert section is not None and summary.run.counters is None
    assert section.peak_rss_bytes == max(max(p["peak_rss_bytes"], p["maxrss_bytes"]) for p in memory["phases"])
    assert section.planned_bytes == artifact.sidecar.memory.planned_bytes == sum(program.planned_arenas)
    assert section.constants_bytes == artifact.sidecar.memory.constants_bytes > 0
    assert section.other_bytes is not None and section.baseline_rss_bytes == memory["phases"][0]["rss_bytes"]
    assert summary.data["memory"]["phases"]["first_execution"]["peak_rss_bytes"] > 0
    assert not [r for r in summary.reasons if "arenas" in r]  # the runner's plan agrees with the program's
    assert not [r for r in summary.reasons if "constant" in r]  # and so do its constants

    # A lowering record that counts other constants than the runner read from the .pte: a reason, not a silent pick.
    memory_record = artifact.sidecar.memory
    altered = dataclasses.replace(
        artifact.sidecar,
        memory=dataclasses.replace(memory_record, constants_bytes=memory_record.constants_bytes + 64),
    )
    disagreeing = analyze_bundle(bundle, sidecar=altered)
    expected = f"the runner read {program.constants_bytes} bytes of constant data, the program says"
    assert [r for r in disagreeing.reasons if expected in r] and disagreeing.validity == "degraded"


@pytest.fixture(scope="module")
def wide_program(tiny_artifacts: dict) -> Any:
    """distilbert-tiny at 256 tokens: the same graph with bigger activations, so a bigger planned arena."""
    spec = dataclasses.replace(BUILTIN_SPECS["distilbert-tiny"], name="distilbert-tiny-256", seq_len=256)
    lowering.lower(spec, variants=[VARIANTS["portable"]], weights="random", root=ARTIFACT_CACHE)
    return load_artifact("distilbert-tiny-256", VARIANTS["portable"], ARTIFACT_CACHE)


def test_a_bigger_arena_shows_a_bigger_planned_figure(provisioned_agent: Any, wide_program: Any) -> None:
    narrow = load_artifact("distilbert-tiny", VARIANTS["portable"], ARTIFACT_CACHE)
    figures: dict[str, int] = {}
    for name, artifact in (("narrow", narrow), ("wide", wide_program)):
        bundle = _profile(provisioned_agent, artifact, f"arena-{name}")
        summary = analyze_bundle(bundle, pte=artifact.pte, sidecar=artifact.sidecar)
        runner_arenas = json.loads((bundle / "timings.json").read_text())["program_memory"]["planned_arenas"]
        assert summary.run.memory is not None and summary.run.memory.planned_bytes is not None
        assert summary.run.memory.planned_bytes == sum(runner_arenas) == artifact.sidecar.memory.planned_bytes
        figures[name] = summary.run.memory.planned_bytes
    assert figures["wide"] > figures["narrow"] * 1.5


def test_live_bytes_follow_the_memory_plan(tiny_artifacts: dict) -> None:
    for model in ("distilbert-tiny", "gpt2-tiny"):
        for variant in (VARIANTS["portable"], VARIANTS["xnnpack"]):
            artifact = load_artifact(model, variant, ARTIFACT_CACHE)
            reported = to_data(artifact.sidecar.memory)
            plan = read_program_plan(artifact.pte)
            live = reported["live_bytes"]
            # One figure per instruction of the plan, never more than the arenas hold.
            assert set(live) == {i.node_id("forward") for i in plan.instructions}
            assert 0 < reported["peak_live_bytes"] == max(live.values()) <= reported["planned_bytes"]
            # The inputs (two int64 [1, 128] tensors, planned) are live when the first instruction runs.
            assert live["forward_0_0"] >= 2 * 128 * 8
            assert reported["pte_bytes"] == artifact.pte.stat().st_size


# ---------------------------------------------------------------- end to end through fab


@pytest.fixture(scope="module")
def counters_lab(sshd_lab: Any, local_board: Any, tmp_path_factory: pytest.TempPathFactory) -> Any:
    fake = sshd_lab.board("pi5-counters", **SHARED_BUILD)
    folder = tmp_path_factory.mktemp("counters-lab")
    inventory = write_inventory(folder / "inventory.yaml", [local_board, fake.board], groups={})
    yield {"inventory": inventory, "fakes": [fake], "folder": folder}
    sshd_lab.discard(fake)


def test_counters_pass_end_to_end_on_local_and_sshd_boards(
    counters_lab: dict[str, Any], tiny_artifacts: dict, tmp_path: Path
) -> None:
    results = tmp_path / "results"
    result = fab("deploy-and-profile", "--model", "distilbert-tiny", "--backend", "xnnpack",
                 "--board", "local,pi5-counters", "--iterations", "4", "--warmup", "1", "--no-explore",
                 f"--counters={SOFTWARE},cycles,l2_refills", lab=counters_lab, results=results)  # fmt: skip
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert "peak MB" in result.stdout
    # The terminal says which counters are missing and why: once per board and cause, not per counter.
    for board in ("local", "pi5-counters"):
        assert len(re.findall(rf"{board}: counters cycles, l2_refills not captured: ENOENT", output)) == 1, output
    artifact = load_artifact("distilbert-tiny", VARIANTS["xnnpack"], ARTIFACT_CACHE)
    graphs = adapter_graphs(artifact.pte)
    found = bundles(results)
    for board in ("local", "pi5-counters"):
        (bundle,) = found[(board, "distilbert-tiny", "xnnpack")]
        summary = json.loads((bundle / "analysis" / "summary.json").read_text())
        counters = summary["counters"]
        assert counters["status"] == "ok" and counters["captured"] == ["task_clock", "page_faults", "context_switches"]
        assert {m["name"]: m["error"] for m in counters["missing"]} == {"cycles": "ENOENT", "l2_refills": "ENOENT"}
        assert counters["threads"] == 1 and counters["totals"]["task_clock"] > 0
        check = counters["consistency"]
        assert check["checked"] and check["metric"] == "task_clock"
        assert check["agrees"] or check["reason"], check  # agrees, or says why not

        overlays = bundle / "model_explorer"
        index = json.loads((overlays / "overlays.json").read_text())
        assert {m["name"] for m in index["counters"]["missing"]} == {"cycles", "l2_refills"}
        assert not (overlays / "me_overlay_cycles.json").exists() and not (overlays / "me_overlay_ipc.json").exists()
        assert "live bytes" in index["live_bytes"]["measures"] or "live" in index["live_bytes"]["measures"]
        for metric in ("task_clock", "page_faults", "context_switches", "live_bytes"):
            assert index["metrics"][metric] == f"me_overlay_{metric}.json"
            assert _assert_overlay_on_real_nodes(overlays / f"me_overlay_{metric}.json", graphs) > 0
        live = json.loads((overlays / "me_overlay_live_bytes.json").read_text())["forward"]["results"]
        assert {node: value["value"] for node, value in live.items()} == artifact.sidecar.memory.live_bytes

        with open(bundle / "analysis" / "ops.csv", newline="") as handle:
            header = next(csv.reader(handle))
        assert {"task_clock", "page_faults", "context_switches"} <= set(header)
        assert "cycles" not in header and "ipc" not in header  # no column of zeros for what was not captured
        ops = json.loads((bundle / "analysis" / "ops.json").read_text())
        delegate = next(i for i in ops["instructions"] if i["kind"] == "DelegateCall")
        assert delegate["task_clock"] > 0

        memory = summary["memory"]
        assert memory["peak_rss_bytes"] > 0 and set(memory["phases"]) == {
            "start", "load", "method_init", "first_execution", "end"
        }  # fmt: skip
        assert memory["planned_bytes"] == artifact.sidecar.memory.planned_bytes

    # The analysis tables, memory deltas in fab compare, and the boards' counter facts in fab boards.
    runs = [found[(board, "distilbert-tiny", "xnnpack")][0].name for board in ("local", "pi5-counters")]
    analyze = fab("analyze", "--run", runs[0], lab=None, results=results)
    assert analyze.returncode == 0, analyze.stdout + analyze.stderr
    assert "Memory" in analyze.stdout and "peak RSS MB" in analyze.stdout and "Counters" in analyze.stdout
    assert "counters cycles, l2_refills not captured: ENOENT" in analyze.stderr
    compare = fab("compare", *runs, lab=None, results=results)
    assert compare.returncode == 0, compare.stdout + compare.stderr
    assert "Memory" in compare.stdout and "peak RSS at the first execution" in compare.stdout  # in words
    boards = fab("boards", lab=counters_lab, results=results)
    assert boards.returncode == 0, boards.stdout + boards.stderr
    assert boards.stdout.count("no PMU") == 2 and "task_clock" in boards.stdout


def test_unknown_counter_is_refused_before_anything_runs(counters_lab: dict[str, Any], tmp_path: Path) -> None:
    result = fab("run", "--model", "distilbert-tiny", "--board", "local", "--counters=cycles,bogus",
                 lab=counters_lab, results=tmp_path / "results")  # fmt: skip
    assert result.returncode == 64, result.stdout + result.stderr
    assert "--counters: unknown counter 'bogus'" in result.stderr


# ---------------------------------------------------------------- the event table and board facts


def test_counter_names_and_the_arm_event_table() -> None:
    assert parse_counters(None) == parse_counters("default") == DEFAULT_COUNTERS
    assert parse_counters("task_clock, cycles,task_clock") == ("task_clock", "cycles")
    with pytest.raises(UsageError, match="unknown counter 'L1'"):
        parse_counters("cycles,L1")
    assert set(SOFTWARE_COUNTERS) == {"task_clock", "page_faults", "context_switches"}
    # No generic L2 event exists: Arm gets the raw L2D_CACHE_REFILL, elsewhere the last-level cache.
    assert perf_event("l2_refills", "aarch64") == ("raw", 0x17)
    assert perf_event("l2_refills", "x86_64") == ("generic", "LLC-load-misses")
    assert perf_event("cycles", "aarch64") == ("generic", "cpu-cycles")
    # The runner's table (C++) names the same counters, in the same order, with the same raw Arm number.
    source = (PROJECT_ROOT / "board" / "runner" / "src" / "perf_counters.cpp").read_text()
    names = re.findall(r'\{"(\w+)",', source)
    assert names == list(COUNTERS)
    assert "kArmL2dCacheRefill = 0x17" in source


def test_every_counter_and_derived_metric_reaches_the_overlays_and_the_tables(tmp_path: Path) -> None:
    """COUNTERS and DERIVED (orchestrator/counters.py) are the one list: a counters pass that captured all of them
    gets an overlay, an ops column and a summary entry for each, with no other list to extend (the runner's table in
    C++ is tied to COUNTERS above)."""
    from orchestrator.counters import DERIVED
    from orchestrator.names import is_valid_name
    from orchestrator.results.counters_profile import counters_summary, read_counter_profile
    from orchestrator.results.documents import _counter_columns
    from orchestrator.results.overlays import LIVE_BYTES, METRICS, write_counter_overlays

    names = list(COUNTERS)
    metrics = [*COUNTERS, *DERIVED]
    assert len(set(metrics)) == len(metrics) and not set(metrics) & {*METRICS, LIVE_BYTES}
    assert all(is_valid_name(metric) for metric in metrics)  # each names an overlay file
    assert all(num in COUNTERS and den in COUNTERS for num, den, _ in DERIVED.values())
    document = {
        "schema": 1, "threads": 1, "scope": "thread", "captured": names, "missing": [], "multiplexed": False,
        "scaling": "none", "columns": ["event_index", "chain", "instruction", *names], "executions": [[]],
    }  # fmt: skip
    (tmp_path / "counters.json").write_text(json.dumps(document))
    profile = read_counter_profile(tmp_path)
    assert profile is not None and profile.captured == names and profile.derived == list(DERIVED)
    written = write_counter_overlays(tmp_path, profile, "run")
    assert [path.name for path in written] == [f"me_overlay_{metric}.json" for metric in metrics]
    assert _counter_columns(profile) == metrics  # the ops.json / ops.csv columns, and so the counters table
    summary = counters_summary(profile, {"requested": ",".join(names)}, [], 1)
    assert summary is not None and [*summary.captured, *summary.derived] == metrics  # what render_counters shows


def test_the_pi5_sysfs_pmu_advertises_the_events_of_the_table() -> None:
    events = SAMPLES / "rpi5" / "sysroot" / "sys" / "bus" / "event_source" / "devices" / "armv8_cortex_a76" / "events"
    advertised = {path.name: int(path.read_text().strip().removeprefix("event="), 16) for path in events.iterdir()}
    names = {"cycles": "cpu_cycles", "instructions": "inst_retired", "l1d_refills": "l1d_cache_refill",
             "l2_refills": "l2d_cache_refill", "branch_misses": "br_mis_pred"}  # fmt: skip
    for counter, alias in names.items():
        assert advertised[alias] == COUNTERS[counter].armv8_event, counter


@pytest.mark.parametrize(
    ("sample", "pmu"),
    [("rpi4", None), ("rpi5", "armv8_cortex_a76"), ("rk3588", "armv8_cortex_a55")],
)
def test_info_reports_the_pmu_from_sysfs(agent: Any, board_sample_env: Any, sample: str, pmu: str | None) -> None:
    result = agent.run("info", env=board_sample_env(sample))
    assert result.returncode == 0, result.stderr
    perf = result.document["perf"]
    assert perf["perf_event_paranoid"] == 2
    assert perf["hardware_pmu"] == pmu  # an absent PMU (the Pi 4's kernel) is a fact, not an error
    names = {source["name"] for source in perf["event_sources"]}
    assert {"software", "tracepoint"} <= names
    if pmu:
        source = next(s for s in perf["event_sources"] if s["name"] == pmu)
        assert "l2d_cache_refill" in source["events"] and source["type"] >= 8
    assert perf["counters"] is None  # no runner in a sample


def test_info_lists_the_counters_this_machine_opens(provisioned_agent: Any) -> None:
    perf = provisioned_agent.run("info").document["perf"]
    assert perf["perf_event_paranoid"] == int(Path("/proc/sys/kernel/perf_event_paranoid").read_text())
    assert perf["counters"]["task_clock"] == "ok" and perf["counters"]["context_switches"] == "ok"
    # This CI machine has no hardware PMU.
    assert perf["hardware_pmu"] is None and perf["counters"]["cycles"] == "ENOENT"


# ---------------------------------------------------------------- memory figures as data


def test_memory_summary_notes_a_runner_that_planned_other_arenas(tiny_artifacts: dict) -> None:
    from orchestrator.results.memory import memory_summary

    artifact = load_artifact("distilbert-tiny", VARIANTS["portable"], ARTIFACT_CACHE)
    program = read_program_memory(artifact.pte)
    phases = [
        {"phase": "start", "peak_rss_bytes": 5_000_000, "rss_bytes": 5_000_000, "maxrss_bytes": 5_000_000},
        {"phase": "end", "peak_rss_bytes": 9_000_000, "rss_bytes": 8_000_000, "maxrss_bytes": 9_500_000},
    ]
    timings = {"memory": {"peak_reset": True, "phases": phases}, "program_memory": {"planned_arenas": [64]}}
    memory, notes = memory_summary(timings, program)
    assert memory is not None
    assert notes and "planned arenas of [64] bytes" in notes[0]
    assert memory.peak_rss_bytes == 9_500_000  # ru_maxrss is never below the peak of any phase
    assert memory.other_bytes == max(0, 9_500_000 - 5_000_000 - program.planned_bytes - program.constants_bytes)
    same, quiet = memory_summary({**timings, "program_memory": {"planned_arenas": program.planned_arenas}}, program)
    assert same is not None
    assert quiet == [] and same.planned_bytes == program.planned_bytes

    # The constants the runner read from the .pte are checked the same way; board data is validated first.
    agreeing = {"planned_arenas": program.planned_arenas, "constants_bytes": program.constants_bytes}
    assert memory_summary({**timings, "program_memory": agreeing}, program)[1] == []
    other = {**agreeing, "constants_bytes": program.constants_bytes + 16}
    memory, notes = memory_summary({**timings, "program_memory": other}, program)
    assert memory is not None
    assert notes == [
        f"the runner read {program.constants_bytes + 16} bytes of constant data, "
        f"the program says {program.constants_bytes}"
    ]
    assert memory.constants_bytes == program.constants_bytes  # the program's own figure stays the one shown
    for garbage in ("12", -1, True, 1.5, 2**64, [1]):
        memory, notes = memory_summary({**timings, "program_memory": {**agreeing, "constants_bytes": garbage}}, program)
        assert len(notes) == 1 and "constants_bytes is not a byte count" in notes[0], garbage
        assert memory is not None
        assert memory.constants_bytes == program.constants_bytes
    # An older runner (no field) or an unreadable program (null) is unknown, not a mismatch.
    assert memory_summary({**timings, "program_memory": {**agreeing, "constants_bytes": None}}, program)[1] == []

    # The runner's arenas are validated the same way before they are compared or shown.
    for arenas in ("[64]", [64, "x"], [True], [-1], [1] * 65, {"a": 1}):
        memory, notes = memory_summary({**timings, "program_memory": {**agreeing, "planned_arenas": arenas}}, program)
        assert len(notes) == 1 and "planned_arenas is not a list of byte counts" in notes[0], arenas
        assert memory is not None
        assert memory.planned_bytes == program.planned_bytes
        alone, _ = memory_summary({**timings, "program_memory": {"planned_arenas": arenas}}, None)
        assert alone is not None
        assert alone.planned_bytes is None and alone.planned_arenas == ()

    # Without the program or its sidecar, the runner's figures are what there is.
    alone, _ = memory_summary({**timings, "program_memory": agreeing}, None)
    assert alone is not None
    assert alone.constants_bytes == program.constants_bytes and alone.planned_bytes == program.planned_bytes
    assert alone.other_bytes == max(0, 9_500_000 - 5_000_000 - program.planned_bytes - program.constants_bytes)
    negative, _ = memory_summary({**timings, "program_memory": {**agreeing, "constants_bytes": -5}}, None)
    assert negative is not None and negative.other_bytes is None


def test_compare_reports_memory_deltas() -> None:
    from orchestrator.results.compare import memory_deltas
    from orchestrator.results.summary import Memory

    a = Memory(peak_rss_bytes=100, planned_bytes=40, phases={"load": {"peak_rss_bytes": 50}})
    b = Memory(peak_rss_bytes=130, planned_bytes=40, phases={"load": {"peak_rss_bytes": 45}})
    rows = {row.figure: row for row in memory_deltas(a, b)}
    assert rows["peak_rss_bytes"].delta == 30 and rows["peak_rss_bytes"].ratio == pytest.approx(0.3)
    assert rows["planned_bytes"].delta == 0
    assert rows["peak_rss_bytes.load"].delta == -5
    assert "constants_bytes" not in rows  # unknown on both sides
    assert memory_deltas(a, None) == []
    assert from_data(to_data(b), Memory, where="summary.json") == b  # summary.json keeps the layout it reads back


def test_live_bytes_overlay_needs_no_board(tiny_artifacts: dict, tmp_path: Path) -> None:
    """What `fab explore --model M` shows before any run: the plan's live bytes, on the adapter's real nodes."""
    from orchestrator.results.overlays import write_program_overlays
    from orchestrator.servers.explorer import overlay_target

    artifact = load_artifact("gpt2-tiny", VARIANTS["xnnpack"], ARTIFACT_CACHE)
    (overlay,) = write_program_overlays(artifact.pte, tmp_path)
    assert overlay.name == "me_overlay_live_bytes.json" and overlay_target(overlay) == artifact.pte.name
    assert _assert_overlay_on_real_nodes(overlay, adapter_graphs(artifact.pte)) == len(
        artifact.sidecar.memory.live_bytes
    )
    index = json.loads((tmp_path / "model_explorer" / "overlays.json").read_text())
    assert "memory plan" in index["live_bytes"]["measures"]
