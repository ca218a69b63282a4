"""Warm paths stay light: the lowering cache is keyed on the resolved weights, and warm `fab` tasks import
no torch, transformers, executorch, scipy or matplotlib they do not need.

Imports are observed from outside, in real `fab` processes run with `python -X importtime`, which logs
every module the first time it is imported, whichever thread or function imports it.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from orchestrator.boards.inventory import Board
from orchestrator.commands import options
from orchestrator.errors import UsageError
from orchestrator.lowering.artifacts import ArtifactPaths, load_artifact
from orchestrator.lowering.export.lower import LoweringResult
from orchestrator.lowering.spec import load_spec_file
from orchestrator.lowering.variants import VARIANTS
from orchestrator.lowering.weights import cached_config, resolve_weights
from orchestrator.paths import PROJECT_ROOT
from tests.plugins.boards import write_inventory

HEAVY = frozenset({"torch", "torchvision", "transformers", "executorch", "scipy", "matplotlib", "huggingface_hub"})
RUN_ID = re.compile(r"\d{8}T\d{6}Z-[0-9a-f]{6}")
TINY_CONFIG: dict[str, Any] = {"vocab_size": 1000, "dim": 64, "n_layers": 2, "n_heads": 2, "hidden_dim": 128}


def fab(*args: str, env: dict[str, str]) -> tuple[subprocess.CompletedProcess[str], set[str]]:
    """A real `fab` process and the top-level packages it imported."""
    proc = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "fabric", *args],
        cwd=PROJECT_ROOT,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=600,
    )
    return proc, imported_packages(proc.stderr)


def imported_modules(stderr: str) -> set[str]:
    return set(re.findall(r"^import time:\s+\d+ \|\s+\d+ \|\s*([\w.]+)\s*$", stderr, flags=re.MULTILINE))


def imported_packages(stderr: str) -> set[str]:
    return {name.split(".")[0] for name in imported_modules(stderr)}


def mtimes(folder: Path) -> dict[str, int]:
    return {path.name: path.stat().st_mtime_ns for path in folder.iterdir()}


def copy_model(tiny_artifacts: dict[str, LoweringResult], model: str, root: Path) -> Path:
    shutil.copytree(tiny_artifacts[model].paths.folder, root / model, copy_function=shutil.copy2)
    return root


@pytest.fixture
def offline_hub(tmp_path: Path) -> dict[str, str]:
    """An empty HuggingFace cache and no hub: `--weights auto` must fall back to random."""
    return {"HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(tmp_path / "hf-cache"), "HF_HOME": str(tmp_path / "hf-home")}


def write_spec(path: Path, model_id: str) -> Path:
    spec = {"name": "warm-bert", "model_type": "distilbert", "task": "fill-mask", "model_id": model_id,
            "mask_token_id": 103, "seq_len": 32, "config": TINY_CONFIG}  # fmt: skip
    path.write_text(json.dumps(spec))
    return path


def put_in_hf_cache(cache: Path, model_id: str) -> Path:
    """Pretrained weights in the hub cache's layout (refs/main → snapshots/<commit>/), as a download leaves them."""
    import torch
    from transformers import DistilBertConfig, DistilBertForMaskedLM

    commit = "0123456789abcdef0123456789abcdef01234567"
    repo = cache / ("models--" + model_id.replace("/", "--"))
    torch.manual_seed(7)
    DistilBertForMaskedLM(DistilBertConfig(**TINY_CONFIG)).save_pretrained(repo / "snapshots" / commit)
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(commit)
    return repo


def test_random_then_auto_is_a_cache_hit_without_torch(
    tiny_artifacts: dict[str, LoweringResult], tmp_path: Path
) -> None:
    """The tiny models are random whatever is asked: `auto` after `random` reuses the lowering."""
    root = copy_model(tiny_artifacts, "distilbert-tiny", tmp_path / "artifacts")
    folder = ArtifactPaths.for_model("distilbert-tiny", root).folder
    assert load_artifact("distilbert-tiny", VARIANTS["xnnpack"], root).sidecar.weights == "random"
    before = mtimes(folder)

    proc, imported = fab("lower", "--model", "distilbert-tiny", env={"ETLAB_ARTIFACTS": str(root)})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "using cached artifacts for portable, xnnpack" in proc.stderr
    assert mtimes(folder) == before
    assert not imported & HEAVY, sorted(imported & HEAVY)


