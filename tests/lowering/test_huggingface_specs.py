"""The `huggingface` source's spec check (lowering/sources/builders/huggingface.py, spec.py): any family transformers
knows with any task it has a head for, mismatched pairs refused naming the family's tasks, and the `inputs` a spec
declares (names, dtypes, shapes, batch size) checked with file:line:field errors, before anything loads.

The models lowered and checked against eager are in test_huggingface_lowering.py; properties (any spec validates or
is refused) in test_spec_properties.py.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from orchestrator.errors import SpecError
from orchestrator.lowering.builtins import BUILTIN_SPECS
from orchestrator.lowering.sources.huggingface import HuggingFaceOptions
from orchestrator.lowering.spec import TASKS, InputSpec, load_spec_file
from tests.lowering.spec_helpers import checked


def write(tmp_path: Path, data: dict[str, Any]) -> Path:
    """One field per line (None: left out); an `inputs` list one item per line, so each item has its own line."""
    lines = []
    for key, value in data.items():
        if value is None:
            continue
        if key == "inputs" and isinstance(value, list) and value:
            items = ",\n".join(f"    {json.dumps(item)}" for item in value)
            lines.append(f'  "inputs": [\n{items}\n  ]')
        else:
            lines.append(f"  {json.dumps(key)}: {json.dumps(value)}")
    path = tmp_path / "spec.json"
    path.write_text("{\n" + ",\n".join(lines) + "\n}\n")
    return path


def spec(model_type: str, task: str, **changes: Any) -> dict[str, Any]:
    """A spec of the family's default config (the check builds it on the meta device only)."""
    data: dict[str, Any] = {"name": "family", "model_type": model_type, "task": task, "model_id": "some/model"}
    if task == "fill-mask":
        data["mask_token_id"] = 3
    if task == "image-classification":
        data["image_size"] = 224
    return {**data, **changes}


SUPPORTED = [
    ("bert", "fill-mask"), ("bert", "token-classification"), ("bert", "feature-extraction"),
    ("roberta", "text-classification"), ("albert", "text-classification"), ("electra", "token-classification"),
    ("mobilebert", "fill-mask"), ("llama", "causal-lm"), ("qwen2", "causal-lm"), ("qwen2", "text-classification"),
    ("t5", "feature-extraction"), ("gpt2", "text-classification"), ("vit", "image-classification"),
    ("vit", "feature-extraction"), ("wav2vec2", "speech-encoder"), ("wav2vec2", "audio-classification"),
    ("whisper", "speech-encoder"), ("whisper", "audio-classification"),
]  # fmt: skip


@pytest.mark.parametrize(("model_type", "task"), SUPPORTED)
def test_a_family_and_a_task_it_has_a_head_for_pass_the_check(tmp_path: Path, model_type: str, task: str) -> None:
    report = checked(write(tmp_path, spec(model_type, task)), available=None)  # Llama's defaults: 7B parameters
    assert report.parameters > 0 and report.config.model_type == model_type


@pytest.mark.parametrize(
    ("model_type", "task", "tasks"),
    [
        ("bert", "image-classification", "fill-mask, causal-lm, text-generation, text-classification, "
                                          "token-classification, feature-extraction"),
        ("vit", "fill-mask", "feature-extraction, image-classification"),
        ("wav2vec2", "causal-lm", "feature-extraction, audio-classification, speech-encoder"),
        ("t5", "text-classification", "feature-extraction"),
    ],
)  # fmt: skip
def test_a_task_the_family_has_no_head_for_is_refused_naming_its_tasks(
    tmp_path: Path, model_type: str, task: str, tasks: str
) -> None:
    path = write(tmp_path, spec(model_type, task))
    expected = f"{path}:4: field 'task': {task!r} does not go with model_type {model_type!r}, which supports {tasks}"
    with pytest.raises(SpecError, match=re.escape(expected)):
        checked(path)


