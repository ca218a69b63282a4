"""A program's source map read back and laid on a run of the native runner on the local board
(orchestrator/results/source_map.py, results/modules.py): ops.json's rows and XNNPACK nodes gain their module and
line, summary.json the time by module; a damaged or inconsistent map is refused by name (exit 65, no traceback), a
program without one analysed without them, said once. The map's writing is tests/lowering/test_source_map.py; a
factory model's modules ranked on the local board, tests/e2e/test_source_map_e2e.py."""

from __future__ import annotations

import csv
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.commands.render import render_modules
from orchestrator.errors import AnalysisError
from orchestrator.paths import PROJECT_ROOT
from orchestrator.results.analysis import analyze_bundle
from orchestrator.results.modules import ModuleRow, rolled_up, shown_delegated_ms, shown_ms
from orchestrator.results.ops_record import load_ops
from orchestrator.results.source_map import SourceMapError
from tests.plugins.analysis import BundleCase, BundleCopy, analyze, copy_bundle
from tests.plugins.artifacts import ARTIFACT_CACHE

MAP = "distilbert-tiny_xnnpack.sources.json"


@pytest.fixture
def xnnpack_run(runner_bundles: dict[str, BundleCase], tmp_path: Path) -> BundleCase:
    return copy_bundle(runner_bundles["runner_distilbert_xnnpack"], tmp_path / "run")


def test_every_timed_row_of_a_real_run_gets_its_module(xnnpack_run: BundleCase) -> None:
    summary = analyze(xnnpack_run)
    ops = load_ops(xnnpack_run.path)
    kernels = [row for row in ops.kernel_calls() if row.samples]
    assert kernels and all(row.module is not None and row.source for row in kernels)
    assert any(row.module == "distilbert.embeddings.LayerNorm" for row in kernels)  # a portable layer norm
    nodes = [node for delegate in ops.delegates for node in delegate.nodes]
    assert nodes and sum(node.module is not None for node in nodes) >= 0.9 * len(nodes)
    assert {"distilbert.transformer.layer.0.attention.q_lin", "vocab_projector"} <= {node.module for node in nodes}
    fc = next(node for node in nodes if node.module == "vocab_projector")
    assert fc.type == "XNNFullyConnected" and fc.module_type == "torch.nn.modules.linear.Linear"
    vocab = xnnpack_run.model.sidecar.outputs[0].shape[-1]
    assert fc.shape == (1, 128, vocab), fc.shape  # the head's output dims, read from the delegate's graph
    rows = list(csv.DictReader((xnnpack_run.path / "analysis" / "ops.csv").open()))
    assert any(row["module"] == "distilbert.embeddings.LayerNorm" and "normalization" in row["module_type"]
               for row in rows)  # fmt: skip
    assert any(row["source"].startswith("modeling_distilbert.py:") for row in rows)
    written = json.loads((xnnpack_run.path / "analysis" / "ops.json").read_text())
    fused = [node for delegate in written["delegates"] for node in delegate["fused_nodes"]]
    assert all(node["module"] is not None for node in fused), fused  # nodes that timed nothing are traced too
    tree = json.loads((xnnpack_run.path / "analysis" / "summary.json").read_text())["modules"]
    assert tree["attributed_share"] >= 0.95, tree["attributed_share"]
    by_name = {row["module"]: row for row in tree["modules"]}
    layers = [by_name[f"distilbert.transformer.layer.{n}"] for n in (0, 1)]
    assert all(layer["delegated_ms"] > 0 and layer["total_ms"] >= layer["self_ms"] for layer in layers)
    assert by_name["distilbert.transformer.layer.0.ffn"]["module_type"].endswith(".FFN")  # no rows of its own
    # a parent holds its children's time
    assert by_name["distilbert.transformer"]["total_ms"] >= sum(layer["total_ms"] for layer in layers) * 0.999
    assert summary.notes == []


def _children(row: ModuleRow, rows: tuple[ModuleRow, ...]) -> list[ModuleRow]:
    return [child for child in rows if child.depth == row.depth + 1 and child.module.startswith(row.module + ".")]


