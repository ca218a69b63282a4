"""The verification program `setup-board` pushes (deploy/payload.py): boards set up in parallel threads ask for it at
once, and torch.export's module-level state must not see two traces at a time (`fab setup-board -b local,pi-b`
failed one board with "_EXPORT_MODULE_HIERARCHY must not be None")."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from orchestrator.deploy import payload

pytestmark = pytest.mark.slow  # lowers a real (tiny) program


def test_two_boards_asking_at_once_get_one_program(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ETLAB_CACHE", str(tmp_path / "cache"))  # none made yet
    start = threading.Barrier(3)
    got: list[Path] = []
    failed: list[BaseException] = []

    def board() -> None:
        start.wait()
        try:
            got.append(payload.verify_model())
        except BaseException as exc:  # a thread's failure is the test's
            failed.append(exc)

    threads = [threading.Thread(target=board) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=300)
    assert not failed, failed
    assert len(got) == 3 and len(set(got)) == 1
    assert got[0].is_file() and got[0].read_bytes()[4:8] == b"ET12"  # an ExecuTorch program
