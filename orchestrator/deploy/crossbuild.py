"""Cross-build the native runner on the workstation, for boards without a compiler (`build: workstation|auto`).

The runner is built by Debian's cross g++ (`aarch64-linux-gnu-g++`) against the SDK of the executorch wheel
for the board's platform, with the same CMakeLists as on a board, so it carries the same version stamp. The
build mirrors the board workdir's layout (`runtime/<v>/` beside `runner/<v>/`), so the binary's `$ORIGIN`
RUNPATH finds the SDK on the board exactly as an on-board build does. Builds are cached by source hash,
executorch version, architecture and compiler.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from orchestrator import paths
from orchestrator.errors import BoardError
from orchestrator.fsutil import atomic_write_json, file_lock, read_json, sha256_and_size, sha256_file

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


COMPLETE = "complete.json"  # written last, beside runner/: what a finished build produced


def _cache_key(compiler: CrossCompiler, wheel: Path, source_sha256: str, executorch_version: str) -> str:
    return hashlib.sha256(
        f"{source_sha256}\n{executorch_version}\n{wheel.name}\n{compiler.arch}\n{compiler.version}".encode()
    ).hexdigest()[:16]


def _complete(folder: Path, binary: Path) -> bool:
    """Whether `folder` holds a finished build: its stamp names the binary's exact size and sha256 (a binary that
    a killed build left behind, or one truncated later, is rebuilt)."""
    try:
        stamp = read_json(folder / COMPLETE)
        if not isinstance(stamp, dict) or stamp.get("size") != binary.stat().st_size:
            return False
    except (OSError, ValueError):
        return False
    return stamp.get("sha256") == sha256_file(binary)


@contextlib.contextmanager
def cross_built_runner(
    compiler: CrossCompiler, wheel: Path, runner_source: Path, source_sha256: str, executorch_version: str
) -> Iterator[Path]:
    """The runner for `compiler.arch`, built or reused, on the workstation; it stays in place for the block.

    One lock per cache key (`<key>.lock`): a build holds it exclusively, users of the binary share it, so parallel
    setups of boards without a compiler build once and nobody removes a build someone is pushing."""
    key = _cache_key(compiler, wheel, source_sha256, executorch_version)
    root = paths.state_dir() / "cache" / "cross" / compiler.arch
    folder = root / key
    binary = folder / "runner" / executorch_version / RUNNER_NAME
    lock = root / f"{key}.lock"
    for _ in range(3):
        with file_lock(lock, shared=True):
            if _complete(folder, binary):
                yield binary
                return
        with file_lock(lock):
            if not _complete(folder, binary):
                _build(compiler, wheel, runner_source, folder, binary, executorch_version)
                _remove_stale(root, key)
    raise BoardError(f"the cross-built runner in {folder} kept disappearing (another etlab removing it?)")


def cross_build_runner(
    compiler: CrossCompiler, wheel: Path, runner_source: Path, source_sha256: str, executorch_version: str
) -> Path:
    """Build (or reuse) the runner for `compiler.arch`; returns the binary on the workstation."""
    with cross_built_runner(compiler, wheel, runner_source, source_sha256, executorch_version) as binary:
        return binary


def _build(
    compiler: CrossCompiler, wheel: Path, runner_source: Path, folder: Path, binary: Path, executorch_version: str
) -> None:
    """Build into a private folder and move the finished binary into place, then write the stamp: a build killed
    at any point leaves no stamp, so it is never taken for a finished one. The caller holds the key's lock."""
    (folder / COMPLETE).unlink(missing_ok=True)
    sdk = unpack_sdk(wheel, folder / "runtime" / executorch_version)
    tools = _build_tools()
    log = folder / "build.log"
    out = binary.parent
    out.mkdir(parents=True, exist_ok=True)
    private = Path(tempfile.mkdtemp(prefix=".build-", dir=folder))
    try:
        build, staging = private / "build", private / "install"
        build.mkdir()
        (build / "toolchain.cmake").write_text(toolchain_file(compiler, sdk))
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
                # The final place: the $ORIGIN RUNPATH is computed from it (board/runner/CMakeLists.txt).
                f"-DCMAKE_INSTALL_PREFIX={out}",
            ],
            [tools["cmake"], "--build", str(build), "--parallel", "2"],
            # Installed into the private folder; the RUNPATH is fixed at build time, so moving it keeps it right.
            [tools["cmake"], "--install", str(build), "--prefix", str(staging)],
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
        built = staging / RUNNER_NAME
        if not built.is_file():
            raise BoardError(f"the cross build finished but produced no {binary.name}; see {log}")
        with open(built, "rb+") as handle:
            os.fsync(handle.fileno())
        os.replace(built, binary)
        sha256, size = sha256_and_size(binary)
        atomic_write_json(folder / COMPLETE, {"sha256": sha256, "size": size})
    finally:
        shutil.rmtree(private, ignore_errors=True)


def _remove_stale(root: Path, key: str) -> None:
    """Remove builds of earlier sources or versions, except any that another build or push holds right now."""
    for stale in root.iterdir():
        if not stale.is_dir() or stale.name == key:
            continue
        lock = root / f"{stale.name}.lock"
        with open(lock, "a") as handle:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                continue  # in use: left for a later build to remove
            shutil.rmtree(stale, ignore_errors=True)
            # Unlinked while held: one that opened it just now builds anew into a private folder; nothing is lost.
            lock.unlink(missing_ok=True)
