"""Exit codes follow the README's table through the real `fab` tasks on real sshd boards: a board that answers
malformed data is 65 and one that cannot be set up is 1 (neither is an unreachable board, 69); mixed classes exit
1; and `fab gc` reports what the agent really removed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from orchestrator.boards.workdir import BoardWorkdir
from orchestrator.deploy.payload import board_tarball
from orchestrator.errors import ExitCode
from orchestrator.lowering.export.lower import LoweringResult
from orchestrator.paths import PROJECT_ROOT
from orchestrator.versions import executorch_version
from tests.plugins.artifacts import ARTIFACT_CACHE
from tests.plugins.boards import write_inventory
from tests.plugins.sshd import SshdBoard
from tests.results.board_data_helpers import board_bundle, install_agent


def fab(*args: str, results: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "ETLAB_ARTIFACTS": str(ARTIFACT_CACHE), "ETLAB_RESULTS": str(results)}
    return subprocess.run(
        [sys.executable, "-m", "fabric", *args], cwd=PROJECT_ROOT, env=env, capture_output=True, text=True, timeout=600
    )


def fake_provisioned(fake: SshdBoard, agent_main: str) -> None:
    """A board that passes the quick check before a run (state.json, an agent, a runner answering --version) and
    whose agent is `agent_main`: no runner is built, the rest of the chain is real."""
    workdir = fake.workdir_path
    wd = BoardWorkdir(str(workdir))
    runner = Path(wd.runner(executorch_version())) / "etlab_runner"
    runner.parent.mkdir(parents=True)
    version = json.dumps({"executorch_version": executorch_version(), "runner_version": "test"})
    runner.write_text(f"#!/bin/sh\necho '{version}'\n")
    runner.chmod(0o755)
    state = {
        "executorch_version": executorch_version(),
        "board_tree_sha256": board_tarball()[1],
        "runner_path": str(runner),
        "runner_build": "board",
    }
    (workdir / "state.json").write_text(json.dumps(state))
    package = workdir / "board" / "agent" / "etlab_agent"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "__main__.py").write_text(agent_main)


MALFORMED_PROFILE = """import json
# Test-only: a hostile board's agent answers `profile` with a bundle somewhere else than the run id says.
print(json.dumps({"run_id": "not-this-run", "status": "ok", "bundle": "/etc"}))
"""


def test_a_malformed_profile_answer_exits_65_and_names_the_board(
    sshd_board: SshdBoard, tiny_artifacts: dict[str, LoweringResult], tmp_path: Path
) -> None:
    fake_provisioned(sshd_board, MALFORMED_PROFILE)
    inventory = write_inventory(tmp_path / "inventory.yaml", [sshd_board.board])

    result = fab("deploy-and-profile", "--model", "distilbert-tiny", "--board", sshd_board.name,
                 "--inventory", str(inventory), "--iterations", "2", "--no-explore",
                 results=tmp_path / "results")  # fmt: skip

    output = result.stdout + result.stderr
    assert result.returncode == ExitCode.DATA, output  # bad data from a board, not an unreachable one (69)
    assert "agent profile sent malformed output" in output and sshd_board.name in output, output


def no_compiler_path(folder: Path) -> str:
    """A PATH with the system's tools but no C++ compiler, as on a board without build-essential."""
    folder.mkdir()
    for system in ("/usr/bin", "/bin"):
        for tool in Path(system).iterdir():
            if tool.name not in ("c++", "g++", "clang++") and not (folder / tool.name).exists():
                (folder / tool.name).symlink_to(tool)
    return str(folder)


def test_a_board_without_a_compiler_keeps_class_1_in_deploy_and_profile(
    sshd_boards: Callable[..., list[SshdBoard]], tiny_artifacts: dict[str, LoweringResult], tmp_path: Path
) -> None:
    (fake,) = sshd_boards(1, session_env={"PATH": no_compiler_path(tmp_path / "bin")}, build="board")
    inventory = write_inventory(tmp_path / "inventory.yaml", [fake.board])

    result = fab("deploy-and-profile", "--model", "distilbert-tiny", "--board", fake.name,
                 "--inventory", str(inventory), "--iterations", "2", "--no-explore",
                 results=tmp_path / "results")  # fmt: skip

    output = result.stdout + result.stderr
    assert result.returncode == ExitCode.FAILED, output  # it answered: it cannot be set up, it is not unreachable
    assert "no C++ compiler" in output and fake.name in output, output


