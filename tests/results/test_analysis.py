"""Bundle analysis on real bundles: tiny DistilBERT / GPT-2 lowered with ExecuTorch and run with ETDump on."""

from __future__ import annotations

import csv
import json
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from orchestrator.commands.render import render_top_ops
from orchestrator.errors import AnalysisError
from orchestrator.fsutil import sha256_file
from orchestrator.programs.plan import read_program_plan
from orchestrator.results.analysis import analyze_bundle
from orchestrator.results.documents import load_summary
from orchestrator.results.etdump import parse_etdump, read_etdump
from orchestrator.results.etdump_profile import profile_etdump
from orchestrator.results.ops_record import load_ops
from orchestrator.results.summary import read_summary, summary_data
from orchestrator.servers.dashboard.where import operator_rows
from orchestrator.tensorfile import NamedTensor, read_tensors, write_tensors
from tests.plugins.analysis import (
    RUNNER_KEYS,
    BundleCase,
    BundleCopy,
    TinyModel,
    analyze,
    board_info,
    edit_json,
    raw_hashes,
    remanifest,
    rewrite_etdump,
    write_manifest,
)

pytestmark = pytest.mark.slow  # lowers and runs real models (session fixtures)

XNNPACK_KEYS = ("distilbert_xnnpack", "gpt2_xnnpack")


# ---------------------------------------------------------------------------------------------------------------
# ETDump parsing


@pytest.mark.parametrize("key", [*XNNPACK_KEYS, "distilbert_portable"])
def test_etdump_reader_agrees_with_executorch_deserializer(analysis_bundles: dict[str, BundleCase], key: str) -> None:
    from executorch.devtools.etdump.serialize import deserialize_from_etdump_flatcc

    path = analysis_bundles[key].path / "etdump.etdp"
    ours = read_etdump(path)
    theirs = deserialize_from_etdump_flatcc(path.read_bytes())
    assert [b.name for b in ours.blocks] == [r.name for r in theirs.run_data]
    for block, run in zip(ours.blocks, theirs.run_data, strict=True):
        events = [e.profile_event for e in run.events or [] if e.profile_event is not None]
        assert block.event_names == [e.name or "" for e in events]
        assert block.delegate_names == [e.delegate_debug_id_str for e in events]
        assert block.chain.tolist() == [e.chain_index for e in events]
        assert block.instruction.tolist() == [e.instruction_id for e in events]
        assert block.start.tolist() == [e.start_time for e in events]
        assert block.end.tolist() == [e.end_time for e in events]


def test_etdump_blocks_follow_executions(analysis_bundles: dict[str, BundleCase]) -> None:
    case = analysis_bundles["distilbert_xnnpack"]
    timings = json.loads((case.path / "timings.json").read_text())
    etdump = read_etdump(case.path / "etdump.etdp")
    assert etdump.blocks[0].name == "Default"
    assert len(etdump.execute_blocks) == len(timings["warmup_ms"]) + len(timings["iterations_ms"])
    assert len(etdump.method_event_ticks("Method::init")) == 1


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"", "not an ETDump"),
        (b"garbage!" * 20, "not an ETDump"),
        (struct.pack("<I", 10_000) + b"\0\0\0\0ED00" + b"\0" * 40, "truncated"),
    ],
)
def test_corrupt_etdump_bytes_raise(data: bytes, message: str) -> None:
    with pytest.raises(AnalysisError, match=message):
        parse_etdump(data)


def test_etdump_with_bad_offsets_raises(analysis_bundles: dict[str, BundleCase]) -> None:
    data = bytearray((analysis_bundles["distilbert_xnnpack"].path / "etdump.etdp").read_bytes())
    struct.pack_into("<I", data, 4, len(data) * 4)  # root offset beyond the end
    with pytest.raises(AnalysisError, match="corrupt or truncated"):
        parse_etdump(bytes(data))


# ---------------------------------------------------------------------------------------------------------------
# Statistics vs ExecuTorch's Inspector


