"""bootstrap.sh's package install: uv (handed pip's settings by tools/uv_args.py) against pip, cold, alternated.

Each round installs etlab with its test extra into a fresh venv twice: once as bootstrap.sh's fallback does
(`pip install -e '.[test]'`, pip's cache off) and once as bootstrap.sh does (`uv pip install`, an empty uv cache),
so both download or copy every wheel as a clean CI machine does. Prints each install's wall time, the ratio, and
whether the two venvs hold the same distributions at the same versions (they must: the speed is worth nothing
otherwise).

    .venv/bin/python bench/bench_install.py [--rounds 2]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def base_python() -> str:
    """The interpreter .venv was made from: each venv here is its own, not nested in .venv."""
    return str(getattr(sys, "_base_executable", sys.executable))


def install_with_pip(scratch: Path) -> tuple[float, Path]:
    python = scratch / "pip-venv" / "bin" / "python"
    subprocess.run([base_python(), "-m", "venv", python.parent.parent], check=True)
    started = time.perf_counter()
    subprocess.run([python, "-m", "pip", "install", "-q", "-e", ".[test]"], cwd=ROOT, check=True,
                   env={**os.environ, "PIP_NO_CACHE_DIR": "1"})  # fmt: skip
    return time.perf_counter() - started, python


def install_with_uv(scratch: Path) -> tuple[float, Path]:
    python = scratch / "uv-venv" / "bin" / "python"
    subprocess.run([base_python(), "-m", "venv", python.parent.parent], check=True)
    env = {**os.environ, "UV_CACHE_DIR": str(scratch / "uv-cache"), "PIP_NO_CACHE_DIR": "1"}
    started = time.perf_counter()  # as bootstrap.sh: uv itself installed by pip, then the settings, then uv
    subprocess.run([python, "-m", "pip", "install", "-q", "uv"], check=True, env=env)
    args = subprocess.run([python, ROOT / "tools" / "uv_args.py", python], check=True, capture_output=True,
                          text=True).stdout.split()  # fmt: skip
    uv = python.parent / "uv"
    # --compile-bytecode as bootstrap.sh: pip compiles too, and where PYTHONDONTWRITEBYTECODE is set nothing else does
    options = ["-q", "--compile-bytecode", "--python", str(python), *args]
    install = [str(uv), "pip", "install", *options, "-e", ".[test]"]
    subprocess.run(install, cwd=ROOT, check=True, env=env)
    return time.perf_counter() - started, python


def distributions(python: Path) -> set[str]:
    listed = subprocess.run([python, "-m", "pip", "list", "--format", "freeze", "--exclude-editable"],
                            check=True, capture_output=True, text=True).stdout.split()  # fmt: skip
    return {line for line in listed if not line.startswith("uv==")}


def main() -> None:
    parser = argparse.ArgumentParser(description="uv against pip for bootstrap.sh's install")
    parser.add_argument("--rounds", type=int, default=2)
    rounds = parser.parse_args().rounds
    times: dict[str, list[float]] = {"pip": [], "uv": []}
    for round_index in range(rounds):
        order = (install_with_pip, install_with_uv) if round_index % 2 == 0 else (install_with_uv, install_with_pip)
        with tempfile.TemporaryDirectory(prefix="etlab-install-") as folder:
            venvs = {}
            for install in order:
                name = "pip" if install is install_with_pip else "uv"
                seconds, venvs[name] = install(Path(folder))
                times[name].append(seconds)
                print(f"round {round_index + 1}: {name} {seconds:.1f} s", flush=True)
            only_pip = distributions(venvs["pip"]) - distributions(venvs["uv"])
            only_uv = distributions(venvs["uv"]) - distributions(venvs["pip"])
            differences = f" (pip only: {sorted(only_pip)}, uv only: {sorted(only_uv)})" if only_pip or only_uv else ""
            print(f"round {round_index + 1}: same distributions and versions: {not differences}{differences}")
            shutil.rmtree(folder, ignore_errors=True)
    pip, uv = statistics.median(times["pip"]), statistics.median(times["uv"])
    print(f"median: pip {pip:.1f} s, uv {uv:.1f} s: uv takes {uv / pip:.2f}x pip's time")


if __name__ == "__main__":
    main()