@pytest.mark.parametrize("task", ["audio-classification", "speech-encoder", "feature-extraction"])
def test_log_mel_features_of_another_layout_than_whispers_are_refused_not_a_crash(tmp_path: Path, task: str) -> None:
    """wav2vec2-bert's input_features are [batch, frames, 160]: not Whisper's [batch, mel bins, frames], which is the
    only layout etlab makes (it used to read config.num_mel_bins and exit 70)."""
    path = write(tmp_path, spec("wav2vec2-bert", task))
    with pytest.raises(SpecError, match="'wav2vec2-bert', which has no head for any task etlab lowers"):
        checked(path, available=None)


def test_every_task_is_listed_and_the_builtins_check() -> None:
    from orchestrator.lowering.sources.builders.models import check_spec

    assert set(TASKS) == {
        "fill-mask", "causal-lm", "text-generation", "text-classification", "token-classification",
        "feature-extraction", "image-classification", "audio-classification", "speech-encoder",
    }  # fmt: skip
    # Each full-size built-in has its pretrained id and a tiny variant with random weights from a small config.
    pairs = {"bert-base": "bert-base-tiny", "vit": "vit-tiny", "whisper-tiny-encoder": "whisper-tiny-encoder-tiny",
             "wav2vec2": "wav2vec2-tiny", "smollm2-135m": "smollm2-tiny", "smollm2-135m-gen": "smollm2-gen-tiny",
             "gpt2-gen": "gpt2-gen-tiny"}  # fmt: skip
    for full, tiny in pairs.items():
        assert (
            BUILTIN_SPECS[full].options_of(HuggingFaceOptions).model_id
            and BUILTIN_SPECS[tiny].options_of(HuggingFaceOptions).config
            and not BUILTIN_SPECS[tiny].options_of(HuggingFaceOptions).model_id
        )
        assert BUILTIN_SPECS[full].task == BUILTIN_SPECS[tiny].task
        assert check_spec(BUILTIN_SPECS[tiny], "random").parameters < 500_000, tiny
    # The full-size architectures from their configs alone (random weights need no hub).
    assert check_spec(BUILTIN_SPECS["vit"], "random").config.num_labels == 1000
    whisper = check_spec(BUILTIN_SPECS["whisper-tiny-encoder"], "random").config  # the defaults are whisper-tiny's
    assert (whisper.d_model, whisper.encoder_layers, whisper.max_source_positions) == (384, 4, 1500)
    # SmolLM2-135M: 134.5M parameters, tied embeddings.
    assert check_spec(BUILTIN_SPECS["smollm2-135m"], "random").parameters == 134_515_008
    # Qwen2.5-0.5B (bench_llm.py's larger model): 494,032,768 parameters as Qwen publishes it, tied embeddings, and
    # widths that 8da4w's groups of 32 divide (no padded linear).
    qwen = check_spec(BUILTIN_SPECS["qwen2.5-0.5b-gen"], "random")
    assert qwen.parameters == 494_032_768 and qwen.config.tie_word_embeddings
    assert qwen.config.hidden_size % 32 == 0 and qwen.config.intermediate_size % 32 == 0


def test_default_inputs_follow_the_task_and_the_family(tmp_path: Path) -> None:
    from orchestrator.lowering.sources.builders.huggingface import model_inputs
    from orchestrator.lowering.sources.builders.huggingface_heads import check_family

    def defaults(data: dict[str, Any]) -> list[tuple[str, str, tuple[int, ...]]]:
        model = load_spec_file(write(tmp_path, data))
        config = checked(tmp_path / "spec.json", available=None).config
        return [(i.name, i.dtype, i.shape) for i in model_inputs(model, config, check_family(model))]

    ids = [("input_ids", "int64", (2, 16)), ("attention_mask", "int64", (2, 16))]
    assert defaults(spec("bert", "token-classification", seq_len=16, batch_size=2)) == [
        *ids, ("token_type_ids", "int64", (2, 16))]  # fmt: skip
    llama = spec("llama", "text-classification", seq_len=16, batch_size=2, config={"pad_token_id": 0})
    assert defaults(llama) == ids  # no segment embeddings
    # A decoder's classifier reads each row's last token that is not padding: a batch needs the pad token's id.
    refused = r"field 'batch_size': LlamaForSequenceClassification finds each row's last token by its padding"
    with pytest.raises(SpecError, match=rf"spec\.json:\d+: {refused}, so a batch needs config\.pad_token_id"):
        defaults(llama | {"config": None})
    assert defaults(spec("bert", "fill-mask", seq_len=16, batch_size=2)) == ids  # the fill-mask wrapper's two
    assert defaults(spec("vit", "image-classification", image_size=224)) == [
        ("pixel_values", "float32", (1, 3, 224, 224))
    ]
    assert defaults(spec("wav2vec2", "speech-encoder")) == [("input_values", "float32", (1, 16000))]
    assert defaults(spec("whisper", "speech-encoder")) == [("input_features", "float32", (1, 80, 3000))]


