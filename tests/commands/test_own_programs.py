"""Your own programs at the command line: `--pte`, `--reference`, `--exported` and `--name` refuse bad files and bad
combinations with 64 (the option named) or 65 (what the file holds), never 70 or a traceback; and `--model NAME` finds
a model lowered with `--spec`. What the files become is tested in tests/lowering/test_user_programs.py, the local
board in tests/e2e/test_own_programs_e2e.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from orchestrator.paths import PROJECT_ROOT
from orchestrator.tensorfile import NamedTensor, write_tensors


def fab(*args: str, artifacts: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "ETLAB_ARTIFACTS": str(artifacts), "ETLAB_RESULTS": str(artifacts.parent / "results")}
    return subprocess.run(
        [sys.executable, "-m", "fabric", *args], cwd=PROJECT_ROOT, env=env, capture_output=True, text=True, timeout=600
    )


def refused(proc: subprocess.CompletedProcess[str], code: int, *words: str) -> None:
    said = proc.stdout + proc.stderr
    assert proc.returncode == code, said
    assert "Traceback" not in said and "internal error" not in said, said
    for word in words:
        assert word in said, said


@pytest.fixture(scope="module")
def pte(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny XNNPACK program with one float32 [1, 4] input and output, lowered with ExecuTorch's own API."""
    import torch
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.exir import to_edge_transform_and_lower

    path = tmp_path_factory.mktemp("program") / "double.pte"
    exported = torch.export.export(torch.nn.Linear(4, 4).eval(), (torch.randn(1, 4),))
    with open(path, "wb") as handle:
        to_edge_transform_and_lower(exported, partitioner=[XnnpackPartitioner()]).to_executorch().write_to_file(handle)
    return path


def test_missing_and_misnamed_files_are_usage_errors(tmp_path: Path) -> None:
    artifacts = tmp_path / "artifacts"
    refused(fab("push", "--pte", str(tmp_path / "none.pte"), artifacts=artifacts), 64, "--pte", "no such file")
    text = tmp_path / "model.txt"
    text.write_text("hello")
    refused(fab("run", "--pte", str(text), artifacts=artifacts), 64, "--pte", "not a .pte file")
    refused(fab("lower", "--exported", str(tmp_path / "none.pt2"), artifacts=artifacts), 64, "--exported")
    refused(fab("lower", "--exported", str(text), artifacts=artifacts), 64, "not a .pt2 file")


@pytest.mark.slow
def test_both_a_program_and_a_model_and_options_without_their_file_are_refused(pte: Path, tmp_path: Path) -> None:
    artifacts = tmp_path / "artifacts"
    both = fab("deploy-and-profile", "--pte", str(pte), "--model", "gpt2-tiny", "--no-explore", artifacts=artifacts)
    refused(both, 64, "give --pte or --model, not both")
    refused(fab("push", "--model", "gpt2-tiny", "--reference", str(pte), artifacts=artifacts), 64, "--reference")
    refused(fab("lower", "--name", "x", "--model", "gpt2-tiny", artifacts=artifacts), 64, "--name")
    refused(
        fab("lower", "--exported", "m.pt2", "--spec", "s.json", artifacts=artifacts),
        64,
        "--exported",
        "--spec",
        "not both",
    )
    refused(fab("push", "--pte", str(pte), "--name", "bad name!", artifacts=artifacts), 64, "--name", "bad name!")
    assert not artifacts.exists()  # nothing was written for a refused command line


def test_files_that_are_no_programs_are_data_errors(tmp_path: Path) -> None:
    artifacts = tmp_path / "artifacts"
    fake = tmp_path / "fake.pte"
    fake.write_bytes(b"PK\x03\x04 this is a zip file, not a program")
    refused(fab("push", "--pte", str(fake), artifacts=artifacts), 65, "fake.pte", "not an ExecuTorch program")
    fake_pt2 = tmp_path / "fake.pt2"
    fake_pt2.write_bytes(b"\x00" * 100)
    refused(fab("lower", "--exported", str(fake_pt2), artifacts=artifacts), 65, "fake.pt2", "not a .pt2 archive")


