"""What provisioning sends to a board: the board/ tree as a reproducible tarball, wheels for the board's platform
(downloaded on the workstation, offline for the board), and the built-in program that verifies a runner.
"""

from __future__ import annotations

import glob
import gzip
import hashlib
import io
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import threading
from pathlib import Path
from typing import Any, NamedTuple

from orchestrator import paths
from orchestrator.errors import BoardError
from orchestrator.fsutil import TMP_PREFIX, atomic_path, atomic_write_bytes, file_lock
from orchestrator.tensorfile import NamedTensor, write_tensors
from orchestrator.versions import executorch_version

MIN_GLIBC = (2, 28)  # executorch wheels are manylinux_2_28
_TREE_EXCLUDE = {"build", "__pycache__", ".pytest_cache", ".ruff_cache"}


def version_tuple(text: str | None) -> tuple[int, ...]:
    """(major, minor) of a dotted version; () when it is not one."""
    try:
        return tuple(int(part) for part in (text or "").split(".")[:2])
    except ValueError:
        return ()


# ---------------------------------------------------------------- the board/ tree


def _tree_files(root: Path) -> list[Path]:
    files = []
    for path in sorted(root.rglob("*")):
        relative = path.relative_to(root)
        if any(part in _TREE_EXCLUDE for part in relative.parts) or path.suffix == ".pyc":
            continue
        if path.is_file():
            files.append(path)
    return files