def test_declared_inputs_set_the_batch_and_the_sizes(tmp_path: Path) -> None:
    data = spec("bert", "text-classification", inputs=[
        {"name": "input_ids", "dtype": "int64", "shape": [4, 24]},
        {"name": "attention_mask", "dtype": "int64", "shape": [4, 24]},
        {"name": "token_type_ids", "dtype": "int64", "shape": [4, 24]}])  # fmt: skip
    model = load_spec_file(write(tmp_path, data))
    assert (model.batch_size, model.seq_len) == (4, 24)
    assert model.inputs == model.declared_inputs and model.inputs[2] == InputSpec("token_type_ids", "int64", (4, 24))
    assert checked(tmp_path / "spec.json").parameters > 0
    image = load_spec_file(write(tmp_path, spec("vit", "image-classification", image_size=None, inputs=[
        {"name": "pixel_values", "dtype": "float32", "shape": [2, 3, 64, 64]}])))  # fmt: skip
    assert (image.batch_size, image.options_of(HuggingFaceOptions).image_size) == (2, 64)


def pixel(shape: list[int], dtype: str = "float32", name: str = "pixel_values") -> dict[str, Any]:
    return {"name": name, "dtype": dtype, "shape": shape}


def ids(name: str = "input_ids", shape: list[int] | None = None, dtype: str = "int64") -> dict[str, Any]:
    return {"name": name, "dtype": dtype, "shape": shape or [1, 16]}


@pytest.mark.parametrize(
    ("task", "inputs", "changes", "where", "message"),
    [
        ("image-classification", [pixel([1, 3, 32, 32], name="pixel_value")], {}, "inputs[0].name",
         "'pixel_value' is not an input of task 'image-classification'; its inputs: pixel_values (did you mean"),
        ("image-classification", [pixel([1, 3, 32, 32], "float16")], {}, "inputs[0].dtype",
         "pixel_values is float32, got 'float16'"),
        ("image-classification", [pixel([1, 3, 32])], {}, "inputs[0].shape", "pixel_values has 4 dimensions"),
        ("image-classification", [pixel([1, 3, 32, 48])], {}, "inputs[0].shape", "the image is square"),
        ("image-classification", [pixel([2, 3, 32, 32])], {"batch_size": 1}, "inputs[0].shape",
         "the first dimension is the batch size, 1, got 2"),
        ("text-classification", [ids(), ids("attention_mask", [1, 8])], {}, "inputs[1].shape",
         "every token input has the shape of the first one"),
        ("text-classification", [ids(), ids()], {}, "inputs[1].name", "'input_ids' is declared twice"),
        ("text-classification", [ids()], {"seq_len": 32}, "inputs[0].shape",
         "input_ids is [batch_size, seq_len] = [1, 32], got [1, 16]"),
        ("fill-mask", [ids()], {"mask_token_id": 3}, "inputs", "task 'fill-mask' needs input_ids, attention_mask"),
        ("text-classification", [ids("attention_mask")], {}, "inputs",
         "task 'text-classification' needs input_ids; missing: input_ids"),
        ("speech-encoder", [ids()], {}, "inputs[0].name",
         "'input_ids' is not an input of task 'speech-encoder'; its inputs: input_values, input_features"),
        ("text-classification", [{"name": "input_ids", "shape": [1, 4]}], {}, "inputs[0]",
         'must be an object with exactly "name", "dtype" and "shape"'),
        ("text-classification", [], {}, "inputs", "must list at least one input"),
    ],
)  # fmt: skip
def test_a_bad_declared_input_is_refused_with_its_line(
    tmp_path: Path, task: str, inputs: list[Any], changes: dict[str, Any], where: str, message: str
) -> None:
    data = spec("vit" if task == "image-classification" else "bert", task, image_size=None, **changes)
    path = write(tmp_path, {**data, "inputs": inputs})
    text = path.read_text().splitlines()
    index = re.fullmatch(r"inputs\[(\d+)\].*", where)
    line = (text.index('  "inputs": [') + 2 + int(index[1])) if index else next(
        n for n, row in enumerate(text, 1) if row.startswith('  "inputs"'))  # fmt: skip
    with pytest.raises(SpecError, match=re.escape(f"{path}:{line}: field {where!r}: {message}")):
        load_spec_file(path)


