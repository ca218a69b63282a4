"""Energy per inference and per token (issue 55), end to end on the local board: the board agent samples the PMIC
(`vcgencmd pmic_read_adc`) while the runner runs. This machine has no PMIC, so the agent is pointed at a fake
`vcgencmd` that prints the documented format (rail currents and voltages, one a line); a board without one says
"not measured", never 0. Malformed readings (a negative current, NaN, 10 kW) are refused with 65 and the raw
bundle is kept."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.boards.inventory import Board
from orchestrator.paths import PROJECT_ROOT
from tests.plugins.artifacts import ARTIFACT_CACHE
from tests.plugins.boards import write_inventory

# A Pi 5 under load, as `vcgencmd pmic_read_adc` prints it: EXT5V has a voltage and no current (not metered)
PMIC = """\
   3V7_WL_SW_A current(0)=0.00390372A
     3V3_SYS_A current(1)=0.05660400A
    VDD_CORE_A current(7)=2.10000000A
   3V7_WL_SW_V volt(8)=3.71000000V
     3V3_SYS_V volt(9)=3.31000000V
    VDD_CORE_V volt(15)=0.89000000V
       EXT5V_V volt(24)=5.15000000V
"""
WATTS = 0.00390372 * 3.71 + 0.056604 * 3.31 + 2.1 * 0.89


def fake_vcgencmd(folder: Path, pmic: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "pmic.txt").write_text(pmic)
    tool = folder / "vcgencmd"
    tool.write_text(
        f'#!/bin/sh\ncase "$1" in\n  pmic_read_adc) cat {folder / "pmic.txt"} ;;\n'
        '  *) echo "vcgencmd: unsupported command $1" >&2; exit 1 ;;\nesac\n'
    )
    tool.chmod(0o755)
    return tool


def deploy(board: Board, tmp_path: Path, model: str, vcgencmd: Path | None) -> tuple[int, str, Path]:
    inventory = write_inventory(tmp_path / "inventory.yaml", [board])
    env = {**os.environ, "ETLAB_ARTIFACTS": str(ARTIFACT_CACHE), "ETLAB_RESULTS": str(tmp_path / "results"),
           "ETLAB_WIDTH": "400"}  # fmt: skip
    if vcgencmd is not None:
        env["ETLAB_AGENT_VCGENCMD"] = str(vcgencmd)
    proc = subprocess.run(
        [sys.executable, "-m", "fabric", "deploy-and-profile", "--model", model, "--backend", "xnnpack", "--board",
         "local", "--inventory", str(inventory), "--iterations", "40", "--warmup", "1", "--no-explore"],
        cwd=PROJECT_ROOT, env=env, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    (run,) = [m.parent for m in (tmp_path / "results").glob(f"local/{model}/xnnpack/*/run.json")]
    return proc.returncode, " ".join((proc.stdout + proc.stderr).split()), run


@pytest.mark.parametrize("model", ["distilbert-tiny", "smollm2-gen-tiny"])
def test_joules_per_inference_and_per_token_from_the_pmic(
    local_board: Board, tmp_path: Path, tiny_artifacts: object, model: str
) -> None:
    code, said, run = deploy(local_board, tmp_path, model, fake_vcgencmd(tmp_path / "pmic", PMIC))
    assert code == 0, said
    recorded = json.loads((run / "run.json").read_text())["energy"]
    assert recorded["status"] == "measured" and recorded["samples"] >= 1
    samples = json.loads((run / "energy.json").read_text())["samples"]
    assert all(sample["watts"] == pytest.approx(WATTS) and sample["rails"] == 3 for sample in samples)
    summary = json.loads((run / "analysis" / "summary.json").read_text())
    energy = summary["energy"]
    assert energy["status"] == "measured" and energy["mean_watts"] == pytest.approx(WATTS)
    median_ms = summary["latency"]["warm"]["median_ms"]
    assert energy["joules_per_inference"] == pytest.approx(WATTS * median_ms / 1000)
    if model == "smollm2-gen-tiny":
        rate = summary["generation"]["decode_tokens_per_s"]
        assert energy["joules_per_token"] == pytest.approx(WATTS / rate)
        assert "mJ per token" in said
    else:
        assert energy["joules_per_token"] is None and "J per inference" in said
    assert f"energy of {model}/xnnpack on local: {WATTS:.2f} W" in said


def test_a_board_without_a_pmic_says_not_measured(local_board: Board, tmp_path: Path, tiny_artifacts: object) -> None:
    code, said, run = deploy(local_board, tmp_path, "distilbert-tiny", tmp_path / "no-such-vcgencmd")
    assert code == 0, said
    assert not (run / "energy.json").exists()
    energy = json.loads((run / "analysis" / "summary.json").read_text())["energy"]
    assert energy == {"status": "not measured", "why": "no vcgencmd on this board", "source": None, "samples": 0,
                      "mean_watts": None, "joules_per_inference": None, "joules_per_token": None}  # fmt: skip
    assert "energy of" not in said  # no line of zeros for a board that cannot measure


def test_a_malformed_pmic_reading_is_refused_and_the_bundle_kept(
    local_board: Board, tmp_path: Path, tiny_artifacts: object
) -> None:
    """A reading of 10 kW (the other malformed readings: tests/results/test_energy.py, at the file's level)."""
    absurd = PMIC.replace("current(7)=2.10000000A", "current(7)=2000.0A")
    code, said, run = deploy(local_board, tmp_path, "distilbert-tiny", fake_vcgencmd(tmp_path / "pmic", absurd))
    assert code == 65, said
    assert "energy.json: samples[0].watts" in said and "Traceback" not in said
    assert (run / "energy.json").is_file() and (run / "etdump.etdp").is_file()  # the raw bundle is kept
