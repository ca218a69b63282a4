"""Model specs: what to lower, from the built-in list or a user's JSON file.

A spec names the HuggingFace model, the task (which decides what the graph outputs), the sequence
length and the inputs. It is plain data; `models.py` turns it into a torch module.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import yaml
from yaml.nodes import MappingNode, Node, SequenceNode

from orchestrator.config import (
    Check,
    Checker,
    Invalid,
    describe,
    did_you_mean,
    integer,
    line_of,
    plain,
    string,
    text,
)
from orchestrator.errors import SpecError
from orchestrator.names import is_valid_name

TASKS = ("fill-mask", "causal-lm")
MODEL_TYPES = ("distilbert", "gpt2", "bert")
INPUT_NAMES = ("input_ids", "attention_mask")


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
    raise SpecError(
        f"unknown model {model!r}{did_you_mean(model, BUILTIN_SPECS)}; known models: {', '.join(BUILTIN_SPECS)}",
        hint="or pass your own spec with --spec path/to/model_spec.json",
    )


class _SpecChecker(Checker):
    """Names fields as `field 'seq_len'`: a spec is flat JSON."""

    def error(self, node: Node, field_name: str, message: str) -> None:
        self.problems.append((line_of(node), f"field {field_name!r}: {message}" if field_name else message))


def _supported(options: tuple[str, ...]) -> Check:
    def check(node: Node, _field: str) -> str:
        value = string(node)
        if value not in options:
            raise Invalid(f"{value!r} is not supported; supported: {', '.join(options)}{did_you_mean(value, options)}")
        return value

    return check


def _name(node: Node, _field: str) -> str:
    value = string(node)
    if not is_valid_name(value):
        raise Invalid("must be 1-64 letters, digits, '.', '_' or '-', starting with a letter or digit")
    return value


def _mapping(node: Node, _field: str) -> dict[str, Any]:
    if not isinstance(node, MappingNode):
        raise Invalid(f"expected a mapping (JSON object), got {describe(node)}")
    return dict(plain(node, _field))


def _list(node: Node, _field: str) -> list[Any]:
    if not isinstance(node, SequenceNode):
        raise Invalid(f"expected a list, got {describe(node)}")
    return list(plain(node, _field))


_FIELDS: dict[str, Check] = {
    "name": _name,
    "model_type": _supported(MODEL_TYPES),
    "task": _supported(TASKS),
    "seq_len": integer(1, 4096),
    "model_id": text,
    "config": _mapping,
    "mask_token_id": integer(0),
    "description": text,
    "inputs": _list,
}
_REQUIRED = ("name", "model_type", "task")


def load_spec_file(path: Path) -> ModelSpec:
    """Parse and validate a user spec; every error names the file, the line and the field."""

    def fail(message: str) -> SpecError:
        return SpecError(message, hint="the spec schema is documented in README.md (Model specs)")

    try:
        text_ = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise fail(f"{path}: cannot read spec file ({getattr(exc, 'strerror', None) or exc})") from exc
    try:
        data = json.loads(text_)
    except (ValueError, RecursionError) as exc:
        where = f" at line {exc.lineno}, column {exc.colno}: {exc.msg}" if isinstance(exc, json.JSONDecodeError) else ""
        raise fail(f"{path}: not valid JSON{where}") from exc
    if not isinstance(data, dict):
        raise fail(f"{path}: the spec must be a JSON object")
    try:
        root = yaml.compose(text_)  # JSON is YAML: the nodes carry the line of every field
    except yaml.YAMLError:
        root = yaml.compose(json.dumps(data, indent=0))  # JSON that PyYAML refuses (tabs): lines are then approximate
    checker = _SpecChecker(path)
    found = checker.fields(root, "", _FIELDS)
    for key in _REQUIRED:
        if key not in data:
            checker.error(root, key, "is required")
    if checker.problems:
        raise fail("\n".join(checker.errors))
    lines = {key.value: value for key, value in root.value}

    def problem(key: str, message: str) -> SpecError:
        checker.error(lines.get(key, root), key, message)
        return fail("\n".join(checker.errors))

    seq_len = found.get("seq_len", 128)
    if found["task"] == "fill-mask" and found.get("mask_token_id") is None:
        raise problem("mask_token_id", "is required for task 'fill-mask' (the [MASK] token id, e.g. 103 for BERT)")
    if "inputs" in found:
        expected = [{"name": name, "dtype": "int64", "shape": [1, seq_len]} for name in INPUT_NAMES]
        if found["inputs"] != expected:
            raise problem("inputs", f"must be {json.dumps(expected)}: input_ids and attention_mask, int64 [1, seq_len]")
    if not found.get("model_id") and not found.get("config") and found["name"] not in BUILTIN_SPECS:
        raise problem("model_id", "give a model_id (HuggingFace id or local folder) or a config for random weights")
    return ModelSpec(
        name=found["name"],
        model_type=found["model_type"],
        task=found["task"],
        seq_len=seq_len,
        model_id=found.get("model_id"),
        config=dict(found.get("config", {})),
        mask_token_id=found.get("mask_token_id"),
        description=found.get("description", ""),
        source=str(path),
    )