@pytest.mark.parametrize(
    ("model_type", "task", "inputs", "message"),
    [
        ("llama", "text-classification", [ids(), ids("attention_mask"), ids("token_type_ids")],
         "'token_type_ids' is not an input of LlamaForSequenceClassification; it takes input_ids, attention_mask"),
        ("whisper", "speech-encoder", [pixel([1, 80, 1500], name="input_features")],
         "the config takes [batch_size, 80, 3000] (num_mel_bins, 2 x max_source_positions), got [1, 80, 1500]"),
        ("wav2vec2", "speech-encoder", [pixel([1, 80, 3000], name="input_features")],
         "'input_features' is not an input of Wav2Vec2Model; it takes input_values"),
        ("vit", "image-classification", [pixel([1, 4, 224, 224])], "the config has 3 image channels, not 4"),
        ("wav2vec2", "speech-encoder", [pixel([1, 100], name="input_values")],
         "100 samples are fewer than the 400 of one frame"),
    ],
)  # fmt: skip
def test_declared_inputs_the_family_does_not_take_are_refused_before_loading(
    tmp_path: Path, model_type: str, task: str, inputs: list[Any], message: str
) -> None:
    path = write(tmp_path, spec(model_type, task, image_size=None, inputs=inputs))
    index = len(inputs) - 1  # the last input is the wrong one
    line = path.read_text().splitlines().index('  "inputs": [') + 2 + index
    with pytest.raises(SpecError, match=re.escape(f"{path}:{line}: field 'inputs[{index}].")) as excinfo:
        checked(path, available=None)
    assert message in str(excinfo.value)


def test_fields_of_another_kind_of_input_are_refused(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match=r"spec\.json:\d+: field 'image_size': is required for task 'image-class"):
        load_spec_file(write(tmp_path, spec("vit", "image-classification") | {"image_size": None}))
    with pytest.raises(SpecError, match=r"field 'image_size': is for task 'image-classification' only"):
        load_spec_file(write(tmp_path, spec("bert", "text-classification", image_size=32)))
    # Run on the meta device before anything loads: an image of another size than ViT's position embeddings.
    vit = spec(
        "vit",
        "image-classification",
        image_size=64,
        config=BUILTIN_SPECS["vit-tiny"].options_of(HuggingFaceOptions).config,
    )
    cannot_run = r"the model cannot run on pixel_values \[1, 3, 64, 64\]: ValueError: Input image size \(64\*64\)"
    with pytest.raises(SpecError, match=rf"spec\.json:6: field 'image_size': {cannot_run} doesn't match"):
        checked(write(tmp_path, vit))
    with pytest.raises(SpecError, match=r"field 'seq_len': is for text tasks only"):
        load_spec_file(write(tmp_path, spec("wav2vec2", "speech-encoder", seq_len=32)))
    with pytest.raises(SpecError, match=r"field 'config.num_labels': expected a number of classes from 1 to 100000"):
        checked(write(tmp_path, spec("vit", "image-classification", config={"num_labels": 0})))
    unused = checked(write(tmp_path, spec("bert", "feature-extraction", config={"num_labels": 3}))).warnings
    assert unused == (f"{tmp_path / 'spec.json'}:6: field 'config.num_labels': ignored: task 'feature-extraction' "
                      "has no classifier head",)  # fmt: skip
