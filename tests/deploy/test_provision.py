"""`setup-board` for real on a fresh local board: from scratch, then a no-op, then re-provision on a version change."""

from __future__ import annotations

import json
import subprocess
import zipfile
from pathlib import Path

import pytest

from orchestrator.boards.inventory import Board
from orchestrator.deploy import payload, provision
from orchestrator.deploy.agent_client import BoardAgent
from orchestrator.errors import BoardError
from orchestrator.transport import connect
from orchestrator.versions import executorch_version


@pytest.fixture(scope="module")
def fresh_board(tmp_path_factory: pytest.TempPathFactory) -> Board:
    return Board(name="fresh local", transport="local", workdir=str(tmp_path_factory.mktemp("board") / "wd"))


@pytest.fixture(scope="module")
def first_setup(fresh_board: Board) -> provision.ProvisionReport:
    with connect(fresh_board) as conn:
        return provision.setup_board(conn)


def test_setup_from_scratch(fresh_board: Board, first_setup: provision.ProvisionReport) -> None:
    report = first_setup
    assert not report.up_to_date
    assert report.executorch_version == executorch_version()
    assert any("SDK" in action for action in report.actions)
    assert "built the native runner" in report.actions
    assert "verified a built-in .pte" in report.actions
    workdir = Path(fresh_board.workdir)
    state = json.loads((workdir / "state.json").read_text())
    assert state["executorch_version"] == executorch_version()
    assert state["board_tree_sha256"] == payload.tree_sha256(payload.paths.BOARD_SOURCE_DIR)
    runner = Path(state["runner_path"])
    assert runner.is_file() and runner.is_relative_to(workdir / "runner" / executorch_version())
    answer = json.loads(subprocess.run([runner, "--version"], capture_output=True, text=True, check=True).stdout)
    assert answer["executorch_version"].split("+")[0] == executorch_version()
    # The runner links the SDK pushed into the workdir, not the workstation's venv.
    ldd = subprocess.run(["ldd", str(runner)], capture_output=True, text=True, check=True).stdout
    linked = {
        line.split("=>")[0].strip(): Path(line.split("=>")[1].split("(")[0].strip()).resolve()
        for line in ldd.splitlines()
        if "=>" in line and "libexecutorch" in line
    }
    assert "libexecutorch.so" in linked and "libexecutorch_backend_xnnpack.so" in linked
    for library in linked.values():
        assert library.parent == (workdir / "runtime" / executorch_version() / "lib").resolve()
    assert ".venv" not in ldd and "libtorch" not in ldd and "libpython" not in ldd
    # The agent answers through the same interface the orchestrator uses for SSH boards.
    with connect(fresh_board) as conn:
        info = BoardAgent(conn, conn.workdir).info()
    assert info["state"]["executorch_version"] == executorch_version()
    assert info["runner"]["executorch_version"].split("+")[0] == executorch_version()


def test_second_setup_is_a_noop(fresh_board: Board, first_setup: provision.ProvisionReport) -> None:
    state_file = Path(fresh_board.workdir) / "state.json"
    before = state_file.read_text()
    with connect(fresh_board) as conn:
        report = provision.setup_board(conn)
    assert report.up_to_date and report.actions == []
    assert state_file.read_text() == before


def test_quick_check_before_a_run_trusts_only_a_matching_board(
    fresh_board: Board, first_setup: provision.ProvisionReport
) -> None:
    workdir = Path(fresh_board.workdir)
    state_file = workdir / "state.json"
    state = json.loads(state_file.read_text())
    runner = Path(state["runner_path"])
    agent_main = workdir / "board" / "agent" / "etlab_agent" / "__main__.py"

    def check() -> provision.ProvisionReport | None:
        with connect(fresh_board) as conn:
            return provision.quick_check(conn)

    report = check()
    assert report is not None and report.up_to_date and report.executorch_version == executorch_version()
    assert report.runner_version == json.loads(subprocess.check_output([runner, "--version"]))["runner_version"]
    # Whatever differs from what this workstation would provision sends the run through the full setup.
    tampered = {
        "board/ sources changed": {**state, "board_tree_sha256": "0" * 64},
        "another runtime": {**state, "executorch_version": "0.9.0"},
        "a runner elsewhere": {**state, "runner_path": "/bin/true"},
    }
    for why, changed in tampered.items():
        state_file.write_text(json.dumps(changed))
        assert check() is None, why
    for text in ("not json", "[1, 2]", ""):
        state_file.write_text(text)
        assert check() is None, text
    state_file.unlink()
    assert check() is None, "no state.json"
    state_file.write_text(json.dumps(state))
    agent_main.rename(agent_main.with_suffix(".away"))
    try:
        assert check() is None, "the agent is missing"
    finally:
        agent_main.with_suffix(".away").rename(agent_main)
    runner.rename(runner.with_suffix(".away"))
    try:
        assert check() is None, "the runner is missing"
    finally:
        runner.with_suffix(".away").rename(runner)
    assert check() is not None, "restored: up to date again"


