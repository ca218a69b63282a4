"""The native runner built once per content, and tiny DistilBERT programs for it to run.

`runner_binary` builds board/runner with board/runner/build.sh (cmake and ninja from the venv) into
`.etlab/test-cache/runner-<hash>/`, where the hash covers the runner sources, the ExecuTorch build version
and the SDK location; a later session with nothing changed reuses the binary without building.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import importlib.util
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from orchestrator.lowering.export.lower import LoweringResult
from orchestrator.lowering.variants import VARIANTS
from orchestrator.paths import BOARD_SOURCE_DIR, state_dir
from orchestrator.tensorfile import NamedTensor, read_tensors
from orchestrator.versions import installed

RUNNER_SOURCE_DIR = BOARD_SOURCE_DIR / "runner"
RUNNER_BINARY_NAME = "etlab_runner"
KERNEL_CHECK_NAME = "etlab_kernel_check"  # built and installed beside the runner here (ETLAB_BUILD_KERNEL_CHECK)
SEQUENCE_LENGTH = 128


def executorch_sdk_dir() -> Path:
    """The executorch wheel's package folder: it holds include/, lib/ and share/cmake/ (no import needed)."""
    spec = importlib.util.find_spec("executorch")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("executorch is not installed in this environment")
    return Path(next(iter(spec.submodule_search_locations))).resolve()


def _runner_sources() -> list[Path]:
    return sorted(
        path
        for path in RUNNER_SOURCE_DIR.rglob("*")
        if path.is_file() and "build" not in path.relative_to(RUNNER_SOURCE_DIR).parts[:1]
    )


def runner_build_key(sdk_dir: Path) -> str:
    digest = hashlib.sha256()
    digest.update(f"executorch={installed('executorch')}\nsdk={sdk_dir}\n".encode())
    for path in _runner_sources():
        digest.update(str(path.relative_to(RUNNER_SOURCE_DIR)).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


@contextlib.contextmanager
def _exclusive(lock_path: Path) -> Iterator[None]:
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    with open(lock_path, "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield


def build_runner(cache_root: Path | None = None, sdk_dir: Path | None = None) -> Path:
    """Build (or reuse) the runner; returns the installed binary's path."""
    sdk_dir = sdk_dir or executorch_sdk_dir()
    cache_root = cache_root or state_dir() / "test-cache"
    output_dir = cache_root / f"runner-{runner_build_key(sdk_dir)}"
    binary = output_dir / RUNNER_BINARY_NAME
    with _exclusive(cache_root / "runner.lock"):
        if binary.is_file():
            return binary
        build_dir = cache_root / f"runner-build-{output_dir.name.removeprefix('runner-')}"
        shutil.rmtree(build_dir, ignore_errors=True)
        staging = output_dir.with_name(output_dir.name + ".partial")
        shutil.rmtree(staging, ignore_errors=True)
        tools = str(Path(sys.executable).parent)  # the venv's cmake and ninja
        env = {**os.environ, "PATH": tools + os.pathsep + os.environ.get("PATH", "")}
        completed = subprocess.run(
            # etlab_kernel_check too, beside the runner (tests/board/test_kernels.py)
            [
                "sh",
                str(RUNNER_SOURCE_DIR / "build.sh"),
                str(sdk_dir),
                str(build_dir),
                str(staging),
                "-DETLAB_BUILD_KERNEL_CHECK=ON",
            ],
            env=env,
            capture_output=True,
            text=True,
            check=False,
        )
        if completed.returncode != 0:
            raise RuntimeError(f"runner build failed ({completed.returncode}):\n{completed.stdout}\n{completed.stderr}")
        staging.rename(output_dir)
        shutil.rmtree(build_dir, ignore_errors=True)
        for stale in cache_root.glob("runner-*"):  # builds of earlier sources
            if stale.is_dir() and stale != output_dir:
                shutil.rmtree(stale, ignore_errors=True)
    return binary


@pytest.fixture(scope="session")
def runner_binary() -> Path:
    """The native runner, built against the venv's executorch wheel."""
    return build_runner()


@dataclass(frozen=True)
class RunnerModels:
    """Tiny DistilBERT lowered twice, with inputs and the eager model's outputs for them."""

    portable_pte: Path
    xnnpack_pte: Path
    inputs_etlt: Path
    inputs: list[NamedTensor]
    reference: np.ndarray  # eager logits for `inputs`
    generated_reference: np.ndarray  # eager logits for the runner's generated inputs (README.md)

    def pte(self, backend: str) -> Path:
        return {"portable": self.portable_pte, "xnnpack": self.xnnpack_pte}[backend]


def runner_models_from(result: LoweringResult) -> RunnerModels:
    """The tiny DistilBERT the real lowering produced, plus the eager outputs for the runner's generated inputs."""
    import torch

    from orchestrator.lowering.builtins import BUILTIN_SPECS
    from orchestrator.lowering.sources.builders.models import load_model

    paths = result.paths
    inputs = read_tensors(paths.reference_inputs)
    (reference,) = read_tensors(paths.reference_outputs)
    # What the runner generates without --inputs: ids (i*7+3) % 100, then ones (board/runner/README.md).
    generated_ids = ((torch.arange(SEQUENCE_LENGTH, dtype=torch.int64) * 7 + 3) % 100).unsqueeze(0)
    model = load_model(BUILTIN_SPECS[result.spec.name], "random").module
    with torch.no_grad():
        generated_reference = model(generated_ids, torch.ones_like(generated_ids)).numpy()
    return RunnerModels(
        paths.pte(VARIANTS["portable"]),
        paths.pte(VARIANTS["xnnpack"]),
        paths.reference_inputs,
        inputs,
        reference.array,
        generated_reference,
    )


@pytest.fixture(scope="session")
def runner_models(tiny_artifacts: dict[str, LoweringResult]) -> RunnerModels:
    return runner_models_from(tiny_artifacts["distilbert-tiny"])