@pytest.mark.filterwarnings("ignore:Output Buffer not found")
@pytest.mark.parametrize("key", [*XNNPACK_KEYS, "distilbert_portable", *RUNNER_KEYS])
def test_per_op_figures_agree_with_inspector(all_bundles: dict[str, BundleCase], key: str) -> None:
    """Inspector includes every Execute block, so compare on all of them (skip_executions=0)."""
    from executorch.devtools import Inspector

    case = all_bundles[key]
    etdump_path = case.path / "etdump.etdp"
    profile = profile_etdump(read_etdump(etdump_path), read_program_plan(case.model.pte), skip_executions=0)
    inspector = Inspector(etdump_path=str(etdump_path))
    execute = [block for block in inspector.event_blocks if block.name == "Execute"]
    assert len(execute) == 1, "every execution has the same event signature"
    by_instruction = {i.index: i for i in profile.instructions}
    delegates = {d.node_id: d for d in profile.delegates}
    position_in_delegate: dict[int, int] = {}
    compared = 0
    for event in execute[0].events:
        raw = event.perf_data.raw if event.perf_data else []
        if event.name in ("OPERATOR_CALL", "DELEGATE_CALL"):
            dist = by_instruction[event._instruction_id].dist
        elif event.is_delegated_op:
            delegate = delegates[f"forward_0_{event._instruction_id}"]
            k = position_in_delegate.get(event._instruction_id, 0)
            position_in_delegate[event._instruction_id] = k + 1
            assert delegate.event_names[k] == event.name
            dist = profile_distribution(delegate.event_samples_ms[:, k])
        else:
            continue  # native_call_* twins: counted once, through OPERATOR_CALL
        assert dist is not None
        assert dist.n == len(raw) == profile.executions
        for ours, theirs in ((dist.median, event.perf_data.p50), (dist.p10, event.perf_data.p10),
                             (dist.p90, event.perf_data.p90), (dist.mean, event.perf_data.avg)):  # fmt: skip
            assert ours == pytest.approx(theirs, rel=0.01, abs=1e-9)
        compared += 1
    assert compared >= len(profile.instructions)


def profile_distribution(samples: np.ndarray):
    from orchestrator.results.stats import distribution

    return distribution(samples)


def test_kernel_calls_are_counted_once(analysis_bundles: dict[str, BundleCase]) -> None:
    case = analysis_bundles["distilbert_portable"]
    etdump = read_etdump(case.path / "etdump.etdp")
    profile = profile_etdump(etdump, read_program_plan(case.model.pte), skip_executions=0)
    block = etdump.execute_blocks[-1]
    index = next(i for i in profile.instructions if i.kind == "KernelCall" and i.op == "aten::addmm.out").index
    outer = [k for k, n in enumerate(block.event_names) if n == "OPERATOR_CALL" and block.instruction[k] == index]
    inner = [
        k for k, n in enumerate(block.event_names) if n.startswith("native_call_") and block.instruction[k] == index
    ]
    assert len(outer) == len(inner) == 1
    instruction = next(i for i in profile.instructions if i.index == index)
    assert instruction.samples_ms[-1] == pytest.approx(block.durations[outer[0]] / 1e6)
    assert instruction.samples_ms[-1] < (block.durations[outer[0]] + block.durations[inner[0]]) / 1e6


def test_summary_json_reads_back_as_the_typed_summary_and_refuses_a_damaged_one(bundle_copy: BundleCopy) -> None:
    case = bundle_copy(XNNPACK_KEYS[0])
    summary = analyze(case)
    path = case.path / "analysis" / "summary.json"
    on_disk = json.loads(path.read_text())
    assert read_summary(on_disk) == summary.run
    assert summary_data(read_summary(on_disk)) == on_disk, "the file layout is what the typed model writes"
    for damage in (
        {"validity": {"status": "great", "reasons": []}},
        {"latency": {**on_disk["latency"], "warm": {"median_ms": "fast"}}},
        {"model": ["not", "a", "mapping"]},
        {"schema": 99},
    ):
        path.write_text(json.dumps({**on_disk, **damage}))
        with pytest.raises(AnalysisError, match=r"summary\.json"):
            load_summary(case.path)


# ---------------------------------------------------------------------------------------------------------------
# analyze_bundle outputs


