"""Text-generation programs attending through etlab's operators, on the local board: the native runner's generate
loop runs the program `--attention etlab` lowers, and its ids equal eager HuggingFace greedy generation; a program
whose own defaults would write past its KV cache is refused before anything runs.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from orchestrator.boards.inventory import Board
from orchestrator.lowering.builtins import BUILTIN_SPECS
from orchestrator.lowering.export import lower as lowerer
from orchestrator.lowering.variants import Variant
from orchestrator.tensorfile import read_tensors
from tests.e2e.test_generation_e2e import fab
from tests.plugins.artifacts import ARTIFACT_CACHE


def test_an_etlab_attention_program_generates_what_eager_greedy_does_on_the_board(
    local_board: Board, tmp_path: Path
) -> None:
    model = "smollm2-gen-tiny"  # Llama, SmolLM2's shape: grouped-query attention, tied embeddings
    proc = fab(tmp_path, local_board, ARTIFACT_CACHE, "deploy-and-profile", "--model", model, "--attention",
               "etlab", "--backend", "xnnpack", "--weights", "random", "--iterations", "2", "--warmup", "1",
               "--no-explore")  # fmt: skip
    said = proc.stdout + proc.stderr
    assert proc.returncode == 0, said[-4000:]
    sidecar = json.loads((ARTIFACT_CACHE / model / f"{model}_xnnpack.json").read_text())
    assert sidecar["generation"]["attention"] == "etlab"
    assert "etlab.attend.out" in sidecar["delegation"]["fallback_histogram"]
    (run,) = [m.parent for m in (tmp_path / "results").glob(f"local/{model}/xnnpack/*/result_manifest.json")]
    summary = json.loads((run / "analysis" / "summary.json").read_text())
    assert summary["generation"]["tokens"]["agreement"] == 1.0
    (ran,) = read_tensors(run / "outputs.etlt")
    (reference,) = read_tensors(ARTIFACT_CACHE / model / f"{model}_reference_outputs.etlt")
    assert ran.array.tolist() == reference.array.tolist()


def test_a_program_whose_defaults_overflow_its_cache_is_refused_before_anything_runs(
    local_board: Board, tmp_path: Path
) -> None:
    """A sidecar is data from a file: one asking the runner for a prompt and new tokens beyond the program's cache
    (edited, or from a broken etlab) would have the runner write past it. Refused, exit 65, nothing pushed."""
    lowered = lowerer.lower(BUILTIN_SPECS["gpt2-gen-tiny"], variants=[Variant("xnnpack")], weights="random",
                            root=ARTIFACT_CACHE, jobs=1)  # fmt: skip
    artifacts = tmp_path / "artifacts"
    shutil.copytree(lowered.paths.folder, artifacts / "gpt2-gen-tiny")
    sidecar = artifacts / "gpt2-gen-tiny" / "gpt2-gen-tiny_xnnpack.json"
    data = json.loads(sidecar.read_text())
    data["generation"]["new_tokens"] = 60  # 8 + 60 > 64
    sidecar.write_text(json.dumps(data))
    proc = fab(tmp_path, local_board, artifacts, "run", "--model", "gpt2-gen-tiny", "--backend", "xnnpack")
    said = " ".join((proc.stdout + proc.stderr).split())
    assert proc.returncode == 65, said
    assert "need 68 positions; the KV cache holds 64" in said
    assert "Traceback" not in said
    assert not (tmp_path / "results").exists() or not list((tmp_path / "results").rglob("timings.json"))
