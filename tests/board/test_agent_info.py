"""The board agent's `info`: the documented schema, parsed from this machine and from captured Raspberry Pi and
multi-cluster samples, the throttled bits, and probe outputs it cannot parse."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.board.agent_helpers import assert_info_schema
from tests.plugins.agent import AGENT_DIR, AgentCli

sys.path.insert(0, str(AGENT_DIR))
from etlab_agent import info as agent_info

NO_FLAGS = dict.fromkeys(agent_info.THROTTLED_BITS.values(), False)

# ---------------------------------------------------------------------------------------------------- info


def test_info_on_this_machine_has_the_documented_schema(agent: AgentCli) -> None:
    result = agent.run("info")
    assert result.returncode == 0, result.stderr
    document = result.document
    assert_info_schema(document)
    assert document["python"].count(".") == 2
    assert document["cores_online"] >= 1
    assert document["memory"]["total_kb"] > 0
    assert document["state"] is None and document["runner"] is None and document["lock_holder"] is None


def test_info_parses_a_throttled_raspberry_pi_4(agent: AgentCli, board_sample_env: Callable) -> None:
    result = agent.run("info", env=board_sample_env("rpi4"))
    assert result.returncode == 0, result.stderr
    document = result.document
    assert_info_schema(document)
    assert document["model"] == "Raspberry Pi 4 Model B Rev 1.4"  # trailing NUL stripped
    assert document["cores_online"] == 4
    assert document["cpufreq"] == [
        {
            "policy": "policy0",
            "cpus": [0, 1, 2, 3],
            "cur_khz": 600000,
            "min_khz": 600000,
            "max_khz": 1800000,
            "hw_max_khz": 1800000,
            "governor": "ondemand",
        }
    ]
    assert document["governor"] == "ondemand"
    assert document["temperature_c"] == pytest.approx(81.768)
    assert document["temperature_zone"] == "cpu-thermal"
    assert document["vcgencmd_temp_c"] == pytest.approx(81.8)
    # 0x50005: under-voltage now, throttled now, and both have occurred.
    throttled = document["throttled"]
    assert throttled["raw"] == "0x50005" and throttled["value"] == 0x50005
    assert throttled["flags"] == dict(
        NO_FLAGS, under_voltage_now=True, throttled_now=True, under_voltage_occurred=True, throttling_occurred=True
    )
    assert throttled["active"] == [
        "under_voltage_now",
        "throttled_now",
        "under_voltage_occurred",
        "throttling_occurred",
    ]
    assert document["memory"] == {"total_kb": 3884332, "available_kb": 3391256}
    assert document["os_release"] == "Debian GNU/Linux 11 (bullseye)"
    assert document["kernel"] == "6.1.21-v8+"
    # The core from MIDR, AES from AT_HWCAP: a Pi 4's Cortex-A72 has no AES instructions.
    assert document["cpu"] == {"core": "Cortex-A72", "midr": "0x410fd083", "hwcap": "0x887", "aes": False}


def test_info_parses_a_healthy_raspberry_pi_5(agent: AgentCli, board_sample_env: Callable) -> None:
    document = agent.run("info", env=board_sample_env("rpi5")).document
    assert document["model"] == "Raspberry Pi 5 Model B Rev 1.0"
    assert document["cpufreq"][0]["max_khz"] == 2400000
    assert document["cpufreq"][0]["cur_khz"] == 2400000
    assert document["temperature_c"] == pytest.approx(48.3)
    assert document["vcgencmd_temp_c"] == pytest.approx(48.3)
    assert document["throttled"]["value"] == 0
    assert document["throttled"]["flags"] == NO_FLAGS and document["throttled"]["active"] == []
    assert document["memory"]["total_kb"] == 8245936
    assert document["os_release"] == "Debian GNU/Linux 12 (bookworm)"


FIRMWARE = "2024/09/23 14:02:56 \nCopyright (c) 2012 Raspberry Pi\nversion 8c3fcd1e (release) (embedded)\n"


def test_info_records_the_firmware_and_config_txt_a_result_depends_on(
    agent: AgentCli, board_sample_env: Callable, tmp_path: Path
) -> None:
    """`vcgencmd version` (as the firmware prints it) and config.txt's digest, so a nightly and `compare` can say
    that one changed between two results; on the Pi 5 sample with a config.txt and a firmware of its own."""
    import hashlib
    import shutil

    env = board_sample_env("rpi5")
    sysroot = tmp_path / "sysroot"
    shutil.copytree(env["ETLAB_AGENT_SYSROOT"], sysroot)
    config = sysroot / "boot/firmware/config.txt"
    config.parent.mkdir(parents=True)
    config.write_text("arm_boost=1\ndtparam=audio=on\n")
    answers = tmp_path / "answers"
    answers.mkdir()
    (answers / "version.txt").write_text(FIRMWARE)
    vcgencmd = tmp_path / "vcgencmd"
    vcgencmd.write_text(f'#!/bin/sh\ncat {answers}/"$1".txt 2>/dev/null || exit 1\n')
    vcgencmd.chmod(0o755)
    document = agent.run("info", env={**env, "ETLAB_AGENT_SYSROOT": str(sysroot),
                                      "ETLAB_AGENT_VCGENCMD": str(vcgencmd)}).document  # fmt: skip
    assert document["firmware"] == "2024/09/23 14:02:56; version 8c3fcd1e (release) (embedded)"
    sha256 = hashlib.sha256(config.read_bytes()).hexdigest()
    assert document["config_txt"] == {"path": "/boot/firmware/config.txt", "sha256": sha256}
    bare = agent.run("info", env=env).document  # the captured sample: neither
    assert bare["firmware"] is None and bare["config_txt"] is None


def test_info_parses_a_multi_cluster_board_without_vcgencmd(agent: AgentCli, board_sample_env: Callable) -> None:
    document = agent.run("info", env=board_sample_env("rk3588")).document
    assert document["model"] == "Radxa ROCK 5 Model B"
    assert document["cores_online"] == 8
    assert [(p["policy"], p["cpus"], p["max_khz"]) for p in document["cpufreq"]] == [
        ("policy0", [0, 1, 2, 3], 1800000),
        ("policy4", [4, 5], 2400000),
        ("policy6", [6, 7], 2400000),
    ]
    assert document["governor"] == "schedutil"
    assert len(document["thermal_zones"]) == 7
    assert document["temperature_zone"] == "soc-thermal"
    assert document["temperature_c"] == pytest.approx(43.49)
    assert document["throttled"] is None and document["vcgencmd_temp_c"] is None


def test_info_with_nothing_to_read_gives_nulls_not_a_crash(agent: AgentCli, tmp_path: Path) -> None:
    empty = tmp_path / "empty-sysroot"
    empty.mkdir()
    broken_vcgencmd = tmp_path / "vcgencmd"
    broken_vcgencmd.write_text("#!/bin/sh\necho 'garbage output'\n")
    broken_vcgencmd.chmod(0o755)
    result = agent.run("info", env={"ETLAB_AGENT_SYSROOT": str(empty), "ETLAB_AGENT_VCGENCMD": str(broken_vcgencmd)})
    assert result.returncode == 0, result.stderr
    document = result.document
    assert_info_schema(document)
    for key in ("model", "cores_online", "governor", "temperature_c", "throttled", "vcgencmd_temp_c", "os_release"):
        assert document[key] is None, key
    assert document["cpufreq"] == [] and document["thermal_zones"] == []
    assert document["memory"] == {"total_kb": None, "available_kb": None}


@pytest.mark.parametrize(
    ("text", "active"),
    [
        ("throttled=0x1", ["under_voltage_now"]),
        ("throttled=0x2", ["arm_frequency_capped_now"]),
        ("throttled=0x4", ["throttled_now"]),
        ("throttled=0x8", ["soft_temperature_limit_now"]),
        ("throttled=0x10000", ["under_voltage_occurred"]),
        ("throttled=0x20000", ["arm_frequency_capping_occurred"]),
        ("throttled=0x40000", ["throttling_occurred"]),
        ("throttled=0x80000", ["soft_temperature_limit_occurred"]),
        (
            "throttled=0xe0000",
            ["arm_frequency_capping_occurred", "throttling_occurred", "soft_temperature_limit_occurred"],
        ),
    ],
)
def test_each_documented_throttled_bit(text: str, active: list[str]) -> None:
    parsed = agent_info.parse_throttled(text)
    assert parsed is not None
    assert parsed["active"] == active
    assert [name for name, on in parsed["flags"].items() if on] == active


def test_unparseable_probe_outputs_are_null() -> None:
    assert agent_info.parse_throttled('error=1 error_msg="Command not registered"') is None
    assert agent_info.parse_measure_temp("temp=?") is None
    assert agent_info.parse_cpu_list("0-3,6,8-9") == [0, 1, 2, 3, 6, 8, 9]
    assert agent_info.parse_cpu_list("x-y") is None