def test_the_time_by_module_adds_up_to_the_median_at_every_depth(
    bundle_copy: BundleCopy, capsys: pytest.CaptureFixture[str]
) -> None:
    """Each row of `--by module[:DEPTH]`, self or total, says its delegated and not-delegated time (the LM head runs
    wholly inside XNNPACK: once "—" where it was a module's own time), and the rows add up to the run's median at any
    depth, with the time on no module and the runtime around the instructions."""
    case = bundle_copy("distilbert_xnnpack")  # 6 iterations: the median is between two executions
    run = analyze(case).run
    tree = run.modules
    assert tree is not None and run.latency.warm is not None and tree.median_ms is not None
    median = run.latency.warm.median_ms
    assert tree.median_ms == pytest.approx(median) and " of 6, at the median" in str(tree.executions)
    assert " and " in str(tree.executions)  # the middle two
    assert tree.unattributed_ms is not None and tree.outside_ms is not None and tree.outside_ms >= 0
    for row in tree.modules:  # a parent's total is its self and its children's totals, delegated parts too
        children = _children(row, tree.modules)
        assert row.total_ms == pytest.approx(row.self_ms + sum(child.total_ms for child in children)), row.module
        assert row.self_delegated_ms is not None
        delegated = row.self_delegated_ms + sum(child.delegated_ms for child in children)
        assert row.delegated_ms == pytest.approx(delegated), row.module
    head = next(row for row in tree.modules if row.module == "vocab_projector")
    assert head.self_ms == head.total_ms == head.self_delegated_ms == head.delegated_ms > 0
    for depth in (None, 1, 4):
        rows = rolled_up(tree, depth)
        assert all(shown_delegated_ms(row, depth) is not None for row in rows)
        modules = sum(shown_ms(row, depth) for row in rows)
        assert modules + tree.unattributed_ms + tree.outside_ms == pytest.approx(median), depth
    for depth in (1, 4):  # what the terminal shows: every row's figures, adding up to the median within rounding
        render_modules(run, depth, limit=8)
        table = capsys.readouterr().out
        cells = [[cell.strip() for cell in line.split("│")[1:-1]] for line in table.splitlines() if "│" in line]
        assert cells and all(len(row) == 7 and row[5] != "—" and row[6] != "—" for row in cells), table
        shown = [float(row[3]) for row in cells if row[3]]  # a module folded on two lines: its figures on the first
        assert sum(shown) == pytest.approx(median, abs=0.0005 * len(shown)), table
        (projector,) = [row for row in cells if row[0] == "vocab_projector"]
        assert projector[2] == ("total" if depth == 1 else "self") and float(projector[5]) == float(projector[3])
        assert f"add up to the run's median, {median:.3f} ms" in " ".join(table.split())


