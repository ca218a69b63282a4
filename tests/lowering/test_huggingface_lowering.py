"""HuggingFace families beyond the first three, lowered with real ExecuTorch (XNNPACK) and run against eager: one tiny
model per input kind and head (RoBERTa text-classification at batch 2, BERT token-classification with token_type_ids,
T5's encoder, ViT, wav2vec2, Whisper's encoder, AST on its filter bank, a SmolLM2-shaped Llama), and their reference
inputs valid for the model. The spec check is test_huggingface_specs.py; the local board end to end is
tests/e2e/test_model_sources_e2e.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from orchestrator.lowering.builtins import BUILTIN_SPECS
from orchestrator.lowering.export import lower as lowering
from orchestrator.lowering.export.lower import LoweringResult
from orchestrator.lowering.sources.huggingface import HuggingFaceOptions
from orchestrator.lowering.spec import ModelSpec
from orchestrator.lowering.variants import VARIANTS, Variant
from orchestrator.tensorfile import read_tensors
from tests.plugins.artifacts import ARTIFACT_CACHE

pytestmark = pytest.mark.timeout(900)

_TEXT = {"vocab_size": 1000, "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2,
         "intermediate_size": 128, "max_position_embeddings": 64}  # fmt: skip
USER_SPECS = {
    spec.name: spec
    for spec in (
        ModelSpec(name="hf-roberta-cls-b2", model_type="roberta", task="text-classification", seq_len=16,
                  batch_size=2, options=HuggingFaceOptions(config={**_TEXT, "num_labels": 3, "pad_token_id": 1})),
        ModelSpec(name="hf-bert-tokens", model_type="bert", task="token-classification", seq_len=16,
                  options=HuggingFaceOptions(config={**_TEXT, "num_labels": 5})),
        ModelSpec(name="hf-t5-encoder", model_type="t5", task="feature-extraction", seq_len=16,
                  options=HuggingFaceOptions(config={"vocab_size": 1000, "d_model": 64, "num_layers": 2, "num_heads": 2,
                                                     "d_kv": 32, "d_ff": 128})),
        # Audio Spectrogram Transformer: input_values are a filter bank [batch, max_length frames, num_mel_bins]
        ModelSpec(name="hf-ast-tiny", model_type="audio-spectrogram-transformer", task="audio-classification",
                  options=HuggingFaceOptions(config={"hidden_size": 64, "num_hidden_layers": 2,
                                                     "num_attention_heads": 2, "intermediate_size": 128,
                                                     "max_length": 100, "num_mel_bins": 16, "num_labels": 4})),
    )
}  # fmt: skip
# name -> (input name, dtype, shape), output shape
EXPECTED: dict[str, tuple[list[tuple[str, Any, tuple[int, ...]]], tuple[int, ...]]] = {
    "hf-roberta-cls-b2": ([("input_ids", np.int64, (2, 16)), ("attention_mask", np.int64, (2, 16)),
                           ("token_type_ids", np.int64, (2, 16))], (2, 3)),
    "hf-bert-tokens": ([("input_ids", np.int64, (1, 16)), ("attention_mask", np.int64, (1, 16)),
                        ("token_type_ids", np.int64, (1, 16))], (1, 16, 5)),
    "hf-t5-encoder": ([("input_ids", np.int64, (1, 16)), ("attention_mask", np.int64, (1, 16))], (1, 16, 64)),
    "hf-ast-tiny": ([("input_values", np.float32, (1, 100, 16))], (1, 4)),
    "vit-tiny": ([("pixel_values", np.float32, (1, 3, 32, 32))], (1, 10)),
    "wav2vec2-tiny": ([("input_values", np.float32, (1, 16000))], (1, 49, 64)),
    "whisper-tiny-encoder-tiny": ([("input_features", np.float32, (1, 80, 100))], (1, 50, 64)),
    "smollm2-tiny": ([("input_ids", np.int64, (1, 128)), ("attention_mask", np.int64, (1, 128))], (1, 128, 1000)),
}  # fmt: skip


def spec_of(name: str) -> ModelSpec:
    return USER_SPECS.get(name) or BUILTIN_SPECS[name]


@pytest.fixture(scope="module", params=list(EXPECTED))
def lowered(request: pytest.FixtureRequest) -> LoweringResult:
    """One tiny model, XNNPACK only, in the test artifact cache (reused across sessions until the code changes)."""
    return lowering.lower(spec_of(request.param), variants=[VARIANTS["xnnpack"]], weights="random",
                          root=ARTIFACT_CACHE)  # fmt: skip


def test_the_program_matches_eager_on_valid_reference_inputs(lowered: LoweringResult) -> None:
    import torch
    from executorch.runtime import Runtime

    name = lowered.spec.name
    inputs, output_shape = EXPECTED[name]
    tensors = read_tensors(lowered.paths.reference_inputs)
    assert [(t.name, t.array.dtype, t.array.shape) for t in tensors] == inputs
    (reference,) = read_tensors(lowered.paths.reference_outputs)
    assert reference.array.shape == output_shape and np.isfinite(reference.array).all()
    sidecar = lowered.variants[VARIANTS["xnnpack"]].sidecar
    assert sidecar.task == lowered.spec.task
    assert sidecar.delegation.delegate_call_sites >= 1
    method = Runtime.get().load_program(lowered.paths.pte(VARIANTS["xnnpack"])).load_method("forward")
    (output,) = method.execute([torch.from_numpy(t.array) for t in tensors])
    scale = float(np.abs(reference.array).max())
    np.testing.assert_allclose(output.numpy(), reference.array, rtol=1e-3, atol=1e-3 * scale)
    arrays = {t.name: t.array for t in tensors}
    if "input_ids" in arrays:  # ids in the vocabulary, each row padded after its real tokens
        assert (
            arrays["input_ids"].min() >= 0
            and arrays["input_ids"].max() < spec_of(name).options_of(HuggingFaceOptions).config["vocab_size"]
        )
        mask = arrays["attention_mask"]
        assert all(row[: int(row.sum())].all() and not row[int(row.sum()) :].any() for row in mask)
    if "token_type_ids" in arrays:  # two segments, zero on padding
        assert set(np.unique(arrays["token_type_ids"])) == {0, 1}
        assert not (arrays["token_type_ids"] * (1 - arrays["attention_mask"])).any()
    if "pixel_values" in arrays:  # ViT's image processor's range
        assert -1.0 <= arrays["pixel_values"].min() < -0.9 and 0.9 < arrays["pixel_values"].max() <= 1.0
    if "input_values" in arrays and arrays["input_values"].ndim == 3:  # AST's filter bank: a signal, every frame
        assert float(arrays["input_values"].std(axis=2).min()) > 0.01 and np.isfinite(arrays["input_values"]).all()
    elif "input_values" in arrays:  # wav2vec2's feature extractor normalises each row
        assert abs(float(arrays["input_values"].mean())) < 1e-3 and abs(float(arrays["input_values"].std()) - 1) < 1e-3
    if "input_features" in arrays:  # Whisper's log-mel, scaled to about [-1, 1.5]
        assert arrays["input_features"].min() > -1.5 and arrays["input_features"].max() < 2.0
        assert float(arrays["input_features"].std()) > 0.05  # a signal, not silence


def test_batch_rows_are_distinct_and_the_program_keeps_them_apart() -> None:
    """Batch 2: rows of different lengths, each row's logits its own (the row alone gives the same)."""
    import torch

    from orchestrator.lowering.sources.builders.models import example_inputs, load_model

    spec = USER_SPECS["hf-roberta-cls-b2"]
    loaded = load_model(spec, "random")
    ids, mask, types = (torch.from_numpy(t.array) for t in example_inputs(spec, loaded.module))
    assert mask.sum(dim=1).tolist() == [12, 8]
    with torch.no_grad():
        both = loaded.module(ids, mask, types)
        alone = loaded.module(ids[1:], mask[1:], types[1:])
    assert not torch.allclose(both[0], both[1])
    torch.testing.assert_close(both[1:], alone, rtol=1e-4, atol=1e-5)


