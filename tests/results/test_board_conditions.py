"""A board's conditions around a run (results/validity.py `board_conditions`) are read defensively: what the degraded
note and the advisor multiply by must be a number, whatever the board sent."""

from __future__ import annotations

from typing import Any

import pytest

from orchestrator.results.validity import board_conditions


@pytest.mark.parametrize("sent", ["4", "x" * 100, [4], 0, -2, True, 10**9, 2.5])
def test_a_core_count_that_is_not_one_is_unknown(sent: Any) -> None:
    conditions = board_conditions({"cores_online": sent, "load_1m": 1.0}, {"cores_online": sent})
    assert conditions["cores_online"] is None


def test_a_core_count_is_kept() -> None:
    assert board_conditions({"cores_online": 2}, {"cores_online": 4})["cores_online"] == 4
    assert board_conditions({"cores_online": 2}, {"cores_online": "?"})["cores_online"] == 2
