"""Published checkpoints' config.json files as a huggingface spec's `config` (sources/builders/huggingface_config.py):
each accepted by the spec check, with its records, labels and the keys its config class reads with getattr; per-stage
sizes as lists; AST's spectrogram input; impossible values and loading switches still refused with file:line:field.

The files in tests/data/hf_configs are the checkpoints' config.json as published, their label maps cut to their first
classes. The spec check builds each model on the meta device only; AST is lowered in test_huggingface_lowering.py.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from orchestrator.errors import ExitCode, SpecError
from orchestrator.lowering.spec import CHECKPOINT_RECORDS, load_spec_file
from orchestrator.paths import PROJECT_ROOT
from tests.lowering.spec_helpers import checked

CONFIGS = Path(__file__).parents[1] / "data" / "hf_configs"
# checkpoint -> the task it is checked for, and the spec's other fields
PUBLISHED: dict[str, tuple[str, dict[str, Any]]] = {
    "bert-base-uncased": ("fill-mask", {"mask_token_id": 103}),
    "distilbert-base-uncased-finetuned-sst-2-english": ("text-classification", {}),
    "twitter-roberta-base-sentiment-latest": ("text-classification", {}),
    "gpt2": ("causal-lm", {}),
    "Llama-3.2-1B": ("causal-lm", {}),
    "Qwen2.5-0.5B-Instruct": ("text-generation", {}),
    "t5-small": ("feature-extraction", {}),
    "vit-base-patch16-224-in21k": ("feature-extraction", {}),
    "deit-tiny-distilled-patch16-224": ("image-classification", {"image_size": 224}),
    "swin-tiny-patch4-window7-224": ("image-classification", {"image_size": 224}),
    "convnext-tiny-224": ("image-classification", {"image_size": 224}),
    "mit-b0": ("image-classification", {"image_size": 224}),
    "mobilevit-small": ("image-classification", {"image_size": 256}),
    "wav2vec2-base-960h": ("speech-encoder", {}),
    "whisper-tiny": ("speech-encoder", {}),
    "ast-finetuned-audioset-10-10-0.4593": ("audio-classification", {}),
    "hubert-base-superb-ks": ("audio-classification", {}),
    "wavlm-base-plus": ("speech-encoder", {}),
}
RECORDS = ("architectures", "model_type", "transformers_version", "torch_dtype", "_name_or_path", "tokenizer_class")


def published(name: str) -> dict[str, Any]:
    return json.loads((CONFIGS / f"{name}.json").read_text())


def spec_file(tmp_path: Path, name: str, config: dict[str, Any], **fields: Any) -> Path:
    """A spec with the checkpoint's config.json as its `config`, one key per line (each has its own line)."""
    task, extra = PUBLISHED[name]
    model_type = published(name)["model_type"]
    data = {"name": "published", "model_type": model_type, "task": task, **extra, **fields, "config": config}
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(data, indent=2))
    return path


def line_of(path: Path, key: str) -> int:
    """The line of `key` inside the spec's `config`."""
    lines = path.read_text().splitlines()
    start = lines.index('  "config": {')
    return next(n for n, line in enumerate(lines[start:], start + 1) if line.strip().startswith(f'"{key}"'))


def as_json(value: Any) -> Any:
    return [as_json(item) for item in value] if isinstance(value, list | tuple) else value


@pytest.mark.parametrize("name", list(PUBLISHED))
def test_a_published_config_is_accepted_as_it_is(tmp_path: Path, name: str) -> None:
    config = published(name)
    path = spec_file(tmp_path, name, config)
    from orchestrator.lowering.sources.builders.huggingface import _config
    from orchestrator.lowering.sources.builders.huggingface_config import declared_fields

    report = checked(path, available=None)
    assert report.parameters > 0 and report.config.model_type == config["model_type"]
    built = _config(load_spec_file(path))  # the config the model is built from (a model may change its own)

    own = type(built).from_dict(config)  # transformers' own reading of the config.json: etlab builds the same
    for key in set(config) & set(declared_fields(type(built))):
        assert as_json(getattr(built, key)) == as_json(getattr(own, key)), key

    def architecture(made: Any) -> dict[str, Any]:  # all but the records (etlab builds float32)
        return {key: value for key, value in made.to_dict().items() if key not in CHECKPOINT_RECORDS}

    assert architecture(built) == architecture(own)
    if "id2label" in config and PUBLISHED[name][0].endswith("classification"):
        assert built.num_labels == len(config["id2label"]) and built.id2label[0] == config["id2label"]["0"]
    said = "\n".join(report.warnings)
    assert not [key for key in RECORDS if f"'config.{key}'" in said], said  # records: accepted without a word
    for warning in report.warnings:  # each names its line and field
        found = re.search(r"field 'config\.(\w+)'", warning)
        assert found and warning.startswith(f"{path}:{line_of(path, found[1])}: "), warning