def test_a_spec_file_naming_a_users_own_program_as_source_is_a_usage_error(tmp_path: Path) -> None:
    """`user-program` and `exported-program` are model sources of their options (--pte, --exported), not of spec
    files: exit 64, naming the file's field and the option."""
    artifacts = tmp_path / "artifacts"
    spec = tmp_path / "mine.json"
    spec.write_text(json.dumps({"name": "mine", "source": "user-program"}))
    said = "field 'source': 'user-program' is a program of your own, given by --pte FILE.pte"
    refused(fab("lower", "--spec", str(spec), artifacts=artifacts), 64, "mine.json:1", said)
    assert not artifacts.exists()


@pytest.mark.slow
def test_a_reference_that_does_not_fit_the_program_is_refused(pte: Path, tmp_path: Path) -> None:
    artifacts = tmp_path / "artifacts"
    wrong = tmp_path / "wrong.etlt"
    write_tensors(wrong, [NamedTensor("out", np.zeros((1, 5), "float32"))])
    refused(
        fab("push", "--pte", str(pte), "--reference", str(wrong), artifacts=artifacts),
        65,
        "--reference",
        "float32 [1, 5]",
        "output 0 of double.pte is float32 [1, 4]",
    )
    extra = tmp_path / "extra.etlt"
    write_tensors(extra, [NamedTensor("out", np.zeros((1, 4), "float32")), NamedTensor("more", np.zeros(1, "int64"))])
    refused(fab("run", "--pte", str(pte), "--reference", str(extra), artifacts=artifacts), 65, "2 tensors", "1 outputs")


@pytest.mark.slow
def test_model_finds_a_spec_lowered_earlier(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    artifacts = tmp_path / "artifacts"
    spec = tmp_path / "my-bert.json"
    tiny = {"vocab_size": 1000, "dim": 32, "n_layers": 1, "n_heads": 2, "hidden_dim": 64}
    written = {"name": "my-bert", "model_type": "distilbert", "task": "fill-mask", "mask_token_id": 3}
    written |= {"seq_len": 16, "config": tiny}
    spec.write_text(json.dumps(written))
    unknown = fab("lower", "--model", "my-bert", "--backend", "portable", artifacts=artifacts)
    refused(unknown, 64, "unknown model 'my-bert'")

    lowered = fab("lower", "--spec", str(spec), "--backend", "portable", artifacts=artifacts)
    assert lowered.returncode == 0, lowered.stdout + lowered.stderr
    again = fab("lower", "--model", "my-bert", "--backend", "portable", artifacts=artifacts)
    assert again.returncode == 0, again.stdout + again.stderr
    said = again.stdout + again.stderr
    assert f"using the spec lowered from {spec}" in said and "using cached artifacts" in said, said

    spec.write_text(json.dumps({**written, "seq_len": 32}))
    stale = fab("lower", "--model", "my-bert", "--backend", "portable", artifacts=artifacts)
    said = stale.stdout + stale.stderr
    assert stale.returncode == 0, said
    assert "changed since" in said and f"fab lower --spec {spec}" in said and "using cached artifacts" in said, said
    listed = fab("push", "--model", "my-bertt", artifacts=artifacts)
    refused(listed, 64, "unknown model 'my-bertt'", "lowered from spec files or your own programs: my-bert")
    monkeypatch.setenv("ETLAB_WIDTH", "300")  # `fab models` below: the spec file's path on one line
    models = fab("models", artifacts=artifacts)
    said = models.stdout + models.stderr
    assert models.returncode == 0, said
    assert "my-bert" in said and str(spec.name) in said, said  # lowered from the spec file, named as such
    from orchestrator.lowering.builtins import BUILTIN_SPECS

    assert all(name in said for name in BUILTIN_SPECS), said
