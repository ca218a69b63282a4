"""`build-runner`: configure and build board/runner against the ExecuTorch SDK, on the board itself.

cmake (>= 3.28) and ninja come from PATH or from `<wd>/tools/{cmake,ninja}/bin` (unpacked from wheels by
provisioning); a missing C++ compiler is reported with the exact package to install.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any, Sequence

from .errors import AgentError, BadInput
from .files import atomic_path, log, utc_now
from .process import run_probe
from .workdir import Workdir

MIN_CMAKE = (3, 28)
RUNNER_NAME = "etlab_runner"
INSTALL_COMPILER = "sudo apt-get install -y g++"
COMPILER_PROBE = "#include <string>\n#include <vector>\nint main() { return std::vector<std::string>{}.size(); }\n"


class MissingTool(AgentError):
    """A build prerequisite is absent; `install` in the details says how to get it."""


def _version_of(tool: str) -> tuple[int, ...] | None:
    try:
        done = subprocess.run([tool, "--version"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    match = re.search(r"(\d+)\.(\d+)(?:\.(\d+))?", done.stdout.decode("utf-8", errors="replace"))
    if done.returncode != 0 or not match:
        return None
    return tuple(int(part) for part in match.groups() if part is not None)


def find_cmake(workdir: Workdir) -> str:
    candidates = [shutil.which("cmake"), str(workdir.tools / "cmake" / "bin" / "cmake")]
    seen = []
    for candidate in candidates:
        if not candidate or not os.access(candidate, os.X_OK):
            continue
        version = _version_of(candidate)
        seen.append(f"{candidate} ({'.'.join(map(str, version)) if version else 'unusable'})")
        if version and version[:2] >= MIN_CMAKE:
            return candidate
    raise MissingTool(
        f"no cmake >= {'.'.join(map(str, MIN_CMAKE))} found"
        + (f" (found {', '.join(seen)})" if seen else " on PATH or in " + str(workdir.tools / "cmake" / "bin"))
        + ": provision the board so the cmake wheel is unpacked into <workdir>/tools/cmake",
        missing="cmake",
        install="pip wheel cmake>=3.28, unpacked by provisioning into <workdir>/tools/cmake",
    )


def find_ninja(workdir: Workdir) -> str:
    for candidate in (shutil.which("ninja"), str(workdir.tools / "ninja" / "bin" / "ninja")):
        if candidate and os.access(candidate, os.X_OK) and _version_of(candidate):
            return candidate
    raise MissingTool(
        f"no ninja found on PATH or in {workdir.tools / 'ninja' / 'bin'}: provision the board so the ninja "
        "wheel is unpacked into <workdir>/tools/ninja (or: sudo apt-get install -y ninja-build)",
        missing="ninja",
        install="sudo apt-get install -y ninja-build",
    )


def find_compiler() -> str:
    """A C++ compiler that can compile a program using the standard library, or MissingTool."""
    names = [os.environ.get("CXX") or "", "c++", "g++", "clang++"]
    found = [path for path in (shutil.which(name) for name in names if name) if path]
    if not found:
        raise MissingTool(
            f"no C++ compiler found (looked for $CXX, c++, g++, clang++ on PATH): install one with "
            f"`{INSTALL_COMPILER}` (or `sudo apt-get install -y build-essential`)",
            missing="c++ compiler",
            install=INSTALL_COMPILER,
            alternative="sudo apt-get install -y build-essential",
        )
    compiler = found[0]
    try:
        done = subprocess.run(
            [compiler, "-x", "c++", "-std=c++17", "-fsyntax-only", "-"],
            input=COMPILER_PROBE.encode(),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            timeout=120,
        )
        works = done.returncode == 0
        output = done.stdout.decode("utf-8", errors="replace").strip()
    except (OSError, subprocess.SubprocessError) as exc:
        works, output = False, str(exc)
    if not works:
        raise MissingTool(
            f"C++ compiler {compiler} cannot compile a C++17 program ({output.splitlines()[-1] if output else '?'}): "
            f"install the toolchain with `{INSTALL_COMPILER}` (or `sudo apt-get install -y build-essential`)",
            missing="c++ standard library headers",
            install=INSTALL_COMPILER,
            alternative="sudo apt-get install -y build-essential",
        )
    return compiler


def _run_logged(step: str, argv: Sequence[str], log_file: Any, env: dict[str, str], timeout: float) -> None:
    log_file.write(f"\n$ {' '.join(argv)}\n".encode())
    log_file.flush()
    log(f"build-runner: {step}")
    try:
        done = subprocess.run(list(argv), stdout=log_file, stderr=subprocess.STDOUT, env=env, timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        raise AgentError(f"runner build step '{step}' exceeded {timeout:g} s") from exc
    if done.returncode != 0:
        raise AgentError(f"runner build step '{step}' failed with exit code {done.returncode}")


def _tail(path: Path, lines: int = 25) -> list[str]:
    try:
        return path.read_text(encoding="utf-8", errors="replace").splitlines()[-lines:]
    except OSError:
        return []


def build_runner(
    workdir: Workdir, sdk: Path, source: Path, out: Path, jobs: int | None = None, timeout: float = 3600.0
) -> dict[str, Any]:
    """Build `source` (board/runner) against `sdk`; the binary lands atomically at `<out>/etlab_runner`."""
    sdk = Path(sdk).expanduser().absolute()
    source = Path(source).expanduser().absolute()
    out = Path(out).expanduser().absolute()
    if not (sdk / "share" / "cmake" / "executorch-config.cmake").is_file():
        raise BadInput(f"{sdk} is not an ExecuTorch SDK: share/cmake/executorch-config.cmake is missing")
    if not (source / "CMakeLists.txt").is_file():
        raise BadInput(f"{source} has no CMakeLists.txt: pass the board/runner folder")
    compiler = find_compiler()
    cmake = find_cmake(workdir)
    ninja = find_ninja(workdir)
    jobs = jobs or os.cpu_count() or 1

    out.mkdir(parents=True, exist_ok=True)
    build_dir = out / "build"
    # Always from scratch: the pushed sources carry mtime 0 (a reproducible tarball), so an incremental build would
    # take every old object file as up to date and link a stale runner. A build only runs when something changed.
    shutil.rmtree(build_dir, ignore_errors=True)
    build_log = out / "build.log"
    env = dict(os.environ, CXX=compiler)
    env["PATH"] = os.pathsep.join([os.path.dirname(ninja), os.path.dirname(cmake), env.get("PATH", "")])
    started = time.monotonic()
    try:
        with open(str(build_log), "wb") as log_file:
            log_file.write(f"etlab build-runner {utc_now()}: sdk={sdk} source={source} out={out}\n".encode())
            configure = [cmake, "-S", str(source), "-B", str(build_dir), "-G", "Ninja"]
            configure += ["-DCMAKE_BUILD_TYPE=Release", f"-DCMAKE_MAKE_PROGRAM={ninja}"]
            configure += [
                f"-DCMAKE_CXX_COMPILER={compiler}",
                f"-DEXECUTORCH_ROOT={sdk}",
                f"-DCMAKE_INSTALL_PREFIX={out}",
            ]
            _run_logged("configure", configure, log_file, env, timeout)
            _run_logged("build", [cmake, "--build", str(build_dir), "--parallel", str(jobs)], log_file, env, timeout)
    except AgentError as exc:
        raise AgentError(str(exc), build_log=str(build_log), log_tail=_tail(build_log)) from exc
    built = build_dir / RUNNER_NAME
    if not built.is_file():
        raise AgentError(f"the build finished but produced no {built}", build_log=str(build_log))
    # The binary's RUNPATH was computed for <out> (CMAKE_INSTALL_PREFIX), so a plain copy is the install.
    final = out / RUNNER_NAME
    with atomic_path(final) as tmp:
        shutil.copyfile(str(built), str(tmp))
        os.chmod(str(tmp), 0o755)
    version = _runner_version(final)
    return {
        "runner": str(final),
        "runner_version": version.get("runner_version"),
        "executorch_version": version.get("executorch_version"),
        "build_log": str(build_log),
        "cmake": cmake,
        "ninja": ninja,
        "compiler": compiler,
        "jobs": jobs,
        "duration_s": round(time.monotonic() - started, 3),
    }


def _runner_version(runner: Path) -> dict[str, Any]:
    answer = run_probe([str(runner), "--version"], 30.0)
    if answer is None:
        raise AgentError(f"built runner {runner} does not answer --version")
    code, stdout, stderr = answer
    try:
        version = json.loads(stdout.decode("utf-8", errors="replace"))
    except ValueError:
        version = None
    if code != 0 or not isinstance(version, dict):
        detail = stderr.decode("utf-8", errors="replace").strip()
        raise AgentError(f"built runner {runner} --version failed (exit {code}): {detail}")
    return version