def test_auto_fallback_and_random_share_the_cache(tmp_path: Path, offline_hub: dict[str, str]) -> None:
    """A model with a model_id, offline and not in the HF cache: auto → random → auto reuse one lowering,
    without importing torch to find out; once the weights are in the cache, auto lowers them."""
    spec = write_spec(tmp_path / "spec.json", "etlab-test/warm-bert")
    root = tmp_path / "artifacts"
    env = {**offline_hub, "ETLAB_ARTIFACTS": str(root)}
    paths = ArtifactPaths.for_model("warm-bert", root)

    first, imported = fab("lower", "--spec", str(spec), "--backend", "portable", env=env)
    assert first.returncode == 0, first.stderr[-3000:]
    assert "Falling back to RANDOM weights" in first.stderr
    assert "torch" in imported  # a real lowering: the import check above and below can see torch
    sidecar = load_artifact("warm-bert", VARIANTS["portable"], root).sidecar
    assert sidecar.weights == "random" and "HF_HUB_OFFLINE" in sidecar.weights_note
    before = mtimes(paths.folder)

    for weights in ("random", "auto", "random"):
        again, imported = fab("lower", "--spec", str(spec), "--backend", "portable", "--weights", weights, env=env)
        assert again.returncode == 0, again.stderr[-3000:]
        assert "using cached artifacts for portable" in again.stderr, (weights, again.stderr[-3000:])
        assert mtimes(paths.folder) == before, weights
        assert not imported & HEAVY, (weights, sorted(imported & HEAVY))

    # The weights arrive in the HF cache: auto now means pretrained, a different lowering.
    put_in_hf_cache(Path(offline_hub["HF_HUB_CACHE"]), "etlab-test/warm-bert")
    pretrained, _ = fab("lower", "--spec", str(spec), "--backend", "portable", env=env)
    assert pretrained.returncode == 0, pretrained.stderr[-3000:]
    assert "using cached artifacts" not in pretrained.stderr
    assert load_artifact("warm-bert", VARIANTS["portable"], root).sidecar.weights == "pretrained"
    hit, _ = fab("lower", "--spec", str(spec), "--backend", "portable", "--weights", "pretrained", env=env)
    assert hit.returncode == 0 and "using cached artifacts for portable" in hit.stderr, hit.stderr[-3000:]


