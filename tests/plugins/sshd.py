"""Fixtures around the fake boards of orchestrator/testing/sshd.py: a session lab, boards per test, a netns board."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from orchestrator.testing.sshd import (  # noqa: F401 - re-exported for the tests
    LabSetupError,
    NetnsBoard,
    SshdBoard,
    SshdLab,
    descendants,
    free_port,
    keygen,
    pid_namespaces_work,
    require_sshd,
)


def worker_network() -> int:
    """The loopback range of this test process's boards: 127.0.x.y alone, 127.<1+n>.x.y on xdist worker gw<n>."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    return 1 + int(worker.removeprefix("gw")) if worker.startswith("gw") else 0


@pytest.fixture(scope="session")
def sshd_lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SshdLab]:
    lab = SshdLab(tmp_path_factory.mktemp("sshd-lab"), network=worker_network())
    yield lab
    lab.close()


@pytest.fixture
def sshd_boards(sshd_lab: SshdLab) -> Iterator[Callable[..., list[SshdBoard]]]:
    """`sshd_boards(n, names=None, **options)` starts n fake boards (options as for SshdLab.board), stopped after
    the test."""
    started: list[SshdBoard] = []

    def make(count: int = 1, *, names: list[str] | None = None, **options: Any) -> list[SshdBoard]:
        if names is not None and len(names) != count:
            raise ValueError("give one name per board")
        fakes = [sshd_lab.board(names[i] if names else None, **options) for i in range(count)]
        started.extend(fakes)
        return fakes

    yield make
    for fake in started:
        sshd_lab.discard(fake)


@pytest.fixture
def sshd_board(sshd_boards: Callable[..., list[SshdBoard]]) -> SshdBoard:
    return sshd_boards(1)[0]


@pytest.fixture
def netns_board(sshd_lab: SshdLab) -> Iterator[NetnsBoard]:
    """A board in its own network namespace, with blackhole()/restore() to cut and mend its link."""
    fake = sshd_lab.netns_board(keepalive=1.0, tcp_user_timeout=3.0, connect_timeout=3.0)
    yield fake
    sshd_lab.discard(fake)
