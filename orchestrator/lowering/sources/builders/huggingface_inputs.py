"""The `huggingface` source's reference inputs: deterministic and valid for the model, ids inside the vocabulary with a
[MASK] where fill-mask needs one, images and audio (a waveform, AST's filter bank, Whisper's log-mel features) in
the range their preprocessors produce.
"""

from __future__ import annotations

import numpy as np

from orchestrator.lowering.sources.huggingface import HuggingFaceOptions
from orchestrator.lowering.spec import IMAGE_INPUT, TEXT_INPUTS, InputSpec, ModelSpec
from orchestrator.lowering.weights import RANDOM_SEED
from orchestrator.tensorfile import NamedTensor

_SAMPLE_RATE = 16000  # what every speech preprocessor here expects
_WHISPER_HOP = 160  # samples per log-mel frame of Whisper's feature extractor
_FBANK_HOP, _FBANK_WINDOW = 160, 400  # AST's filter bank: a 25 ms window every 10 ms, in samples


def reference_inputs(
    spec: ModelSpec,
    vocab_size: int,
    inputs: tuple[InputSpec, ...] | None = None,
    segments: int = 1,
    pad: int = 0,
    seed: int = RANDOM_SEED,
) -> list[NamedTensor]:
    """Deterministic inputs of the shapes `inputs` (default: the spec's); `segments` is the family's number of token
    types, `pad` its padding token id. See `_token_inputs`, `_image`, `_audio`, `_filter_bank`, `_log_mel`."""
    inputs = spec.inputs if inputs is None else inputs
    rng = np.random.default_rng(seed)
    if inputs[0].name in TEXT_INPUTS:
        return _token_inputs(spec, vocab_size, inputs, rng, segments, pad)
    item = inputs[0]
    if item.name == IMAGE_INPUT:
        array = _image(rng, item.shape)
    elif item.name == "input_values" and len(item.shape) == 3:
        array = _filter_bank(rng, item.shape)
    elif item.name == "input_values":
        array = _audio(rng, item.shape)
    else:
        array = _log_mel(rng, item.shape)
    return [NamedTensor(item.name, array)]


def _token_inputs(
    spec: ModelSpec,
    vocab_size: int,
    inputs: tuple[InputSpec, ...],
    rng: np.random.Generator,
    segments: int,
    pad: int,
) -> list[NamedTensor]:
    """A sequence per row (3/4 real tokens in the first, then 1/2, 3/4, ...), padded with the pad token (a decoder's
    classifier reads the last token that is not one), with a [MASK] for fill-mask models; token types 0 then 1 (two
    segments) where the family has two."""
    batch, seq_len = inputs[0].shape
    low = min(1000, vocab_size // 2)
    input_ids = np.full((batch, seq_len), pad, dtype=np.int64)
    attention_mask = np.zeros((batch, seq_len), dtype=np.int64)
    token_types = np.zeros((batch, seq_len), dtype=np.int64)
    for row in range(batch):
        real = max(1, (seq_len * (3 if row % 2 == 0 else 2)) // 4)
        input_ids[row, :real] = rng.integers(low, vocab_size, size=real)
        if spec.task == "fill-mask":
            mask_token_id = spec.options_of(HuggingFaceOptions).mask_token_id
            assert mask_token_id is not None  # the spec check requires it
            input_ids[row, min(real - 1, max(1, real // 3))] = mask_token_id
        attention_mask[row, :real] = 1
        if segments >= 2:
            token_types[row, real // 2 : real] = 1
    arrays = {"input_ids": input_ids, "attention_mask": attention_mask, "token_type_ids": token_types}
    return [NamedTensor(item.name, arrays[item.name]) for item in inputs]


def _image(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    """Uniform pixels in [0, 1], normalised as ViT's image processor does (mean 0.5, std 0.5): [-1, 1]."""
    pixels = rng.random(shape, dtype=np.float32)
    return ((pixels - 0.5) / 0.5).astype(np.float32)


def _waveform(rng: np.random.Generator, batch: int, samples: int) -> np.ndarray:
    """A chord and a little noise per row (a different chord each), 16 kHz: [batch, samples] in [-1, 1]."""
    time = np.arange(samples, dtype=np.float64) / _SAMPLE_RATE
    rows = []
    for row in range(batch):
        base = 220.0 * (row + 1) * rng.uniform(0.8, 1.25)
        tone = sum(np.sin(2 * np.pi * base * k * time) / k for k in (1, 2, 3))
        rows.append(0.3 * tone / 1.83 + 0.05 * rng.standard_normal(samples))
    return np.clip(np.stack(rows), -1.0, 1.0)


def _audio(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    """The waveform as wav2vec2's feature extractor hands it over: zero mean, unit variance per row."""
    wave = _waveform(rng, *shape)
    normalised = (wave - wave.mean(axis=1, keepdims=True)) / np.sqrt(wave.var(axis=1, keepdims=True) + 1e-7)
    return normalised.astype(np.float32)


def _filter_bank(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    """The waveform through AST's own feature extractor (Kaldi's log-mel filter bank, 25 ms windows every 10 ms,
    normalised with AudioSet's mean and deviation): [batch, frames, mel bins]."""
    from transformers import ASTFeatureExtractor

    batch, frames, bins = shape
    extractor = ASTFeatureExtractor(num_mel_bins=bins, max_length=frames, sampling_rate=_SAMPLE_RATE)
    samples = (frames - 1) * _FBANK_HOP + _FBANK_WINDOW  # exactly `frames` windows
    waves = list(_waveform(rng, batch, samples).astype(np.float32))
    features = extractor(waves, sampling_rate=_SAMPLE_RATE, return_tensors="np")["input_values"]
    return np.ascontiguousarray(features, dtype=np.float32)


def _log_mel(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    """The waveform through Whisper's own feature extractor (log-mel, scaled to about [-1, 1.5]):
    [batch, mel bins, frames]."""
    from transformers import WhisperFeatureExtractor

    batch, bins, frames = shape
    extractor = WhisperFeatureExtractor(feature_size=bins, sampling_rate=_SAMPLE_RATE)
    extractor.n_samples = frames * _WHISPER_HOP  # the window the encoder takes, whatever its length
    extractor.nb_max_frames = frames
    waves = list(_waveform(rng, batch, frames * _WHISPER_HOP).astype(np.float32))
    features = extractor(waves, sampling_rate=_SAMPLE_RATE, return_tensors="np")["input_features"]
    return np.ascontiguousarray(features[:, :, :frames], dtype=np.float32)