def test_auto_resolution_reads_the_hf_cache_like_huggingface_hub(
    tmp_path: Path, offline_hub: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from huggingface_hub import try_to_load_from_cache

    for name, value in offline_hub.items():
        monkeypatch.setenv(name, value)

    def hub_lookup() -> object:
        # huggingface_hub reads the environment when imported, so tell it where this cache is.
        return try_to_load_from_cache("etlab-test/cached-bert", "config.json", cache_dir=offline_hub["HF_HUB_CACHE"])

    spec = load_spec_file(write_spec(tmp_path / "spec.json", "etlab-test/cached-bert"))
    choice = resolve_weights(spec, "auto")
    assert (choice.mode, choice.fallback) == ("random", True) and "HF_HUB_OFFLINE" in choice.reason
    assert cached_config("etlab-test/cached-bert") is None

    repo = put_in_hf_cache(Path(offline_hub["HF_HUB_CACHE"]), "etlab-test/cached-bert")
    found = cached_config("etlab-test/cached-bert")
    assert found is not None and found.parent.parent == repo / "snapshots"
    assert hub_lookup() == str(found)
    assert resolve_weights(spec, "auto").mode == "pretrained"
    assert resolve_weights(spec, "random").mode == "random"
    # A ref to a commit that is not in snapshots/ is not cached (huggingface_hub agrees).
    (repo / "refs" / "main").write_text("f" * 40)
    assert cached_config("etlab-test/cached-bert") is None
    assert hub_lookup() is None
    # A misspelt mode is refused where it is given (the command layer), never deeper down.
    with pytest.raises(UsageError, match="--weights must be one of"):
        options.weights("pretrianed")


def test_warm_board_tasks_import_nothing_heavy(
    tiny_artifacts: dict[str, LoweringResult], local_board: Board, tmp_path: Path
) -> None:
    """deploy-and-profile (cached lowering, provisioned board), push, run, pull, analyze, boards and compare."""
    root = copy_model(tiny_artifacts, "distilbert-tiny", tmp_path / "artifacts")
    inventory = write_inventory(tmp_path / "inventory.yaml", [local_board])
    env = {"ETLAB_ARTIFACTS": str(root), "ETLAB_RESULTS": str(tmp_path / "results"), "ETLAB_INVENTORY": str(inventory)}
    model, board, short = ["--model", "distilbert-tiny"], ["--board", "local"], ["--iterations", "3", "--warmup", "1"]

    steps: list[tuple[str, list[str], frozenset[str]]] = [
        ("deploy-and-profile", [*model, *board, *short, "--no-explore"], HEAVY),
        ("push", [*model, *board], HEAVY),
        ("run", [*model, *board, *short], HEAVY),
        ("pull", board, HEAVY),
        ("analyze", ["--latest"], HEAVY),
        ("advise", model, HEAVY),
        ("boards", [], HEAVY),
    ]
    for task, args, forbidden in steps:
        proc, imported = fab(task, *args, env=env)
        assert proc.returncode == 0, (task, proc.stdout[-2000:], proc.stderr[-3000:])
        assert not imported & forbidden, (task, sorted(imported & forbidden))
    assert "using cached artifacts" in fab("lower", *model, env=env)[0].stderr

    # compare needs scipy's Mann-Whitney U, and nothing else heavy. The two runs: deploy-and-profile's and run's,
    # the newest two (the session's local board also holds other tests' bundles, which `pull` brought along).
    pulled = sorted(path.name for path in (tmp_path / "results" / "local" / "distilbert-tiny" / "xnnpack").iterdir())
    run_ids = pulled[-2:]
    assert len(run_ids) == 2 and all(RUN_ID.fullmatch(run_id) for run_id in run_ids), pulled
    proc, imported = fab("compare", *run_ids, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "scipy" in imported
    assert not imported & (HEAVY - {"scipy"}), sorted(imported & HEAVY)


# What a warm deploy-and-profile (cached lowering, provisioned board, --no-explore) has no use for: the advisor's
# trial (it lowers rewritten variants and A/B-tests them: `fab advise --try` only), the A/B re-test, Model
# Explorer's server, and the lowering that builds models.
NOT_FOR_A_WARM_DEPLOY = frozenset(
    {
        "orchestrator.advice.trial",
        "orchestrator.deploy.abtest",
        "orchestrator.servers.explorer",
    }
)
# The lowering stack that builds models, every module of the sources' build side (torch, transformers, timm): a warm
# deploy's cache check needs the spec side only (it finds the builder's file, which imports the empty package).
BUILD_SIDE = "orchestrator.lowering.sources.builders."
# Every module the process holds when it exits, whichever way it was imported (`-X importtime` misses what
# importlib.import_module loads: the analysis prefetch, the `module:name` builders).
MODULES_AT_EXIT = """
import atexit, os, sys

def _write_modules():
    with open(os.environ["ETLAB_TEST_MODULES"], "w") as out:
        out.write("\\n".join(sorted(sys.modules)))

atexit.register(_write_modules)
"""


def test_warm_deploy_imports_only_what_it_needs(
    tiny_artifacts: dict[str, LoweringResult], local_board: Board, tmp_path: Path
) -> None:
    root = copy_model(tiny_artifacts, "distilbert-tiny", tmp_path / "artifacts")
    inventory = write_inventory(tmp_path / "inventory.yaml", [local_board])
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(MODULES_AT_EXIT)
    listing = tmp_path / "modules.txt"
    python_path = os.pathsep.join(filter(None, [str(hook), os.environ.get("PYTHONPATH")]))
    env = {"ETLAB_ARTIFACTS": str(root), "ETLAB_RESULTS": str(tmp_path / "results"), "ETLAB_INVENTORY": str(inventory),
           "PYTHONPATH": python_path, "ETLAB_TEST_MODULES": str(listing)}  # fmt: skip
    args = ["--model", "distilbert-tiny", "--board", "local", "--iterations", "3", "--warmup", "1", "--no-explore"]
    proc = subprocess.run(
        [sys.executable, "-m", "fabric", "deploy-and-profile", *args],
        cwd=PROJECT_ROOT, env={**os.environ, **env}, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, (proc.stdout[-2000:], proc.stderr[-3000:])
    assert "using cached artifacts" in proc.stderr and "advice for distilbert-tiny" in proc.stderr, proc.stderr[-3000:]
    modules = set(listing.read_text().split())
    # The audit sees what the deploy did: the cache check, the analysis (in a board's thread) and the advice.
    assert {
        "orchestrator.lowering.export.lower",
        "orchestrator.results.analysis",
        "orchestrator.advice.advisor",
    } <= modules
    assert not modules & NOT_FOR_A_WARM_DEPLOY, sorted(modules & NOT_FOR_A_WARM_DEPLOY)
    assert not [name for name in modules if name.startswith(BUILD_SIDE)], sorted(modules)
    assert not {name.split(".")[0] for name in modules} & HEAVY, sorted(modules)


def test_deploy_lowers_only_the_backend_asked_for(local_board: Board, tmp_path: Path) -> None:
    """`--backend xnnpack` lowers the XNNPACK program alone (the portable one was lowered too, for a Model Explorer
    that `--no-explore` never opens); without `--backend`, Model Explorer's view gets both fp32 programs."""
    inventory = write_inventory(tmp_path / "inventory.yaml", [local_board])
    env = {"ETLAB_ARTIFACTS": str(tmp_path / "artifacts"), "ETLAB_RESULTS": str(tmp_path / "results"),
           "ETLAB_INVENTORY": str(inventory)}  # fmt: skip
    args = ["--model", "distilbert-tiny", "--board", "local", "--iterations", "2", "--warmup", "0", "--no-explore"]
    proc = subprocess.run(
        [sys.executable, "-m", "fabric", "deploy-and-profile", "--backend", "xnnpack", *args],
        cwd=PROJECT_ROOT, env={**os.environ, **env}, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, (proc.stdout[-2000:], proc.stderr[-3000:])
    lowered = sorted(path.name for path in (tmp_path / "artifacts" / "distilbert-tiny").glob("*.pte"))
    assert lowered == ["distilbert-tiny_xnnpack.pte"], lowered
