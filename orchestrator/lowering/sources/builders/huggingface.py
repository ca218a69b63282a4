"""The `huggingface` model source: any family transformers knows, with the head of the spec's task.

The head comes from transformers' own task mappings (huggingface_heads.py): a family and a task that do not go
together are refused before anything loads, naming the tasks the family has. The inputs
follow the head class's main input (`main_input_name`): token ids with their mask (and `token_type_ids` where the
family has segment embeddings), `pixel_values`, `input_values` (a waveform, or AST's log-mel filter bank
[batch, frames, mel bins]: the config's sizes decide), or Whisper's log-mel `input_features` [batch, mel bins, frames]
(a family whose input_features are laid out otherwise has no head etlab lowers).

What the program outputs:
the model as its user would export it, no rewrite: the head's first output as a plain tensor (for fill-mask and
causal-lm the logits the spec's `output` names: every position's [B, seq_len, vocab], or one position's [B, vocab],
selected after the head as a user's own code would; the last hidden state for feature-extraction and
speech-encoder; Whisper's encoder alone). etlab's rewrites (rewrites/: the head at one position, eager attention,
tanh GELU) apply only when asked (`--rewrites`).

Reference inputs are deterministic and valid for the model (huggingface_inputs.py): ids inside the vocabulary with a
[MASK] where fill-mask needs one, images and audio in the range their preprocessors produce.
"""

from __future__ import annotations

import contextlib
import copy
import inspect
import logging
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import torch

from orchestrator import console
from orchestrator.errors import SpecError
from orchestrator.lowering.attention.choice import ETLAB, SDPA, attention_of, sliding_window_problem
from orchestrator.lowering.quantize.calibration import shaped_like
from orchestrator.lowering.sources.builders.huggingface_config import Overrides, check_derived, read_overrides
from orchestrator.lowering.sources.builders.huggingface_heads import (
    AUTO_BUILT,
    MAIN_INPUTS,
    TASK_HEADS,
    check_family,
    head_class,
    main_input,
    spectrogram,
)
from orchestrator.lowering.sources.builders.huggingface_inputs import reference_inputs
from orchestrator.lowering.sources.builders.models import AUDIO, LoadedModel, SourceBuilder, SpecCheck
from orchestrator.lowering.sources.builders.torchvision import declare_torchvision_ops, generated_images
from orchestrator.lowering.sources.huggingface import HuggingFaceOptions
from orchestrator.lowering.spec import (
    ALL_POSITIONS,
    AUDIO_SAMPLES,
    IMAGE_INPUT,
    INPUT_NAMES,
    WRAPPED_TASKS,
    InputSpec,
    ModelSpec,
)
from orchestrator.lowering.spec_errors import FLOAT_BYTES, brief, spec_failure, too_large
from orchestrator.lowering.weights import RANDOM_SEED, PretrainedUnavailable, WeightsChoice
from orchestrator.tensorfile import NamedTensor

declare_torchvision_ops()  # transformers imports torchvision whenever it is installed

# The sizes most configs have (through their attribute_map): each must be a positive integer.
_SIZES = ("vocab_size", "hidden_size", "num_attention_heads", "num_hidden_layers", "max_position_embeddings")


# ---------------------------------------------------------------------------------------------------------------
# The config: the family's defaults or the model folder's, with the spec's overrides


def _base_config(spec: ModelSpec, pretrained: bool) -> tuple[Any, str]:
    """The config before the spec's overrides (the defaults, or the model folder's), and the field it comes from."""
    from transformers import CONFIG_MAPPING, AutoConfig

    options = spec.options_of(HuggingFaceOptions)
    if not pretrained:  # the family's defaults: blamed on `config` if the spec has one, else on the family
        return CONFIG_MAPPING[spec.model_type](), "config" if options.config or "config" in spec.lines else "model_type"
    if not options.model_id:
        raise PretrainedUnavailable(f"model {spec.name!r} has no model_id, so it has no pretrained weights")
    try:
        config = AutoConfig.from_pretrained(options.model_id, trust_remote_code=options.trust_remote_code)
    except Exception as exc:  # transformers raises OSError, ValueError, HTTP errors...
        raise PretrainedUnavailable(
            spec.problem("model_id", f"cannot load pretrained weights for {options.model_id!r}: {brief(exc)}")
        ) from exc
    if config.model_type != spec.model_type:
        raise spec_failure(
            [("model_type", f"is {spec.model_type!r}, but {options.model_id} is a {config.model_type!r} model")], spec
        )
    return config, "model_id"


