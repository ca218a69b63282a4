"""A spec file cannot switch on code execution, and spec or calibration mistakes are refused before anything loads.

A spec's `config` holds fields of the model's config class only: nothing reaches `from_pretrained` as a keyword
(`trust_remote_code`, `weights_only`), a typo gets a did-you-mean instead of being ignored, and the config is built
(no weights) and checked against the task, the sequence length, the [MASK] id and the available memory. Remote
code runs only with `--trust-remote-code` on the command line. Every mistake is exit 64 naming file, line and field.
Properties (any spec or calibration file validates or is refused): test_spec_properties.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from orchestrator.errors import ExitCode, SpecError, UsageError
from orchestrator.lowering.spec import RemoteCodeInSpec, load_spec_file
from orchestrator.lowering.variants import VARIANTS
from orchestrator.paths import PROJECT_ROOT
from tests.lowering.spec_helpers import (
    BERT_TINY,
    DISTILBERT_TINY,
    GIB,
    GPT2_TINY,
    calibration,
    checked,
    etlt,
    spec_data,
    write_spec,
)

pytestmark = pytest.mark.timeout(600)


def line_of(path: Path, text: str) -> int:
    """The 1-based line of the first line of `path` containing `text`."""
    return next(n for n, line in enumerate(path.read_text().splitlines(), 1) if text in line)


def fab(*args: str, tmp_path: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    environment = {
        **os.environ,
        "ETLAB_ARTIFACTS": str(tmp_path / "artifacts"),
        "HF_HUB_OFFLINE": "1",
        "HF_MODULES_CACHE": str(tmp_path / "hf-modules"),  # where transformers copies a folder's own code
        **(env or {}),
    }
    return subprocess.run(
        [sys.executable, "-m", "fabric", *args], cwd=PROJECT_ROOT, env=environment, capture_output=True, text=True,
        timeout=600,
    )  # fmt: skip


# ---------------------------------------------------------------------------------------------------------------
# Model folders that run code when loaded


EVIL_CONFIG = """import pathlib
pathlib.Path({marker!r}).mkdir(exist_ok=True)  # test-only: proves this file ran
from transformers import BertConfig


class EvilConfig(BertConfig):
    model_type = "bert"
"""
EVIL_MODEL = """from transformers import BertForMaskedLM

from .configuration_evil import EvilConfig


class EvilForMaskedLM(BertForMaskedLM):
    config_class = EvilConfig
"""


def remote_code_folder(tmp_path: Path) -> tuple[Path, Path]:
    """A tiny BERT whose config.json points at the folder's own Python (auto_map), which creates `marker`."""
    from transformers import BertConfig, BertForMaskedLM

    folder, marker = tmp_path / "remote-bert", tmp_path / "remote-code-ran"
    BertForMaskedLM(BertConfig(**BERT_TINY)).save_pretrained(folder)
    (folder / "configuration_evil.py").write_text(EVIL_CONFIG.format(marker=str(marker)))
    (folder / "modeling_evil.py").write_text(EVIL_MODEL)
    config = json.loads((folder / "config.json").read_text())
    config["auto_map"] = {"AutoConfig": "configuration_evil.EvilConfig",
                          "AutoModelForMaskedLM": "modeling_evil.EvilForMaskedLM"}  # fmt: skip
    (folder / "config.json").write_text(json.dumps(config))
    return folder, marker


class _Payload:
    """Unpickling this creates a folder: what a hostile pytorch_model.bin could do instead."""

    def __init__(self, marker: Path) -> None:
        self.marker = str(marker)

    def __reduce__(self) -> tuple[Any, tuple[str, int, bool]]:
        return os.makedirs, (self.marker, 0o777, True)


def pickled_weights_folder(tmp_path: Path) -> tuple[Path, Path]:
    """A tiny DistilBERT whose pytorch_model.bin holds a pickle payload (only `weights_only=False` unpickles it)."""
    import torch
    from transformers import DistilBertConfig

    folder, marker = tmp_path / "pickled-bert", tmp_path / "pickle-ran"
    folder.mkdir()
    DistilBertConfig(**DISTILBERT_TINY).save_pretrained(folder)
    torch.save({"payload": _Payload(marker)}, folder / "pytorch_model.bin")
    return folder, marker


# ---------------------------------------------------------------------------------------------------------------
# Item 1: a spec file cannot switch on code execution


