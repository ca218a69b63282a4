"""The fake lab's own failures (orchestrator/testing/sshd.py): a machine that lacks a piece says which."""

from __future__ import annotations

import pytest

from orchestrator.testing.sshd import LabSetupError, NetnsBoard


def test_a_namespace_that_cannot_be_made_is_a_lab_setup_error() -> None:
    """It was a TypeError: the error was raised with pytest's `pytrace=False`, which no exception takes."""
    board = NetnsBoard.__new__(NetnsBoard)  # only the namespace step: no sshd, no veth pair
    board.namespace = "etlab/invalid"  # `ip netns add` refuses a name with a slash, creating nothing
    with pytest.raises(LabSetupError, match="cannot create a network namespace"):
        board._create_namespace()
