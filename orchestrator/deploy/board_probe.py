"""Runs ON a board as `python3 -c <this file> <workdir>`, before anything is installed there.

Standard library only, Python 3.8 compatible. Prints one JSON document: what provisioning must know
(architecture, Python, glibc, compiler, cmake, ninja) and what is already provisioned (state.json, the
runner's own version answer), so an up-to-date board costs a single round trip.
"""

import json
import os
import platform
import re
import shutil
import subprocess
import sys


def _version_of(command):
    try:
        output = subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=20).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    match = re.search(rb"(\d+\.\d+(\.\d+)?)", output)
    return match.group(1).decode() if match else None


def _tool(name, workdir):
    bundled = os.path.join(workdir, "tools", name, "bin", name)
    return bundled if os.access(bundled, os.X_OK) else shutil.which(name)


def probe(workdir_arg):
    workdir = os.path.abspath(os.path.expanduser(workdir_arg))
    libc, libc_version = platform.libc_ver()
    compiler = shutil.which("c++") or shutil.which("g++") or shutil.which("clang++")
    cmake = _tool("cmake", workdir)
    ninja = _tool("ninja", workdir)
    state = None
    state_path = os.path.join(workdir, "state.json")
    if os.path.isfile(state_path):
        try:
            with open(state_path) as handle:
                state = json.load(handle)
        except (OSError, ValueError):
            state = None
    runner_answer = None
    runner = (state or {}).get("runner_path")
    if runner and os.access(runner, os.X_OK):
        try:
            done = subprocess.run([runner, "--version"], capture_output=True, timeout=30)
            runner_answer = json.loads(done.stdout.decode() or "null") if done.returncode == 0 else None
        except (OSError, ValueError, subprocess.SubprocessError):
            runner_answer = None
    try:
        usage = shutil.disk_usage(workdir if os.path.isdir(workdir) else os.path.dirname(workdir) or "/")
        free_mb = usage.free // (1 << 20)
    except OSError:
        free_mb = None
    return {
        "workdir": workdir,
        "arch": platform.machine(),
        "system": platform.system(),
        "python": platform.python_version(),
        "python_tag": "cp{}{}".format(*sys.version_info[:2]),
        "libc": libc,
        "glibc": libc_version if libc == "glibc" else None,
        "compiler": compiler,
        "compiler_version": _version_of([compiler, "--version"]) if compiler else None,
        "cmake": cmake,
        "cmake_version": _version_of([cmake, "--version"]) if cmake else None,
        "ninja": ninja,
        "state": state,
        "runner": runner_answer,
        "agent_present": os.path.isfile(os.path.join(workdir, "board", "agent", "etlab_agent", "__main__.py")),
        "free_mb": free_mb,
    }


if __name__ == "__main__":
    print(json.dumps(probe(sys.argv[1] if len(sys.argv) > 1 else "~/.etlab")))