def test_a_spec_cannot_switch_on_remote_code(tmp_path: Path) -> None:
    folder, marker = remote_code_folder(tmp_path)
    spec = write_spec(tmp_path / "spec.json", spec_data("bert", model_id=str(folder),
                                                       config={"trust_remote_code": True}))  # fmt: skip

    result = fab("lower", "--spec", str(spec), "--weights", "pretrained", "--backend", "portable", tmp_path=tmp_path)

    output = result.stdout + result.stderr
    assert result.returncode == ExitCode.USAGE, output
    assert f"{spec}:{line_of(spec, 'trust_remote_code')}: field 'config.trust_remote_code'" in output, output
    assert "--trust-remote-code" in output, output  # where the opt-in is
    assert "Traceback" not in output, output
    assert not marker.exists(), "the folder's Python ran"


def test_a_spec_cannot_turn_off_weights_only(tmp_path: Path) -> None:
    folder, marker = pickled_weights_folder(tmp_path)
    spec = write_spec(tmp_path / "spec.json", spec_data(model_id=str(folder), config={"weights_only": False}))

    result = fab("lower", "--spec", str(spec), "--weights", "pretrained", "--backend", "portable", tmp_path=tmp_path)

    output = result.stdout + result.stderr
    assert result.returncode == ExitCode.USAGE, output
    assert f"{spec}:{line_of(spec, 'weights_only')}: field 'config.weights_only'" in output, output
    assert "Traceback" not in output, output
    assert not marker.exists(), "the pickle payload ran"


def test_a_config_typo_is_warned_by_fab_with_a_did_you_mean(tmp_path: Path) -> None:
    """A key the config class does not declare is kept, as transformers keeps a config.json's other keys (modelling
    code reads many with getattr), so a typo is not silently lost: it is named, with the field it may mean."""
    config = {**DISTILBERT_TINY, "n_layer": 1}
    spec = write_spec(tmp_path / "spec.json", spec_data(config=config))

    result = fab("lower", "--spec", str(spec), "--weights", "random", "--backend", "portable", tmp_path=tmp_path,
                 env={"ETLAB_WIDTH": "400"})  # fmt: skip

    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    line = line_of(spec, json.dumps("n_layer"))
    warning = f"{spec}:{line}: field 'config.n_layer': not a field DistilBertConfig declares"
    assert f"WARNING: {warning} (did you mean 'n_layers'?)" in output, output
    assert "Traceback" not in output, output


def test_remote_code_runs_only_with_the_command_line_opt_in(tmp_path: Path) -> None:
    folder, marker = remote_code_folder(tmp_path)
    spec = write_spec(tmp_path / "spec.json", spec_data("bert", model_id=str(folder), config={}))
    base = ("lower", "--spec", str(spec), "--weights", "pretrained", "--backend", "portable")

    without = fab(*base, tmp_path=tmp_path)
    assert without.returncode == 0, without.stdout + without.stderr
    assert not marker.exists(), "the folder's Python ran without --trust-remote-code"

    opted_in = fab(*base, "--trust-remote-code", tmp_path=tmp_path)
    output = opted_in.stdout + opted_in.stderr
    assert opted_in.returncode == 0, output
    assert marker.exists(), "--trust-remote-code did not run the folder's code"
    assert "WARNING" in output and "--trust-remote-code" in output and str(folder) in output, output


def test_loading_options_are_refused_without_importing_transformers(tmp_path: Path) -> None:
    """Refused on reading the file, so even a cached lowering (which imports nothing heavy) refuses them."""
    config = {**DISTILBERT_TINY, "trust_remote_code": True, "weights_only": False, "_attn_implementation": "x",
              "auto_map": {"AutoConfig": "evil.Config"}, "_name_or_path": "x"}  # fmt: skip
    path = write_spec(tmp_path / "spec.json", spec_data(config=config))
    with pytest.raises(SpecError) as excinfo:
        load_spec_file(path)
    lines = str(excinfo.value).splitlines()
    assert lines[0].startswith(f"{path}:{line_of(path, 'trust_remote_code')}: field 'config.trust_remote_code': ")
    assert "only the command line can" in lines[0] and "--" not in str(excinfo.value)  # the library names no option
    assert isinstance(excinfo.value, RemoteCodeInSpec)
    assert lines[1].startswith(f"{path}:{line_of(path, 'weights_only')}: field 'config.weights_only': ")
    assert lines[2].startswith(f"{path}:{line_of(path, '_attn_implementation')}: field 'config._attn_implementation'")
    assert lines[3].startswith(f"{path}:{line_of(path, 'auto_map')}: field 'config.auto_map': ")
    assert len(lines) == 5 and "_name_or_path" not in str(excinfo.value)  # a published config.json's record: kept


