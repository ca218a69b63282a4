"""Turn a ModelSpec into an exportable torch module, its reference inputs, and its weights story.

`check_spec`, `load_model` and `example_inputs` go to the builder of the spec's source (spec.py SOURCES); the one
builder today is `HUGGINGFACE`, transformers' Auto classes, below.

The wrappers select the one output a deployment needs inside the graph (the [MASK] logits, or the
last real token's logits), before the LM head, so the board computes and returns [1, vocab] instead of
[1, seq, vocab].
"""

from __future__ import annotations

import copy
import importlib
import importlib.machinery
import importlib.util
import math
import sys
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch

from orchestrator import console
from orchestrator.config import did_you_mean, field_path
from orchestrator.errors import SpecError
from orchestrator.lowering.spec import LOADING_OPTIONS, SOURCES, SPEC_HINT, ModelSpec

# Deciding the weights needs no torch, so it lives in weights.py.
from orchestrator.lowering.weights import RANDOM_SEED, PretrainedUnavailable, WeightsChoice, resolve_weights
from orchestrator.tensorfile import NamedTensor

# The schemas of torchvision's own operators, when its C++ library cannot load; kept alive for the process.
_TORCHVISION_FRAGMENTS: list[Any] = []


def declare_torchvision_ops() -> None:
    """Make an installed torchvision importable even when its C++ operators cannot load against this torch.

    PyPI's torchvision wheel for Linux x86-64 is a CUDA build: next to a CPU-only torch its `_C` library does not
    load, and its import then fails on two operators it registers unconditionally (`nms`, `qnms`). transformers
    imports torchvision whenever it is installed, so that would break every model, not only torchvision's. When the
    library does not load, those two schemas are declared here, with no kernel: no model etlab builds (transformers'
    text models, torchvision's classifiers) calls them. Nothing of torchvision is imported here.
    """
    if "torchvision" in sys.modules or _TORCHVISION_FRAGMENTS:
        return
    found = importlib.util.find_spec("torchvision")
    if found is None or found.submodule_search_locations is None:
        return
    folder = Path(next(iter(found.submodule_search_locations)))
    libraries = [folder / f"_C{suffix}" for suffix in importlib.machinery.EXTENSION_SUFFIXES]
    library = next((path for path in libraries if path.is_file()), None)
    if library is not None:
        try:
            torch.ops.load_library(str(library))  # what torchvision's import does first
            return
        except OSError:
            pass
    fragment = torch.library.Library("torchvision", "FRAGMENT")
    for op in ("nms", "qnms"):
        if not hasattr(torch.ops.torchvision, op):
            fragment.define(f"{op}(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
    _TORCHVISION_FRAGMENTS.append(fragment)


declare_torchvision_ops()


@dataclass
class LoadedModel:
    module: torch.nn.Module
    weights: str  # "pretrained" or "random"
    weights_note: str
    parameters: int


def _logits_at(
    model: torch.nn.Module, position: torch.Tensor, input_ids: torch.Tensor, attention_mask: torch.Tensor
) -> torch.Tensor:
    """The model's logits at `position` only: [1, 1, vocab].

    The base model's last hidden state is cut to that one position before the head runs, so the head (the
    largest matmul, hidden x vocab: a fifth of GPT-2's time) runs on one row instead of seq_len. A forward hook
    on `base_model` does this for any HF head model, whose head reads the base model's first output.
    """

    def keep_position(_module: torch.nn.Module, _args: Any, output: Any) -> Any:
        selected = torch.index_select(output[0], 1, position)
        if isinstance(output, tuple):
            return (selected, *output[1:])
        output["last_hidden_state"] = selected
        return output

    handle = model.base_model.register_forward_hook(keep_position)
    try:
        return model(input_ids=input_ids, attention_mask=attention_mask).logits
    finally:
        handle.remove()


class FillMaskLogits(torch.nn.Module):
    """Masked-LM logits at the first [MASK] position: [1, vocab]."""

    def __init__(self, model: torch.nn.Module, mask_token_id: int) -> None:
        super().__init__()
        self.model = model
        self.mask_token_id = mask_token_id

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        position = (input_ids == self.mask_token_id).to(torch.int32).argmax(dim=1)
        return _logits_at(self.model, position, input_ids, attention_mask)[0]


class LastTokenLogits(torch.nn.Module):
    """Causal-LM logits of the last unmasked token: [1, vocab]."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        last = attention_mask.sum(dim=1) - 1
        return _logits_at(self.model, last, input_ids, attention_mask)[0]


def _auto_class(spec: ModelSpec) -> Any:
    import transformers

    return transformers.AutoModelForMaskedLM if spec.task == "fill-mask" else transformers.AutoModelForCausalLM


# The sizes every config of these families has (through its attribute_map): each must be a positive integer.
_SIZES = ("vocab_size", "hidden_size", "num_attention_heads", "num_hidden_layers", "max_position_embeddings")
_TASK_HEADS = {"fill-mask": "MODEL_FOR_MASKED_LM_MAPPING_NAMES", "causal-lm": "MODEL_FOR_CAUSAL_LM_MAPPING_NAMES"}
_FLOAT_BYTES = 4


@dataclass(frozen=True)
class SpecCheck:
    """What `check_spec` found: the config the model will be built from, and its parameter count."""

    config: Any
    parameters: int


def _fail(problems: list[tuple[str, str]], spec: ModelSpec) -> SpecError:
    """One SpecError with every (field, message), in file order."""
    order = {name: spec.lines.get(name, 0) for name, _ in problems}
    lines = [spec.problem(name, message) for name, message in sorted(problems, key=lambda p: order[p[0]])]
    return SpecError("\n".join(lines), hint=SPEC_HINT)


def _own_fields(config_class: Any) -> dict[str, str]:
    """The fields a spec may set: the class's own architecture fields and their aliases -> the real name.

    Fields every config shares (return_dict, dtype, architectures, ...) decide how a model is loaded or what it
    returns, not what it is, and the wrappers here rely on their defaults.
    """
    from transformers import PreTrainedConfig

    shared = {f.name for f in fields(PreTrainedConfig)}
    own = {f.name: f.name for f in fields(config_class) if f.name not in shared and not f.name.startswith("_")}
    aliases = {alias: real for alias, real in getattr(config_class, "attribute_map", {}).items() if real in own}
    return own | aliases


def _base_config(spec: ModelSpec, pretrained: bool) -> tuple[Any, str]:
    """The config before the spec's overrides (the defaults, or the model folder's), and the field it comes from."""
    from transformers import CONFIG_MAPPING, AutoConfig

    if not pretrained:  # the family's defaults: blamed on `config` if the spec has one, else on the family
        return CONFIG_MAPPING[spec.model_type](), "config" if spec.config or "config" in spec.lines else "model_type"
    if not spec.model_id:
        raise PretrainedUnavailable(f"model {spec.name!r} has no model_id, so it has no pretrained weights")
    try:
        config = AutoConfig.from_pretrained(spec.model_id, trust_remote_code=spec.trust_remote_code)
    except Exception as exc:  # transformers raises OSError, ValueError, HTTP errors...
        raise PretrainedUnavailable(
            spec.problem("model_id", f"cannot load pretrained weights for {spec.model_id!r}: {_brief(exc)}")
        ) from exc
    if config.model_type != spec.model_type:
        raise _fail(
            [("model_type", f"is {spec.model_type!r}, but {spec.model_id} is a {config.model_type!r} model")], spec
        )
    return config, "model_id"


def _brief(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{exc.__class__.__name__}: {text[0][:300] if text else ''}"


def _with_overrides(spec: ModelSpec, base: Any) -> tuple[Any, dict[str, str]]:
    """`base` with the spec's `config` set field by field (each checked by the class); the fields they set -> key.

    Nothing from the spec ever becomes a keyword of `from_pretrained`.
    """
    config = copy.deepcopy(base)
    allowed = _own_fields(type(config))
    problems: list[tuple[str, str]] = []
    given: dict[str, str] = {}
    for key, value in spec.config.items():
        name = field_path("config", key)
        if key in LOADING_OPTIONS or key.startswith("_"):
            problems.append((name, "is a loading option, not a field of the model's config: a spec cannot set it"))
        elif key not in allowed:
            shared = hasattr(base, key) and not callable(getattr(type(base), key, None))
            close = did_you_mean(key, allowed)
            reason = (
                "decides how the model is loaded or what it returns, not part of its architecture"
                if shared
                else f"is not a field of {type(base).__name__}{close}"
            )
            problems.append((name, reason if close else f"{reason}; its fields: {', '.join(sorted(allowed))}"))
        elif isinstance(value, float) and not math.isfinite(value):
            problems.append((name, f"expected a finite number, got {value!r}"))
        else:
            try:
                setattr(config, allowed[key], value)  # by its real name: a strict config checks the type then
            except Exception as exc:  # huggingface_hub's StrictDataclassFieldValidationError, or a setter's
                cause = exc.__cause__ or exc
                problems.append((name, str(cause).splitlines()[-1].strip() or exc.__class__.__name__))
            else:
                given[allowed[key]] = name
    if problems:
        raise _fail(problems, spec)
    return config, given


def _field_of(config: Any, attribute: str, given: dict[str, str], origin: str) -> str:
    """The spec field that set a standard attribute (`hidden_size` is DistilBERT's `dim`), else where it came from."""
    real = getattr(type(config), "attribute_map", {}).get(attribute, attribute)
    return given.get(real, origin)


def _parameters(spec: ModelSpec, config: Any) -> int:
    """The parameter count, from the model built on the meta device (no memory); two layers stand for all of them."""

    def count(layers: int | None) -> int:
        probe = copy.deepcopy(config)
        if layers is not None:
            probe.num_hidden_layers = layers
        with torch.device("meta"):
            model = _auto_class(spec).from_config(probe, trust_remote_code=spec.trust_remote_code)
        return sum(p.numel() for p in model.parameters())

    layers = getattr(config, "num_hidden_layers", None)
    if not isinstance(layers, int) or layers <= 2:
        return count(None)
    one, two = count(1), count(2)
    return one + (layers - 1) * (two - one)


class ModelBuilder(Protocol):
    """What a model source's builder does (spec.py `Source.builder` names one)."""

    def check(self, spec: ModelSpec, choice: WeightsChoice, available: int | None) -> SpecCheck: ...
    def load(self, spec: ModelSpec, choice: WeightsChoice) -> LoadedModel: ...
    def example_inputs(self, spec: ModelSpec, module: torch.nn.Module) -> list[NamedTensor]: ...


def builder(source: str) -> ModelBuilder:
    """The builder of model source `source`, its module imported now."""
    if source not in SOURCES:
        raise SpecError(f"unknown model source {source!r}; known: {', '.join(SOURCES)}", hint=SPEC_HINT)
    module, _, name = SOURCES[source].builder.partition(":")
    found: ModelBuilder = getattr(importlib.import_module(module), name)
    return found


def check_spec(spec: ModelSpec, weights: str | WeightsChoice = "random", *, available: int | None = None) -> SpecCheck:
    """What would only fail after loading, refused as SpecError by the spec's source before anything loads."""
    choice = weights if isinstance(weights, WeightsChoice) else resolve_weights(spec, weights)
    return builder(spec.model_source).check(spec, choice, available)


def load_model(spec: ModelSpec, weights: str | WeightsChoice) -> LoadedModel:
    """The wrapped module with the weights `weights` asks for (a mode, or a choice already resolved)."""
    choice = weights if isinstance(weights, WeightsChoice) else resolve_weights(spec, weights)
    return builder(spec.model_source).load(spec, choice)


def example_inputs(spec: ModelSpec, module: torch.nn.Module) -> list[NamedTensor]:
    """The deterministic reference inputs of the model `load_model` built."""
    return builder(spec.model_source).example_inputs(spec, module)


def _check_huggingface(spec: ModelSpec, choice: WeightsChoice, available: int | None) -> SpecCheck:
    """Build the spec's config (no weights) and refuse, as SpecError, what would only fail after loading.

    The task must have a head for the model type; the config's fields must be the class's own, of the right type;
    the sizes positive, the hidden size a multiple of the heads; `seq_len` within the position embeddings; the
    [MASK] id in the vocabulary; and the float32 weights must fit in `available` bytes (MemAvailable).
    """
    from transformers.models.auto import modeling_auto

    heads = getattr(modeling_auto, _TASK_HEADS[spec.task])
    if spec.model_type not in heads:
        able = [task for task, mapping in _TASK_HEADS.items() if spec.model_type in getattr(modeling_auto, mapping)]
        raise _fail([("task", f"{spec.task!r} does not go with model_type {spec.model_type!r}, which has a head for "
                              f"{', '.join(able) or 'no task here'} only")], spec)  # fmt: skip
    base, origin = _base_config(spec, choice.mode == "pretrained")
    config, given = _with_overrides(spec, base)

    problems: list[tuple[str, str]] = []
    for attribute in _SIZES:
        value = getattr(config, attribute, None)
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
            problems.append((_field_of(config, attribute, given, origin), f"must be at least 1, got {value!r}"))
    if problems:
        raise _fail(problems, spec)
    hidden, heads_count = getattr(config, "hidden_size", None), getattr(config, "num_attention_heads", None)
    if isinstance(hidden, int) and isinstance(heads_count, int) and hidden % heads_count:
        divisible = f"the hidden size {hidden} is not divisible by the {heads_count} attention heads"
        heads_field = _field_of(config, "num_attention_heads", given, origin)
        problems.append((_field_of(config, "hidden_size", given, heads_field), divisible))
    positions = getattr(config, "max_position_embeddings", None)
    if isinstance(positions, int) and spec.seq_len > positions:
        problems.append(("seq_len", f"{spec.seq_len} is beyond the model's {positions} position embeddings"))
    vocab = getattr(config, "vocab_size", None) or 1
    if spec.task == "fill-mask" and spec.mask_token_id is not None and spec.mask_token_id >= vocab:
        problems.append(("mask_token_id", f"{spec.mask_token_id} is outside the vocabulary (0..{vocab - 1})"))
    for real, name in given.items():
        value = getattr(config, real)
        if real.endswith("_token_id") and isinstance(value, int) and not 0 <= value < vocab:
            problems.append((name, f"{value} is outside the vocabulary (0..{vocab - 1})"))
    if problems:
        raise _fail(problems, spec)

    # A bound without building anything: the token embeddings and 4 hidden x hidden projections per layer.
    width = hidden if isinstance(hidden, int) else 1
    layers = getattr(config, "num_hidden_layers", None) or 1
    terms = {"vocab_size": vocab * width, "num_hidden_layers": 4 * layers * width * width}
    if available is not None and _FLOAT_BYTES * sum(terms.values()) > available:
        largest = max(terms, key=lambda key: terms[key])
        field_name = _field_of(config, largest, given, "")
        field_name = field_name or _field_of(config, "hidden_size", given, origin)
        raise _fail([(field_name, _too_large(sum(terms.values()), available, "at least "))], spec)
    try:
        if callable(getattr(config, "validate", None)):
            config.validate()  # the class's own cross-field checks (strict configs)
        parameters = _parameters(spec, config)
    except Exception as exc:  # anything the modelling code refuses: the config cannot make a model
        raise _fail([(origin, f"the model cannot be built from this config: {_brief(exc)}")], spec) from exc
    if available is not None and _FLOAT_BYTES * parameters > available:
        raise _fail([(origin, _too_large(parameters, available, ""))], spec)
    return SpecCheck(config, parameters)


def _too_large(parameters: int, available: int, bound: str) -> str:
    weights = _FLOAT_BYTES * parameters / 2**30
    return (
        f"the model has {bound}{parameters / 1e6:.1f}M parameters ({weights:.2f} GiB of float32 weights), more than "
        f"the {available / 2**30:.2f} GiB of available memory"
    )


def _config(spec: ModelSpec) -> Any:
    """The default config of the model type with the spec's overrides."""
    config, _ = _with_overrides(spec, _base_config(spec, pretrained=False)[0])
    return config


def build_random(spec: ModelSpec) -> torch.nn.Module:
    """The architecture from its config with seeded random weights: no hub needed."""
    torch.manual_seed(RANDOM_SEED)
    model = _auto_class(spec).from_config(_config(spec))
    return model.eval()


def build_pretrained(spec: ModelSpec) -> torch.nn.Module:
    """`from_pretrained` from the HF cache, a local folder, or the hub.

    The spec's overrides are set on the config object; the keywords are ours alone, so a spec can never switch on
    remote code or unpickling. The folder's own Python runs only with `--trust-remote-code` on the command line.
    """
    config, _ = _with_overrides(spec, _base_config(spec, pretrained=True)[0])
    model = _auto_class(spec).from_pretrained(spec.model_id, config=config, trust_remote_code=spec.trust_remote_code)
    return model.eval()


def _load_huggingface(spec: ModelSpec, choice: WeightsChoice) -> LoadedModel:
    """The wrapped module with the weights `choice` resolved to."""
    if choice.mode == "pretrained":
        try:
            module = build_pretrained(spec)
        except SpecError:
            raise
        except Exception as exc:  # transformers raises OSError, ValueError, HTTP errors...
            raise PretrainedUnavailable(
                f"cannot load pretrained weights for {spec.model_id!r}: {exc.__class__.__name__}: {str(exc)[:300]}"
            ) from exc
        return _wrap(spec, module, "pretrained", f"from_pretrained({spec.model_id!r})")
    if choice.fallback:
        console.loud_warning(
            f"pretrained weights for {spec.model_id!r} are unavailable ({choice.reason}).\n"
            f"Falling back to RANDOM weights (seed {RANDOM_SEED}): timings are representative, outputs are not."
        )
    note = f"random (seed {RANDOM_SEED})"
    if choice.requested == "auto":
        note += f"; pretrained unavailable: {choice.reason}"
    return _wrap(spec, build_random(spec), "random", note)


def delegable(model: torch.nn.Module) -> torch.nn.Module:
    """The same function, written so XNNPACK can take all of it; in place.

    - Eager attention: the SDPA decomposition leaves per-layer boolean-mask ops (where, eq, any, logical_not)
      in portable kernels; eager attention adds one float mask inside the delegate.
    - `gelu_new` becomes `gelu_pytorch_tanh`, the same tanh approximation: XNNPACK takes GELU but not `pow(x, 3)`,
      which cost GPT-2 a portable `pow` per block (36 ms of 255 here).
    """
    from transformers.activations import NewGELUActivation, get_activation

    model.set_attn_implementation("eager")
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, NewGELUActivation):
                setattr(parent, name, get_activation("gelu_pytorch_tanh"))
    return model