def test_what_a_published_config_says_is_what_gets_built(tmp_path: Path) -> None:
    """Per-stage sizes stay lists, Llama 3's legacy RoPE keys become its rope_parameters, AST takes a spectrogram,
    and the keys a class does not declare are kept where modelling code reads them, each named once."""
    from orchestrator.lowering.sources.builders.huggingface import model_inputs
    from orchestrator.lowering.sources.builders.huggingface_heads import check_family

    def built(name: str) -> Any:
        return checked(spec_file(tmp_path, name, published(name)), available=None)

    segformer = built("mit-b0").config
    assert (segformer.num_attention_heads, segformer.sr_ratios) == ([1, 2, 5, 8], [8, 4, 2, 1])  # per stage
    swin = built("swin-tiny-patch4-window7-224").config
    assert (list(swin.num_heads), swin.hidden_size, swin.num_layers) == ([3, 6, 12, 24], 768, 4)  # derived as given
    llama = built("Llama-3.2-1B").config.rope_parameters
    assert (llama["rope_type"], llama["rope_theta"], llama["factor"]) == ("llama3", 500000.0, 32.0)
    ast = load_spec_file(spec_file(tmp_path, "ast-finetuned-audioset-10-10-0.4593",
                                   published("ast-finetuned-audioset-10-10-0.4593")))  # fmt: skip
    config = checked(tmp_path / "spec.json", available=None).config
    inputs = model_inputs(ast, config, check_family(ast))
    assert [(i.name, i.shape) for i in inputs] == [("input_values", (1, 1024, 128))]  # [batch, frames, mel bins]
    bert = built("bert-base-uncased")
    assert bert.config.position_embedding_type == "absolute" and bert.config.gradient_checkpointing is False
    assert len(bert.warnings) == 2 and "did you mean 'max_position_embeddings'?" in bert.warnings[1]
    whisper = built("whisper-tiny").warnings
    assert any("'config.max_length': ignored: a generation setting" in warning for warning in whisper), whisper


SWIN = "swin-tiny-patch4-window7-224"


@pytest.mark.parametrize(
    ("name", "changes", "key", "message"),
    [
        (SWIN, {"depths": [2, 2, -6, 2]}, "depths", "must be at least 1, got [2, 2, -6, 2]"),
        (SWIN, {"embed_dim": -96}, "embed_dim", "must be at least 1, got -96"),
        (SWIN, {"window_size": "7"}, "window_size", "expected int, got str '7'"),
        (SWIN, {"num_heads": 12}, "num_heads", "expected a list of int, got int 12"),
        (SWIN, {"image_size": [224, "x"]}, "image_size", "expected int or a list of int or a list of 2 (int, int)"),
        ("mit-b0", {"num_attention_heads": [1, 2, 0, 8]}, "num_attention_heads", "must be at least 1"),
        ("vit-base-patch16-224-in21k", {"num_attention_heads": [6, 12]}, "num_attention_heads",
         "expected int, got list [6, 12]"),
        ("vit-base-patch16-224-in21k", {"hidden_size": 768.5}, "hidden_size", "expected int, got float 768.5"),
        ("vit-base-patch16-224-in21k", {"layer_norm_eps": "small"}, "layer_norm_eps", "expected float, got str"),
        ("vit-base-patch16-224-in21k", {"model_type": "deit"}, "model_type", "is 'deit', but the spec's model_type"),
        ("vit-base-patch16-224-in21k", {"to_json_string": 1}, "to_json_string", "is not a field of ViTConfig"),
        ("hubert-base-superb-ks", {"id2label": {"yes": "0"}}, "id2label", "expected a mapping of class numbers"),
        ("hubert-base-superb-ks", {"problem_type": "ranking"}, "problem_type", "expected one of 'regression'"),
        ("whisper-tiny", {"num_hidden_layers": 6}, "num_hidden_layers", "is WhisperConfig's encoder_layers as"),
    ],
)  # fmt: skip
def test_impossible_values_in_a_published_config_are_refused_with_their_line(
    tmp_path: Path, name: str, changes: dict[str, Any], key: str, message: str
) -> None:
    path = spec_file(tmp_path, name, published(name) | changes)
    with pytest.raises(SpecError) as excinfo:
        checked(path, available=None)
    assert f"{path}:{line_of(path, key)}: field 'config.{key}': {message}" in str(excinfo.value), str(excinfo.value)


