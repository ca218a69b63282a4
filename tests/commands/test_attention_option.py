"""`--attention etlab|sdpa` (commands/common.py `attention_spec`): a lowering choice of text-generation programs,
through real `fab` processes. The default attends through etlab's operators; `sdpa` is transformers' static-cache
program under its own name, side by side; the table and the sidecar name the choice. Anything else, or a model
that does not generate, is refused with exit 64 before anything is lowered.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.paths import PROJECT_ROOT


def fab(artifacts: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "ETLAB_ARTIFACTS": str(artifacts), "ETLAB_WIDTH": "400"}
    return subprocess.run([sys.executable, "-m", "fabric", *args], cwd=PROJECT_ROOT, env=env, capture_output=True,
                          text=True, timeout=900)  # fmt: skip


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["lower", "--model", "smollm2-gen-tiny", "--attention", "flash"], "--attention must be one of etlab, sdpa"),
        (["lower", "--model", "gpt2-tiny", "--attention", "etlab"], "--attention: gpt2-tiny is not a text-generation"),
        (["deploy-and-profile", "--model", "smollm2-tiny", "--attention", "sdpa", "--no-explore"],
         "--attention: smollm2-tiny is not a text-generation"),
        (["lower", "--exported", "model.pt2", "--attention", "sdpa"], "--attention: not for --exported"),
    ],
)  # fmt: skip
def test_a_bad_attention_is_refused_before_anything_is_lowered(tmp_path: Path, args: list[str], words: str) -> None:
    artifacts = tmp_path / "artifacts"
    proc = fab(artifacts, *args)
    said = proc.stdout + proc.stderr
    assert proc.returncode == 64, said
    assert words in " ".join(said.split()), said
    assert "Traceback" not in said
    assert not artifacts.exists() or not list(artifacts.rglob("*.pte"))


def test_sdpa_is_another_program_beside_etlab_s_and_the_table_names_each(tmp_path: Path) -> None:
    artifacts = tmp_path / "artifacts"
    lowered = {}
    # the default's two backends at once: one lowered in a spawned worker, which reads the .pt2 of etlab's operators
    for option in (["--backend", "portable,xnnpack", "--jobs", "2"], ["--backend", "portable", "--attention", "sdpa"]):
        proc = fab(artifacts, "lower", "--model", "smollm2-gen-tiny", "--weights", "random", *option)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        lowered[option[-1] if "--attention" in option else "default"] = " ".join(proc.stdout.split())
    assert "attention: etlab (etlab's operators, over the filled cache only)" in lowered["default"]
    assert "attention: sdpa (transformers' static cache)" in lowered["sdpa"]
    assert "smollm2-gen-tiny.sdpa" in lowered["sdpa"]
    assert " xnnpack " in lowered["default"] and "lowered" in lowered["default"]
    for name, attention, ops in (("smollm2-gen-tiny", "etlab", "etlab.attend.out"),
                                 ("smollm2-gen-tiny.sdpa", "sdpa", "aten.index_put.out")):  # fmt: skip
        sidecar = json.loads((artifacts / name / f"{name}_portable.json").read_text())
        assert sidecar["generation"]["attention"] == attention
        assert ops in sidecar["delegation"]["fallback_histogram"]
