"""Cross-build the native runner on the workstation, for boards without a compiler (`build: workstation|auto`).

The runner is built by Debian's cross g++ (`aarch64-linux-gnu-g++`) against the SDK of the executorch wheel
for the board's platform, with the same CMakeLists as on a board, so it carries the same version stamp. The
build mirrors the board workdir's layout (`runtime/<v>/` beside `runner/<v>/`), so the binary's `$ORIGIN`
RUNPATH finds the SDK on the board exactly as an on-board build does. Builds are cached by source hash,
executorch version, architecture and compiler.
"""

from __future__ import annotations

import hashlib
import platform
import shutil
import subprocess
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path

from orchestrator import paths
from orchestrator.errors import BoardError

# Board architecture (uname -m) -> GNU triplet of Debian's cross toolchain.
TRIPLETS = {"aarch64": "aarch64-linux-gnu", "x86_64": "x86_64-linux-gnu", "armv7l": "arm-linux-gnueabihf"}
CMAKE_PROCESSORS = {"aarch64": "aarch64", "x86_64": "x86_64", "armv7l": "arm"}
RUNNER_NAME = "etlab_runner"


@dataclass(frozen=True)
class CrossCompiler:
    arch: str
    cxx: str  # path of the C++ compiler
    version: str


def install_hint(arch: str) -> str:
    triplet = TRIPLETS.get(arch, f"{arch}-linux-gnu")
    return f"sudo apt-get install -y g++-{triplet.replace('_', '-')}"


def find_cross_compiler(arch: str) -> CrossCompiler | None:
    """The workstation's C++ compiler for `arch` (the native g++ when the workstation is that arch), or None."""
    triplet = TRIPLETS.get(arch)
    candidates = [f"{triplet}-g++"] if triplet else []
    if arch == platform.machine():
        candidates.append("g++")
    for name in candidates:
        found = shutil.which(name)
        if found is None:
            continue
        done = subprocess.run([found, "-dumpfullversion"], capture_output=True, text=True, check=False)
        if done.returncode == 0:
            return CrossCompiler(arch, found, done.stdout.strip())
    return None


def toolchain_file(compiler: CrossCompiler, sdk: Path) -> str:
    """A CMake toolchain file: cross compiler, target processor, and the SDK as the only place to find packages."""
    processor = CMAKE_PROCESSORS.get(compiler.arch, compiler.arch)
    return "\n".join(
        [
            "set(CMAKE_SYSTEM_NAME Linux)",
            f"set(CMAKE_SYSTEM_PROCESSOR {processor})",
            f'set(CMAKE_CXX_COMPILER "{compiler.cxx}")',
            f'set(CMAKE_FIND_ROOT_PATH "{sdk}")',
            "set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)",
            "set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY ONLY)",
            "set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE ONLY)",
            "set(CMAKE_FIND_ROOT_PATH_MODE_PACKAGE BOTH)",
            "",
        ]
    )


def unpack_sdk(wheel: Path, target: Path) -> Path:
    """The wheel's executorch/{include,lib,share}/ in `target` (once per wheel)."""
    stamp = target / ".unpacked"
    if stamp.is_file() and stamp.read_text() == wheel.name:
        return target
    shutil.rmtree(target, ignore_errors=True)
    target.mkdir(parents=True)
    prefixes = ("executorch/include/", "executorch/lib/", "executorch/share/")
    with zipfile.ZipFile(wheel) as archive:
        for member in archive.infolist():
            if member.is_dir() or not member.filename.startswith(prefixes) or ".." in member.filename.split("/"):
                continue
            destination = target / member.filename.removeprefix("executorch/")
            destination.parent.mkdir(parents=True, exist_ok=True)
            with archive.open(member) as source, open(destination, "wb") as sink:
                shutil.copyfileobj(source, sink)
    stamp.write_text(wheel.name)
    return target


def _build_tools() -> dict[str, str]:
    """cmake and ninja: the venv's (pip wheels) first, then PATH."""
    found = {}
    for tool in ("cmake", "ninja"):
        beside = Path(sys.executable).parent / tool
        path = str(beside) if beside.is_file() else shutil.which(tool)
        if path is None:
            raise BoardError(f"cannot cross-build the runner: {tool} is not installed on the workstation")
        found[tool] = path
    return found


def cross_build_runner(
    compiler: CrossCompiler, wheel: Path, runner_source: Path, source_sha256: str, executorch_version: str
) -> Path:
    """Build (or reuse) the runner for `compiler.arch`; returns the binary on the workstation."""
    key = hashlib.sha256(
        f"{source_sha256}\n{executorch_version}\n{wheel.name}\n{compiler.arch}\n{compiler.version}".encode()
    ).hexdigest()[:16]
    root = paths.state_dir() / "cache" / "cross" / compiler.arch
    out = root / key / "runner" / executorch_version
    binary = out / RUNNER_NAME
    if binary.is_file():
        return binary
    sdk = unpack_sdk(wheel, root / key / "runtime" / executorch_version)
    build = root / key / "build"
    shutil.rmtree(build, ignore_errors=True)
    build.mkdir(parents=True)
    (build / "toolchain.cmake").write_text(toolchain_file(compiler, sdk))
    tools = _build_tools()
    log = root / key / "build.log"
    steps = [
        [
            tools["cmake"],
            "-S",
            str(runner_source),
            "-B",
            str(build),
            "-G",
            "Ninja",
            "-DCMAKE_BUILD_TYPE=Release",
            f"-DCMAKE_MAKE_PROGRAM={tools['ninja']}",
            f"-DCMAKE_TOOLCHAIN_FILE={build / 'toolchain.cmake'}",
            f"-DEXECUTORCH_ROOT={sdk}",
            f"-DCMAKE_INSTALL_PREFIX={out}",
        ],
        [tools["cmake"], "--build", str(build), "--parallel", "2"],
        [tools["cmake"], "--install", str(build)],
    ]
    with open(log, "wb") as handle:
        for argv in steps:
            handle.write(f"\n$ {' '.join(argv)}\n".encode())
            handle.flush()
            done = subprocess.run(argv, stdout=handle, stderr=subprocess.STDOUT, check=False)
            if done.returncode != 0:
                tail = log.read_text(errors="replace").strip().splitlines()[-15:]
                raise BoardError(
                    f"cross-building the runner for {compiler.arch} failed (exit {done.returncode}); see {log}:\n"
                    + "\n".join(tail)
                )
    shutil.rmtree(build, ignore_errors=True)
    if not binary.is_file():
        raise BoardError(f"the cross build finished but produced no {binary}")
    for stale in root.iterdir():  # builds of earlier sources or versions
        if stale.is_dir() and stale.name != key:
            shutil.rmtree(stale, ignore_errors=True)
    return binary