def fab(*args: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "ETLAB_ARTIFACTS": str(tmp_path / "artifacts"), "ETLAB_WIDTH": "400"}
    return subprocess.run([sys.executable, "-m", "fabric", *args], cwd=PROJECT_ROOT, env=env, capture_output=True,
                          text=True, timeout=600)  # fmt: skip


def test_fab_refuses_impossible_values_and_loading_switches_with_exit_64(tmp_path: Path) -> None:
    """Every impossible value at once, each on its line; a loading switch refused when the file is read."""
    config = published(SWIN) | {"depths": [2, 2, -6, 2], "window_size": "7", "num_heads": 12}
    path = spec_file(tmp_path, SWIN, config)
    result = fab("lower", "--spec", str(path), "--weights", "random", "--backend", "portable", tmp_path=tmp_path)
    output = result.stdout + result.stderr
    assert result.returncode == ExitCode.USAGE, output
    for key in ("depths", "window_size", "num_heads"):
        assert f"{path}:{line_of(path, key)}: field 'config.{key}': " in output, output
    assert "Traceback" not in output and not (tmp_path / "artifacts" / "published").exists(), output

    for switch, value in (("trust_remote_code", True), ("auto_map", {"AutoConfig": "x.Config"}), ("revision", "x")):
        path = spec_file(tmp_path, SWIN, published(SWIN) | {switch: value})
        result = fab("lower", "--spec", str(path), "--weights", "random", "--backend", "portable", tmp_path=tmp_path)
        output = result.stdout + result.stderr
        assert result.returncode == ExitCode.USAGE, output
        assert f"{path}:{line_of(path, switch)}: field 'config.{switch}': " in output, output


def test_a_spectrogram_model_declares_and_checks_its_frames_and_bins(tmp_path: Path) -> None:
    """AST's input_values are [batch, max_length, num_mel_bins]; a waveform's shape, or other sizes, are refused."""
    config = {"model_type": "audio-spectrogram-transformer", "hidden_size": 64, "num_hidden_layers": 1,
              "num_attention_heads": 2, "intermediate_size": 128, "max_length": 100, "num_mel_bins": 16}  # fmt: skip

    def declared(shape: list[int]) -> Path:
        inputs = [{"name": "input_values", "dtype": "float32", "shape": shape}]
        return spec_file(tmp_path, "ast-finetuned-audioset-10-10-0.4593", config, inputs=inputs)

    assert checked(declared([2, 100, 16])).parameters > 0
    for shape in ([1, 16000], [1, 16, 100]):  # a waveform; bins and frames swapped
        with pytest.raises(SpecError) as excinfo:
            checked(declared(shape))
        takes = "the config takes [batch_size, 100, 16] (max_length frames, num_mel_bins)"
        assert f"field 'inputs[0].shape': {takes}, got {shape}" in str(excinfo.value), str(excinfo.value)
    wav2vec2 = published("wav2vec2-base-960h")
    inputs = [{"name": "input_values", "dtype": "float32", "shape": [1, 100, 16]}]
    with pytest.raises(SpecError, match=re.escape("field 'inputs[0].shape': Wav2Vec2Model takes a waveform, "
                                                  "[batch_size, samples], got [1, 100, 16]")):  # fmt: skip
        checked(spec_file(tmp_path, "wav2vec2-base-960h", wav2vec2, inputs=inputs), available=None)
