"""Calibration data for a calibrated scheme (int8-static): generated token ids, or a user's file (JSON rows of token
ids, or an ETLT file of any input kind) checked against the model's inputs."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from orchestrator import strictjson
from orchestrator.errors import UsageError
from orchestrator.fsutil import read_json

CALIBRATION_SAMPLES = 8  # generated samples when the user gives no calibration file


class CalibrationError(UsageError):
    """A calibration file that cannot be used (exit 64); the message starts with the file's path."""


def generated_calibration(reference_args: tuple, vocab_size: int, samples: int = CALIBRATION_SAMPLES) -> list[tuple]:
    """Deterministic samples shaped like the reference inputs: random token ids, varied real lengths, every row of a
    batch alike; inputs after the ids and the mask (token_type_ids) as the reference has them."""
    import torch

    input_ids, attention_mask, *others = reference_args
    generator = torch.Generator().manual_seed(1234)
    seq_len = input_ids.shape[1]
    result = [reference_args]
    low = min(1000, vocab_size // 2)
    for index in range(samples - 1):
        real = max(1, seq_len * (index + 2) // (samples + 1))
        ids = torch.zeros_like(input_ids)
        ids[:, :real] = torch.randint(low, vocab_size, (real,), generator=generator)
        # Keep a [MASK] where the reference has one, so fill-mask models see it.
        mask_positions = (input_ids[0] != 0) & (input_ids[0] < low)
        ids[:, mask_positions] = input_ids[:, mask_positions]
        mask = torch.zeros_like(attention_mask)
        mask[:, : max(real, int(mask_positions.nonzero().max()) + 1 if mask_positions.any() else real)] = 1
        result.append((ids, mask, *others))
    return result


def shaped_like(samples: list[tuple], reference_args: tuple) -> list[tuple]:
    """Samples of one row (token ids and mask, an image) made the reference's shape: repeated over its batch, and
    the inputs after theirs (token_type_ids) taken from the reference."""
    batch = reference_args[0].shape[0]
    return [
        (*(t.expand(batch, *t.shape[1:]).contiguous() for t in sample), *reference_args[len(sample) :])
        for sample in samples
    ]


def calibration_from_file(path: Path, seq_len: int, vocab_size: int) -> list[tuple]:
    """Samples from an ETLT file (input_ids [N, seq] and optionally attention_mask) or JSON token-id lists.

    Everything is checked here, before any lowering starts (lower.py calls this first in the main process): a
    mistake is a CalibrationError naming the file (the command layer adds its option), never an exception from
    inside the calibration.
    """
    import torch

    where = str(path)
    if not path.is_file():
        raise CalibrationError(f"{where}: no such file")
    rows = _json_rows(path, where) if path.suffix.lower() == ".json" else _etlt_rows(path, where)
    result = []
    for number, (ids, mask) in enumerate(rows):
        if any(t < 0 or t >= vocab_size for t in ids):
            raise CalibrationError(f"{where}: sample {number} has token ids outside 0..{vocab_size - 1}")
        if mask is not None:
            real = sum(mask)
            if real == 0 or not all(mask[:real]) or any(mask[real:]):
                raise CalibrationError(
                    f"{where}: sample {number}: attention_mask must be 1s for the real tokens, then 0s (padding "
                    "on the right), with at least one 1"
                )
        ids = ids[:seq_len]
        real = len(ids) if mask is None else min(seq_len, sum(mask))
        padded = torch.zeros((1, seq_len), dtype=torch.int64)
        padded[0, : len(ids)] = torch.tensor(ids, dtype=torch.int64)
        attention = torch.zeros((1, seq_len), dtype=torch.int64)
        attention[0, : max(1, real)] = 1
        result.append((padded, attention))
    if len(result) < 2:
        raise CalibrationError(f"{where}: give several samples (found {len(result)}); calibration needs variety")
    return result


def calibration_samples(path: Path, inputs: Sequence[tuple[str, str, Sequence[int]]], model: str) -> list[tuple]:
    """Samples for a model of any inputs (images, audio, a factory's) from an ETLT file: one tensor per input
    (`inputs`: name, dtype, shape), named as it, of its dtype and its shape behind a leading sample axis.

    A file that does not match is a CalibrationError naming the file and saying what the model takes.
    """
    import numpy as np
    import torch

    # here, not at the top: numpy, which the scheme registry's readers (fab's start-up) do not need
    from orchestrator.tensorfile import TensorFileError, read_tensors

    where = str(path)
    wanted = ", ".join(f"{name} {dtype} [N, {', '.join(map(str, shape))}]" for name, dtype, shape in inputs)
    needs = f"{model} takes {len(inputs)} input(s); its calibration file is an ETLT file of {wanted} (N samples)"
    if path.suffix.lower() == ".json":
        raise CalibrationError(f"{where}: token-id lists are for token models; {needs}")
    try:
        tensors = {t.name: t.array for t in read_tensors(path)}
    except TensorFileError as exc:
        raise CalibrationError(f"{where}: {exc}; {needs}") from None
    if set(tensors) != {name for name, _, _ in inputs}:
        raise CalibrationError(f"{where}: holds {', '.join(sorted(tensors)) or 'nothing'}; {needs}")
    counts = set()
    for name, dtype, shape in inputs:
        array = tensors[name]
        if str(array.dtype) != dtype or tuple(array.shape[1:]) != tuple(shape):
            got = f"{array.dtype} [{', '.join(map(str, array.shape))}]"
            raise CalibrationError(f"{where}: {name} is {got}; {needs}")
        if array.dtype.kind == "f" and not np.isfinite(array).all():
            raise CalibrationError(f"{where}: {name} holds NaN or infinite values")
        counts.add(array.shape[0])
    if len(counts) != 1:
        raise CalibrationError(f"{where}: its tensors hold different numbers of samples; {needs}")
    samples = counts.pop()
    if samples < 2:
        raise CalibrationError(f"{where}: give several samples (found {samples}); calibration needs variety")
    return [tuple(torch.from_numpy(tensors[name][index].copy()) for name, _, _ in inputs) for index in range(samples)]


def _token_ids(value: Any) -> list[int] | None:
    """A non-empty list of integer token ids (not booleans, not floats), or None."""
    if not isinstance(value, list) or not value:
        return None
    if not all(isinstance(t, int) and not isinstance(t, bool) for t in value):
        return None
    return value


def _json_rows(path: Path, where: str) -> list[tuple[list[int], list[int] | None]]:
    try:
        data = read_json(path)
    except strictjson.JsonDataError as exc:
        raise CalibrationError(f"{where}: {exc.field + ': ' if exc.field else ''}{exc.problem}") from None
    except OSError as exc:
        raise CalibrationError(f"{where}: unreadable ({exc})") from None
    samples = data.get("samples", data) if isinstance(data, dict) else data
    if not isinstance(samples, list) or not samples:
        raise CalibrationError(f"{where}: expected a list of token-id lists (or {{'samples': [...]}})")
    rows: list[tuple[list[int], list[int] | None]] = []
    for number, sample in enumerate(samples):
        ids = _token_ids(sample.get("input_ids") if isinstance(sample, dict) else sample)
        if ids is None:
            raise CalibrationError(f"{where}: sample {number} is not a non-empty list of integer token ids")
        mask = sample.get("attention_mask") if isinstance(sample, dict) else None
        if mask is not None and (_token_ids(mask) is None or len(mask) != len(ids) or set(mask) - {0, 1}):
            raise CalibrationError(
                f"{where}: sample {number}: attention_mask must be a list of 0s and 1s as long as input_ids"
            )
        rows.append((ids, mask))
    return rows


def _etlt_rows(path: Path, where: str) -> list[tuple[list[int], list[int] | None]]:
    import numpy as np

    # here, not at the top: numpy, which the scheme registry's readers (fab's start-up) do not need
    from orchestrator.tensorfile import TensorFileError, read_tensors

    try:
        tensors = {t.name: t.array for t in read_tensors(path)}
    except TensorFileError as exc:
        raise CalibrationError(f"{where}: {exc}") from None
    ids_array = tensors.get("input_ids")
    if (
        ids_array is None
        or ids_array.ndim != 2
        or 0 in ids_array.shape
        or not np.issubdtype(ids_array.dtype, np.integer)
    ):
        raise CalibrationError(
            f"{where}: needs an integer tensor 'input_ids' of shape [samples, seq_len], both at least 1"
        )
    masks = tensors.get("attention_mask")
    if masks is not None:
        integer = np.issubdtype(masks.dtype, np.integer) or masks.dtype == np.bool_
        if not integer or masks.shape != ids_array.shape or not np.isin(masks, (0, 1)).all():
            raise CalibrationError(
                f"{where}: attention_mask must be an integer tensor of 0s and 1s shaped like input_ids "
                f"{list(ids_array.shape)}, got {masks.dtype} {list(masks.shape)}"
            )
    return [
        ([int(v) for v in ids_array[index]], None if masks is None else [int(v) for v in masks[index]])
        for index in range(ids_array.shape[0])
    ]