@pytest.mark.parametrize("key", [*XNNPACK_KEYS, "distilbert_portable"])
def test_analyze_bundle_writes_summary_ops_and_overlays(bundle_copy: BundleCopy, key: str) -> None:
    case = bundle_copy(key)
    before = raw_hashes(case.path)
    summary = analyze(case)
    assert raw_hashes(case.path) == before, "raw bundle files are never modified"
    data = summary_data(load_summary(case.path))
    assert data == json.loads(json.dumps(summary.data))
    timings = json.loads((case.path / "timings.json").read_text())

    latency = data["latency"]
    assert latency["iterations"] == len(timings["iterations_ms"]) == 6
    assert latency["first_run_ms"] == timings["warmup_ms"][0]
    assert latency["warm"]["median_ms"] == pytest.approx(float(np.median(timings["iterations_ms"])))
    assert latency["warm"]["min_ms"] <= latency["warm"]["median_ms"] <= latency["warm"]["max_ms"]
    assert latency["load_ms"] == timings["load_ms"]

    profile = data["profile"]
    assert profile["executions"] == 6, "warmup blocks are skipped"
    assert profile["ns_per_tick"] == 1.0, "the Linux runtime ticks in nanoseconds"
    # In ns, not µs: a wrong tick would be 1000x off. The bundle's wall clock is the Python runtime's execute(),
    # which also copies the outputs (all positions' logits) into new tensors: on a tiny model, most of it.
    assert 0.05 < profile["etdump_vs_timings"] <= 1.1, "ETDump's method time matches the wall clock, in ns"
    tops = profile["top_layers"]
    assert [t["ms"] for t in tops] == sorted((t["ms"] for t in tops), reverse=True)  # by median, as the shares
    split = profile["split"]  # medians: the split of the run's median (the baseline of every share)
    assert split["delegated_pct"] + split["non_delegated_pct"] <= 100.0001
    # the split adds up to the run's median (its parts', when those are larger), up to float rounding (CI saw the
    # sum one ulp under the median it was subtracted from)
    timed = split["delegated_ms"] + split["non_delegated_ms"]
    parts = timed + split["other_ms"]
    assert parts == pytest.approx(max(profile["method_ms"]["median"], timed), rel=1e-12)
    if key.endswith("portable"):
        assert split["delegated_ms"] == 0
    else:
        assert split["delegated_ms"] > 0 and split["non_delegated_ms"] > 0

    assert data["correctness"]["checked"] and data["correctness"]["ok"]
    assert data["correctness"]["top1_agreement"] == 1.0
    # A shared CI machine (another test worker lowering beside it) may make tiny runs jittery, and stretch the Python
    # wall clock's output copies past ETDump's method time (its ratio bounded above); nothing else may be wrong.
    load_effects = ("unstable timings", "ETDump's method time is ")
    assert all(r["reason"].startswith(load_effects) for r in data["validity"]["reasons"]), data["validity"]
    assert data["validity"]["status"] == ("degraded" if data["validity"]["reasons"] else "valid")
    assert data["model"]["sha256"] == case.model.sidecar.sha256
    assert data["labels"]["backend"] == case.model.backend
    assert data["board_conditions"]["temperature_c_after"] == 49.8

    plan = read_program_plan(case.model.pte)
    with open(case.path / "analysis" / "ops.csv", newline="") as handle:
        rows = list(csv.DictReader(handle))
    assert [r["node_id"] for r in rows] == [f"forward_{i.chain}_{i.index}" for i in plan.instructions]
    ops = json.loads((case.path / "analysis" / "ops.json").read_text())
    for row, instruction in zip(ops["instructions"], plan.instructions, strict=True):
        assert row["kind"] == instruction.kind
        if instruction.kind == "KernelCall":
            assert row["op"].startswith("aten::") or "::" in row["op"]
        if instruction.kind == "DelegateCall":
            assert row["op"] == "XnnpackBackend"
        assert row["samples"] == 6
        assert row["p10_ms"] <= row["median_ms"] <= row["p90_ms"]
    assert sum(r["pct"] for r in ops["instructions"]) <= 100.0 + 1e-9  # shares of one median: up to float rounding
    assert {p.name for p in (case.path / "model_explorer").iterdir()} == {
        "me_overlay_median_ms.json", "me_overlay_mean_ms.json", "me_overlay_pct.json", "overlays.json",
        "me_overlay_live_bytes.json",  # from the program's memory plan; no counters pass, so no counter overlays
        # the same run on the exported .pt2 the program was lowered from (its source map names the .pt2's nodes)
        "me_overlay_exported_median_ms.json", "me_overlay_exported_mean_ms.json", "me_overlay_exported_pct.json",
        "me_overlay_exported_lowering.json",
    }  # fmt: skip


