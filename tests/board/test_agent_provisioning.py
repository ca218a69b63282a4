"""The board agent's provisioning commands: `unpack` (hostile members refused, exec bits kept, atomic), the bootstrap
that runs the agent on the standard library, and `build-runner` from the SDK to a profile."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from orchestrator.versions import executorch_version
from tests.board.agent_helpers import sha256
from tests.plugins.agent import AGENT_DIR, AgentCli
from tests.plugins.runner import RunnerModels, executorch_sdk_dir

# --------------------------------------------------------------------------------------------- unpack


def make_wheel(path: Path, members: dict[str, tuple[bytes, int]]) -> Path:
    """A zip with the given members, each (content, unix mode)."""
    with zipfile.ZipFile(path, "w") as archive:
        for name, (content, mode) in members.items():
            info = zipfile.ZipInfo(name)
            info.external_attr = mode << 16
            archive.writestr(info, content)
    return path


@pytest.mark.parametrize(
    "hostile",
    ["../escape.txt", "/tmp/absolute-escape.txt", "pkg/../../escape.txt", "pkg/..\\..\\escape.txt"],
)
def test_unpack_refuses_members_that_escape(agent: AgentCli, tmp_path: Path, hostile: str) -> None:
    wheel = make_wheel(
        tmp_path / "evil-1.0-py3-none-any.whl",
        {"pkg/ok.py": (b"ok", 0o644), hostile: (b"pwned", 0o644)},
    )
    dest = tmp_path / "unpacked" / "dest"
    result = agent.run("unpack", "--wheel", wheel, "--dest", dest)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "refusing member" in result.document["error"] and result.document["member"] == hostile
    assert not dest.exists() and not (tmp_path / "unpacked" / "escape.txt").exists()
    assert not (tmp_path / "escape.txt").exists() and not Path("/tmp/absolute-escape.txt").exists()
    assert not list(tmp_path.rglob(".tmp-unpack-*"))


def test_unpack_refuses_symlink_members(agent: AgentCli, tmp_path: Path) -> None:
    wheel = make_wheel(tmp_path / "link.whl", {"pkg/link": (b"/etc/passwd", stat.S_IFLNK | 0o777)})
    result = agent.run("unpack", "--wheel", wheel, "--dest", tmp_path / "dest")
    assert result.returncode == 1 and "symbolic link" in result.document["error"]
    assert not (tmp_path / "dest").exists()


def test_unpack_selects_strips_keeps_exec_bits_and_replaces_atomically(agent: AgentCli, tmp_path: Path) -> None:
    wheel = make_wheel(
        tmp_path / "cmake-4.0-py3-none-manylinux.whl",
        {
            "cmake/__init__.py": (b"# python shim\n", 0o644),
            "cmake/data/bin/cmake": (b"#!/bin/sh\necho cmake version 4.0.0\n", 0o755),
            "cmake/data/share/cmake-4.0/Modules/X.cmake": (b"# module\n", 0o644),
            "cmake-4.0.dist-info/RECORD": (b"", 0o644),
        },
    )
    dest = tmp_path / "tools" / "cmake"
    dest.mkdir(parents=True)
    (dest / "stale-file").write_text("from an older cmake")
    result = agent.run(
        "unpack", "--wheel", wheel, "--dest", dest, "--member-prefix", "cmake/data/", "--strip-prefix", "cmake/data/"
    )
    assert result.returncode == 0, result.stdout + result.stderr
    document = result.document
    assert document["files"] == 2 and document["replaced"] is True and document["wheel_sha256"] == sha256(wheel)
    files = sorted(str(path.relative_to(dest)) for path in dest.rglob("*") if path.is_file())
    assert files == [".etlab_unpacked.json", "bin/cmake", "share/cmake-4.0/Modules/X.cmake"]
    assert os.access(dest / "bin" / "cmake", os.X_OK)
    assert not os.access(dest / "share" / "cmake-4.0" / "Modules" / "X.cmake", os.X_OK)
    assert subprocess.run([dest / "bin" / "cmake"], capture_output=True, text=True).stdout == "cmake version 4.0.0\n"
    assert not list(dest.parent.glob(".tmp-unpack-*")) and not list(dest.parent.glob(".old-unpack-*"))

    nothing = agent.run("unpack", "--wheel", wheel, "--dest", tmp_path / "x", "--member-prefix", "absent/")
    assert nothing.returncode == 1 and "no file" in nothing.document["error"]


def test_bootstrap_unpacks_click_so_the_agent_runs_on_the_standard_library(tmp_path: Path) -> None:
    """bootstrap.py needs only the standard library; the agent then runs with click from pylib alone."""
    import click

    package = Path(click.__file__).parent
    wheel = tmp_path / "click-test-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        for path in package.rglob("*.py"):
            archive.write(path, f"click/{path.relative_to(package)}")
    pylib = tmp_path / "workdir" / "pylib"
    clean_env = {"PATH": os.environ.get("PATH", ""), "PYTHONDONTWRITEBYTECODE": "1"}
    boot = subprocess.run(
        [sys.executable, "-S", AGENT_DIR / "bootstrap.py", "--wheel", wheel, "--dest", pylib],
        capture_output=True,
        text=True,
        env=clean_env,
    )
    assert boot.returncode == 0, boot.stdout + boot.stderr
    assert json.loads(boot.stdout)["dest"] == str(pylib)
    # -S: no site-packages, so click can only come from pylib.
    agent = subprocess.run(
        [sys.executable, "-S", "-m", "etlab_agent", "--workdir", tmp_path / "workdir", "lock-status"],
        capture_output=True,
        text=True,
        env=dict(clean_env, PYTHONPATH=f"{pylib}:{AGENT_DIR}"),
    )
    assert agent.returncode == 0, agent.stderr
    assert json.loads(agent.stdout) == {"held": False, "holder": None}


# --------------------------------------------------------------------------------------- build-runner


def cmake_version(cmake: str) -> tuple[int, ...]:
    output = subprocess.run([cmake, "--version"], capture_output=True, text=True).stdout
    return tuple(int(part) for part in output.split()[2].split(".")[:2])


@pytest.mark.slow
def test_provisioning_flow_unpacks_the_sdk_builds_the_runner_and_profiles(
    agent: AgentCli, tmp_path: Path, runner_models: RunnerModels
) -> None:
    """The board side of provisioning, for real: SDK from a wheel via `unpack`, cmake/ninja from <wd>/tools (the
    system cmake, if any, is too old on Debian 12), `build-runner`, `set-state`, then a profile with that runner."""
    version = executorch_version()
    sdk_source = executorch_sdk_dir()
    wheel = tmp_path / f"executorch-{version}-cp311-cp311-linux.whl"
    with zipfile.ZipFile(wheel, "w") as archive:  # the wheel's SDK members, as the real wheel lays them out
        for part in ("include", "lib", "share"):
            for path in sorted((sdk_source / part).rglob("*")):
                if path.is_file():
                    archive.write(path, f"executorch/{path.relative_to(sdk_source)}")
        archive.writestr("executorch/exir/__init__.py", "# python half of the wheel: not unpacked\n")
    runtime = agent.workdir / "runtime" / version
    prefixes = [arg for part in ("include", "lib", "share") for arg in ("--member-prefix", f"executorch/{part}/")]
    unpacked = agent.run("unpack", "--wheel", wheel, "--dest", runtime, *prefixes, "--strip-prefix", "executorch/")
    assert unpacked.returncode == 0, unpacked.stdout + unpacked.stderr
    assert sorted(path.name for path in runtime.iterdir()) == [".etlab_unpacked.json", "include", "lib", "share"]

    tools = agent.workdir / "tools"
    (tools / "cmake" / "bin").mkdir(parents=True)
    (tools / "ninja" / "bin").mkdir(parents=True)
    import cmake as cmake_package

    (tools / "cmake" / "bin" / "cmake").symlink_to(Path(cmake_package.CMAKE_BIN_DIR) / "cmake")
    (tools / "ninja" / "bin" / "ninja").symlink_to(Path(sys.executable).parent / "ninja")
    out = agent.workdir / "runner" / version
    # As provisioning unpacks them: from a reproducible tarball, every source file has mtime 0.
    source = tmp_path / "runner-source"
    shutil.copytree(AGENT_DIR.parent / "runner", source, ignore=shutil.ignore_patterns("build"))
    for path in source.rglob("*"):
        os.utime(path, (0, 0))
    system_path = {"PATH": "/usr/local/bin:/usr/bin:/bin"}
    result = agent.run(
        "build-runner", "--sdk", runtime, "--source", source, "--out", out, "--jobs", "2", env=system_path, timeout=900
    )
    assert result.returncode == 0, result.stdout + result.stderr
    document = result.document
    system_cmake = shutil.which("cmake", path=system_path["PATH"])
    if system_cmake is None or cmake_version(system_cmake) < (3, 28):
        assert document["cmake"] == str(tools / "cmake" / "bin" / "cmake")
    assert document["runner"] == str(out / "etlab_runner")
    assert document["executorch_version"] == version and document["runner_version"]
    assert f"-DEXECUTORCH_ROOT={runtime}" in (out / "build.log").read_text()
    linked = subprocess.run(["ldd", out / "etlab_runner"], capture_output=True, text=True).stdout
    libexecutorch = next(line for line in linked.splitlines() if "libexecutorch.so" in line)
    assert str(runtime) in libexecutorch  # the unpacked SDK, not the venv's wheel

    assert (
        agent.run("set-state", f"executorch_version={version}", f"runner_path={out / 'etlab_runner'}").returncode == 0
    )
    profiled = agent.run("profile", "--model", runner_models.xnnpack_pte, "--run-id", "built", "--iterations", "2")
    assert profiled.returncode == 0, profiled.stdout + profiled.stderr
    board_info = agent.read_bundle_json("built", "board_info_before.json")
    assert board_info["runner"]["executorch_version"] == version
    assert board_info["state"]["runner_path"] == str(out / "etlab_runner")

    # New sources (still mtime 0) into the same place: the runner must be rebuilt from them, not from stale objects.
    options = source / "src" / "options.cpp"
    options.write_text(options.read_text().replace("Runs an ExecuTorch program", "Runs a rebuilt ExecuTorch program"))
    os.utime(options, (0, 0))
    rebuilt = agent.run(
        "build-runner", "--sdk", runtime, "--source", source, "--out", out, "--jobs", "2", env=system_path, timeout=900
    )
    assert rebuilt.returncode == 0, rebuilt.stdout + rebuilt.stderr
    usage = subprocess.run([out / "etlab_runner", "--help"], capture_output=True, text=True).stdout
    assert "Runs a rebuilt ExecuTorch program" in usage, usage


def test_build_runner_names_the_package_when_no_compiler_exists(agent: AgentCli, tmp_path: Path) -> None:
    bare_path = tmp_path / "bin-without-compiler"
    bare_path.mkdir()
    source = AGENT_DIR.parent / "runner"
    out = tmp_path / "out"
    no_compiler = {"PATH": str(bare_path), "CXX": ""}
    result = agent.run("build-runner", "--sdk", executorch_sdk_dir(), "--source", source, "--out", out, env=no_compiler)
    assert result.returncode == 1, result.stdout + result.stderr
    document = result.document
    assert document["install"] == "sudo apt-get install -y g++"
    assert "sudo apt-get install -y g++" in document["error"] and "build-essential" in document["error"]
    assert not (tmp_path / "out").exists()


def test_build_runner_refuses_a_folder_that_is_not_an_sdk(agent: AgentCli, tmp_path: Path) -> None:
    result = agent.run(
        "build-runner", "--sdk", tmp_path, "--source", AGENT_DIR.parent / "runner", "--out", tmp_path / "o"
    )
    assert result.returncode == 2 and "executorch-config.cmake" in result.document["error"]