def _wrap(spec: ModelSpec, model: torch.nn.Module, weights: str, note: str) -> LoadedModel:
    model = delegable(model)
    if spec.task == "fill-mask":
        assert spec.mask_token_id is not None
        wrapped: torch.nn.Module = FillMaskLogits(model, spec.mask_token_id)
    else:
        wrapped = LastTokenLogits(model)
    parameters = sum(p.numel() for p in model.parameters())
    return LoadedModel(wrapped.eval(), weights, note, parameters)


def reference_inputs(spec: ModelSpec, vocab_size: int) -> list[NamedTensor]:
    """Deterministic inputs: a padded sequence (3/4 real tokens) with a [MASK] for fill-mask models."""
    rng = np.random.default_rng(RANDOM_SEED)
    seq_len = spec.seq_len
    real = max(1, (seq_len * 3) // 4)
    low = min(1000, vocab_size // 2)
    input_ids = np.zeros((1, seq_len), dtype=np.int64)
    input_ids[0, :real] = rng.integers(low, vocab_size, size=real)
    if spec.task == "fill-mask":
        assert spec.mask_token_id is not None
        input_ids[0, min(real - 1, max(1, real // 3))] = spec.mask_token_id
    attention_mask = np.zeros((1, seq_len), dtype=np.int64)
    attention_mask[0, :real] = 1
    return [NamedTensor("input_ids", input_ids), NamedTensor("attention_mask", attention_mask)]


def vocab_size_of(module: torch.nn.Module) -> int:
    inner = getattr(module, "model", module)
    return int(inner.config.vocab_size)


class HuggingFace:
    """The `huggingface` source: transformers' Auto classes for the task, from a config or `from_pretrained`."""

    def check(self, spec: ModelSpec, choice: WeightsChoice, available: int | None) -> SpecCheck:
        return _check_huggingface(spec, choice, available)

    def load(self, spec: ModelSpec, choice: WeightsChoice) -> LoadedModel:
        return _load_huggingface(spec, choice)

    def example_inputs(self, spec: ModelSpec, module: torch.nn.Module) -> list[NamedTensor]:
        return reference_inputs(spec, vocab_size_of(module))


HUGGINGFACE = HuggingFace()
