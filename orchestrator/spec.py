"""Model specs: what to lower, from the built-in list or a user's JSON file.

A spec names the HuggingFace model, the task (which decides what the graph outputs), the sequence
length and the inputs. It is plain data; `models.py` turns it into a torch module.
"""

from __future__ import annotations

import difflib
import json
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from .errors import SpecError

TASKS = ("fill-mask", "causal-lm")
MODEL_TYPES = ("distilbert", "gpt2", "bert")
INPUT_NAMES = ("input_ids", "attention_mask")
NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")


def is_valid_name(text: object) -> bool:
    """The name rule for whatever becomes a file or folder name: spec names, and every name a board sends."""
    return isinstance(text, str) and NAME_PATTERN.fullmatch(text) is not None


@dataclass(frozen=True)
class InputSpec:
    name: str
    dtype: str
    shape: tuple[int, ...]


@dataclass(frozen=True)
class ModelSpec:
    name: str
    model_type: str
    task: str
    seq_len: int = 128
    model_id: str | None = None
    config: dict[str, Any] = field(default_factory=dict)
    mask_token_id: int | None = None
    description: str = ""
    source: str = "built-in"

    @property
    def inputs(self) -> tuple[InputSpec, ...]:
        return tuple(InputSpec(name, "int64", (1, self.seq_len)) for name in INPUT_NAMES)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["inputs"] = [asdict(spec) | {"shape": list(spec.shape)} for spec in self.inputs]
        return data

    def identity(self) -> dict[str, Any]:
        """What decides the lowered program (the cache key); excludes descriptive fields."""
        data = self.to_dict()
        for key in ("description", "source"):
            data.pop(key)
        return data


_DISTILBERT_TINY = {"vocab_size": 1000, "dim": 64, "n_layers": 2, "n_heads": 2, "hidden_dim": 128}
_GPT2_TINY = {"vocab_size": 1000, "n_embd": 64, "n_layer": 2, "n_head": 2, "n_positions": 128}

BUILTIN_SPECS: dict[str, ModelSpec] = {
    spec.name: spec
    for spec in (
        ModelSpec(
            name="distilbert",
            model_type="distilbert",
            task="fill-mask",
            model_id="distilbert-base-uncased",
            mask_token_id=103,
            description="DistilBERT base (uncased), fill-mask logits at the [MASK] position",
        ),
        ModelSpec(
            name="gpt2",
            model_type="gpt2",
            task="causal-lm",
            model_id="openai-community/gpt2",
            description="GPT-2 small, next-token logits of the last real token",
        ),
        ModelSpec(
            name="distilbert-tiny",
            model_type="distilbert",
            task="fill-mask",
            config=_DISTILBERT_TINY,
            mask_token_id=103,
            description="2-layer, 64-dim DistilBERT with random weights, for tests and quick demos",
        ),
        ModelSpec(
            name="gpt2-tiny",
            model_type="gpt2",
            task="causal-lm",
            config=_GPT2_TINY,
            description="2-layer, 64-dim GPT-2 with random weights, for tests and quick demos",
        ),
    )
}


def resolve_spec(model: str | None = None, spec_path: str | Path | None = None) -> ModelSpec:
    """The spec for `--model NAME` or `--spec FILE` (exactly one)."""
    if (model is None) == (spec_path is None):
        raise SpecError("give exactly one of --model NAME or --spec FILE")
    if spec_path is not None:
        return load_spec_file(Path(spec_path))
    assert model is not None
    if model in BUILTIN_SPECS:
        return BUILTIN_SPECS[model]
    close = difflib.get_close_matches(model, BUILTIN_SPECS, n=1)
    hint = f"did you mean {close[0]!r}? " if close else ""
    raise SpecError(
        f"unknown model {model!r}; {hint}known models: {', '.join(BUILTIN_SPECS)}",
        hint="or pass your own spec with --spec path/to/model_spec.json",
    )


_FIELDS: dict[str, tuple[type | tuple[type, ...], bool]] = {
    # field: (type, required)
    "name": (str, True),
    "model_type": (str, True),
    "task": (str, True),
    "seq_len": (int, False),
    "model_id": ((str, type(None)), False),
    "config": (dict, False),
    "mask_token_id": ((int, type(None)), False),
    "description": (str, False),
    "inputs": (list, False),
}


def load_spec_file(path: Path) -> ModelSpec:
    """Parse and validate a user spec; every error names the file and the field."""

    def fail(field_name: str | None, message: str) -> SpecError:
        where = f"{path}: field {field_name!r}" if field_name else str(path)
        return SpecError(f"{where}: {message}", hint="the spec schema is documented in README.md (Model specs)")

    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise fail(None, f"cannot read spec file ({exc.strerror or exc})") from exc
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise fail(None, f"not valid JSON at line {exc.lineno}, column {exc.colno}: {exc.msg}") from exc
    if not isinstance(data, dict):
        raise fail(None, "the spec must be a JSON object")

    for key in data:
        if key not in _FIELDS:
            close = difflib.get_close_matches(key, _FIELDS, n=1)
            suggestion = f" (did you mean {close[0]!r}?)" if close else ""
            raise fail(key, f"unknown field{suggestion}; allowed fields: {', '.join(_FIELDS)}")
    for key, (kind, required) in _FIELDS.items():
        if key not in data:
            if required:
                raise fail(key, "is required")
            continue
        value = data[key]
        if isinstance(value, bool) or not isinstance(value, kind):
            expected = kind.__name__ if isinstance(kind, type) else " or ".join(k.__name__ for k in kind)
            raise fail(key, f"expected {expected.replace('NoneType', 'null')}, got {json.dumps(value)}")

    if not is_valid_name(data["name"]):
        raise fail("name", "must be 1-64 letters, digits, '.', '_' or '-', starting with a letter or digit")
    if data["model_type"] not in MODEL_TYPES:
        raise fail("model_type", f"{data['model_type']!r} is not supported; supported: {', '.join(MODEL_TYPES)}")
    if data["task"] not in TASKS:
        raise fail("task", f"{data['task']!r} is not supported; supported: {', '.join(TASKS)}")
    seq_len = data.get("seq_len", 128)
    if not 1 <= seq_len <= 4096:
        raise fail("seq_len", f"must be between 1 and 4096, got {seq_len}")
    if data["task"] == "fill-mask" and data.get("mask_token_id") is None:
        raise fail("mask_token_id", "is required for task 'fill-mask' (the [MASK] token id, e.g. 103 for BERT)")
    if "inputs" in data:
        _check_inputs(data["inputs"], seq_len, fail)
    if not data.get("model_id") and not data.get("config") and data["name"] not in BUILTIN_SPECS:
        raise fail("model_id", "give a model_id (HuggingFace id or local folder) or a config for random weights")
    return ModelSpec(
        name=data["name"],
        model_type=data["model_type"],
        task=data["task"],
        seq_len=seq_len,
        model_id=data.get("model_id"),
        config=dict(data.get("config", {})),
        mask_token_id=data.get("mask_token_id"),
        description=data.get("description", ""),
        source=str(path),
    )


def _check_inputs(inputs: list, seq_len: int, fail: Any) -> None:
    """Inputs are fixed by the model wrappers; a spec may state them, and they must agree."""
    expected = [{"name": name, "dtype": "int64", "shape": [1, seq_len]} for name in INPUT_NAMES]
    if inputs != expected:
        raise fail("inputs", f"must be {json.dumps(expected)}: input_ids and attention_mask, int64 [1, seq_len]")
