"""`fab models`: a static list that loads nothing. The built-ins' inputs are recorded (builtins.FAMILY_INPUTS), not
computed by transformers, and must stay what the builders compute; the list imports no torch or transformers, even
with models lowered from a spec file or your own program in the cache; one line per model, the details behind --long.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from orchestrator.fsutil import atomic_write_json
from orchestrator.lowering.builtins import BUILTIN_SPECS, FAMILY_INPUTS, listed_inputs
from orchestrator.lowering.export.lower import LoweringResult
from orchestrator.lowering.export.user_programs import import_program
from orchestrator.lowering.spec import load_spec_file
from orchestrator.lowering.variants import VARIANTS
from orchestrator.paths import PROJECT_ROOT

HEAVY = ("torch", "transformers", "executorch", "torchvision", "timm", "huggingface_hub")
# `fab models` in a process that says, at its very end, every module it imported (whichever way: importlib too).
FAB_MODELS = """
import runpy, sys
sys.argv = ["fab", *sys.argv[1:]]
try:
    runpy.run_module("fabric", run_name="__main__", alter_sys=True)
finally:
    sys.stderr.write("\\nMODULES " + " ".join(sorted(sys.modules)) + "\\n")
"""


def test_the_recorded_inputs_are_what_the_builders_compute() -> None:
    """Each huggingface built-in lists what its builder gives the program, from the config alone (no weights); the
    other sources' builders take the spec's inputs as they are (SourceBuilder.known_inputs)."""
    # here, not at the top: the builders import torch and transformers, which only this test needs
    from orchestrator.lowering.sources.builders.models import builder, check_spec

    assert set(FAMILY_INPUTS) == {name for name, spec in BUILTIN_SPECS.items() if not spec.inputs}
    for spec in BUILTIN_SPECS.values():
        if spec.model_source == "huggingface":
            computed = builder(spec.model_source).known_inputs(spec, check_spec(spec, "random").config)
            assert listed_inputs(spec) == computed, spec.name


def fab_models(root: Path, *args: str, width: int = 140) -> tuple[str, set[str]]:
    env = {**os.environ, "ETLAB_ARTIFACTS": str(root), "ETLAB_WIDTH": str(width)}
    proc = subprocess.run(
        [sys.executable, "-c", FAB_MODELS, "models", *args],
        cwd=PROJECT_ROOT, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    said, _, modules = proc.stderr.rpartition("\nMODULES ")
    return proc.stdout + said, {name.split(".")[0] for name in modules.split()}


def test_fab_models_loads_nothing_and_says_one_line_per_model(
    tiny_artifacts: dict[str, LoweringResult], tmp_path: Path
) -> None:
    root = tmp_path / "artifacts"
    shutil.copytree(tiny_artifacts["distilbert-tiny"].paths.folder, root / "distilbert-tiny")
    portable = tiny_artifacts["gpt2-tiny"].paths.pte(VARIANTS["portable"])
    import_program(portable, "mine", root=root)  # your own program
    spec_file = tmp_path / "my-bert.json"  # a model lowered from a spec file: its sidecar records the spec
    spec_file.write_text(
        json.dumps(
            {"name": "my-bert", "model_type": "gpt2", "task": "causal-lm", "seq_len": 8, "config": {"n_layer": 1}}
        )
    )
    artifact = import_program(portable, "my-bert", root=root)
    record = json.loads(artifact.paths.sidecar(artifact.variant).read_text())
    atomic_write_json(artifact.paths.sidecar(artifact.variant), record | {"spec": load_spec_file(spec_file).to_dict()})

    said, imported = fab_models(root)
    assert not imported & set(HEAVY), sorted(imported & set(HEAVY))
    rows = {line.split("│")[1].strip(): line for line in said.splitlines() if line.startswith("│")}
    assert len(rows) == len([line for line in said.splitlines() if line.startswith("│")]), said  # one line each
    assert set(rows) == {*BUILTIN_SPECS, "mine", "my-bert"}, said
    assert "input_features 1×80×3000" in rows["whisper-tiny-encoder"], said  # recorded: its family decides them
    assert "portable, xnnpack" in rows["distilbert-tiny"] and "│ no " in rows["gpt2-tiny"], said
    assert "my-bert.json" in rows["my-bert"] and "causal-lm" in rows["my-bert"], said
    assert "your user-program" in rows["mine"] and "portable" in rows["mine"], said

    detailed, imported = fab_models(root, "--long", width=300)
    assert not imported & set(HEAVY), sorted(imported & set(HEAVY))
    assert "description" in detailed and BUILTIN_SPECS["distilbert"].description in detailed, detailed
    assert "input_features float32 1×80×3000" in detailed and str(spec_file) in detailed, detailed