def _with_overrides(spec: ModelSpec, base: Any, defaults: bool) -> tuple[Any, Overrides]:
    """`base` with the spec's `config` (huggingface_config.py sorts and types it), and what was set and said.
    `defaults`: `base` is the family's default config, built again through its class from the overrides as
    transformers builds one from a config.json (derived fields follow, legacy keys are converted); otherwise they
    are set on the model folder's config.

    Nothing from the spec ever becomes a keyword of `from_pretrained`.
    """
    overrides, problems = read_overrides(spec, type(base), rebuilt=defaults)
    with _vocabulary_shrunk(overrides):
        return _overridden(spec, base, overrides, problems, defaults)


class _TokenIdsOutsideVocabulary(logging.Filter):
    """transformers' "bos_token_id must be `None` or an integer within the vocabulary": said of a spec's own smaller
    vocabulary (a tiny config keeps its family's special token ids), never of anything the user's code does."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "integer within the vocabulary" not in record.getMessage()


@contextlib.contextmanager
def _vocabulary_shrunk(overrides: Overrides) -> Iterator[None]:
    """While a config whose vocabulary the spec sets is built: transformers' logger of configs without the warning
    that the family's special token ids are outside it (only there, only then: the user's own code keeps it)."""
    if "vocab_size" not in overrides.fields and "vocab_size" not in overrides.applied:
        yield
        return
    logger, quiet = logging.getLogger("transformers.configuration_utils"), _TokenIdsOutsideVocabulary()
    logger.addFilter(quiet)
    try:
        yield
    finally:
        logger.removeFilter(quiet)


def _overridden(
    spec: ModelSpec, base: Any, overrides: Overrides, problems: list[tuple[str, str]], defaults: bool
) -> tuple[Any, Overrides]:
    config = copy.deepcopy(base)
    for real, value in overrides.fields.items():
        try:
            setattr(config, real, value)  # a strict config runs its field's own validators (ranges) now
        except Exception as exc:  # huggingface_hub's StrictDataclassFieldValidationError, or a setter's
            cause = exc.__cause__ or exc
            problems.append((overrides.given[real], str(cause).splitlines()[-1].strip() or exc.__class__.__name__))
    if problems:
        raise spec_failure(problems, spec)
    try:
        if defaults and overrides.applied:
            config = type(base)(**overrides.applied)
        else:
            for key, value in {**overrides.labels, **overrides.extras}.items():
                setattr(config, key, value)
    except Exception as exc:  # the class's own checks across fields
        raise spec_failure([("config", f"the config class refuses these values: {brief(exc)}")], spec) from exc
    check_derived(spec, config, overrides)
    return config, overrides


def _field_of(config: Any, attribute: str, given: dict[str, str], origin: str) -> str:
    """The spec field that set a standard attribute (`hidden_size` is DistilBERT's `dim`), else where it came from."""
    real = getattr(type(config), "attribute_map", {}).get(attribute, attribute)
    return given.get(real, origin)


def _config(spec: ModelSpec) -> Any:
    """The default config of the model type with the spec's overrides."""
    config, _ = _with_overrides(spec, _base_config(spec, pretrained=False)[0], defaults=True)
    return config


# ---------------------------------------------------------------------------------------------------------------
# The inputs: the family's, with defaults per kind; declared ones checked against the config


def _token_positions(config: Any) -> int | None:
    """How many token positions the model embeds: its max_position_embeddings, or an encoder-decoder's decoder's
    (Whisper: max_target_positions), which reads the token ids."""
    for attribute in ("max_position_embeddings", "max_target_positions"):
        value = getattr(config, attribute, None)
        if isinstance(value, int):
            return value
    return None


def model_inputs(spec: ModelSpec, config: Any, head: tuple[Any, bool]) -> tuple[InputSpec, ...]:
    """The inputs the program takes, in order: the spec's declared ones, or the defaults of the head's input kind."""
    cls, encoder_only = head
    main = main_input(cls, encoder_only)
    batch = spec.batch_size
    if spec.declared_inputs or spec.generates:
        return spec.inputs
    if main == "input_ids":
        names = list(INPUT_NAMES)
        forward = inspect.signature(cls.forward).parameters
        segments = getattr(config, "type_vocab_size", None)
        if spec.task not in WRAPPED_TASKS and "token_type_ids" in forward and isinstance(segments, int):
            names.append("token_type_ids")  # segment embeddings: BERT's kind; zeros are its default
        return tuple(InputSpec(name, "int64", (batch, spec.seq_len)) for name in names)
    if main == IMAGE_INPUT:
        side = spec.options_of(HuggingFaceOptions).image_size or _image_side(config)
        return (InputSpec(IMAGE_INPUT, "float32", (batch, getattr(config, "num_channels", 3), side, side)),)
    if main == "input_values" and spectrogram(config):
        return (InputSpec("input_values", "float32", (batch, config.max_length, config.num_mel_bins)),)
    if main == "input_values":
        return (InputSpec("input_values", "float32", (batch, AUDIO_SAMPLES)),)
    return (InputSpec("input_features", "float32", (batch, config.num_mel_bins, 2 * config.max_source_positions)),)


def _image_side(config: Any) -> int:
    size = getattr(config, "image_size", 224)
    return int(size[0] if isinstance(size, list | tuple) else size)


def _input_problems(spec: ModelSpec, config: Any, head: tuple[Any, bool]) -> list[tuple[str, str]]:
    """Declared inputs the family does not take, or whose sizes its config refuses."""
    cls, encoder_only = head
    main = main_input(cls, encoder_only)
    takes = MAIN_INPUTS[main]
    if main == "input_ids" and spec.task not in WRAPPED_TASKS:
        defaults = {item.name for item in model_inputs(replace(spec, declared_inputs=()), config, head)}
        takes = tuple(name for name in takes if name in defaults)
    problems = []
    for index, item in enumerate(spec.declared_inputs):
        where = f"inputs[{index}]"
        if item.name not in takes:
            problems.append((f"{where}.name", f"{item.name!r} is not an input of {cls.__name__}; it takes "
                                              f"{', '.join(takes)}"))  # fmt: skip
        elif item.name == IMAGE_INPUT and item.shape[1] != getattr(config, "num_channels", 3):
            channels = f"the config has {config.num_channels} image channels, not {item.shape[1]}"
            problems.append((f"{where}.shape", channels))
        elif item.name == "input_features":
            expected = [config.num_mel_bins, 2 * config.max_source_positions]
            if list(item.shape[1:]) != expected:
                takes_shape = f"[batch_size, {expected[0]}, {expected[1]}] (num_mel_bins, 2 x max_source_positions)"
                problems.append((f"{where}.shape", f"the config takes {takes_shape}, got {list(item.shape)}"))
        elif item.name == "input_values" and spectrogram(config):
            expected = [config.max_length, config.num_mel_bins]
            if list(item.shape[1:]) != expected:
                takes_shape = f"[batch_size, {expected[0]}, {expected[1]}] (max_length frames, num_mel_bins)"
                problems.append((f"{where}.shape", f"the config takes {takes_shape}, got {list(item.shape)}"))
        elif item.name == "input_values" and len(item.shape) != 2:
            problems.append((f"{where}.shape", f"{cls.__name__} takes a waveform, [batch_size, samples], got "
                                               f"{list(item.shape)}"))  # fmt: skip
        elif item.name == "input_values" and item.shape[1] < 400:
            problems.append((f"{where}.shape", f"{item.shape[1]} samples are fewer than the 400 of one frame"))
    if spec.declared_inputs and main not in {item.name for item in spec.declared_inputs} and not problems:
        problems.append(("inputs", f"{cls.__name__} needs {main}"))
    return problems


def _run_on_meta(spec: ModelSpec, config: Any, head: tuple[Any, bool]) -> None:
    """Run the task's module on the meta device (shapes only, no memory) with the inputs' shapes: refuses what only
    fails when it runs (an image of another size than ViT's position embeddings, too little audio). A model whose
    forward reads values (`.item()`) cannot run there; it is left to the lowering."""
    inputs = model_inputs(spec, config, head)
    try:
        with torch.device("meta"):
            module = FirstOutput(_from_config(spec, config, head), tuple(item.name for item in inputs))
            module(*(torch.zeros(item.shape, dtype=getattr(torch, item.dtype)) for item in inputs))
    except Exception as exc:
        if "meta" in str(exc) or isinstance(exc, NotImplementedError):  # the meta device, not the spec
            return
        sized = spec.options_of(HuggingFaceOptions).image_size is not None
        where = "inputs" if spec.declared_inputs else "image_size" if sized else "task"
        shapes = ", ".join(f"{item.name} {list(item.shape)}" for item in inputs)
        raise spec_failure([(where, f"the model cannot run on {shapes}: {brief(exc)}")], spec) from exc


# ---------------------------------------------------------------------------------------------------------------
# The checks before anything loads


def _check_huggingface(spec: ModelSpec, choice: WeightsChoice, available: int | None) -> SpecCheck:
    """Build the spec's config (no weights) and refuse, as SpecError, what would only fail after loading.

    The family must be one transformers knows, with a head for the task; the config's keys are sorted and typed
    against its class (huggingface_config.py: a field of the type transformers annotates, a record, labels, or a
    key kept with a warning); the sizes positive (each per stage), the hidden size a multiple of the heads;
    `seq_len` within the position embeddings; the [MASK] id in the vocabulary; declared inputs the family's; and the
    float32 weights must fit in `available` bytes (MemAvailable).
    """
    head = check_family(spec)
    base, origin = _base_config(spec, choice.mode == "pretrained")
    config, overrides = _with_overrides(spec, base, choice.mode != "pretrained")
    given = overrides.given

    problems: list[tuple[str, str]] = []
    for attribute in _SIZES:  # a scalar, or one per stage (Swin's heads, SegFormer's): the class's type decides
        value = getattr(config, attribute, None)
        if value is not None and not _sizes(value):
            problems.append((_field_of(config, attribute, given, origin), f"must be at least 1, got {value!r}"))
    if problems:
        raise spec_failure(problems, spec)
    hidden, heads_count = getattr(config, "hidden_size", None), getattr(config, "num_attention_heads", None)
    if isinstance(hidden, int) and isinstance(heads_count, int) and hidden % heads_count:
        divisible = f"the hidden size {hidden} is not divisible by the {heads_count} attention heads"
        heads_field = _field_of(config, "num_attention_heads", given, origin)
        problems.append((_field_of(config, "hidden_size", given, heads_field), divisible))
    inputs = model_inputs(spec, config, head)
    positions = _token_positions(config)
    if isinstance(positions, int) and inputs[0].name == "input_ids" and spec.seq_len > positions:
        problems.append(("seq_len", f"{spec.seq_len} is beyond the model's {positions} position embeddings"))
    if spec.generates and isinstance(positions, int) and spec.cache_capacity > positions:
        where = "context" if "context" in spec.lines or spec.context else "task"
        problems.append((where, f"a KV cache of {spec.cache_capacity} positions is beyond the model's {positions} "
                                "position embeddings"))  # fmt: skip
    window = sliding_window_problem(config, spec.cache_capacity) if attention_of(spec) == ETLAB else None
    if window is not None:
        problems.append(("attention" if "attention" in spec.lines else "task", window))
    vocab = getattr(config, "vocab_size", None) or 1
    mask_token_id = spec.options_of(HuggingFaceOptions).mask_token_id
    if spec.task == "fill-mask" and mask_token_id is not None and mask_token_id >= vocab:
        problems.append(("mask_token_id", f"{mask_token_id} is outside the vocabulary (0..{vocab - 1})"))
    for real, name in given.items():
        value = getattr(config, real)
        if real.endswith("_token_id") and isinstance(value, int) and not 0 <= value < vocab:
            problems.append((name, f"{value} is outside the vocabulary (0..{vocab - 1})"))
    problems += _input_problems(spec, config, head)
    if spec.batch_size > 1 and getattr(config, "pad_token_id", None) is None and _reads_last_token(head[0]):
        problems.append(("batch_size", f"{head[0].__name__} finds each row's last token by its padding, so a batch "
                                       "needs config.pad_token_id"))  # fmt: skip
    if problems:
        raise spec_failure(problems, spec)

    # A bound without building anything: the token embeddings and 4 hidden x hidden projections per layer.
    width = hidden if isinstance(hidden, int) else 1
    layers = getattr(config, "num_hidden_layers", None) or 1
    terms = {"vocab_size": vocab * width, "num_hidden_layers": 4 * layers * width * width}
    if available is not None and FLOAT_BYTES * sum(terms.values()) > available:
        largest = max(terms, key=lambda key: terms[key])
        field_name = _field_of(config, largest, given, "")
        field_name = field_name or _field_of(config, "hidden_size", given, origin)
        raise spec_failure([(field_name, too_large(sum(terms.values()), available, "at least "))], spec)
    try:
        if callable(getattr(config, "validate", None)):
            config.validate()  # the class's own cross-field checks (strict configs)
        parameters = _parameters(spec, config, head)
    except Exception as exc:  # anything the modelling code refuses: the config cannot make a model
        raise spec_failure([(origin, f"the model cannot be built from this config: {brief(exc)}")], spec) from exc
    if available is not None and FLOAT_BYTES * parameters > available:
        raise spec_failure([(origin, too_large(parameters, available, ""))], spec)
    if spec.task not in AUTO_BUILT:
        _run_on_meta(spec, config, head)
    return SpecCheck(config, parameters, tuple(overrides.warnings))


def _sizes(value: Any) -> bool:
    """A size of at least 1, or a non-empty list of them (one per stage)."""
    items = list(value) if isinstance(value, list | tuple) else [value]
    return bool(items) and all(type(item) is int and item >= 1 for item in items)


def _reads_last_token(cls: Any) -> bool:
    """A decoder's sequence classifier: it classifies each row's last token that is not padding."""
    from transformers.modeling_layers import GenericForSequenceClassification

    return isinstance(cls, type) and issubclass(cls, GenericForSequenceClassification)


def _parameters(spec: ModelSpec, config: Any, head: tuple[Any, bool]) -> int:
    """The parameter count, from the model built on the meta device (no memory); two layers stand for all of them."""

    def count(layers: int | None) -> int:
        probe = copy.deepcopy(config)
        if layers is not None:
            probe.num_hidden_layers = layers
        with torch.device("meta"):
            model = _from_config(spec, probe, head)
        return sum(p.numel() for p in model.parameters())

    layers = getattr(config, "num_hidden_layers", None)
    if not isinstance(layers, int) or layers <= 2:
        return count(None)
    one, two = count(1), count(2)
    return one + (layers - 1) * (two - one)


# ---------------------------------------------------------------------------------------------------------------
# Building the module


def _auto_class(spec: ModelSpec) -> Any:
    import transformers

    return getattr(transformers, TASK_HEADS[spec.task][1])


def _from_config(spec: ModelSpec, config: Any, head: tuple[Any, bool]) -> torch.nn.Module:
    """The task's module with fresh weights: the Auto class's, a T5EncoderModel, or a speech model's encoder."""
    cls, encoder_only = head
    if spec.task in AUTO_BUILT:
        remote_code = spec.options_of(HuggingFaceOptions).trust_remote_code
        model = _auto_class(spec).from_config(config, trust_remote_code=remote_code)
    else:
        model = cls._from_config(config)
    return model.get_encoder() if encoder_only else model


def build_random(spec: ModelSpec) -> torch.nn.Module:
    """The architecture from its config with seeded random weights: no hub needed."""
    head = check_family(spec)
    torch.manual_seed(RANDOM_SEED)
    return _from_config(spec, _config(spec), head).eval()


def build_pretrained(spec: ModelSpec) -> torch.nn.Module:
    """`from_pretrained` from the HF cache, a local folder, or the hub.

    The spec's overrides are set on the config object; the keywords are ours alone, so a spec can never switch on
    remote code or unpickling. The folder's own Python runs only with `--trust-remote-code` on the command line.
    """
    cls, encoder_only = check_family(spec)
    config, _ = _with_overrides(spec, _base_config(spec, pretrained=True)[0], defaults=False)
    loader = _auto_class(spec) if spec.task in AUTO_BUILT or not cls.__name__.endswith("EncoderModel") else cls
    options = spec.options_of(HuggingFaceOptions)
    model = loader.from_pretrained(options.model_id, config=config, trust_remote_code=options.trust_remote_code)
    return (model.get_encoder() if encoder_only else model).eval()


def _load_huggingface(spec: ModelSpec, choice: WeightsChoice) -> LoadedModel:
    """The wrapped module with the weights `choice` resolved to."""
    model_id = spec.options_of(HuggingFaceOptions).model_id
    if choice.mode == "pretrained":
        try:
            module = build_pretrained(spec)
        except SpecError:
            raise
        except Exception as exc:  # transformers raises OSError, ValueError, HTTP errors...
            raise PretrainedUnavailable(
                f"cannot load pretrained weights for {model_id!r}: {exc.__class__.__name__}: {str(exc)[:300]}"
            ) from exc
        return _wrap(spec, module, "pretrained", f"from_pretrained({model_id!r})")
    if choice.fallback:
        console.loud_warning(
            f"pretrained weights for {model_id!r} are unavailable ({choice.reason}).\n"
            f"Falling back to RANDOM weights (seed {RANDOM_SEED}): timings are representative, outputs are not."
        )
    note = f"random (seed {RANDOM_SEED})"
    if choice.requested == "auto":
        note += f"; pretrained unavailable: {choice.reason}"
    return _wrap(spec, build_random(spec), "random", note)


# ---------------------------------------------------------------------------------------------------------------
# What the program computes


class FirstOutput(torch.nn.Module):
    """The model as its user would export it: its inputs by name, its first output (logits, or the last hidden
    state) as a plain tensor."""

    def __init__(self, model: torch.nn.Module, input_names: tuple[str, ...]) -> None:
        super().__init__()
        self.model = model
        self.input_names = input_names

    def forward(self, *inputs: torch.Tensor) -> torch.Tensor:
        output = self.model(**dict(zip(self.input_names, inputs, strict=True)), return_dict=False)
        return output[0]


class PositionLogits(torch.nn.Module):
    """The logits of one position per row, [B, vocab], selected from every position's as a user's own code would
    (the head runs on every position): the final one (`output: last`), or the first [MASK] in input_ids, found in
    the graph (`output: mask`; the first position when a row has none)."""

    def __init__(self, model: torch.nn.Module, input_names: tuple[str, ...], mask_token_id: int | None) -> None:
        super().__init__()
        self.model = model
        self.input_names = input_names
        self.mask_token_id = mask_token_id

    def forward(self, *inputs: torch.Tensor) -> torch.Tensor:
        by_name = dict(zip(self.input_names, inputs, strict=True))
        logits = self.model(**by_name, return_dict=False)[0]
        position = self.position(by_name)
        if position is None:
            return logits[:, -1]
        return logits[torch.arange(logits.shape[0]), position]

    def position(self, by_name: dict[str, torch.Tensor]) -> torch.Tensor | None:
        """Each row's first [MASK] in input_ids (None: the final position, the same for every row)."""
        if self.mask_token_id is None:
            return None
        return (by_name["input_ids"] == self.mask_token_id).to(torch.int32).argmax(dim=1)  # argmax takes no bool


def _wrap(spec: ModelSpec, model: torch.nn.Module, weights: str, note: str) -> LoadedModel:
    """The model as its user would export it: its first output; for fill-mask and causal-lm the logits the spec's
    `output` names (etlab's rewrites, rewrites/, apply only when asked)."""
    head = check_family(spec)
    parameters = sum(p.numel() for p in model.parameters())
    if spec.generates:  # prefill and decode with a KV cache inside (generation.py)
        from transformers import PreTrainedModel

        from orchestrator.lowering.export.generation import GenerationModule

        assert isinstance(model, PreTrainedModel)  # a causal LM, never an encoder taken out of one
        last_only = spec.output != ALL_POSITIONS
        module = GenerationModule(model, spec.cache_capacity, attention_of(spec) or SDPA, last_only)
        return LoadedModel(module.eval(), weights, note, parameters)
    names = tuple(item.name for item in model_inputs(spec, model.config, head))
    if spec.task in WRAPPED_TASKS and spec.output != ALL_POSITIONS:
        mask = spec.options_of(HuggingFaceOptions).mask_token_id if spec.output == "mask" else None
        return LoadedModel(PositionLogits(model, names, mask).eval(), weights, note, parameters)
    return LoadedModel(FirstOutput(model, names).eval(), weights, note, parameters)


# ---------------------------------------------------------------------------------------------------------------
# Calibration samples, and the builder


def vocab_size_of(module: torch.nn.Module) -> int:
    inner: Any = getattr(module, "model", module)  # a HuggingFace model: its config's fields differ per family
    return int(inner.config.vocab_size)


def calibration_inputs(spec: ModelSpec, module: torch.nn.Module, samples: int) -> list[tuple[torch.Tensor, ...]]:
    """Calibration samples (int8-static) for a model of float inputs (audio): the reference inputs, then inputs made
    the same way from other seeds."""
    model: Any = module.model  # the HuggingFace model FirstOutput wraps
    config = model.config
    inputs = model_inputs(spec, config, check_family(spec))
    made = [reference_inputs(spec, 1, inputs, seed=RANDOM_SEED + sample) for sample in range(samples)]
    return [tuple(torch.from_numpy(tensor.array) for tensor in tensors) for tensors in made]


class HuggingFace(SourceBuilder):
    """The `huggingface` source: transformers' head for the task, from a config or `from_pretrained`."""

    def known_inputs(self, spec: ModelSpec, config: Any) -> tuple[InputSpec, ...]:
        if spec.declared_inputs:
            return spec.declared_inputs
        head = head_class(spec.model_type, spec.task)  # the family adds its own inputs
        return model_inputs(spec, config, head) if head is not None else spec.inputs

    def calibration(
        self, spec: ModelSpec, module: torch.nn.Module, example_args: tuple[torch.Tensor, ...], kind: str, samples: int
    ) -> tuple[list[tuple[torch.Tensor, ...]], str]:
        side = spec.options_of(HuggingFaceOptions).image_size
        if side is not None:
            generated = shaped_like(generated_images(side, samples), example_args)
            return generated, "generated: deterministic random images, ImageNet-normalised (not real photos)"
        made = calibration_inputs(spec, module, samples)  # audio, or images the family's config sizes
        if kind == AUDIO:
            return made, "generated: deterministic synthetic audio, a chord and noise (not real speech)"
        return made, "generated: deterministic random images, normalised (not real photos)"

    def check(self, spec: ModelSpec, choice: WeightsChoice, available: int | None) -> SpecCheck:
        return _check_huggingface(spec, choice, available)

    def load(self, spec: ModelSpec, choice: WeightsChoice) -> LoadedModel:
        return _load_huggingface(spec, choice)

    def example_inputs(self, spec: ModelSpec, module: torch.nn.Module) -> list[NamedTensor]:
        if spec.generates:
            from orchestrator.lowering.export import generation

            return generation.example_inputs(module, spec)  # type: ignore[arg-type]
        model: Any = module.model  # the HuggingFace model FirstOutput wraps
        config = model.config
        inputs = model_inputs(spec, config, check_family(spec))
        vocab = getattr(config, "vocab_size", None) or 1
        segments = getattr(config, "type_vocab_size", None) or 1
        pad = getattr(config, "pad_token_id", None)
        pad = pad if isinstance(pad, int) and 0 <= pad < vocab else 0
        return reference_inputs(spec, int(vocab), inputs, int(segments), pad)


HUGGINGFACE = HuggingFace()