def test_version_mismatch_reprovisions(fresh_board: Board, first_setup: provision.ProvisionReport) -> None:
    state_file = Path(fresh_board.workdir) / "state.json"
    state = json.loads(state_file.read_text())
    state["executorch_version"] = "0.9.0"
    state_file.write_text(json.dumps(state))
    stale_runtime = Path(fresh_board.workdir) / "runtime" / "0.9.0"
    stale_runtime.mkdir(parents=True)
    with connect(fresh_board) as conn:
        facts = provision.probe(conn, conn.workdir)
        assert provision._problems(facts, payload.board_tarball()[1]) == [
            f"runtime is executorch 0.9.0, workstation has {executorch_version()}"
        ]
        report = provision.setup_board(conn)
    assert not report.up_to_date
    assert "built the native runner" in report.actions
    assert json.loads(state_file.read_text())["executorch_version"] == executorch_version()
    assert not stale_runtime.exists(), "old runtimes are removed once the new one is verified"


def test_missing_compiler_names_the_packages() -> None:
    facts = {"system": "Linux", "libc": "glibc", "glibc": "2.36", "compiler": None, "free_mb": 9000}
    provision._check_prerequisites("pi5-a", facts)  # a board without g++ may get a cross-built runner
    with pytest.raises(BoardError) as excinfo:
        provision.build_place("board", "aarch64", facts)
    assert "no C++ compiler" in str(excinfo.value)
    assert "sudo apt-get install -y g++" in str(excinfo.value)
    assert "build-essential" in str(excinfo.value)


def test_old_glibc_is_refused() -> None:
    facts = {"system": "Linux", "libc": "glibc", "glibc": "2.24", "compiler": "/usr/bin/c++"}
    with pytest.raises(BoardError, match=r"glibc 2\.24 is too old"):
        provision._check_prerequisites("pi3", facts)


def test_manylinux_tags_follow_glibc() -> None:
    tags = payload.manylinux_platforms("aarch64", "2.31")
    assert tags[0] == "manylinux_2_31_aarch64"
    assert "manylinux_2_28_aarch64" in tags and "manylinux_2_17_aarch64" in tags
    assert "manylinux_2_32_aarch64" not in tags
    assert tags[-1] == "manylinux2014_aarch64"


def test_fetches_the_aarch64_sdk_for_a_pi() -> None:
    """The wheel for a Raspberry Pi (aarch64, Python 3.11, glibc 2.36), at the workstation's version, with its SDK."""
    facts = {"arch": "aarch64", "python": "3.11.2", "glibc": "2.36"}
    wheel = payload.fetch_wheel("executorch", f"executorch=={executorch_version()}", facts, any_python=True)
    assert wheel.name.startswith(f"executorch-{executorch_version()}-")
    assert wheel.name.endswith("aarch64.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert "executorch/share/cmake/executorch-config.cmake" in names
    assert "executorch/lib/libexecutorch_backend_xnnpack.so" in names
    # Cached: a second fetch does not need the network.
    assert payload.fetch_wheel("executorch", f"executorch=={executorch_version()}", facts) == wheel


def test_board_tarball_is_reproducible() -> None:
    first, tree = payload.board_tarball()
    assert payload.board_tarball() == (first, tree)
    assert tree == payload.tree_sha256(payload.paths.BOARD_SOURCE_DIR)


def test_probe_answers_are_checked_before_use(tmp_path: Path) -> None:
    """The board probe's JSON names wheels to fetch and paths to use: a malformed answer is refused by name."""
    import json
    import subprocess
    import sys

    from orchestrator.deploy.provision import PROBE_SOURCE, checked_facts
    from orchestrator.errors import BoardDataError

    real = subprocess.run(
        [sys.executable, "-c", PROBE_SOURCE.read_text(), str(tmp_path)], capture_output=True, text=True, check=True
    ).stdout
    facts = checked_facts("local", real)
    assert facts["workdir"] == str(tmp_path) and facts["arch"]
    changes: list[tuple[dict[str, object], str]] = [
        ({"arch": "x86_64 --index-url http://evil"}, "arch"),
        ({"free_mb": "lots"}, "free_mb"),
        ({"workdir": "relative/path"}, "workdir"),
        ({"state": ["not", "a", "mapping"]}, "state"),
        ({"agent_present": "yes"}, "agent_present"),
        ({"glibc": "2.36; rm -rf /"}, "glibc"),
    ]
    for change, field in changes:
        with pytest.raises(BoardDataError, match=field):
            checked_facts("pi5-a", json.dumps({**json.loads(real), **change}))
    for garbage in ("", "[]", "{" * 50000, "null"):
        with pytest.raises(BoardDataError, match="pi5-a: the board probe sent malformed output"):
            checked_facts("pi5-a", garbage)
