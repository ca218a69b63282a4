"""The board conditions a result depends on beyond its program (issue 55): the firmware, the kernel and config.txt
recorded with every run (board_info_before.json), and named as a changed condition by `fab compare` and by the
nightly's verdict when they differ between two results."""

from __future__ import annotations

from typing import Any

from orchestrator.lab.judging import changed_conditions
from orchestrator.lab.run_record import RunRecord
from orchestrator.results.validity import board_conditions, condition_changes

INFO: dict[str, Any] = {
    "governor": "ondemand",
    "kernel": "6.6.31+rpt-rpi-2712",
    "firmware": "2024/09/23 14:02:56; version 8c3fcd1e (release) (embedded)",
    "config_txt": {"path": "/boot/firmware/config.txt", "sha256": "a" * 64},
}


def test_what_the_board_ran_on_is_recorded_with_the_result() -> None:
    conditions = board_conditions(INFO, INFO)
    assert conditions["kernel"] == "6.6.31+rpt-rpi-2712" and conditions["firmware"].startswith("2024/09/23")
    assert conditions["config_txt_sha256"] == "a" * 64
    hostile = board_conditions({"kernel": 5, "firmware": ["x"], "config_txt": "not a dict"}, None)
    assert (hostile["kernel"], hostile["firmware"], hostile["config_txt_sha256"]) == (None, None, None)


def test_a_firmware_kernel_or_config_change_is_named() -> None:
    before = board_conditions(INFO, INFO)
    config = {"path": "/boot/firmware/config.txt", "sha256": "b" * 64}
    after = board_conditions({**INFO, "kernel": "6.12.20+rpt-rpi-2712", "config_txt": config}, INFO)
    assert condition_changes(before, before) == []
    assert condition_changes(before, after) == [
        "kernel 6.6.31+rpt-rpi-2712 → 6.12.20+rpt-rpi-2712",
        f"config.txt {'a' * 12} → {'b' * 12}",
    ]
    upgraded = board_conditions({**INFO, "firmware": "2025/01/10 11:00:00; version 1a2b3c4d (release)"}, INFO)
    assert condition_changes(before, upgraded) == [
        "firmware 2024/09/23 14:02:56; version 8c3fcd1e (release) (embedded) → 2025/01/10 11:00:00; version "
        "1a2b3c4d (release)"
    ]


def test_the_nightly_verdict_names_the_changed_firmware() -> None:
    def record(night: str, info: dict[str, Any]) -> RunRecord:
        return RunRecord(run_id=f"r-{night}", night=night, board="pi5-a", model="m", backend="xnnpack", status="ok",
                         conditions=board_conditions(info, info))  # fmt: skip

    baseline = record("2026-12-01", INFO)
    tonight = record("2026-12-02", {**INFO, "firmware": "2025/01/10 11:00:00; version 1a2b3c4d (release)"})
    assert changed_conditions(tonight, baseline) == [
        "firmware 2024/09/23 14:02:56; version 8c3fcd1e (release) (embedded) → 2025/01/10 11:00:00; version "
        "1a2b3c4d (release)"
    ]
