"""A huggingface spec's `config`, key by key, against the family's config class as transformers declares it: what
huggingface.py sets on the config, what it ignores, and what it refuses, before anything is built.

A published checkpoint's config.json may be given whole. Each of its keys is one of:
- a field the class declares (its dataclass fields, and their `attribute_map` aliases): the value must be of the type
  transformers annotates the field with (`typing.get_type_hints` of the class, checked by huggingface_hub's validator,
  the one transformers' strict configs run), so a list goes where the type takes per-stage values (Swin's depths,
  SegFormer's heads per stage) and only there; a JSON number is a float where only a float goes, a JSON list a tuple
  where only a tuple goes. The sizes in SIZE_FIELDS are at least 1, each of a list's too;
- a record of how the checkpoint was saved (spec.CHECKPOINT_RECORDS: architectures, transformers_version,
  torch_dtype, _name_or_path, ...): never applied; its `model_type` must be the spec's;
- a classifier's labels (LABELS): applied for a classification task, ignored with a warning otherwise;
- a setting of what the model returns (RETURNS) or of generation (num_beams, max_length, ...: transformers itself
  drops those from a model's config), or a value the class derives from its other fields (Swin's hidden_size):
  ignored, with a warning when it says something else than the class;
- RoPE's keys from before `rope_parameters` (ROPE_LEGACY: Llama 3's rope_scaling, rope_theta): given to the class,
  which folds them into rope_parameters (a model folder's own rope_parameters are kept, with a warning);
- any other key: given to the class as transformers gives it a config.json's other keys (modelling code reads such
  keys with getattr), with a warning and a did-you-mean to the closest declared field, since it may be a typo.
Loading switches (trust_remote_code, ...) and transformers' internals are refused when the spec file is read
(spec.py); the class's own methods and properties are refused here.
"""

from __future__ import annotations

import collections.abc
import contextlib
import functools
import types
import typing
from dataclasses import MISSING, dataclass, field, fields
from typing import Any

from orchestrator.config import did_you_mean, field_path
from orchestrator.lowering.sources.huggingface import HuggingFaceOptions
from orchestrator.lowering.spec import CHECKPOINT_RECORDS, LOADING_OPTIONS, ModelSpec

CLASSIFICATION_TASKS = ("text-classification", "token-classification", "image-classification", "audio-classification")
LABELS = ("num_labels", "id2label", "label2id", "problem_type")
MAX_LABELS = 100_000
# What the model returns, which etlab's wrappers decide (the program is the head's first output).
RETURNS = frozenset({"return_dict", "output_hidden_states", "output_attentions", "torchscript", "use_return_dict"})
# RoPE as configs before `rope_parameters` wrote it: the class folds these keys into rope_parameters when built.
ROPE_LEGACY = ("rope_theta", "rope_scaling", "partial_rotary_factor")
# Sizes (counts, widths, lengths), each at least 1 where a family declares them: a scalar, or every value per stage.
SIZE_FIELDS = frozenset(
    {
        "vocab_size", "hidden_size", "num_attention_heads", "num_hidden_layers", "max_position_embeddings",
        "intermediate_size", "num_key_value_heads", "head_dim", "num_channels", "image_size", "patch_size",
        "embed_dim", "depths", "num_heads", "hidden_sizes", "window_size", "num_mel_bins", "max_source_positions",
        "max_target_positions", "max_length", "d_model", "d_ff", "d_kv", "num_layers", "encoder_layers",
        "encoder_attention_heads", "decoder_attention_heads", "encoder_ffn_dim", "decoder_ffn_dim", "n_embd",
        "n_layer", "n_head", "n_positions", "n_inner", "dim", "hidden_dim", "n_layers", "n_heads", "conv_dim",
        "conv_kernel", "conv_stride", "num_conv_pos_embeddings", "num_conv_pos_embedding_groups",
        "num_feat_extract_layers", "num_encoder_blocks", "sr_ratios", "patch_sizes", "strides",
        "decoder_hidden_size", "neck_hidden_sizes", "frequency_stride", "time_stride", "num_stages",
    }
)  # fmt: skip


@dataclass
class Overrides:
    """A spec's `config` sorted: what to set on the config, by the class's own names, and what to say about it."""

    fields: dict[str, Any] = field(default_factory=dict)  # declared fields, typed as the class takes them
    labels: dict[str, Any] = field(default_factory=dict)  # a classifier's, id2label's keys as numbers
    extras: dict[str, Any] = field(default_factory=dict)  # other keys, as transformers keeps them
    derived: dict[str, Any] = field(default_factory=dict)  # values the class derives: compared once it is built
    given: dict[str, str] = field(default_factory=dict)  # the class's name of each key set -> the spec's field
    warnings: list[str] = field(default_factory=list)

    @property
    def applied(self) -> dict[str, Any]:
        return {**self.fields, **self.labels, **self.extras}