def test_delegate_internals_are_aggregated_per_site_and_type(bundle_copy: BundleCopy) -> None:
    case = bundle_copy("gpt2_xnnpack")
    analyze(case)
    ops = json.loads((case.path / "analysis" / "ops.json").read_text())
    delegates = ops["delegates"]
    assert delegates and all(d["status"] == "placed" for d in delegates)
    for delegate in delegates:
        assert delegate["events_mean_ms"] <= delegate["call_mean_ms"]
        assert delegate["placed_mean_ms"] == pytest.approx(sum(e["mean_ms"] for e in delegate["events"]))
    types = {row["type"]: row for row in ops["operator_types"]}
    assert "Fully Connected (NC, F32) GEMM" in types
    site_fc = sum(e["mean_ms"] for d in delegates for e in d["events"] if e["name"].startswith("Fully Connected"))
    assert types["Fully Connected (NC, F32) GEMM"]["mean_ms"] == pytest.approx(site_fc)
    assert types["Fully Connected (NC, F32) GEMM"]["count"] == sum(
        1 for d in delegates for e in d["events"] if e["name"].startswith("Fully Connected")
    )


def test_instructions_that_never_fired_are_listed_without_samples(bundle_copy: BundleCopy) -> None:
    case = bundle_copy("distilbert_portable")
    plan = read_program_plan(case.model.pte)
    silent = plan.instructions[5].index

    def fired(event: Any) -> bool:
        profile = event.profile_event
        return profile is not None and profile.instruction_id == silent and profile.chain_index == 0

    def drop(etdump: Any) -> None:
        for run in etdump.run_data:
            run.events = [event for event in run.events or [] if not fired(event)]

    rewrite_etdump(case.path, drop)
    analyze(case)
    rows = {r["node_id"]: r for r in json.loads((case.path / "analysis" / "ops.json").read_text())["instructions"]}
    assert len(rows) == len(plan.instructions)
    assert rows[f"forward_0_{silent}"]["samples"] == 0 and rows[f"forward_0_{silent}"]["median_ms"] is None
    overlay = json.loads((case.path / "model_explorer" / "me_overlay_median_ms.json").read_text())
    assert f"forward_0_{silent}" not in overlay["forward"]["results"]


def test_profile_without_pte_learns_instructions_from_events(analysis_bundles: dict[str, BundleCase]) -> None:
    case = analysis_bundles["distilbert_xnnpack"]
    etdump = read_etdump(case.path / "etdump.etdp")
    with_plan = profile_etdump(etdump, read_program_plan(case.model.pte), skip_executions=2)
    without = profile_etdump(etdump, None, skip_executions=2)
    assert [(i.node_id, i.kind) for i in without.instructions] == [(i.node_id, i.kind) for i in with_plan.instructions]
    for a, b in zip(without.instructions, with_plan.instructions, strict=True):
        assert a.dist == b.dist
        if a.kind == "KernelCall":
            assert b.op is not None
            assert a.op == b.op.split("::")[-1], "native_call_<op> names the same operator as the program"
    assert all(d.status == "not inspectable" for d in without.delegates)


def test_render_top_ops_prints_table(bundle_copy: BundleCopy, capsys: pytest.CaptureFixture[str]) -> None:
    case = bundle_copy("distilbert_portable")
    summary = analyze(case)
    top = summary.data["profile"]["top_layers"][0]
    for source in (summary, case.path):  # in memory, or read back from the bundle
        render_top_ops(source, limit=5)
        out = capsys.readouterr().out
        assert "Top operators" in out and top["node_id"] in out and summary.validity in out
        assert out.count("forward_0_") == 5
        assert "Outputs vs eager" in out and "output_0" in out and "logits" in out  # one row per output