def fab_analyze(bundle: Path, artifacts: Path, *options: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "ETLAB_ARTIFACTS": str(artifacts), "ETLAB_RESULTS": str(bundle.parents[3])}
    return subprocess.run(
        [sys.executable, "-m", "fabric", "analyze", "--bundle", str(bundle), *options],
        cwd=PROJECT_ROOT, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip


def placed_run(runner_bundles: dict[str, BundleCase], tmp_path: Path) -> tuple[Path, Path]:
    """A copy of the run where `fab analyze --bundle` finds its model, and a copy of the model's artifacts."""
    run = copy_bundle(runner_bundles["runner_distilbert_xnnpack"], tmp_path / "results/local/distilbert-tiny/xnnpack/r")
    artifacts = tmp_path / "artifacts"
    shutil.copytree(ARTIFACT_CACHE / "distilbert-tiny", artifacts / "distilbert-tiny")  # copy2: mtimes kept
    return run.path, artifacts


def test_a_damaged_map_is_refused_by_name(runner_bundles: dict[str, BundleCase], tmp_path: Path) -> None:
    run, artifacts = placed_run(runner_bundles, tmp_path)
    shown = fab_analyze(run, artifacts, "--by", "module:4")
    assert shown.returncode == 0, shown.stdout + shown.stderr
    assert "Time by module" in shown.stdout and "TransformerBlock" in shown.stdout and "vocab_projector" in shown.stdout
    assert "traced to a module" in " ".join(shown.stdout.split())  # the caption wraps
    assert "no source map" not in shown.stdout + shown.stderr
    path = artifacts / "distilbert-tiny" / MAP
    data = json.loads(path.read_text())
    data["instructions"][0]["sources"] = ["zero"]
    path.write_text(json.dumps(data))
    damaged = fab_analyze(run, artifacts)
    said = damaged.stdout + damaged.stderr
    assert damaged.returncode == 65 and MAP in said and "Traceback" not in said, said


@pytest.mark.parametrize(
    ("edit", "problem"),
    [
        (lambda data: data["instructions"][0].update(sources=["zero"]), r"instructions\[0\]\.sources\[0\]: expected"),
        (lambda data: data["instructions"][0].update(instruction=100000), "the program has no kernel call 100000"),
        (
            lambda data: data["instructions"][0].update(op="aten::mm.out"),
            r"instructions\[0\]\.op: instruction \d+ calls",
        ),
        (lambda data: data["delegates"][0].update(instruction=data["instructions"][0]["instruction"]), "no delegate"),
        (lambda data: data["delegates"][0]["nodes"][0].update(node=999), "has no node 999"),
        (lambda data: data["instructions"][0].update(sources=[10**6]), "source 1000000 does not exist"),
        (lambda data: data.update(sources=[{"module": 3}]), r"sources\[0\]\.module: expected"),
        (lambda data: data.update(schema=99), "newer etlab"),
        (lambda data: data["sources"][0].update(module="x" * 5000), r"sources\[0\]\.module: expected `str` of length"),
        (lambda data: data.update(method="prefill"), "the map is of method"),
        (lambda data: data["instructions"][0].update(exported=["../x"]), r"instructions\[0\]\.exported\[0\]"),
        (lambda data: data.update(exported_program="../model.pt2"), "exported_program: expected `str` matching"),
    ],
)
def test_an_inconsistent_map_is_refused_with_the_field(
    runner_bundles: dict[str, BundleCase], tmp_path: Path, edit, problem: str
) -> None:
    """A .pte with a map beside it and no sidecar (a program brought along): the map alone is checked."""
    case = copy_bundle(runner_bundles["runner_distilbert_xnnpack"], tmp_path / "run")
    pte = tmp_path / "program" / case.model.pte.name
    pte.parent.mkdir()
    shutil.copy2(case.model.pte, pte)
    data = json.loads((case.model.pte.parent / MAP).read_text())
    edit(data)
    (pte.parent / MAP).write_text(json.dumps(data))
    with pytest.raises(SourceMapError, match=problem) as raised:
        analyze_bundle(case.path, pte=pte, sidecar=None)
    assert MAP in str(raised.value) and isinstance(raised.value, AnalysisError)


def test_without_a_map_the_analysis_says_so_once(runner_bundles: dict[str, BundleCase], tmp_path: Path) -> None:
    run, artifacts = placed_run(runner_bundles, tmp_path)
    sidecar_path = artifacts / "distilbert-tiny" / "distilbert-tiny_xnnpack.json"
    sidecar = json.loads(sidecar_path.read_text())
    del sidecar["files"]["sources"]  # as lowered before maps, or a program brought along
    sidecar_path.write_text(json.dumps(sidecar))
    (artifacts / "distilbert-tiny" / MAP).unlink()
    ran = fab_analyze(run, artifacts, "--by", "module")
    said = ran.stdout + ran.stderr
    assert ran.returncode == 0, said
    assert said.count("no source map") == 1 and "Top operators" in said
    summary = json.loads((run / "analysis" / "summary.json").read_text())
    assert summary["modules"] is None and summary["profile"]["instructions_timed"] > 0
    assert all(row.module is None for row in load_ops(run).instructions)


def test_by_takes_module_or_module_and_a_depth(tmp_path: Path) -> None:
    for wrong in ("modules", "module:0", "module:x", "module:", "op"):
        ran = fab_analyze(tmp_path / "a/b/c/d", tmp_path, "--by", wrong)
        assert ran.returncode == 64 and "--by" in ran.stderr, (wrong, ran.stderr)


def test_the_advisor_says_where_in_the_model(runner_bundles: dict[str, BundleCase], tmp_path: Path) -> None:
    """Each finding about operators names their source lines and modules; a portable operator's names its
    file:line in the model's code, and a fix of kind "code" points at that line."""
    run, artifacts = placed_run(runner_bundles, tmp_path)
    done = fab_analyze(run, artifacts)
    assert done.returncode == 0, done.stdout + done.stderr
    findings = json.loads((run / "analysis" / "advice.json").read_text())["findings"]
    about_operators = [f for f in findings if f["nodes"]]
    assert about_operators and all(f["where"] for f in about_operators), findings
    ops = load_ops(run)
    portable = {row.node_id: row for row in ops.kernel_calls()}
    on_portable = [f for f in about_operators if set(f["nodes"].get(ops.method, ())) & set(portable)]
    assert on_portable, findings
    for finding in on_portable:
        assert any(" at modeling_distilbert.py:" in line for line in finding["where"]), finding["where"]
    said = " ".join((done.stdout + done.stderr).split())
    for finding in (f for f in findings[:3] if f["fix_kind"] == "code" and f["where"]):  # the lines it prints
        line = said.split(f"advice: {finding['id']} ", 1)[1].split("advice:", 1)[0]
        assert " at modeling_distilbert.py:" in line, line
