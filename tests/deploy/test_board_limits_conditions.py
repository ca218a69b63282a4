"""The board's limits are measured again when the board changes, not only its runner (issue 55: "re-measured when
the runner or the board changes"): each limit keeps the kernel, firmware, config.txt and governor it was measured
under, and setup-board measures both again, saying what changed, when the board's differ; when nothing changed it
keeps them (setup-board stays fast). The board is the local one, its state edited as a kernel update, an older
etlab or a malformed record would leave it."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from orchestrator.boards.inventory import Board
from orchestrator.boards.limits import (
    COMPUTE_STATE_KEY,
    STATE_KEY,
    ComputePeak,
    ReadBandwidth,
    recorded_bandwidth,
    recorded_compute,
)
from orchestrator.deploy.board_status import limits_text
from orchestrator.records import RecordError
from tests.plugins.boards import provision_board

pytestmark = pytest.mark.slow

KEYS = (STATE_KEY, COMPUTE_STATE_KEY)
AGAIN = "the board's limits are measured again"


def _edit_limits(board: Board, edit: Callable[[dict[str, Any]], None]) -> None:
    """Each limit's record in the board's state.json, as `edit` leaves it."""
    path = Path(board.workdir) / "state.json"
    state = json.loads(path.read_text())
    for key in KEYS:
        record = json.loads(state[key])
        edit(record)
        state[key] = json.dumps(record)
    path.write_text(json.dumps(state))


def _state(board: Board) -> dict[str, Any]:
    state: dict[str, Any] = json.loads((Path(board.workdir) / "state.json").read_text())
    return state


def _recorded(board: Board) -> tuple[ReadBandwidth, ComputePeak]:
    """The limits the board's state records (both there)."""
    state = _state(board)
    bandwidth, peak = recorded_bandwidth(state, "state.json"), recorded_compute(state, "state.json")
    assert bandwidth is not None and peak is not None, state
    return bandwidth, peak


def _setup(board: Board, capsys: pytest.CaptureFixture[str]) -> tuple[list[str], str]:
    """setup-board on a provisioned board: what it did, and what it said (on one line)."""
    capsys.readouterr()
    report = provision_board(board)
    assert report.up_to_date and report.bandwidth is not None and report.compute is not None, report.limits_notes
    captured = capsys.readouterr()
    return report.actions, " ".join((captured.out + captured.err).split())


def test_the_limits_are_measured_again_when_the_board_changes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    board = Board(name="changing", transport="local", workdir=str(tmp_path / "wd"), build="workstation")
    provision_board(board)
    kernel = os.uname().release  # the local board's, as its agent reads /proc/sys/kernel/osrelease
    bandwidth, peak = _recorded(board)
    assert bandwidth.conditions is not None and bandwidth.conditions == peak.conditions
    assert bandwidth.conditions.kernel == kernel

    # Nothing changed: kept as they are, nothing said.
    actions, said = _setup(board, capsys)
    assert actions == [] and AGAIN not in said, said
    assert _recorded(board) == (bandwidth, peak)

    # A kernel update: both measured again, said in one line, and recorded under the kernel the board runs now.
    def older_kernel(record: dict[str, Any]) -> None:
        record["conditions"]["kernel"] = "6.6.51-v8-16k+"

    _edit_limits(board, older_kernel)
    actions, said = _setup(board, capsys)
    assert f"changing: kernel 6.6.51-v8-16k+ → {kernel}: {AGAIN}" in said, said
    assert said.count(AGAIN) == 1, said
    assert [action.split(" (")[0] for action in actions] == ["measured the read bandwidth", "measured the peak"]
    assert all(record.conditions == bandwidth.conditions for record in _recorded(board))

    # ... and the next setup keeps them.
    actions, said = _setup(board, capsys)
    assert actions == [] and AGAIN not in said, said

    # Limits an older etlab recorded, without their conditions: unknown, so measured again once, then recorded.
    def recorded_by_an_older_etlab(record: dict[str, Any]) -> None:
        del record["conditions"]

    _edit_limits(board, recorded_by_an_older_etlab)
    assert all(record.conditions is None for record in _recorded(board))
    actions, said = _setup(board, capsys)
    assert f"changing: board conditions not recorded: {AGAIN}" in said and len(actions) == 2, said
    assert all(record.conditions == bandwidth.conditions for record in _recorded(board))
    actions, said = _setup(board, capsys)
    assert actions == [] and AGAIN not in said, said


def test_malformed_recorded_conditions_are_refused_by_field_and_measured_again(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    board = Board(name="garbled", transport="local", workdir=str(tmp_path / "wd"), build="workstation")
    provision_board(board)

    def garbled(record: dict[str, Any]) -> None:
        record["conditions"]["config_txt_sha256"] = "not a digest"

    _edit_limits(board, garbled)
    with pytest.raises(RecordError) as refused:
        recorded_bandwidth(_state(board), "board_info_before.json")
    assert refused.value.field == "limits.conditions.config_txt_sha256", str(refused.value)
    assert (
        limits_text("garbled", _state(board))
        == "unreadable (limits.conditions.config_txt_sha256): fab setup-board measures it again"
    )
    actions, said = _setup(board, capsys)  # no traceback: the malformed record is not current, so measured again
    assert len(actions) == 2 and "Traceback" not in said, said
    assert all(record.conditions is not None for record in _recorded(board))
