"""Where accuracy goes, end to end on the local board: `fab deploy-and-profile --numerics` on a hand-built model with
one layer made to break int8 (its input holds one huge channel, which a dynamic int8 scale keeps while every other
channel rounds to zero, and its weights read only those others). The numerics pass runs after the timing pass, the
analysis names that layer and its source line as the one that introduced the loss, inside the XNNPACK delegate, and
paints it in Model Explorer's overlays (the .pte's delegate node and the .pt2's node) and on the dashboard's run page
(Chromium); the fp32 program's operators stay near fp32's own rounding. The board files' checks are tests/results/
test_numerics_records.py; the runner's statistics against numpy, tests/board/test_runner_numerics.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from orchestrator.boards.inventory import Board
from orchestrator.paths import PROJECT_ROOT
from orchestrator.results.bundle import BOARD_FILES, COUNTERS_FILES, ENERGY_FILES
from orchestrator.servers.dashboard.app import Sources, start_dashboard
from orchestrator.tensorfile import read_tensors
from tests.lowering.test_factory import write_factory
from tests.plugins.boards import write_inventory
from tests.plugins.explorer import free_port
from tests.servers.test_dashboard_browser import Watched

FRAGILE = """
import torch


class Fragile(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.spread = torch.nn.Linear(32, 32)
        self.register_buffer("spike", torch.cat([torch.full((1,), 1.0e4), torch.ones(31)]))
        self.fragile = torch.nn.Linear(32, 32)
        self.head = torch.nn.Linear(32, 8)
        with torch.no_grad():
            self.fragile.weight[:, 0] = 0.0  # it reads only the channels the spike's scale crushes

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        spread = torch.tanh(self.spread(features)) * self.spike
        crushed = self.fragile(spread)
        return self.head(torch.relu(crushed))


def build():
    torch.manual_seed(0)
    return Fragile(), {"features": torch.randn(1, 32)}
"""
# A layer whose outputs (about 1e-5) sit below the smallest scale int8-static's observers allow (2^-12): all zeros,
# as every layer of a random-weight MobileNetV2 past a dozen blocks.
FAINT = """
import torch


class Faint(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.loud = torch.nn.Linear(16, 16)
        self.faint = torch.nn.Linear(16, 16)
        self.head = torch.nn.Linear(16, 4)
        with torch.no_grad():
            self.faint.weight.mul_(1.0e-5)
            self.faint.bias.zero_()

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        quiet = self.faint(torch.relu(self.loud(features)))
        return self.head(quiet)


def build():
    torch.manual_seed(0)
    return Faint(), {"features": torch.randn(1, 16)}
"""
FRAGILE_LINE = next(number for number, line in enumerate(FRAGILE.splitlines(), 1) if "self.fragile(spread)" in line)


@dataclass(frozen=True)
class Deployed:
    run: Path  # the pulled run's folder
    summary: dict[str, Any]
    numerics: dict[str, Any]  # analysis/numerics.json
    said: str  # what `fab analyze` of the run said
    runs: dict[str, Path]  # every variant's run folder
    env: dict[str, str]
    deployed: str  # what `fab deploy-and-profile` said


def deploy(board: Board, tmp_path: Path, *chosen: str, code: int = 0, model: str = FRAGILE) -> Deployed:
    """deploy-and-profile --numerics of `model` (a factory) on the local board (exit `code`), then `fab analyze`."""
    spec = write_factory(tmp_path, model)
    inventory = write_inventory(tmp_path / "inventory.yaml", [board])
    results = tmp_path / "results"
    env = {**os.environ, "ETLAB_ARTIFACTS": str(tmp_path / "artifacts"), "ETLAB_RESULTS": str(results),
           "ETLAB_WIDTH": "400"}  # fmt: skip
    proc = subprocess.run(
        [sys.executable, "-m", "fabric", "deploy-and-profile", "--spec", str(spec), "--trust-code", "--board",
         "local", "--backend", "xnnpack", "--iterations", "2", "--warmup", "1", "--no-explore", "--inventory",
         str(inventory), "--numerics", *chosen],
        cwd=PROJECT_ROOT, env=env, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    said = proc.stdout + proc.stderr
    assert proc.returncode == code, said
    runs = {path.parent.parent.name: path.parent for path in results.glob("local/my-small/*/*/result_manifest.json")}
    run = runs[f"xnnpack-{chosen[-1].split(',')[-1]}" if chosen else "xnnpack"]
    summary = json.loads((run / "analysis" / "summary.json").read_text())
    numerics = json.loads((run / "analysis" / "numerics.json").read_text())
    run_record = json.loads((run / "run.json").read_text())
    assert run_record["numerics_pass"]["status"] == "ok", run_record["numerics_pass"]
    # the timing pass ran the program it was given, the numerics pass its own
    assert run_record["runner_argv"][2] != run_record["numerics_pass"]["argv"][2]
    analyzed = subprocess.run(
        [sys.executable, "-m", "fabric", "analyze", "--bundle", str(run)],
        cwd=PROJECT_ROOT, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    return Deployed(run, summary, numerics, analyzed.stdout + analyzed.stderr, runs, env, said)


def test_the_layer_that_breaks_int8_is_named_with_its_source_line(
    local_board: Board, tmp_path: Path, browser_page: Any
) -> None:
    # the accuracy gate fails (exit 1), as it should for this model; the numerics say where
    deployed = deploy(local_board, tmp_path, "--quantize", "none,int8-dynamic", code=1)
    summary, numerics, said = deployed.summary, deployed.numerics, deployed.said
    result = summary["numerics"]
    assert result["status"] == "ok" and result["taps"] == len(numerics["operators"]) >= 5
    worst = result["losing_most"][0]
    assert worst["op"] == "aten.linear" and worst["module"] == "fragile", result["losing_most"]
    assert worst["source"] == f"small.py:{FRAGILE_LINE}"
    assert worst["introduced_db"] < 10 and worst["introduced_share"] > 0.9, worst  # the crushed channels: gone
    by_module = {row["module"]: row for row in numerics["operators"] if row["op"] == "aten.linear"}
    # before the spike, the dynamic int8 linear keeps its accuracy; the loss starts at the layer that reads it
    assert by_module["spread"]["sqnr_db"] > 25 > by_module["fragile"]["sqnr_db"], by_module
    assert by_module["head"]["introduced_db"] > worst["introduced_db"]
    assert "Where accuracy goes" in said and "fragile" in said
    # deploy-and-profile says it in one line, with where the rest is
    one_line = " ".join(deployed.deployed.split())
    assert f"the most error added: aten.linear in fragile at small.py:{FRAGILE_LINE}" in one_line
    # Model Explorer: red where the error was added, on the delegate's XNNPACK node and on the .pt2's own node
    overlays = deployed.run / "model_explorer"
    index = json.loads((overlays / "overlays.json").read_text())
    assert index["metrics"]["introduced_db"] == "me_overlay_introduced_db.json"
    painted = json.loads((overlays / "me_overlay_introduced_db.json").read_text())
    (delegate,) = [graph for graph in painted if "::" in graph]  # the one XNNPACK delegate
    values = [result["value"] for result in painted[delegate]["results"].values()]
    assert min(values) == pytest.approx(worst["introduced_db"], abs=0.01) and len(values) >= 3
    on_pt2 = json.loads((overlays / index["exported_program"]["overlays"]["introduced_db"]).read_text())
    assert on_pt2["graph"]["results"][worst["node"]]["value"] == pytest.approx(worst["introduced_db"], abs=0.01)
    # the dashboard's run page, in Chromium
    sources = Sources(deployed.run.parents[3], None, tmp_path / "artifacts", ("local",))
    server = start_dashboard(sources, port=free_port(), explorer_port=free_port())
    try:
        watched = Watched(browser_page)
        watched.open(server.url + f"run/{summary['run_id']}")
        section = browser_page.locator("#numerics").inner_text()
        assert "Where accuracy goes" in section and "fragile" in section and f"small.py:{FRAGILE_LINE}" in section
        watched.check()
    finally:
        server.stop()
    keeping_the_fragile_layer_float_wins_the_accuracy_back(deployed, summary["run_id"], tmp_path)


def keeping_the_fragile_layer_float_wins_the_accuracy_back(deployed: Deployed, run_id: str, tmp_path: Path) -> None:
    """The advisor proposes keeping that layer in float with the SQNR it predicts; `--try` measures it on the board
    beside the int8 and fp32 programs, and the speed/accuracy table says how to adopt each."""
    inventory = str(tmp_path / "inventory.yaml")
    advised = subprocess.run(
        [sys.executable, "-m", "fabric", "advise", "--run", run_id, "--try", "--board", "local", "--inventory",
         inventory, "--rounds", "5", "--retest-seconds", "1", "--trust-code"],
        cwd=PROJECT_ROOT, env=deployed.env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    said = " ".join((advised.stdout + advised.stderr).split())
    assert advised.returncode == 0, said
    advice = json.loads((deployed.run / "analysis" / "advice.json").read_text())
    (finding,) = [finding for finding in advice["findings"] if finding["kind"] == "keep-float"]
    assert finding["keep_float"] == ["fragile"] and finding["gate_failed"] and finding["id"] == "F1"
    assert finding["predicted_sqnr_db"] > finding["sqnr_db"] + 20, finding
    assert "--quantize int8-dynamic --keep-float fragile" in finding["fix"]
    trial = json.loads((deployed.run / "analysis" / "advice_trial.json").read_text())
    by_change = {(tuple(v["keep_float"]), v["backend"]): v for v in trial["variants"]}
    kept, fp32 = by_change[(("fragile",), None)], by_change[((), "xnnpack")]
    # measured on the board: the layer kept float wins back about what was predicted; fp32 is fp32
    assert kept["sqnr_db"] > trial["original_sqnr_db"] + 20 and kept["sqnr_db"] > 30, (kept, trial)
    assert abs(kept["sqnr_db"] - finding["predicted_sqnr_db"]) < 10, (kept, finding)
    assert fp32["sqnr_db"] > 100
    # the most accurate program is always on the front; the int8 one at 5 dB is never the only point there
    front = {(point["name"], point["backend"]) for point in trial["pareto_front"]}
    assert ("my-small", "xnnpack") in front and len(trial["pareto_front"]) >= 1
    assert "Speed against accuracy" in said and "--keep-float" in said.split("Speed against accuracy")[1], said


def test_fp32_stays_at_fp32_rounding_through_lower_run_pull(local_board: Board, tmp_path: Path) -> None:
    """The step by step path: `fab lower`, `fab run --numerics=full`, `fab pull`, `fab analyze`."""
    spec = str(write_factory(tmp_path, FRAGILE))
    inventory = str(write_inventory(tmp_path / "inventory.yaml", [local_board]))
    env = {**os.environ, "ETLAB_ARTIFACTS": str(tmp_path / "artifacts"), "ETLAB_RESULTS": str(tmp_path / "results")}
    for step in (
        ["lower", "--spec", spec, "--trust-code", "--backend", "xnnpack"],
        ["run", "--spec", spec, "--board", "local", "--inventory", inventory, "--iterations", "2", "--numerics=full"],
        ["pull", "--board", "local", "--inventory", inventory, "--latest"],
        ["analyze", "--latest"],
    ):
        proc = subprocess.run(
            [sys.executable, "-m", "fabric", *step], cwd=PROJECT_ROOT, env=env, capture_output=True, text=True,
            timeout=600,
        )  # fmt: skip
        assert proc.returncode == 0, (step, proc.stdout + proc.stderr)
    (run,) = [path.parent for path in (tmp_path / "results").glob("local/my-small/xnnpack/*/result_manifest.json")]
    summary = json.loads((run / "analysis" / "summary.json").read_text())
    numerics = json.loads((run / "analysis" / "numerics.json").read_text())
    assert summary["numerics"]["status"] == "ok" and summary["numerics"]["mode"] == "full"
    assert min(row["sqnr_db"] for row in numerics["operators"]) > 80, numerics["operators"]
    assert all(value > 80 for value in summary["numerics"]["output_sqnr_db"])
    assert summary["numerics"]["collapse"] is None and summary["numerics"]["nonfinite"] is None
    # --numerics=full: the tensors too, every one (far under the cap), and every file is one a pull accepts
    assert {path.name for path in run.iterdir() if path.is_file()} == BOARD_FILES - COUNTERS_FILES - ENERGY_FILES
    kept = read_tensors(run / "numerics_tensors.etlt")
    assert [tensor.name for tensor in kept] == [f"output_{i}" for i in range(1 + len(numerics["operators"]))]


def test_a_calibration_that_floors_names_the_first_layer_that_collapses(local_board: Board, tmp_path: Path) -> None:
    # the head's bias carries the output through the accuracy gate (exit 0): only the numerics see the zeros
    deployed = deploy(local_board, tmp_path, "--quantize", "none,int8-static", model=FAINT)
    collapse = deployed.summary["numerics"]["collapse"]
    line = next(number for number, text in enumerate(FAINT.splitlines(), 1) if "self.faint(" in text)
    assert collapse is not None and collapse["module"] == "faint" and collapse["source"] == f"small.py:{line}"
    by_module = {row["module"]: row for row in deployed.numerics["operators"]}
    assert not by_module["loud"]["collapsed"] and by_module["faint"]["collapsed"]
    assert by_module["loud"]["dtype"] == "int8"  # measured as the int8 values the next layer reads
    assert "the first layer that collapses" in deployed.said and "faint" in deployed.said
    # fp32 against int8-static: the first operator where they part ways is the first one int8 rounds
    compared = subprocess.run(
        [sys.executable, "-m", "fabric", "compare", deployed.runs["xnnpack"].name, deployed.run.name, "--numerics"],
        cwd=PROJECT_ROOT, env=deployed.env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    said = compared.stdout + compared.stderr
    assert compared.returncode == 0, said
    # int8 measures the linear with the relu it is fused with: named by the linear's module
    assert "first divergence: aten.relu (with linear before it) in loud" in " ".join(said.split()), said
    same = subprocess.run(
        [sys.executable, "-m", "fabric", "compare", deployed.run.name, deployed.run.name, "--numerics"],
        cwd=PROJECT_ROOT, env=deployed.env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert same.returncode == 0 and "the runs agree" in same.stdout + same.stderr
    refused = subprocess.run(
        [sys.executable, "-m", "fabric", "compare", deployed.run.name, deployed.run.name, "--numerics", "--interleave",
         "6"],
        cwd=PROJECT_ROOT, env=deployed.env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert refused.returncode == 64 and "--numerics" in refused.stderr
