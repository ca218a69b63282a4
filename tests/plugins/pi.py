"""Emulated Raspberry Pis (orchestrator/testing/pi.py) as fixtures, in the session's sshd lab.

Emulation needs qemu-user-static with binfmt_misc and root. In CI (`CI` set, as .ci/run does) a missing piece
fails loudly; on a developer machine the tests skip with the reason. The rootfs is built on first use when
`bootstrap.sh --test` has not prepared it (3-7 minutes, logged).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from orchestrator.testing.pi import PiBoard, emulation_problem, ensure_rootfs, start_pi_board
from orchestrator.testing.sshd import LabSetupError, SshdLab


def in_ci() -> bool:
    return bool(os.environ.get("CI"))


@pytest.fixture(scope="session")
def pi_emulation() -> None:
    """Emulation works and the rootfs is ready, else fail (CI) or skip (locally) with the reason."""
    problem = emulation_problem()
    if problem is None:
        try:
            ensure_rootfs()
        except LabSetupError as exc:
            problem = str(exc)
    if problem is not None:
        if in_ci():
            pytest.fail(f"emulated Raspberry Pi unavailable in CI: {problem}", pytrace=False)
        pytest.skip(f"emulated Raspberry Pi unavailable: {problem}")


@pytest.fixture
def pi_boards(pi_emulation: None, sshd_lab: SshdLab) -> Iterator[Callable[..., PiBoard]]:
    """`pi_boards(name=None, flavour="pi5", compiler=True, **board_fields)` starts an emulated Pi, stopped after
    the test."""
    started: list[PiBoard] = []

    def make(name: str | None = None, **options: Any) -> PiBoard:
        fake = start_pi_board(sshd_lab, name, **options)
        started.append(fake)
        return fake

    yield make
    for fake in started:
        sshd_lab.discard(fake)