def test_a_wrapped_task_at_batch_2_selects_each_rows_own_position() -> None:
    """causal-lm at batch 2 with the head-at-position rewrite: each row's logits are those of its own last real
    token; without it, every position's."""
    import dataclasses

    import torch

    from orchestrator.lowering.rewrites.huggingface import head_at_position
    from orchestrator.lowering.sources.builders.huggingface import build_random
    from orchestrator.lowering.sources.builders.models import example_inputs, load_model

    spec = dataclasses.replace(BUILTIN_SPECS["smollm2-tiny"], batch_size=2, seq_len=16)
    loaded = load_model(spec, "random")
    ids, mask = (torch.from_numpy(t.array) for t in example_inputs(spec, loaded.module))
    rewritten = head_at_position(loaded.module, spec)
    with torch.no_grad():
        selected = rewritten(ids, mask)
        full = build_random(spec)(input_ids=ids, attention_mask=mask).logits
        torch.testing.assert_close(loaded.module(ids, mask), full, rtol=1e-4, atol=1e-5)
    last = mask.sum(dim=1) - 1
    assert selected.shape == (2, 1000)
    torch.testing.assert_close(selected, full[torch.arange(2), last], rtol=1e-4, atol=1e-5)
    program = torch.export.export(rewritten, (ids, mask), strict=False)  # the row selection exports too
    torch.testing.assert_close(program.module()(ids, mask), selected, rtol=1e-4, atol=1e-5)


@pytest.mark.slow
def test_int8_static_calibrates_an_audio_model_on_generated_audio(tmp_path: Path) -> None:
    """Whisper's encoder: no token ids to draw, so the calibration is more audio made like the reference input."""
    static = Variant.parse("xnnpack-int8-static")
    spec = BUILTIN_SPECS["whisper-tiny-encoder-tiny"]
    result = lowering.lower(spec, variants=[static], weights="random", root=tmp_path, jobs=1)
    quantization = result.variants[static].sidecar.quantization
    assert quantization is not None and quantization.calibration_samples == 8
    assert quantization.calibration_source is not None and "synthetic audio" in quantization.calibration_source
    assert quantization.fully_connected == {"qint8 x qcint8": quantization.linear_layers}
    assert quantization.convolution == {"qint8 x qcint8": 2}  # Whisper's two input convolutions