@functools.cache
def field_types(config_class: type) -> dict[str, Any]:
    """The type of each field the class declares, as transformers annotates it."""
    import torch  # PreTrainedConfig annotates `dtype` with torch.dtype, imported there for type checkers only

    try:
        hints = typing.get_type_hints(config_class, localns={"torch": torch})
    except Exception:  # a model folder's own class (--trust-remote-code) may name what it never imports
        hints = {}
    return {f.name: hints.get(f.name, f.type if not isinstance(f.type, str) else Any) for f in fields(config_class)}


@functools.cache
def _derived(config_class: type) -> frozenset[str]:
    """Attributes the class sets from its other fields (Swin's hidden_size and num_layers), not declared itself."""
    try:
        instance = config_class()
    except Exception:  # a class without defaults for everything derives nothing we can see
        return frozenset()
    declared = {f.name for f in fields(config_class)}
    return frozenset(name for name in vars(instance) if not name.startswith("_") and name not in declared)


def declared_fields(config_class: type) -> dict[str, str]:
    """The names a spec may set as fields of the class (its aliases too) -> the field's own name."""
    own = {
        f.name: f.name
        for f in fields(config_class)
        if not f.name.startswith("_") and f.name not in CHECKPOINT_RECORDS | RETURNS and f.name not in LABELS
    }
    aliases = {alias: real for alias, real in getattr(config_class, "attribute_map", {}).items() if real in own}
    return own | aliases


def read_overrides(spec: ModelSpec, config_class: type, rebuilt: bool) -> tuple[Overrides, list[tuple[str, str]]]:
    """The spec's `config` sorted against `config_class`, and the (field, message) of every key refused.
    `rebuilt`: the config is built through the class from them (random weights), not set on a model folder's."""
    from transformers import GenerationConfig

    declared = declared_fields(config_class)
    types_of = field_types(config_class)
    generation = set(GenerationConfig._get_default_generation_params())
    classifier = spec.task in CLASSIFICATION_TASKS
    found = Overrides()
    problems: list[tuple[str, str]] = []

    def warn(name: str, message: str) -> None:
        found.warnings.append(spec.problem(name, message))

    for key, value in spec.options_of(HuggingFaceOptions).config.items():
        name = field_path("config", key)
        if key in CHECKPOINT_RECORDS:
            if key == "model_type" and value != spec.model_type:
                problems.append((name, f"is {value!r}, but the spec's model_type is {spec.model_type!r}"))
        elif key in LOADING_OPTIONS or key.startswith("_"):  # spec.py refuses them in a file; a built-in spec too
            problems.append((name, "is a loading option, not a field of the model's config: a spec cannot set it"))
        elif key in declared:
            real = declared[key]
            typed, problem = _typed(value, types_of[real], _default(config_class, real))
            problem = problem or (_size_problem(typed) if real in SIZE_FIELDS else None)
            if problem is None and real in found.given and found.fields[real] != typed:  # DistilBERT's dim, hidden_size
                problem = (f"is {config_class.__name__}'s {real} as {found.given[real]!r} is, which gives it "
                           f"{found.fields[real]!r}")  # fmt: skip
            if problem is not None:
                problems.append((name, problem))
            elif real not in found.given:
                found.fields[real] = typed
                found.given[real] = name
        elif key in LABELS:
            if not classifier:
                warn(name, f"ignored: task {spec.task!r} has no classifier head")
                continue
            typed, problem = _label(key, value, field_types(config_class).get(key, Any))
            if problem is not None:
                problems.append((name, problem))
            else:
                found.labels[key] = typed
                found.given[key] = name
        elif key in RETURNS:
            warn(name, "ignored: etlab's program returns the head's first output, whatever this says")
        elif key in generation:
            warn(name, "ignored: a generation setting, which transformers keeps out of a model's config")
        elif key in ROPE_LEGACY and "rope_parameters" in types_of:
            if rebuilt:  # the class folds them into rope_parameters, as it does a config.json's
                found.extras[key] = value
            else:
                warn(name, "ignored: the model folder's rope_parameters decide its RoPE; a spec changes them "
                           "through config.rope_parameters")  # fmt: skip
        elif key in _derived(config_class):
            found.derived[key] = value
        elif hasattr(config_class, key) or not key.isidentifier():
            problems.append((name, f"is not a field of {config_class.__name__}: a spec cannot set it"))
        else:
            close = did_you_mean(key, declared)
            warn(name, f"not a field {config_class.__name__} declares{close}; kept, as transformers keeps a "
                       "config.json's other keys (modelling code may read it)")  # fmt: skip
            found.extras[key] = value
    labels, ids = found.labels.get("num_labels"), found.labels.get("id2label")
    if labels is not None and ids is not None and labels != len(ids):
        problems.append((found.given["num_labels"], f"is {labels}, but id2label names {len(ids)} classes"))
    return found, problems


