"""A board's PMIC readings (issue 55): the agent's parse of `vcgencmd pmic_read_adc` (board/agent/etlab_agent/
energy.py) and the workstation's check of energy.json (results/energy.py), each malformed or hostile record refused
with 65 naming its field. End to end on the local board with a fake vcgencmd: tests/e2e/test_energy_e2e.py."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from orchestrator.errors import AnalysisError
from orchestrator.results.energy import energy_summary, read_energy
from tests.e2e.test_energy_e2e import PMIC, WATTS, fake_vcgencmd
from tests.plugins.agent import AGENT_DIR

sys.path.insert(0, str(AGENT_DIR))
from etlab_agent import energy as agent_energy


def test_the_agent_reads_the_rails_that_have_both_a_current_and_a_voltage(tmp_path: Path) -> None:
    rails = agent_energy.read_rails(PMIC + "garbage line\nVDD_CORE_A volt(3)=1.0V\n")  # a unit that does not match
    assert set(rails) == {"3V7_WL_SW", "3V3_SYS", "VDD_CORE", "EXT5V"} and rails["EXT5V"] == {"V": 5.15}
    sample = agent_energy.sample_once(str(fake_vcgencmd(tmp_path, PMIC)))
    assert sample == {"watts": pytest.approx(WATTS), "rails": 3, "error": None}


@pytest.mark.parametrize(
    ("pmic", "said"),
    [
        (PMIC.replace("current(7)=2.10000000A", "current(7)=nanA"), "not a finite number"),
        ("PMIC busy\n", "no rail with current and volts"),
    ],
)
def test_a_reading_the_agent_cannot_use_is_kept_as_a_failed_sample(tmp_path: Path, pmic: str, said: str) -> None:
    sample = agent_energy.sample_once(str(fake_vcgencmd(tmp_path, pmic)))
    assert sample["watts"] is None and said in sample["error"]


def test_a_board_without_the_command_is_not_sampled(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    tool = tmp_path / "vcgencmd"
    tool.write_text('#!/bin/sh\necho "error=1 error_msg=\\"Command not registered\\"" >&2\nexit 1\n')  # a Pi 4
    tool.chmod(0o755)
    monkeypatch.setenv("ETLAB_AGENT_VCGENCMD", str(tool))
    sampler = agent_energy.EnergySampler().start()
    sampler.stop()
    record = sampler.record()
    assert record["status"] == "not measured" and "Command not registered" in record["why"]
    sampler.write(tmp_path)
    assert not (tmp_path / "energy.json").exists()


def _energy(tmp_path: Path, samples: list[dict[str, Any]], **fields: Any) -> Path:
    document = {"schema": 1, "source": "vcgencmd pmic_read_adc", "interval_s": 0.25, "executing_from_s": 0.1,
                "ended_s": 2.0, "samples": samples, **fields}  # fmt: skip
    (tmp_path / "energy.json").write_text(json.dumps(document))
    return tmp_path / "energy.json"


GOOD = {"t_s": 0.5, "watts": 4.0, "rails": 3, "error": None}


@pytest.mark.parametrize(
    ("samples", "fields", "named"),
    [
        ([{**GOOD, "watts": -7.9}], {}, "samples[0].watts"),  # a negative current
        ([{**GOOD, "watts": None, "error": "a rail's reading is not a finite number"}], {}, "samples[0].watts"),
        ([GOOD, {**GOOD, "watts": 10_000.0}], {}, "samples[1].watts"),  # 10 kW
        ([{**GOOD, "t_s": 2.0}, {**GOOD, "t_s": 1.0}], {}, "not in order"),
        ([], {}, "samples: none"),
        ([GOOD], {"schema": 2}, "schema"),
        ([{**GOOD, "rails": 0}], {}, "samples[0].rails"),
        ([GOOD], {"interval_s": 0}, "interval_s"),
    ],
)
def test_malformed_energy_records_are_refused_naming_the_field(
    tmp_path: Path, samples: list[dict[str, Any]], fields: dict[str, Any], named: str
) -> None:
    with pytest.raises(AnalysisError) as refused:
        read_energy(_energy(tmp_path, samples, **fields))
    assert refused.value.exit_code == 65 and named in str(refused.value)


def test_joules_come_from_the_samples_while_the_program_executed(tmp_path: Path) -> None:
    samples = [{**GOOD, "t_s": 0.0, "watts": 1.0}, {**GOOD, "t_s": 0.5, "watts": 4.0}, {**GOOD, "t_s": 1.0,
               "watts": 6.0}, {**GOOD, "t_s": 2.5, "watts": 1.5}]  # fmt: skip
    _energy(tmp_path, samples)  # executing from 0.1 s to 2.0 s: the 4 W and 6 W samples
    measured = energy_summary(tmp_path, {"energy": {"status": "measured"}}, median_ms=200.0, decode_tokens_per_s=None)
    assert measured is not None and measured.samples == 2 and measured.mean_watts == pytest.approx(5.0)
    assert measured.joules_per_inference == pytest.approx(1.0) and measured.joules_per_token is None
    generation = energy_summary(tmp_path, {"energy": {"status": "measured"}}, 900.0, decode_tokens_per_s=50.0)
    assert generation is not None and generation.joules_per_token == pytest.approx(0.1)
    said = energy_summary(tmp_path, {"energy": {"status": "not measured", "why": "no vcgencmd on this board"}}, 1, 1)
    assert said is not None and said.status == "not measured" and said.mean_watts is None
    assert energy_summary(tmp_path, {}, 1.0, None) is None  # a bundle from before energy was recorded