def test_top_operators_name_the_xnnpack_nodes_inside_each_delegate_as_the_dashboard_does(
    bundle_copy: BundleCopy, capsys: pytest.CaptureFixture[str]
) -> None:
    """Not "forward_0_158 | XnnpackBackend" fifteen times: the node inside the delegate, its output shape, module and
    source line (the dashboard's run page's rows, servers/dashboard/where.py), within 140 columns."""
    case = bundle_copy("distilbert_xnnpack")
    summary = analyze(case)
    rows, _, _ = operator_rows(load_ops(case.path), 15)
    node = next(row for row in rows if row.inside and row.module and row.shape)
    render_top_ops(summary)
    out = capsys.readouterr().out
    table = out[out.index("Top operators") : out.index("run " + summary.run.run_id)]
    assert "XnnpackBackend" not in table and f"{node.inside}/" in table
    line = next(line for line in table.splitlines() if line.startswith(f"│ {node.node_id} "))
    assert node.op in line and (node.source or "").removesuffix(" in forward") in line
    assert str(node.module).split(".")[0] in line and str(node.shape) in table
    assert max(len(line) for line in out.splitlines()) <= 140


# ---------------------------------------------------------------------------------------------------------------
# Validity


def test_throttling_and_governor_degrade_a_run(bundle_copy: BundleCopy) -> None:
    case = bundle_copy("distilbert_xnnpack")
    (case.path / "board_info_before.json").write_text(json.dumps(board_info(governor="ondemand")))
    (case.path / "board_info_after.json").write_text(json.dumps(board_info(temperature_c=82.5, throttled="0x50005")))
    remanifest(case.path)
    data = analyze(case).data
    assert data["validity"]["status"] == "degraded"
    reasons = " | ".join(r["reason"] for r in data["validity"]["reasons"])
    assert "throttled_now" in reasons and "under_voltage_now" in reasons
    assert "governor 'ondemand'" in reasons and "82.5" in reasons
    assert data["board_conditions"]["throttled_after"]["raw"] == "0x50005"


def test_sticky_throttle_flags_from_before_the_run_do_not_degrade(bundle_copy: BundleCopy) -> None:
    case = bundle_copy("distilbert_xnnpack")
    for name in ("board_info_before.json", "board_info_after.json"):
        (case.path / name).write_text(json.dumps(board_info(throttled="0x50000")))  # occurred earlier, not now
    remanifest(case.path)
    data = analyze(case).data
    assert data["board_conditions"]["throttling_during_run"] == []
    assert not any("throttl" in r["reason"] for r in data["validity"]["reasons"])
    assert data["board_conditions"]["throttled_after"]["active"] == ["under_voltage_occurred", "throttling_occurred"]


def test_unstable_timings_degrade_a_run(bundle_copy: BundleCopy) -> None:
    case = bundle_copy("distilbert_xnnpack")
    timings = json.loads((case.path / "timings.json").read_text())
    iterations = timings["iterations_ms"]
    edit_json(case.path / "timings.json", iterations_ms=[v * (2.0 if k % 2 else 1.0) for k, v in enumerate(iterations)])
    data = analyze(case).data
    assert data["validity"]["status"] == "degraded"
    assert any("CV" in r["reason"] for r in data["validity"]["reasons"])


def test_output_mismatch_invalidates_a_run(bundle_copy: BundleCopy) -> None:
    case = bundle_copy("gpt2_xnnpack")
    (output,) = read_tensors(case.path / "outputs.etlt")
    wrong = output.array.copy()
    wrong[..., :] = wrong[..., ::-1]
    write_tensors(case.path / "outputs.etlt", [NamedTensor(output.name, wrong)])
    remanifest(case.path)
    data = analyze(case).data
    assert data["validity"]["status"] == "invalid"
    assert data["correctness"]["ok"] is False and data["correctness"]["top1_agreement"] == 0.0
    assert any("output mismatch" in r["reason"] for r in data["validity"]["reasons"])