def tree_sha256(root: Path) -> str:
    """Content hash of a source tree (paths, modes and bytes), independent of mtimes."""
    digest = hashlib.sha256()
    for path in _tree_files(root):
        digest.update(str(path.relative_to(root)).encode() + b"\0")
        digest.update(b"x" if path.stat().st_mode & 0o111 else b"-")
        digest.update(hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()


def board_tarball(root: Path = paths.BOARD_SOURCE_DIR) -> tuple[Path, str]:
    """A reproducible .tar.gz of board/ (cached by content), and the tree hash it carries."""
    tree = tree_sha256(root)
    target = paths.state_dir() / "cache" / f"board-{tree[:16]}.tar.gz"
    if not target.is_file():
        buffer = io.BytesIO()
        with gzip.GzipFile(fileobj=buffer, mode="wb", mtime=0) as zipped, tarfile.open(fileobj=zipped, mode="w") as tar:
            for path in _tree_files(root):
                info = tar.gettarinfo(str(path), arcname=str(path.relative_to(root)))
                info.uid = info.gid = 0
                info.uname = info.gname = ""
                info.mtime = 0
                with open(path, "rb") as handle:
                    tar.addfile(info, handle)
        atomic_write_bytes(target, buffer.getvalue())
        for stale in target.parent.glob("board-*.tar.gz"):  # tarballs of earlier board/ trees
            if stale != target:
                stale.unlink(missing_ok=True)
    return target, tree


# ---------------------------------------------------------------- wheels


def manylinux_platforms(arch: str, glibc: str) -> list[str]:
    """Every manylinux tag a board with this glibc accepts, newest first."""
    major, minor = version_tuple(glibc) or (2, 17)
    tags = [f"manylinux_{major}_{m}_{arch}" for m in range(minor, 16, -1)]
    return [*tags, f"manylinux2014_{arch}"]


def _pip_download(requirement: str, dest: Path, platforms: list[str], python: str | None) -> None:
    """Download into a private folder inside `dest`, then rename the wheel into place: the shared cache never holds a
    partial wheel (a killed pip, or another board's setup downloading the same wheel at the same time)."""
    private = Path(tempfile.mkdtemp(prefix=TMP_PREFIX, dir=dest))
    try:
        argv = [sys.executable, "-m", "pip", "download", "--quiet", "--only-binary=:all:", "--no-deps"]
        argv += ["--dest", str(private)]
        for platform_tag in platforms:
            argv += ["--platform", platform_tag]
        if python:
            argv += ["--python-version", python, "--implementation", "cp"]
        argv.append(requirement)
        done = subprocess.run(argv, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            errors = [line for line in done.stderr.splitlines() if line.startswith("ERROR")]
            last = errors or done.stderr.splitlines()[-1:]
            raise BoardError(f"cannot download {requirement} for {platforms[0]}: {' '.join(last)[:400]}")
        for wheel in private.glob("*.whl"):
            os.replace(wheel, dest / wheel.name)
    finally:
        shutil.rmtree(private, ignore_errors=True)


def fetch_wheel(name: str, requirement: str, probe_facts: dict[str, Any], *, any_python: bool = False) -> Path:
    """A wheel for the board's platform, from the workstation's wheel cache or PyPI."""
    arch = probe_facts["arch"]
    dest = paths.state_dir() / "wheels"
    dest.mkdir(parents=True, exist_ok=True)
    platforms = manylinux_platforms(arch, probe_facts.get("glibc") or "2.17")
    board_python = ".".join(probe_facts["python"].split(".")[:2])
    version = requirement.partition("==")[2]
    pattern = f"{name}-{version or '*'}-*.whl"

    def cached() -> Path | None:
        for candidate in sorted(glob.glob(str(dest / pattern)), reverse=True):
            tags = Path(candidate).name.removesuffix(".whl").split("-")[-1]
            if tags == "any" or any(part.endswith(arch) and part in platforms for part in tags.split(".")):
                return Path(candidate)
        return None

    found = cached()
    if found:
        return found
    # The SDK inside the executorch wheel does not depend on the Python version: any cp wheel will do.
    pythons = [board_python] + (["3.12", "3.11", "3.10"] if any_python else [])
    errors = []
    for python in dict.fromkeys(pythons):
        try:
            _pip_download(requirement, dest, platforms, python)
            break
        except BoardError as exc:
            errors.append(str(exc))
    found = cached()
    if found is None:
        raise BoardError(
            f"no {name} wheel for {arch} / glibc {probe_facts.get('glibc')}: {errors[-1] if errors else ''}"
        )
    return found


# ---------------------------------------------------------------- the verification model


# torch.export keeps module-level state while it traces: boards set up in parallel threads lower one at a time
_VERIFY_LOCK = threading.Lock()


class VerificationFiles(NamedTuple):
    """The verification program, its inputs and the outputs eager PyTorch gave for them (the runner's reference)."""

    program: Path
    inputs: Path
    reference: Path


def verification_files() -> VerificationFiles:
    """A tiny XNNPACK-delegated program with its inputs and reference, made once per executorch version: it proves
    the board runs ours (setup-board) and computes right (the health job)."""
    stem = paths.cache_dir() / f"verify-executorch-{executorch_version()}"
    files = VerificationFiles(stem.with_suffix(".pte"), Path(f"{stem}.inputs.etlt"), Path(f"{stem}.reference.etlt"))
    if all(path.is_file() for path in files):
        return files
    stem.parent.mkdir(parents=True, exist_ok=True)
    # one thread (torch.export's module-level state) and one process (an xdist worker, a lab worker) at a time
    with _VERIFY_LOCK, file_lock(Path(f"{stem}.lock")):
        if not all(path.is_file() for path in files):  # else another board's thread or process made them meanwhile
            _lower_verify_model(files)
        return files


def verify_model() -> Path:
    return verification_files().program


def _lower_verify_model(files: VerificationFiles) -> None:
    import torch
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.exir import to_edge_transform_and_lower

    class Tiny(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.linear = torch.nn.Linear(16, 8)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.relu(self.linear(x)).cumsum(dim=1)  # cumsum stays portable: both paths run

    torch.manual_seed(0)
    model, example = Tiny().eval(), torch.randn(1, 16)
    program = torch.export.export(model, (example,))
    lowered = to_edge_transform_and_lower(program, partitioner=[XnnpackPartitioner()]).to_executorch()
    with torch.no_grad():
        expected = model(example)
    # inputs and reference first: the program is what says the three are there
    write_tensors(files.inputs, [NamedTensor("input_0", example.numpy())])
    write_tensors(files.reference, [NamedTensor("output_0", expected.numpy())])
    with atomic_path(files.program) as tmp:
        tmp.write_bytes(lowered.buffer)
