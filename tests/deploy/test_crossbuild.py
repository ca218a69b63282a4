"""The runner cross-compiles for aarch64 against the aarch64 SDK (a runner change that breaks Arm fails here, fast),
and where the runner is built for a board: `build: board | workstation | auto`."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from orchestrator.deploy import crossbuild
from orchestrator.deploy.payload import fetch_wheel, tree_sha256
from orchestrator.deploy.provision import build_place
from orchestrator.errors import BoardError
from orchestrator.paths import BOARD_SOURCE_DIR
from orchestrator.programs.memory import read_program_memory
from orchestrator.versions import executorch_version
from tests.plugins.pi import in_ci
from tests.plugins.runner import RunnerModels

# What a Raspberry Pi OS bookworm board reports to provisioning.
PI_FACTS = {"arch": "aarch64", "glibc": "2.36", "python": "3.11.2"}
ELF_MACHINES = {0xB7: "aarch64", 0x3E: "x86_64"}


def elf_machine(path: Path) -> str | None:
    header = path.read_bytes()[:20]
    assert header[:4] == b"\x7fELF", f"{path} is not an ELF file"
    return ELF_MACHINES.get(int.from_bytes(header[18:20], "little"))


def aarch64_compiler() -> crossbuild.CrossCompiler:
    compiler = crossbuild.find_cross_compiler("aarch64")
    if compiler is None:
        reason = f"no aarch64 cross compiler: {crossbuild.install_hint('aarch64')} (./bootstrap.sh --test does)"
        if in_ci():
            pytest.fail(reason, pytrace=False)
        pytest.skip(reason)
    return compiler


def test_runner_cross_compiles_for_aarch64_and_runs_under_qemu(
    runner_binary: Path, runner_models: RunnerModels, tmp_path: Path
) -> None:
    compiler = aarch64_compiler()
    wheel = fetch_wheel("executorch", f"executorch=={executorch_version()}", PI_FACTS, any_python=True)
    assert wheel.name.endswith("aarch64.whl")
    source = BOARD_SOURCE_DIR / "runner"
    binary = crossbuild.cross_build_runner(compiler, wheel, source, tree_sha256(source), executorch_version())
    assert elf_machine(binary) == "aarch64" and elf_machine(runner_binary) == "x86_64"
    # The same version stamp as the native build, and it finds the aarch64 SDK through its $ORIGIN RUNPATH.
    env = {**os.environ, "QEMU_LD_PREFIX": "/usr/aarch64-linux-gnu"}
    version = subprocess.run([str(binary), "--version"], capture_output=True, text=True, env=env, timeout=120)
    native = subprocess.run([str(runner_binary), "--version"], capture_output=True, text=True, timeout=60)
    assert version.returncode == 0, version.stderr
    assert json.loads(version.stdout)["runner_version"] == json.loads(native.stdout)["runner_version"]
    assert json.loads(version.stdout)["executorch_version"] == executorch_version()
    # It runs a real XNNPACK program under emulation.
    timings = tmp_path / "timings.json"
    run = subprocess.run(
        [str(binary), "--model", str(runner_models.xnnpack_pte), "--inputs", str(runner_models.inputs_etlt),
         "--warmup", "0", "--iterations", "1", "--threads", "1", "--timings", str(timings)],
        capture_output=True, text=True, env=env, timeout=300,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    document = json.loads(timings.read_text())
    assert len(document["iterations_ms"]) == 1
    # The constants reader agrees on Arm too.
    expected = read_program_memory(runner_models.xnnpack_pte).constants_bytes
    assert document["program_memory"]["constants_bytes"] == expected > 0
    # A second build is the cached binary.
    assert crossbuild.cross_build_runner(compiler, wheel, source, tree_sha256(source), executorch_version()) == binary
    # A binary cut short (a build killed while installing, before the completion stamp) is never reused: rebuilt.
    whole = binary.read_bytes()
    binary.write_bytes(whole[: len(whole) // 2])
    again = crossbuild.cross_build_runner(compiler, wheel, source, tree_sha256(source), executorch_version())
    assert again == binary and binary.read_bytes() == whole
    assert not list(binary.parent.parent.parent.glob(".build-*"))  # the private build folder is gone


def test_stale_cross_builds_are_removed_unless_in_use(tmp_path: Path) -> None:
    """Builds of other sources are cleaned up, but never one that another setup is building or pushing (it holds
    its key's lock)."""
    import fcntl

    root = tmp_path / "cross" / "aarch64"
    for key in ("current", "stale", "in-use"):
        (root / key / "runner").mkdir(parents=True)
    with open(root / "in-use.lock", "a") as held:
        fcntl.flock(held, fcntl.LOCK_SH)
        crossbuild._remove_stale(root, "current")
    assert sorted(p.name for p in root.iterdir() if p.is_dir()) == ["current", "in-use"]
    assert not (root / "stale.lock").exists()


def test_where_the_runner_is_built() -> None:
    with_gxx, without = {"compiler": "/usr/bin/g++"}, {"compiler": None}
    assert build_place("auto", "aarch64", with_gxx) == "board"
    assert build_place("board", "aarch64", with_gxx) == "board"
    assert build_place("workstation", "x86_64", with_gxx) == "workstation"  # the workstation's own g++
    with pytest.raises(BoardError) as refused:
        build_place("board", "aarch64", without)
    assert "apt-get install -y g++" in str(refused.value) and "build: workstation" in str(refused.value)
    # No compiler anywhere (nobody has a riscv64 cross compiler here): the error names both fixes.
    with pytest.raises(BoardError) as neither:
        build_place("auto", "riscv64", without)
    message = str(neither.value)
    assert "on the board: sudo apt-get install -y g++" in message
    assert "on the workstation: sudo apt-get install -y g++-riscv64-linux-gnu" in message
    with pytest.raises(BoardError, match="no cross compiler for riscv64"):
        build_place("workstation", "riscv64", with_gxx)


def test_auto_cross_builds_when_the_board_has_no_compiler() -> None:
    aarch64_compiler()
    assert build_place("auto", "aarch64", {"compiler": None}) == "workstation"