def test_runner_failure_is_an_invalid_run_not_a_crash(
    bundle_copy: BundleCopy, capsys: pytest.CaptureFixture[str]
) -> None:
    case = bundle_copy("distilbert_xnnpack")
    for name in ("etdump.etdp", "outputs.etlt", "timings.json"):
        (case.path / name).unlink()
    write_manifest(case.path, run_id=case.path.name, model_sha256=case.model.sidecar.sha256, status="failed",
                   error="etlab_runner: error: execution failed")  # fmt: skip
    summary = analyze(case)
    assert summary.validity == "invalid" and summary.profile is None
    assert any("execution failed" in reason for reason in summary.reasons)
    assert (case.path / "analysis" / "summary.json").is_file()
    render_top_ops(summary)
    captured = capsys.readouterr()
    assert "no measured iterations" in captured.out and "execution failed" in captured.err


def test_execute_block_count_mismatch_is_reported(bundle_copy: BundleCopy) -> None:
    case = bundle_copy("distilbert_xnnpack")
    timings = json.loads((case.path / "timings.json").read_text())
    edit_json(case.path / "timings.json", iterations_ms=timings["iterations_ms"][:-1])
    data = analyze(case).data
    assert any("Execute blocks" in r["reason"] for r in data["validity"]["reasons"])


# ---------------------------------------------------------------------------------------------------------------
# Failures keep the bundle intact


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (lambda p: (p / "etdump.etdp").write_bytes((p / "etdump.etdp").read_bytes()[:5000]), "truncated"),
        (lambda p: (p / "etdump.etdp").write_bytes(b"\x00" * 4096), "not an ETDump"),
        (lambda p: (p / "timings.json").unlink(), "timings.json"),
        (lambda p: (p / "etdump.etdp").unlink(), "etdump.etdp"),
        (lambda p: (p / "run.json").unlink(), "run.json"),
        (lambda p: (p / "timings.json").write_text("{not json"), "timings.json"),
    ],
    ids=["truncated-etdump", "zeroed-etdump", "no-timings", "no-etdump", "no-run-json", "bad-timings"],
)
def test_bad_bundles_raise_and_keep_raw_files(
    bundle_copy: BundleCopy, damage: Callable[[Path], Any], message: str
) -> None:
    case = bundle_copy("distilbert_xnnpack")
    damage(case.path)
    remanifest(case.path)  # the board wrote the damaged file: its manifest agrees
    before = raw_hashes(case.path)
    with pytest.raises(AnalysisError, match=message):
        analyze(case)
    assert raw_hashes(case.path) == before
    assert not (case.path / "analysis" / "summary.json").exists()


def test_a_file_changed_after_the_board_wrote_it_is_refused(bundle_copy: BundleCopy) -> None:
    case = bundle_copy("distilbert_xnnpack")
    timings = json.loads((case.path / "timings.json").read_text())
    timings["iterations_ms"] = [1.0 for _ in timings["iterations_ms"]]  # prettier numbers, same size or not
    (case.path / "timings.json").write_text(json.dumps(timings))
    before = raw_hashes(case.path)
    with pytest.raises(AnalysisError, match=r"does not match its manifest:\n  timings.json"):
        analyze(case)
    assert raw_hashes(case.path) == before


def test_pte_of_another_model_is_refused(bundle_copy: BundleCopy, analysis_models: dict[str, TinyModel]) -> None:
    case = bundle_copy("distilbert_xnnpack")
    other = analysis_models["distilbert_portable"]
    before = raw_hashes(case.path)
    with pytest.raises(AnalysisError, match="not the model this bundle ran"):
        analyze_bundle(case.path, pte=other.pte, sidecar=other.sidecar)
    with pytest.raises(AnalysisError, match="not the model this bundle ran"):
        analyze_bundle(case.path, pte=other.pte, sidecar=None)  # hashed, no sidecar to trust
    assert raw_hashes(case.path) == before


def test_corrupt_pte_raises(bundle_copy: BundleCopy, tmp_path: Path) -> None:
    case = bundle_copy("distilbert_xnnpack")
    fake = tmp_path / "fake.pte"
    fake.write_bytes(b"\0" * 64)
    edit_json(case.path / "run.json", model_sha256=sha256_file(fake))
    with pytest.raises(AnalysisError, match="not an ExecuTorch program"):
        analyze_bundle(case.path, pte=fake)
