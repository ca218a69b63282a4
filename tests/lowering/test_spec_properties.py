"""Property tests of spec and calibration files: any spec file, any spec text, any family, task and declared inputs,
and any JSON or ETLT calibration file validates (and then builds, or is usable) or is refused as a usage error, never
another failure.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st

from orchestrator.errors import SpecError, UsageError
from orchestrator.lowering.builtins import BUILTIN_SPECS
from orchestrator.lowering.sources.huggingface import HuggingFaceOptions
from orchestrator.lowering.spec import INPUT_KINDS, TASKS, load_spec_file
from orchestrator.tensorfile import NamedTensor, write_tensors
from tests.lowering.spec_helpers import (
    BERT_TINY,
    DISTILBERT_TINY,
    GPT2_TINY,
    calibration,
    checked,
    spec_data,
)

pytestmark = pytest.mark.timeout(600)


FUZZ = settings(max_examples=120, derandomize=True, database=None, deadline=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])  # fmt: skip

ANY_FIELD = sorted({*DISTILBERT_TINY, *GPT2_TINY, *BERT_TINY, "n_layer", "dims", "hidden_dim", "intermediate_size",
                    "activation", "dropout", "pad_token_id", "sinusoidal_pos_embds", "return_dict", "dtype",
                    "trust_remote_code", "weights_only", "layer_norm_eps", "n_inner", "type_vocab_size", "",
                    "hidden_size", "max_position_embeddings"})  # fmt: skip
scalar = st.one_of(
    st.integers(-3, 300),
    st.sampled_from([0, 1, 2, 4, 64, 1000, 10**6, 10**9, 2**63, 10**30, -(2**63)]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.booleans(),
    st.none(),
    st.text(max_size=8),
    st.sampled_from(["64", "gelu", "relu", "float16", "1e-5"]),
)
json_value = st.recursive(
    scalar,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=6,
)
spec_changes = st.one_of(
    st.just({}),
    st.dictionaries(st.sampled_from(["seq_len", "mask_token_id"]), st.integers(1, 1100), max_size=2),
    st.dictionaries(
        st.sampled_from(
            ["model_type", "task", "seq_len", "mask_token_id", "config", "name", "model_id", "inputs", "x"]
        ),
        st.one_of(json_value, st.sampled_from(["bert", "gpt2", "distilbert", "fill-mask", "causal-lm", "roberta"])),
        max_size=2,
    ),
)
# Mostly plausible values, so that a good share of the specs validate and their models get built and run.
plausible = st.one_of(st.integers(1, 130), st.sampled_from([0.0, 0.1, 1e-5, "gelu", "relu", True, False, None]))
config_changes = st.one_of(
    st.just({}),
    st.dictionaries(st.sampled_from(ANY_FIELD), plausible, max_size=2),
    st.dictionaries(st.sampled_from(ANY_FIELD), st.one_of(scalar, json_value), max_size=3),
)
small = st.sampled_from(["distilbert", "gpt2", "bert"])


def validates_or_refuses(path: Path) -> bool:
    """True when the spec validated and its model then built and ran; False when refused with a SpecError."""
    import torch

    from orchestrator.lowering.sources.builders.huggingface_inputs import reference_inputs
    from orchestrator.lowering.sources.builders.models import load_model, vocab_size_of

    try:
        spec = load_spec_file(path)
        report = checked(path, available=64 << 20)  # 16M parameters at most: validated models stay cheap to build
    except SpecError:
        return False
    loaded = load_model(spec, "random")  # must not raise now
    assert loaded.parameters == report.parameters
    inputs = reference_inputs(spec, vocab_size_of(loaded.module))
    with torch.no_grad():
        output = loaded.module(*(torch.from_numpy(t.array) for t in inputs))
    assert output.shape == (1, spec.seq_len, report.config.vocab_size)  # every position's logits: the model as is
    return True


@FUZZ
@given(model_type=small, changes=spec_changes, config=config_changes)
@example(model_type="distilbert", changes={}, config={"n_layer": 1})
@example(model_type="gpt2", changes={"seq_len": 4096}, config={})
@example(model_type="bert", changes={"mask_token_id": 10**6}, config={})
def test_any_spec_file_validates_or_is_refused(
    tmp_path_factory: pytest.TempPathFactory, model_type: str, changes: dict[str, Any], config: dict[str, Any]
) -> None:
    data = spec_data(model_type)
    data["config"] = {**data["config"], **config}
    data.update(changes)
    folder = tmp_path_factory.mktemp("spec")
    path = folder / "spec.json"
    path.write_text(json.dumps(data, indent=2))
    event("validated and built" if validates_or_refuses(path) else "refused")


# Tiny configs of one family per input kind (their spec builds in a fraction of a second), and names that are none.
FAMILY_CONFIGS: dict[str, dict[str, Any]] = {
    "bert": BERT_TINY,
    "roberta": {**BERT_TINY, "pad_token_id": 1},
    "llama": {"vocab_size": 1000, "hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2,
              "num_key_value_heads": 1, "intermediate_size": 64, "max_position_embeddings": 64},
    "vit": BUILTIN_SPECS["vit-tiny"].options_of(HuggingFaceOptions).config,
    "wav2vec2": BUILTIN_SPECS["wav2vec2-tiny"].options_of(HuggingFaceOptions).config,
    "whisper": BUILTIN_SPECS["whisper-tiny-encoder-tiny"].options_of(HuggingFaceOptions).config,
}  # fmt: skip
FAMILY_TASKS = {
    "bert": ("fill-mask", "text-classification", "token-classification", "feature-extraction"),
    "roberta": ("text-classification", "feature-extraction"),
    "llama": ("causal-lm", "text-classification"),
    "vit": ("image-classification", "feature-extraction"),
    "wav2vec2": ("speech-encoder", "audio-classification"),
    "whisper": ("speech-encoder",),
}
_IDS = ("input_ids", "attention_mask")
# declared inputs of the right kind (the batch or the sizes perhaps not the spec's): their names, the shape
FAMILY_INPUTS: dict[str, list[tuple[tuple[str, ...], list[int]]]] = {
    "bert": [(_IDS, [2, 16]), ((*_IDS, "token_type_ids"), [1, 8])],
    "llama": [(_IDS, [2, 16])],
    "vit": [(("pixel_values",), [2, 3, 32, 32]), (("pixel_values",), [1, 3, 16, 16])],
    "wav2vec2": [(("input_values",), [2, 1000])],
    "whisper": [(("input_features",), [2, 80, 100]), (("input_features",), [1, 80, 3000])],
}
declared_input = st.fixed_dictionaries(
    {
        "name": st.sampled_from([*INPUT_KINDS, "pixels", ""]),
        "dtype": st.sampled_from(["int64", "float32", "int32"]),
        "shape": st.lists(st.sampled_from([1, 2, 3, 16, 32, 80, 100, 400, 1000]), max_size=4),
    }
)


@st.composite
def family_specs(draw: st.DrawFn) -> dict[str, Any]:
    model_type = draw(st.sampled_from([*FAMILY_CONFIGS, "Bert", "t5", "no_such_family"]))
    # Mostly a task the family has, so that a good share validates and runs.
    task = draw(st.one_of(st.sampled_from(FAMILY_TASKS.get(model_type, TASKS)), st.sampled_from([*TASKS, "x"])))
    config = dict(FAMILY_CONFIGS.get(model_type, {"d_model": 32}))
    data: dict[str, Any] = {"name": "family", "model_type": model_type, "task": task, "config": config}
    if task == "fill-mask":
        data["mask_token_id"] = 3
    if task == "image-classification":
        data["image_size"] = 32
    if model_type in ("bert", "roberta", "llama"):
        data["seq_len"] = 16  # within their 64 position embeddings
    plausible_inputs = [[{"name": name, "dtype": INPUT_KINDS[name][0], "shape": shape} for name in names]
                        for names, shape in FAMILY_INPUTS.get(model_type, [])]  # fmt: skip
    optional = {"batch_size": st.integers(0, 3), "seq_len": st.sampled_from([8, 16, 100]),
                "image_size": st.sampled_from([16, 32, 64]),
                "inputs": st.one_of(st.sampled_from(plausible_inputs or [[]]), st.lists(declared_input, max_size=3),
                                    json_value)}  # fmt: skip
    for key in draw(st.lists(st.sampled_from(sorted(optional)), max_size=2, unique=True)):
        data[key] = draw(optional[key])
    return data


@FUZZ
@given(data=family_specs())
@example(data={"name": "v", "model_type": "vit", "task": "image-classification", "image_size": 32, "batch_size": 2,
               "config": FAMILY_CONFIGS["vit"]})  # fmt: skip
@example(data={"name": "w", "model_type": "whisper", "task": "speech-encoder", "config": FAMILY_CONFIGS["whisper"],
               "inputs": [{"name": "input_features", "dtype": "float32", "shape": [2, 80, 100]}]})  # fmt: skip
def test_any_family_task_and_inputs_validate_and_run_or_are_refused(
    tmp_path_factory: pytest.TempPathFactory, data: dict[str, Any]
) -> None:
    """Validated: the model builds, its reference inputs have the declared shapes and it runs at that batch size."""
    import torch

    from orchestrator.lowering.sources.builders.models import example_inputs, load_model

    path = tmp_path_factory.mktemp("spec") / "spec.json"
    path.write_text(json.dumps(data, indent=2))
    try:
        spec = load_spec_file(path)
        checked(path, available=64 << 20)
    except SpecError:
        event("refused")
        return
    event(f"validated: {spec.task}")
    loaded = load_model(spec, "random")
    inputs = example_inputs(spec, loaded.module)
    if spec.declared_inputs:
        assert [(t.name, t.array.shape) for t in inputs] == [(i.name, i.shape) for i in spec.declared_inputs]
    with torch.no_grad():
        output = loaded.module(*(torch.from_numpy(t.array) for t in inputs))
    assert output.shape[0] == spec.batch_size and torch.isfinite(output).all()


def nested_config(depth: int) -> str:
    """A JSON nesting bomb inside a spec: a RecursionError in a parser that recurses."""
    return '{"name": "x", "config": ' + "[" * depth + "]" * depth + "}"


@FUZZ
@given(raw=st.one_of(st.binary(max_size=200).map(lambda b: b.decode("latin-1")), json_value.map(json.dumps),
                     st.integers(1, 50_000).map(nested_config)))  # fmt: skip
def test_any_spec_text_validates_or_is_refused(tmp_path_factory: pytest.TempPathFactory, raw: str) -> None:
    path = tmp_path_factory.mktemp("spec") / "spec.json"
    path.write_text(raw, encoding="utf-8", errors="surrogateescape")
    assert validates_or_refuses(path) is False  # none of these is a whole spec


token_rows = st.one_of(
    st.lists(st.lists(st.integers(0, 199), min_size=1, max_size=12), min_size=2, max_size=5),  # usable
    st.lists(st.fixed_dictionaries({"input_ids": st.lists(st.integers(0, 210), min_size=1, max_size=6)},
                                   optional={"attention_mask": st.lists(st.integers(0, 1), max_size=6)}),
             min_size=2, max_size=4),
    st.lists(st.one_of(st.lists(st.one_of(st.integers(-2, 250), scalar), max_size=10), json_value), max_size=5),
)  # fmt: skip
DTYPES = [np.int64, np.int32, np.uint8, np.float32, np.bool_]


@st.composite
def etlt_arrays(draw: st.DrawFn) -> dict[str, np.ndarray]:
    """Half the files well formed (input_ids [N, seq] in the vocabulary, perhaps a right-padded mask), half anything."""
    if draw(st.booleans()):
        samples, seq = draw(st.integers(1, 4)), draw(st.integers(1, 10))
        ids = np.array(draw(st.lists(st.integers(0, 199), min_size=samples * seq, max_size=samples * seq)))
        arrays: dict[str, np.ndarray] = {
            "input_ids": ids.reshape(samples, seq).astype(draw(st.sampled_from([np.int64, np.int32])))
        }
        if draw(st.booleans()):
            lengths = draw(st.lists(st.integers(1, seq), min_size=samples, max_size=samples))
            arrays["attention_mask"] = (np.arange(seq)[None, :] < np.array(lengths)[:, None]).astype(np.int64)
        return arrays
    arrays = {}
    for name in draw(st.lists(st.sampled_from(["input_ids", "attention_mask", "other"]), max_size=3, unique=True)):
        shape = tuple(draw(st.lists(st.integers(0, 5), max_size=3)))
        dtype = draw(st.sampled_from(DTYPES))
        values = draw(st.lists(st.sampled_from([0, 1, 2, 7, 199, 200, -1, 255]), min_size=math.prod(shape),
                               max_size=math.prod(shape)))  # fmt: skip
        array = np.array(values, dtype=np.int64).reshape(shape)
        if dtype is np.float32 and array.size and draw(st.booleans()):
            array = array.astype(np.float32)
            array.flat[0] = np.nan
        arrays[name] = array.astype(dtype)
    return arrays


def usable_or_refused(path: Path) -> None:
    try:
        samples = calibration(path)
    except UsageError as exc:
        assert str(exc).startswith(f"{path}: ")
        event("refused")
        return
    event("usable")
    assert len(samples) >= 2
    for ids, mask in samples:
        assert ids.shape == mask.shape == (1, 8)
        assert int(ids.min()) >= 0 and int(ids.max()) < 200
        real = int(mask.sum())
        assert real >= 1 and mask[0, :real].tolist() == [1] * real


@FUZZ
@given(samples=st.one_of(token_rows, st.fixed_dictionaries({"samples": token_rows}), json_value),
       nesting=st.sampled_from([0, 0, 0, 50_000]))  # fmt: skip
def test_any_json_calibration_file_is_usable_or_refused(
    tmp_path_factory: pytest.TempPathFactory, samples: Any, nesting: int
) -> None:
    path = tmp_path_factory.mktemp("calibration") / "samples.json"
    text = json.dumps(samples, allow_nan=True)
    path.write_text("[" * nesting + text + "]" * nesting)
    usable_or_refused(path)


@FUZZ
@given(arrays=etlt_arrays())
def test_any_etlt_calibration_file_is_usable_or_refused(
    tmp_path_factory: pytest.TempPathFactory, arrays: dict[str, np.ndarray]
) -> None:
    path = tmp_path_factory.mktemp("calibration") / "samples.etlt"
    write_tensors(path, [NamedTensor(name, array) for name, array in arrays.items()])
    usable_or_refused(path)


# An image model's and a factory's inputs: what `calibration_samples` checks a file of any input kind against.
MODEL_INPUTS = [("pixel_values", "float32", (1, 3, 4, 4)), ("scale", "float32", (1, 2))]


@st.composite
def input_arrays(draw: st.DrawFn) -> dict[str, np.ndarray]:
    """Half the files the model's inputs with a leading sample axis (perhaps a NaN), half anything."""
    if draw(st.booleans()):
        samples = draw(st.integers(0, 3))
        arrays = {name: np.zeros((samples, *shape), dtype=dtype) for name, dtype, shape in MODEL_INPUTS}
        if samples and draw(st.booleans()):
            arrays["scale"].flat[0] = draw(st.sampled_from([np.nan, np.inf, 1.5]))
        if draw(st.booleans()):
            arrays.pop(draw(st.sampled_from(sorted(arrays))))
        return arrays
    arrays = {}
    for name in draw(st.lists(st.sampled_from(["pixel_values", "scale", "input_ids"]), max_size=3, unique=True)):
        shape = tuple(draw(st.lists(st.integers(0, 4), max_size=5)))
        arrays[name] = np.ones(shape, dtype=draw(st.sampled_from(DTYPES)))
    return arrays


@FUZZ
@given(arrays=input_arrays())
def test_any_calibration_file_of_a_models_inputs_is_usable_or_refused(
    tmp_path_factory: pytest.TempPathFactory, arrays: dict[str, np.ndarray]
) -> None:
    from orchestrator.lowering.quantize.calibration import calibration_samples

    path = tmp_path_factory.mktemp("calibration") / "inputs.etlt"
    write_tensors(path, [NamedTensor(name, array) for name, array in arrays.items()])
    try:
        samples = calibration_samples(path, MODEL_INPUTS, "small")
    except UsageError as exc:
        assert str(exc).startswith(f"{path}: ")
        event("refused")
        return
    event("usable")
    assert len(samples) >= 2
    for sample in samples:
        assert [tuple(t.shape) for t in sample] == [shape for _, _, shape in MODEL_INPUTS]
        assert all(bool(t.isfinite().all()) for t in sample)