def test_a_refused_bundle_and_an_unreachable_board_exit_1(
    sshd_boards: Callable[..., list[SshdBoard]], tmp_path: Path
) -> None:
    hostile, dead = sshd_boards(2)
    install_agent(hostile)
    board_bundle(hostile, "run-1", {"model": "../../escaped", "backend": "xnnpack"})
    inventory = write_inventory(tmp_path / "inventory.yaml", [hostile.board, dead.board])
    dead.stop()

    mixed = fab("pull", "--board", f"{hostile.name},{dead.name}", "--inventory", str(inventory),
                results=tmp_path / "results")  # fmt: skip
    alone = fab("pull", "--board", hostile.name, "--inventory", str(inventory), results=tmp_path / "results")

    output = mixed.stdout + mixed.stderr
    assert mixed.returncode == ExitCode.FAILED, output  # 65 and 69 mixed: the README's rule says 1
    assert "refused" in output and dead.name in output, output
    assert alone.returncode == ExitCode.DATA, alone.stdout + alone.stderr  # one refused bundle alone is still 65


def test_gc_reports_what_it_removed(sshd_board: SshdBoard, tmp_path: Path) -> None:
    install_agent(sshd_board)
    old = [board_bundle(sshd_board, f"run-{n}", {"model": "tiny", "backend": "xnnpack"}, {"x.bin": b"x" * 3000 * n})
           for n in (1, 2, 3)]  # fmt: skip
    os.utime(old[2], (2e9, 2e9))  # the newest: kept with --keep 1
    for n, folder in enumerate(old[:2]):
        os.utime(folder, (1e9 + n, 1e9 + n))
    freed = sum(path.stat().st_size for folder in old[:2] for path in folder.rglob("*") if path.is_file())
    inventory = write_inventory(tmp_path / "inventory.yaml", [sshd_board.board])

    gc = fab("gc", "--keep", "1", "--board", sshd_board.name, "--inventory", str(inventory),
             results=tmp_path / "results")  # fmt: skip

    assert gc.returncode == 0, gc.stdout + gc.stderr
    remaining = sorted(p.name for p in (sshd_board.workdir_path / "bundles").iterdir() if not p.name.startswith("."))
    assert remaining == ["run-3"]
    row = next(line for line in gc.stdout.splitlines() if sshd_board.name in line)
    cells = [cell.strip() for cell in row.split("│") if cell.strip()]
    assert cells[1:] == ["2", "2", "0", "0", "0", f"{freed:,}"], gc.stdout  # removed, per category, bytes


@pytest.mark.parametrize(
    "answer",
    [{"removed": {"bundles": []}, "bytes_freed": 0}, {"removed": {k: [] for k in ("bundles", "temporaries",
     "models", "inputs")}, "bytes_freed": "lots"}],
    ids=["missing category", "bytes not a number"],
)  # fmt: skip
def test_a_malformed_gc_answer_exits_65_and_names_the_board(
    sshd_board: SshdBoard, tmp_path: Path, answer: dict[str, Any]
) -> None:
    package = sshd_board.workdir_path / "board" / "agent" / "etlab_agent"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "__main__.py").write_text(f"print({json.dumps(json.dumps(answer))})\n")
    inventory = write_inventory(tmp_path / "inventory.yaml", [sshd_board.board])

    gc = fab("gc", "--board", sshd_board.name, "--inventory", str(inventory), results=tmp_path / "results")

    output = gc.stdout + gc.stderr
    assert gc.returncode == ExitCode.DATA, output
    assert "agent gc sent malformed output" in output and sshd_board.name in output, output
    assert "TypeError" not in output and "Traceback" not in output, output


def test_only_link_trouble_is_infrastructure() -> None:
    """What the nightly retries on resume and counts as an incomplete night (exit 2): the link, not the board's
    data or its fitness."""
    from orchestrator.deploy.agent_client import AgentError
    from orchestrator.deploy.cells import exit_class, is_link_trouble
    from orchestrator.errors import BoardDataError, BoardSetupError
    from orchestrator.transport.base import LinkError

    link = [LinkError("lost"), ConnectionResetError("reset"), EOFError(), AgentError("b", "profile", {}, 3, "")]
    assert all(is_link_trouble(exc) and exit_class(exc) == ExitCode.UNAVAILABLE for exc in link)
    assert not is_link_trouble(BoardDataError("b: agent profile sent malformed output"))
    assert exit_class(BoardDataError("x")) == ExitCode.DATA
    assert not is_link_trouble(BoardSetupError("b: no C++ compiler"))
    assert exit_class(BoardSetupError("x")) == ExitCode.FAILED
    assert not is_link_trouble(TypeError("a bug")) and exit_class(TypeError("a bug")) == ExitCode.SOFTWARE
