"""What a fill-mask or causal-lm program returns (the spec's `output`, issue 35 item 1): every position's logits, the
last position's, or the [MASK] position's found in the graph. Checked like every spec field, part of the identity
(the cache key, the sidecar), and the built-ins follow the course: distilbert the [MASK] position, gpt2 the last."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from orchestrator.errors import ExitCode, SpecError
from orchestrator.lowering.builtins import BUILTIN_SPECS
from orchestrator.lowering.export import cache
from orchestrator.lowering.export import lower as lowering
from orchestrator.lowering.lowered import spec_from_record
from orchestrator.lowering.rewrites.registry import check_request, parse_rewrites
from orchestrator.lowering.sources.huggingface import HuggingFaceOptions
from orchestrator.lowering.spec import OUTPUTS, load_spec_file
from orchestrator.lowering.variants import VARIANTS
from orchestrator.tensorfile import read_tensors
from tests.lowering.test_lowering import run_fab

FILL_MASK = {"name": "my-bert", "model_type": "distilbert", "task": "fill-mask", "mask_token_id": 103,
             "config": {"n_layers": 1}}  # fmt: skip
CAUSAL = {"name": "my-gpt2", "model_type": "gpt2", "task": "causal-lm", "config": {"n_layer": 1}}
MASKED_TINY = dataclasses.replace(BUILTIN_SPECS["distilbert-tiny"], output="mask")


def spec_file(tmp_path: Path, data: dict) -> Path:
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(data, indent=2))
    return path


def test_the_builtins_return_what_the_course_returns() -> None:
    assert BUILTIN_SPECS["distilbert"].output == "mask"
    assert BUILTIN_SPECS["gpt2"].output == "last"
    for spec in BUILTIN_SPECS.values():  # the built-in table is never checked as a file is: each output fits
        assert spec.output == "all" or spec.task in OUTPUTS[spec.output], spec.name


@pytest.mark.parametrize(
    ("data", "output"),
    [(FILL_MASK, "mask"), (FILL_MASK, "all"), (CAUSAL, "last"), (CAUSAL, "all"), (CAUSAL, None)],
)
def test_a_spec_file_declares_its_output(tmp_path: Path, data: dict, output: str | None) -> None:
    given = {**data, "output": output} if output else data
    spec = load_spec_file(spec_file(tmp_path, given))
    assert spec.output == (output or "all")
    assert spec.to_dict()["output"] == spec.output  # what the sidecar records


@pytest.mark.parametrize(("output", "expected"), [(None, "last"), ("last", "last"), ("all", "all")])
def test_a_generation_program_returns_the_last_position_unless_its_spec_says_all(
    tmp_path: Path, output: str | None, expected: str
) -> None:
    data = {**CAUSAL, "task": "text-generation", **({"output": output} if output else {})}
    spec = load_spec_file(spec_file(tmp_path, data))
    assert spec.output == expected
    assert spec.to_dict()["output"] == expected  # in the sidecar and the cache key
    assert all(spec.output == "last" for spec in BUILTIN_SPECS.values() if spec.generates)


@pytest.mark.parametrize(
    ("data", "output", "message"),
    [
        (FILL_MASK, "first", "'first' is not supported; supported: all, last, mask"),
        (FILL_MASK, 1, "expected a string"),
        (FILL_MASK, "last", "'last' is not an output of task 'fill-mask'; its outputs: 'all', 'mask'"),
        (CAUSAL, "mask", "'mask' is not an output of task 'causal-lm'; its outputs: 'all', 'last'"),
        (
            {**CAUSAL, "task": "text-classification"},
            "last",
            "only tasks fill-mask, causal-lm, text-generation choose their output",
        ),
        (
            {**CAUSAL, "task": "text-generation"},
            "mask",
            "'mask' is not an output of task 'text-generation'; its outputs: 'all', 'last'",
        ),
    ],
)
def test_a_bad_output_names_its_file_line_and_field(tmp_path: Path, data: dict, output: object, message: str) -> None:
    path = spec_file(tmp_path, {**data, "output": output})
    line = next(n for n, text in enumerate(path.read_text().splitlines(), 1) if '"output"' in text)
    with pytest.raises(SpecError) as raised:
        load_spec_file(path)
    assert raised.value.exit_code == ExitCode.USAGE
    assert f"{path}:{line}: field 'output': " in str(raised.value) and message in str(raised.value)


def test_other_sources_have_no_output(tmp_path: Path) -> None:
    data = {"name": "m", "source": "torchvision", "model": "resnet18", "image_size": 32, "output": "all"}
    with pytest.raises(SpecError, match="field 'output'"):
        load_spec_file(spec_file(tmp_path, data))


def test_a_recorded_output_is_read_back_and_checked() -> None:
    record = MASKED_TINY.to_dict()
    assert spec_from_record(record, "sidecar").output == "mask"
    assert spec_from_record({k: v for k, v in record.items() if k != "output"}, "sidecar").output == "all"  # older
    with pytest.raises(SpecError, match="output 'first' is not one of all, last, mask"):
        spec_from_record({**record, "output": "first"}, "a sidecar")


def test_the_output_is_in_the_cache_key() -> None:
    xnnpack = VARIANTS["xnnpack"]
    keys = {
        output: cache.cache_key(dataclasses.replace(MASKED_TINY, output=output), xnnpack, "random", False)
        for output in ("all", "mask")
    }
    assert keys["all"] != keys["mask"]
    assert keys["all"] == cache.cache_key(BUILTIN_SPECS["distilbert-tiny"], xnnpack, "random", False)


@pytest.mark.parametrize(("name", "rows"), [("distilbert-tiny", 2), ("gpt2-tiny", 1)])
def test_the_selected_logits_are_the_eager_models_at_that_position(name: str, rows: int) -> None:
    """The [MASK] row of each row (batch 2: the rows' masks at different places) or the final position, as the
    eager model's full logits have them; the program exported from it computes the same."""
    from orchestrator.lowering.sources.builders.huggingface import build_random
    from orchestrator.lowering.sources.builders.models import example_inputs, load_model

    output = "mask" if name.startswith("distilbert") else "last"
    spec = dataclasses.replace(BUILTIN_SPECS[name], output=output, batch_size=rows, seq_len=16)
    loaded = load_model(spec, "random")
    ids, mask = (torch.from_numpy(t.array) for t in example_inputs(spec, loaded.module))
    with torch.no_grad():
        selected = loaded.module(ids, mask)
        full = build_random(spec)(input_ids=ids, attention_mask=mask).logits
    if output == "mask":
        positions = [int(row.tolist().index(spec.options_of(HuggingFaceOptions).mask_token_id)) for row in ids]
        assert len(set(positions)) == rows  # each row's own position
    else:
        positions = [15] * rows
    assert selected.shape == (rows, 1000)
    torch.testing.assert_close(selected, full[torch.arange(rows), positions], rtol=1e-4, atol=1e-5)
    program = torch.export.export(loaded.module, (ids, mask), strict=False)
    torch.testing.assert_close(program.module()(ids, mask), selected, rtol=1e-4, atol=1e-5)


@pytest.mark.slow
def test_a_mask_program_lowers_to_the_mask_logits_and_another_output_relowers(tmp_path: Path) -> None:
    from executorch.runtime import Runtime

    xnnpack = VARIANTS["xnnpack"]
    result = lowering.lower(MASKED_TINY, variants=[xnnpack], weights="random", root=tmp_path, jobs=1)
    sidecar = result.variants[xnnpack].sidecar
    assert sidecar.spec["output"] == "mask"
    assert [(o.shape, o.kind) for o in sidecar.outputs] == [((1, 1000), "logits")]
    inputs = [torch.from_numpy(t.array) for t in read_tensors(result.paths.reference_inputs)]
    (reference,) = read_tensors(result.paths.reference_outputs)
    method = Runtime.get().load_program(result.paths.pte(xnnpack)).load_method("forward")
    (got,) = method.execute(inputs)
    np.testing.assert_allclose(got.numpy(), reference.array, atol=1e-4, rtol=1e-4)
    from orchestrator.lowering.sources.builders.huggingface import build_random

    with torch.no_grad():  # the reference is the eager model's logits at the [MASK]
        full = build_random(MASKED_TINY)(input_ids=inputs[0], attention_mask=inputs[1]).logits
    position = int(inputs[0][0].tolist().index(MASKED_TINY.options_of(HuggingFaceOptions).mask_token_id))
    np.testing.assert_allclose(reference.array, full[:, position].numpy(), atol=1e-5, rtol=1e-5)

    every = BUILTIN_SPECS["distilbert-tiny"]  # the same name, every position: lowered again, not the cached one
    again = lowering.lower(every, variants=[xnnpack], weights="random", root=tmp_path, jobs=1)
    relowered = again.variants[xnnpack].sidecar
    assert relowered.cache_key != sidecar.cache_key and relowered.spec["output"] == "all"
    assert [o.shape for o in relowered.outputs] == [(1, 128, 1000)]


@pytest.mark.parametrize("name", ["distilbert", "gpt2"])
def test_head_at_position_applies_to_a_program_that_selects_its_position_after_the_head(name: str) -> None:
    """The course's programs project every position and then keep one: the rewrite applies when asked, and never
    by default (the model as exported is what etlab profiles)."""
    spec = BUILTIN_SPECS[name]
    check_request(parse_rewrites("head-at-position"), spec)
    assert "head-at-position" in parse_rewrites("auto").resolve(spec)
    assert not parse_rewrites("none").resolve(spec)


@pytest.mark.parametrize(("output", "rows"), [("mask", 2), ("last", 1)])
def test_head_at_position_on_one_positions_program_projects_one_row_with_the_same_outputs(
    output: str, rows: int
) -> None:
    """The course's DistilBERT (the [MASK] position's logits) and GPT-2 (the final position's), tiny: rewritten, the
    program takes the same inputs and returns the same [B, vocab] logits, and its head projects one row per batch
    row instead of every position."""
    from orchestrator.lowering.rewrites.registry import apply_rewrites
    from orchestrator.lowering.sources.builders.models import example_inputs, load_model

    name = "distilbert-tiny" if output == "mask" else "gpt2-tiny"
    spec = dataclasses.replace(BUILTIN_SPECS[name], output=output, batch_size=rows, seq_len=16)
    loaded = load_model(spec, "random")
    inputs = tuple(torch.from_numpy(t.array) for t in example_inputs(spec, loaded.module))
    with torch.no_grad():
        original = loaded.module(*inputs)
    rewritten, applied = apply_rewrites(loaded.module, spec, parse_rewrites("head-at-position"))
    assert applied == ("head-at-position",)
    with torch.no_grad():
        got = rewritten(*inputs)
    assert got.shape == original.shape == (rows, 1000)
    torch.testing.assert_close(got, original, rtol=1e-4, atol=1e-5)
    program = torch.export.export(rewritten, inputs, strict=False)
    values = [node.meta.get("val") for node in program.graph.nodes if node.op == "call_function"]
    vocab_wide = [value.shape for value in values if isinstance(value, torch.Tensor) and value.shape[-1:] == (1000,)]
    assert vocab_wide and all(shape.numel() == rows * 1000 for shape in vocab_wide), vocab_wide


def test_fab_models_says_what_each_program_returns() -> None:
    result = run_fab("models", "--long", env={"ETLAB_WIDTH": "400"})  # the output column: the long listing's
    assert result.returncode == 0, result.stderr
    rows = {line.split("│")[1].strip(): line for line in result.stdout.splitlines() if line.count("│") > 3}
    assert "mask: the [MASK] position's logits" in rows["distilbert"]
    assert "last: the last position's logits" in rows["gpt2"]
    assert "all: every position's logits" in rows["gpt2-tiny"]


def test_fab_models_shows_the_speech_models_inputs() -> None:
    """The speech encoders leave their inputs to their family: their input column was empty, and a long name cut."""
    result = run_fab("models")  # the default width of piped output, one line each: the name column never cut
    assert result.returncode == 0, result.stderr
    rows = {line.split("│")[1].strip(): line for line in result.stdout.splitlines() if line.count("│") > 3}
    assert "input_features 1×80×3000" in rows["whisper-tiny-encoder"]
    assert "input_features 1×80×100" in rows["whisper-tiny-encoder-tiny"]
    for name in ("wav2vec2", "wav2vec2-tiny"):
        assert "input_values 1×16000" in rows[name], rows[name]