def check_derived(spec: ModelSpec, config: Any, overrides: Overrides) -> None:
    """Warn of each derived value given that the class derived otherwise (the class's is kept)."""
    for key, value in overrides.derived.items():
        derived = getattr(config, key, None)
        if derived != value and not (isinstance(derived, tuple) and list(derived) == value):
            overrides.warnings.append(spec.problem(field_path("config", key), f"ignored: {type(config).__name__} "
                                                   f"derives it from its other fields, as {derived!r}"))  # fmt: skip


# ---------------------------------------------------------------------------------------------------------------
# Values against their types


def _default(config_class: type, name: str) -> Any:
    found = next(f for f in fields(config_class) if f.name == name)
    if found.default is not MISSING:
        return found.default
    return found.default_factory() if found.default_factory is not MISSING else MISSING


def _readings(value: Any) -> list[Any]:
    """`value` as JSON gave it, then as the types JSON has no word for: a float, a tuple."""
    readings = [value]
    if type(value) is int:
        with contextlib.suppress(OverflowError):  # beyond any float: it stays an int
            readings.append(float(value))
    if isinstance(value, list):
        readings.append(tuple(value))
        if value and all(type(item) is int for item in value):
            try:
                floats = [float(item) for item in value]
            except OverflowError:
                floats = []
            if floats:
                readings += [floats, tuple(floats)]
    return readings


def _valid(value: Any, hint: Any) -> bool:
    from huggingface_hub.dataclasses import type_validator

    try:
        type_validator("value", value, hint)
    except TypeError:
        return False
    return True


def _typed(value: Any, hint: Any, default: Any) -> tuple[Any, str | None]:
    """`value` as a field of type `hint` takes it, or what is wrong with it."""
    for reading in _readings(value):
        if _valid(reading, hint):
            return reading, None
    if default is not MISSING and not _valid(default, hint):  # a type the validator cannot judge: the class will
        return value, None
    return value, f"expected {describe_type(hint)}, got {_kind(value)} {value!r}"


def _size_problem(value: Any) -> str | None:
    """A size below 1, alone or in a list (per stage); None for other types (a float ratio, None: the default)."""
    items = list(value) if isinstance(value, list | tuple) else [value]
    if isinstance(value, list | tuple) and not items:
        return "must list at least one size"
    sizes = [item for item in items if type(item) is int]
    if any(size < 1 for size in sizes):
        return f"must be at least 1, got {value!r}"
    return None


def _label(key: str, value: Any, hint: Any) -> tuple[Any, str | None]:
    """A classifier's labels: 1 to MAX_LABELS classes, id2label's keys class numbers (JSON writes them as strings)."""
    if key == "num_labels":
        if type(value) is not int or not 1 <= value <= MAX_LABELS:
            return value, f"expected a number of classes from 1 to {MAX_LABELS}, got {value!r}"
        return value, None
    if key == "id2label":
        numbered = isinstance(value, dict) and all(_class_number(k) is not None for k in value)
        if not numbered or not all(isinstance(name, str) for name in value.values()):
            return value, f'expected a mapping of class numbers to names ({{"0": "NEGATIVE", ...}}), got {value!r}'
        if not 1 <= len(value) <= MAX_LABELS:
            return value, f"expected 1 to {MAX_LABELS} classes, got {len(value)}"
        return {_class_number(k): name for k, name in value.items()}, None
    return _typed(value, hint, MISSING)


def _class_number(key: Any) -> int | None:
    if type(key) is int:
        return key if key >= 0 else None
    return int(key) if isinstance(key, str) and key.isascii() and key.isdigit() else None


def describe_type(hint: Any) -> str:
    """A type annotation in words: `int | list[int]` -> "int or a list of int"."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is None or hint is type(None):
        return "null"
    if origin in (typing.Union, types.UnionType):
        return " or ".join(dict.fromkeys(describe_type(arg) for arg in args))
    if origin is typing.Literal:
        return "one of " + ", ".join(repr(arg) for arg in args)
    if origin is tuple and args and args[-1] is not Ellipsis:
        return f"a list of {len(args)} ({', '.join(describe_type(arg) for arg in args)})"
    if origin in (list, tuple, set, collections.abc.Sequence):
        return f"a list of {describe_type(args[0])}" if args else "a list"
    if origin is dict or hint is dict:
        return "a mapping"
    return hint.__name__ if isinstance(hint, type) else str(hint)


def _kind(value: Any) -> str:
    return "null" if value is None else type(value).__name__