def test_pretrained_overrides_never_reach_from_pretrained_as_keywords(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Overrides are set on the config object, which is what `from_pretrained` gets."""
    import transformers

    from orchestrator.lowering.sources.builders.huggingface import build_pretrained

    folder, _ = pickled_weights_folder(tmp_path)
    seen: dict[str, Any] = {}

    def fake_from_pretrained(model_id: str, **kwargs: Any) -> Any:
        seen.update(kwargs)
        raise RuntimeError("stop here")

    monkeypatch.setattr(transformers.AutoModelForMaskedLM, "from_pretrained", fake_from_pretrained)
    spec = load_spec_file(write_spec(tmp_path / "spec.json", spec_data(model_id=str(folder), config={"n_layers": 1})))
    with pytest.raises(RuntimeError, match="stop here"):
        build_pretrained(spec)
    assert set(seen) == {"config", "trust_remote_code"}, seen
    assert seen["trust_remote_code"] is False and seen["config"].n_layers == 1


# ---------------------------------------------------------------------------------------------------------------
# Item 3: mistakes that used to load for seconds and then exit 70, refused up front


@pytest.mark.parametrize(
    ("data", "field", "fragment"),
    [
        (spec_data(config={**DISTILBERT_TINY, "n_layers": [1, 2]}), "config.n_layers", "expected int, got list"),
        (spec_data("gpt2", config={**GPT2_TINY, "n_layer": 1.5}), "config.n_layer", "expected int, got float"),
        (spec_data(config={**DISTILBERT_TINY, "to_dict": False}), "config.to_dict", "not a field of DistilBert"),
        (spec_data(config={**DISTILBERT_TINY, "dim": "64"}), "config.dim", "expected int, got str"),
        (spec_data(config={**DISTILBERT_TINY, "hidden_size": "64"}), "config.hidden_size", "expected int, got str"),
        (spec_data(config={**DISTILBERT_TINY, "n_layers": True}), "config.n_layers", "expected int, got bool"),
        (spec_data(config={**DISTILBERT_TINY, "n_layers": 0}), "config.n_layers", "at least 1"),
        (spec_data(config={**DISTILBERT_TINY, "n_layers": -2}), "config.n_layers", "at least 1"),
        (spec_data(config={**DISTILBERT_TINY, "dim": 65}), "config.dim", "divisible"),
        (spec_data(config={**DISTILBERT_TINY, "dropout": 1e400}), "config.dropout", "finite"),
        (spec_data(mask_token_id=1000), "mask_token_id", "vocabulary"),
        (spec_data("gpt2", seq_len=256), "seq_len", "position embeddings"),
        (spec_data(task="causal-lm"), "task", "fill-mask"),
        (spec_data("gpt2", task="fill-mask", mask_token_id=3), "task", "causal-lm"),
        (spec_data(config={**DISTILBERT_TINY, "activation": "swishy"}), "config", "cannot be built"),
        (spec_data(config={**DISTILBERT_TINY, "vocab_size": 10**9}), "config.vocab_size", "available memory"),
        (spec_data(config={**DISTILBERT_TINY, "vocab_size": 2**63 - 1}), "config.vocab_size", "available memory"),
        (spec_data(config={**DISTILBERT_TINY, "vocab_size": 10**400}), "config.vocab_size", "401 digits, beyond any"),
        (spec_data(config={**DISTILBERT_TINY, "dim": -(10**30)}), "config.dim", "31 digits, beyond any"),
        (spec_data(seq_len=10**19), "seq_len", "20 digits, beyond any"),
        (spec_data(config={**DISTILBERT_TINY, "n_layers": 10**9}), "config.n_layers", "available memory"),
    ],
)
def test_mistakes_are_refused_before_loading(tmp_path: Path, data: dict[str, Any], field: str, fragment: str) -> None:
    path = write_spec(tmp_path / "spec.json", data)
    key = field.split(".")[-1]
    with pytest.raises(SpecError) as excinfo:
        checked(path)
    message = str(excinfo.value)
    assert f"{path}:{line_of(path, json.dumps(key))}: field {field!r}: " in message, message
    assert fragment in message, message


def test_a_model_too_large_for_the_memory_is_refused(tmp_path: Path) -> None:
    path = write_spec(tmp_path / "spec.json", spec_data(config={"n_layers": 6}))  # DistilBERT base: 67M parameters
    assert checked(path, available=GIB).parameters == pytest.approx(67.0e6, rel=0.01)
    with pytest.raises(SpecError, match=r"67\.0M parameters .* more than the 0\.20 GiB of available memory"):
        checked(path, available=200 << 20)


def test_a_model_type_transformers_does_not_know_gets_a_did_you_mean(tmp_path: Path) -> None:
    """Any family transformers knows is a model type; another name is refused before anything loads, with the
    closest of transformers' own names."""
    for model_type, close in (("Roberta", "roberta"), ("robertta", "roberta"), ("GPT2", "gpt2")):
        path = write_spec(tmp_path / "spec.json", spec_data() | {"model_type": model_type})
        with pytest.raises(SpecError, match=rf"spec\.json:3: field 'model_type': '{model_type}' is not a model family "
                                            rf"transformers knows \(did you mean '{close}'\?\)"):  # fmt: skip
            checked(path)


def test_a_valid_spec_builds_what_it_says(tmp_path: Path) -> None:
    """An alias of the config class (hidden_size for DistilBERT's dim) is a field too."""
    from orchestrator.lowering.sources.builders.models import load_model

    config = {**DISTILBERT_TINY, "n_layers": 1, "hidden_size": 32}
    del config["dim"]
    path = write_spec(tmp_path / "spec.json", spec_data(config=config))
    report = checked(path)
    assert report.config.n_layers == 1 and report.config.dim == 32
    loaded = load_model(load_spec_file(path), "random")
    assert loaded.parameters == report.parameters


# ---------------------------------------------------------------------------------------------------------------
# Calibration files


IDS = np.array([[5, 6, 7, 0], [8, 9, 0, 0]], dtype=np.int64)


@pytest.mark.parametrize(
    ("write", "fragment"),
    [
        (lambda p: p.with_suffix(".json").write_text("[" * 100_000 + "]" * 100_000), "nested"),
        (lambda p: etlt(p, input_ids=IDS, attention_mask=np.array([1, 1, 0, 0], dtype=np.int64)), "attention_mask"),
        (lambda p: etlt(p, input_ids=IDS, attention_mask=IDS[:1] * 0 + 1), "attention_mask"),
        (lambda p: etlt(p, input_ids=IDS, attention_mask=np.full((2, 4), np.nan, dtype=np.float32)), "attention_mask"),
        (lambda p: etlt(p, input_ids=IDS, attention_mask=np.array([[1, 1, 1, 0], [1, 0, 1, 0]])), "attention_mask"),
        (lambda p: etlt(p, input_ids=IDS, attention_mask=IDS), "attention_mask"),
        (lambda p: etlt(p, input_ids=np.zeros((2, 0), dtype=np.int64)), "input_ids"),
    ],
)
def test_calibration_mistakes_are_usage_errors(tmp_path: Path, write: Any, fragment: str) -> None:
    path = tmp_path / "calibration.etlt"
    write(path)
    target = path if path.exists() else path.with_suffix(".json")
    with pytest.raises(UsageError) as excinfo:
        calibration(target)
    assert str(excinfo.value).startswith(f"{target}: ") and fragment in str(excinfo.value)


def test_calibration_is_checked_before_anything_loads(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Against the vocabulary of the spec's config, in this process, before the model is built or a worker starts."""
    from orchestrator.lowering.export.lower import lower
    from orchestrator.lowering.sources.builders import models

    def no_loading(*_args: Any, **_kwargs: Any) -> Any:
        raise AssertionError("the model was loaded before the calibration file was checked")

    monkeypatch.setattr(models, "load_model", no_loading)
    spec = load_spec_file(write_spec(tmp_path / "spec.json", spec_data()))  # vocabulary 1000
    samples = tmp_path / "samples.json"
    samples.write_text(json.dumps([[101, 7, 8], [101, 1000, 102]]))
    # The library names the file; the command layer adds its option (naming_calibration).
    with pytest.raises(UsageError, match=rf"^{samples}: sample 1 has token ids outside 0\.\.999"):
        lower(spec, variants=[VARIANTS["xnnpack-int8-static"]], weights="random", root=tmp_path / "artifacts",
              calibration=samples, jobs=2)  # fmt: skip
    assert not (tmp_path / "artifacts").exists()


def test_the_command_layer_names_the_calibration_option(tmp_path: Path) -> None:
    """`fab lower` and `deploy-and-profile` say which option gave the file; the library below names only the file."""
    from orchestrator.commands.common import lowering_options, naming_calibration

    missing = tmp_path / "missing.json"
    with pytest.raises(UsageError, match=rf"^--calibration {missing}: no such file"):
        lowering_options(calibration=missing)
    samples = tmp_path / "samples.json"
    samples.write_text(json.dumps([[101, 7, 8]]))
    with pytest.raises(UsageError, match=rf"^--calibration {samples}: give several samples"), naming_calibration():
        calibration(samples)
