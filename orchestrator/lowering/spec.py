"""Model specs: what to lower, from the built-in list or a user's JSON file.

A spec names its source (`SOURCES`, the registry of `ModelSource` records: one module per source under sources/,
which holds its fields and their checks; `huggingface` when a spec does not say), and for a HuggingFace model the
model type (any family transformers knows), the task (which decides the head and what the graph outputs), the batch
size and the inputs (`TASK_INPUTS`: their names, dtypes and shapes, with defaults per task). It is plain data; the
source's builder (`sources/builders/huggingface.py` for `huggingface`) turns it into a torch module. The built-in
specs are builtins.py's.

Reading a spec imports nothing heavy (a cached lowering must stay fast), so the checks that need transformers (the
family, whether it has a head for the task, its config's fields, the sizes) run in `models.check_spec`, before
anything loads. What is refused
here already: the schema, and `config` keys that are loading switches of `from_pretrained` rather than config
fields (`trust_remote_code`, `weights_only`, ...): a spec file must never switch on code execution.
"""

from __future__ import annotations

import importlib
import json
import math
import pkgutil
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any, TypeVar

import yaml
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from orchestrator.config import (
    Check,
    did_you_mean,
    field_node,
    field_path,
    huge_integers,
    leaves,
    line_of,
    text,
    value_node,
)
from orchestrator.errors import SpecError
from orchestrator.lowering.spec_fields import SpecChecker, spec_name
from orchestrator.records import to_data

# fill-mask and causal-lm give the logits the spec's `output` names (below); the others the head's first output as
# the user would export it (logits, or the last hidden state for feature-extraction and speech-encoder).
WRAPPED_TASKS = ("fill-mask", "causal-lm")
# A decoder LM as it is used: one program for prefill (a prompt) and decode (a token at a position), with a static
# KV cache as mutable state inside it (generation.py).
GENERATION_TASK = "text-generation"
# What a fill-mask, causal-lm or text-generation program returns: the logits at every position [B, seq_len, vocab]
# ("all", the default), the final position's ("last": [B, vocab] for causal-lm, [1, 1, vocab] for text-generation,
# whose head then runs on that position only), or the [MASK] position's [B, vocab], found in the graph from
# input_ids ("mask", fill-mask). Each output -> the tasks it fits.
OUTPUTS: dict[str, tuple[str, ...]] = {
    "all": (*WRAPPED_TASKS, GENERATION_TASK),
    "last": ("causal-lm", GENERATION_TASK),
    "mask": ("fill-mask",),
}
OUTPUT_TASKS = (*WRAPPED_TASKS, GENERATION_TASK)  # the tasks whose spec chooses its output
ALL_POSITIONS = "all"
# A text-generation program returns the last position's logits unless its spec says otherwise: what ExecuTorch's
# LLM export does, and what the generate loop reads. Every position's logits would be planned at the prompt
# capacity (context - 1 rows of vocab floats: 192 MiB at 1024 positions for SmolLM2's 49152-token vocabulary).
GENERATION_OUTPUT = "last"
OUTPUT_WORDS = {"all": "every position's logits", "last": "the last position's logits",
                "mask": "the [MASK] position's logits"}  # fmt: skip
TEXT_TASKS = (*WRAPPED_TASKS, "text-classification", "token-classification")
IMAGE_TASK = "image-classification"  # also the task of every torchvision spec: the classifier's logits
TASKS = (*TEXT_TASKS, GENERATION_TASK, "feature-extraction", IMAGE_TASK, "audio-classification", "speech-encoder")
DEFAULT_CONTEXT = 256  # a text-generation program's KV cache capacity when the spec does not say
MAX_CONTEXT = 32768  # the largest KV cache a spec or `--context` may ask for
MIN_CONTEXT = 2  # a prompt token and one generated after it
DEFAULT_NEW_TOKENS = 32
# A text-generation program's prompt capacity when the spec does not say: ExecuTorch's LLM export's default
# max_seq_length. Every activation is planned at this many rows, whatever the context, so it is apart from it.
DEFAULT_PROMPT_CAPACITY = 128
IMAGE_INPUT = "pixel_values"
INPUT_NAMES = ("input_ids", "attention_mask")  # the text inputs every text model takes (token_type_ids: some)
TEXT_INPUTS = (*INPUT_NAMES, "token_type_ids")
# Every input a spec may declare: its dtype and ranks ([B, seq], [B, 3, H, W], input_values a waveform [B, samples]
# or a spectrogram [B, frames, mel bins] (AST's kind), input_features [B, mel bins, frames]); which rank a family
# takes is checked against its config by the builder.
INPUT_KINDS: dict[str, tuple[str, tuple[int, ...]]] = {
    "input_ids": ("int64", (2,)),
    "attention_mask": ("int64", (2,)),
    "token_type_ids": ("int64", (2,)),
    IMAGE_INPUT: ("float32", (4,)),
    "input_values": ("float32", (2, 3)),
    "input_features": ("float32", (3,)),
}
# The inputs each task's models may take; which of them a family takes is checked against transformers.
TASK_INPUTS: dict[str, tuple[str, ...]] = {
    **dict.fromkeys(WRAPPED_TASKS, INPUT_NAMES),
    "text-classification": TEXT_INPUTS,
    "token-classification": TEXT_INPUTS,
    "feature-extraction": (*TEXT_INPUTS, IMAGE_INPUT, "input_values", "input_features"),
    IMAGE_TASK: (IMAGE_INPUT,),
    "audio-classification": ("input_values", "input_features"),
    "speech-encoder": ("input_values", "input_features"),
    GENERATION_TASK: ("input_ids",),
}
AUDIO_SAMPLES = 16000  # the default input_values: one second at 16 kHz
FACTORY_TASK = "custom"  # a factory's module decides its own inputs and outputs
SPEC_HINT = "the spec schema is documented in README.md (Model specs)"
# Keywords of `from_pretrained` and of the hub download, which `config` must never reach: some run code
# (trust_remote_code, weights_only=False unpickles), the others change what is read or from where.
LOADING_OPTIONS = frozenset(
    {
        "trust_remote_code", "weights_only", "code_revision", "revision", "auto_map", "use_safetensors",
        "from_tf", "from_flax", "state_dict", "cache_dir", "force_download", "local_files_only", "token",
        "use_auth_token", "proxies", "subfolder", "gguf_file", "device_map", "low_cpu_mem_usage", "offload_folder",
        "offload_state_dict", "quantization_config", "key_mapping", "adapter_kwargs", "adapter_name", "config",
        "attn_implementation", "experts_implementation", "name_or_path",
    }
)  # fmt: skip
# What a published checkpoint's config.json records about how it was saved and what reads it (its classes, the
# transformers that wrote it, the dtype of its weights, its tokenizer, its pipelines' settings): accepted in `config`
# so that a config.json can be given whole, and never applied (etlab builds the spec's task head in float32; the
# builder checks `model_type` against the spec's).
CHECKPOINT_RECORDS = frozenset(
    {
        "architectures", "model_type", "transformers_version", "torch_dtype", "dtype", "_name_or_path",
        "_commit_hash", "_attn_implementation_autoset", "tokenizer_class", "finetuning_task", "task_specific_params",
        "prefix",
    }
)  # fmt: skip


@dataclass(frozen=True)
class InputSpec:
    name: str
    dtype: str
    shape: tuple[int, ...]


@dataclass(frozen=True)
class SourceOptions:
    """A source's own spec fields, the ones no other source has: each source declares a frozen subclass in its
    module and names it in its ModelSource (`options`); `ModelSpec.options` holds one. This base is the options of a
    source with none. The build side narrows it with `ModelSpec.options_of(ItsOptions)`."""


@dataclass(frozen=True)
class ImageOptions(SourceOptions):
    """The options of a source whose models take one square image: its side (None: the source's default)."""

    image_size: int | None = None


@dataclass(frozen=True)
class ClassifierOptions(ImageOptions):
    """An image classifier built by a library's constructor (torchvision, timm): its keyword arguments (JSON
    scalars, checked against its signature by the builder); `model_type` is the library's model name."""

    kwargs: dict[str, Any] = field(default_factory=dict)


OptionsT = TypeVar("OptionsT", bound=SourceOptions)
# The source-only fields every ModelSpec had before they moved to the sources' options, with the value a spec of
# another source had: ModelSpec.to_dict writes them all at the top level, so that sidecars and cache keys of older
# etlab read and compare alike. A source's other options are written under "source_options".
_FLAT_OPTIONS: dict[str, Any] = {
    "model_id": None, "config": {}, "mask_token_id": None, "kwargs": {}, "image_size": None, "factory": None,
    "trust_remote_code": False,
}  # fmt: skip
# Where to_dict wrote them: after which ModelSpec field.
_OPTIONS_AFTER = {"seq_len": ("model_id", "config", "mask_token_id"), "declared_inputs": ("kwargs", "image_size",
                  "factory"), "model_source": ("trust_remote_code",)}  # fmt: skip


@dataclass(frozen=True)
class ModelSpec:
    name: str
    model_type: str
    task: str
    seq_len: int = 128
    description: str = ""
    batch_size: int = 1
    # The spec file's `inputs`, checked against the task (names, dtypes, ranks, batch); empty: the task's defaults.
    declared_inputs: tuple[InputSpec, ...] = ()
    # The fields of the spec's source of its own (model_id and config for huggingface, a factory's function, ...):
    # the record its ModelSource declares (`SourceOptions` given here: that record's defaults).
    options: SourceOptions = SourceOptions()
    source: str = "built-in"  # where the spec was read: a file, or built-in
    model_source: str = "huggingface"  # the spec file's `source`: a name in SOURCES, where the model comes from
    # Only the command line sets this (`--trust-code`), never a spec file: a factory spec runs the user's own code.
    # Not part of the identity: without it nothing runs, so there is no other program.
    trust_code: bool = False
    # `text-generation`: the KV cache capacity (positions) baked into the program, and how many tokens a run
    # generates by default after a prompt of `seq_len` tokens (seq_len + new_tokens <= context).
    context: int | None = None
    new_tokens: int = DEFAULT_NEW_TOKENS
    # `text-generation`: the most tokens one call of the program takes (its prompt capacity, seq_len <= it <
    # context); None: DEFAULT_PROMPT_CAPACITY, or seq_len when longer, within the context (prompt_capacity).
    max_prompt_len: int | None = None
    # `text-generation`: a text prompt, tokenized on the workstation when the model's tokenizer is cached (never
    # downloaded); without one, deterministic ids of seq_len tokens.
    prompt: str | None = None
    # fill-mask, causal-lm and text-generation: which logits the program returns (OUTPUTS); part of the identity.
    output: str = ALL_POSITIONS
    # Layers a quantized variant keeps in float (mixed precision, `--keep-float`): module paths of linears and
    # convolutions. Only a program's own choice (its name says so, lowering/program.py), never a spec file's.
    keep_float: tuple[str, ...] = ()
    # Where each field was written in the spec file: "seq_len", "config", "config.<key>" -> line.
    lines: dict[str, int] = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self) -> None:  # a recorded spec (a sidecar) is read back through here too
        if self.output not in OUTPUTS:
            raise ValueError(f"output {self.output!r} is not one of {', '.join(OUTPUTS)}")
        source = SOURCES.get(self.model_source)
        if source is None or isinstance(self.options, source.options):
            return
        if type(self.options) is not SourceOptions:
            raise ValueError(f"a {source.name} spec's options are {source.options.__name__}, got {self.options!r}")
        object.__setattr__(self, "options", source.options())  # the source's defaults (a required one: TypeError)

    def options_of(self, kind: type[OptionsT]) -> OptionsT:
        """This spec's options as the record `kind` (its source's, or a base of it); a spec of another source is
        a bug of the caller."""
        if not isinstance(self.options, kind):
            raise TypeError(f"spec {self.name!r} ({self.model_source}) has no {kind.__name__}: {self.options!r}")
        return self.options

    @property
    def image_side(self) -> int | None:
        """The side of the square image the model takes, if its source's options say one (ImageOptions)."""
        return self.options.image_size if isinstance(self.options, ImageOptions) else None

    @property
    def inputs(self) -> tuple[InputSpec, ...]:
        """The inputs the spec decides: declared, or the task's defaults. The builder adds what the family decides
        (token_type_ids where it takes them, the audio inputs' lengths), so these are the whole story only for
        declared inputs, images and the fill-mask and causal-lm wrappers."""
        if self.declared_inputs:
            return self.declared_inputs
        batch = self.batch_size
        side = self.image_side
        if side is not None:  # an image model: one normalised RGB image
            return (InputSpec(IMAGE_INPUT, "float32", (batch, 3, side, side)),)
        if self.task in TEXT_TASKS:
            return tuple(InputSpec(name, "int64", (batch, self.seq_len)) for name in INPUT_NAMES)
        if self.task == GENERATION_TASK:  # the prompt's ids and their positions; the length is dynamic
            return (
                InputSpec("input_ids", "int64", (1, self.seq_len)),
                InputSpec("cache_position", "int64", (self.seq_len,)),
            )
        return ()

    @property
    def generates(self) -> bool:
        return self.task == GENERATION_TASK

    @property
    def cache_capacity(self) -> int:
        """The KV cache's positions: what a prompt and the tokens generated after it share."""
        return self.context or DEFAULT_CONTEXT

    @property
    def prompt_capacity(self) -> int:
        """The most tokens one call of a text-generation program takes: what its activations are planned for."""
        wanted = self.max_prompt_len or max(self.seq_len, DEFAULT_PROMPT_CAPACITY)
        return min(self.cache_capacity - 1, wanted)  # a --context below the spec's capacity bounds it

    def positions(self, new_tokens: int | None = None) -> int:
        """The KV cache positions a generation of its prompt and `new_tokens` (else its own) fills."""
        return self.seq_len + (new_tokens or self.new_tokens)

    def with_options(self, **changes: Any) -> ModelSpec:
        """The same spec with some of its options changed."""
        return replace(self, options=replace(self.options, **changes))

    def allowed(self, *, trust_remote_code: bool, trust_code: bool) -> ModelSpec:
        """The spec with the command line's permissions to run code: a factory's (`trust_code`, any source) and
        the model folder's (`trust_remote_code`, where the source's options have it)."""
        spec = replace(self, trust_code=trust_code)
        if hasattr(self.options, "trust_remote_code"):
            spec = spec.with_options(trust_remote_code=trust_remote_code)
        return spec

    def to_dict(self) -> dict[str, Any]:
        """The spec as the sidecar records it: its fields, its source's options among them at the top level where
        ModelSpec had them once (_FLAT_OPTIONS), the others under "source_options"; a user's own program by its file."""
        options = to_data(self.options)
        if is_user_program(self.model_source):
            return {"name": self.name, "model_source": self.model_source, "source": self.source, **options}
        own = {key: value for key, value in options.items() if key not in _FLAT_OPTIONS and value is not None}
        flat = _FLAT_OPTIONS | {key: value for key, value in options.items() if key in _FLAT_OPTIONS}
        data: dict[str, Any] = {}
        for item in fields(self):
            if item.name != "options":
                data[item.name] = getattr(self, item.name)
            data |= {key: flat[key] for key in _OPTIONS_AFTER.get(item.name, ())}
        if own:  # the built-in sources' options are all flat: their records read as before
            data["source_options"] = own
        data.pop("lines")
        if self.generates:  # resolved, so that a new default is another program
            data["max_prompt_len"] = self.prompt_capacity
        else:  # absent, as before the field existed: other programs' cache keys stay
            data.pop("max_prompt_len")
        if not self.keep_float:  # absent unless chosen: other programs' cache keys stay
            data.pop("keep_float")
        else:
            data["keep_float"] = list(self.keep_float)
        data["declared_inputs"] = [asdict(spec) | {"shape": list(spec.shape)} for spec in self.declared_inputs]
        data["inputs"] = [asdict(spec) | {"shape": list(spec.shape)} for spec in self.inputs]
        return data

    def problem(self, field_name: str, message: str) -> str:
        """`file:line: field 'config.dim': message` for a spec file; the spec's name for a built-in one."""
        line = self.lines.get(field_name) or self.lines.get(re.split(r"[.\[]", field_name, maxsplit=1)[0])
        where = f"{self.source}:{line}" if line else f"spec {self.name!r} ({self.source})"
        return f"{where}: field {field_name!r}: {message}"

    def identity(self) -> dict[str, Any]:
        """What decides the lowered program (the cache key); excludes descriptive fields."""
        data = self.to_dict()
        for key in ("description", "source", "trust_code"):
            data.pop(key, None)  # a user's own program records no description
        source = SOURCES.get(self.model_source)
        if source is not None and source.identity is not None:  # what the fields do not say (a factory's file)
            data |= source.identity(self)
        return data


class UnknownModel(SpecError):
    """A model name that is no built-in; the command layer says how to pass a spec of one's own."""


class UntrustedFactory(SpecError):
    """A factory spec lowered without the command line's permission to run the user's code; the command layer names
    the option."""


class RemoteCodeInSpec(SpecError):
    """A spec file asked to run the model folder's own code, which only the command line can switch on; the command
    layer names the option."""


# The fields of every spec file, whatever its source.
_COMMON_FIELDS: dict[str, Check] = {"name": spec_name, "source": text, "description": text}
DEFAULT_SOURCE = "huggingface"


@dataclass(frozen=True)
class ModelSource:
    """A model source, spec side (no torch): the fields its spec file may set (beyond name, source, description) and
    the ones it must, a check across them, how the checked fields become ModelSpec keywords, its pretrained lookup,
    what it adds to the identity (the cache key). One module per source under orchestrator/lowering/sources/
    registers one (`register_source`); a new source is that one file.

    `builder` is the build side, "module:object", imported on a cache miss only (it imports torch): an object with
    `check(spec, weights_choice, available) -> SpecCheck`, `load(spec, weights_choice) -> LoadedModel`,
    `example_inputs(spec, module) -> list[NamedTensor]`, and what `models.SourceBuilder` gives defaults for (the
    inputs known before loading, their kind, generated calibration samples). sources/builders/models.py dispatches to
    it; spec_errors.py says how it refuses a spec; tests/lowering/test_spec.py ties them.
    """

    name: str
    builder: str
    fields: dict[str, Check]
    required: tuple[str, ...]
    # The first (field, message) across the checked fields (`found`) and the raw JSON (`data`), or None.
    problem: Callable[[dict[str, Any], dict[str, Any]], tuple[str, str] | None] = lambda found, data: None
    # Spec-file field -> ModelSpec field where they differ, and ModelSpec fields the source fixes.
    renames: dict[str, str] = field(default_factory=dict)
    fixed: dict[str, Any] = field(default_factory=dict)
    # Whether pretrained weights can be had now without the network: a torch-free `(spec) -> weights.Availability`.
    # None: the source's modules bring their own weights.
    pretrained: Callable[[ModelSpec], Any] | None = None
    # `kwargs` keys that decide where the weights come from, which only etlab's weights choice decides.
    refused_kwargs: frozenset[str] = frozenset()
    # "module:function" filling in defaults that need the source's library (imported then): `(spec) -> spec`.
    defaults: str | None = None
    # The ModelSpec keywords made whole: `(given, data, spec file's folder) -> given` (declared inputs, a path).
    complete: Callable[[dict[str, Any], dict[str, Any], Path], dict[str, Any]] | None = None
    # The record of its own fields (those that are no field of ModelSpec), kept in `ModelSpec.options`: a frozen
    # SourceOptions subclass declared in the source's module, its fields named as the spec file's (part of the
    # identity). Every field has a default but those the spec file must give.
    options: type[SourceOptions] = SourceOptions
    # What else decides the program beyond the spec's fields (a factory's file): `(spec) -> dict`.
    identity: Callable[[ModelSpec], dict[str, Any]] | None = None
    # A user's own program's option (`--pte FILE.pte`), never a spec file's `source`; `builder` makes its artifacts.
    given_by: str | None = None


_SOURCES_PACKAGE = "orchestrator.lowering.sources"


class SourceRegistry(Mapping[str, ModelSource]):
    """Every model source by name: the modules of orchestrator/lowering/sources/ (found as files and imported on
    first use, so a new source is one module there, and reading a built-in spec imports only those torch-free
    records), then any registered since (a test's, a plugin's)."""

    def __init__(self) -> None:
        self._sources: dict[str, ModelSource] = {}
        self._discovered = False
        self._builtin: list[str] = []

    def _all(self) -> dict[str, ModelSource]:
        if not self._discovered:
            self._discovered = True
            # by name, not by an import: the source modules import this one (a registry, as plugins are found)
            package = importlib.import_module(_SOURCES_PACKAGE)
            self._builtin = sorted(m.name for m in pkgutil.iter_modules(package.__path__) if not m.ispkg)
            for name in self._builtin:
                importlib.import_module(f"{_SOURCES_PACKAGE}.{name}")
        # The default first, then the built-in ones by name, then the others as registered: whatever imported first.
        order = {name: index for index, name in enumerate(sorted(self._builtin, key=lambda n: n != DEFAULT_SOURCE))}
        return dict(sorted(self._sources.items(), key=lambda item: order.get(item[0], len(order))))

    def register(self, source: ModelSource) -> ModelSource:
        known = self._sources.get(source.name)
        if known is not None and known != source:
            raise ValueError(f"model source {source.name!r} is registered already")
        self._sources[source.name] = source
        return source

    def __getitem__(self, name: str) -> ModelSource:
        return self._all()[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._all())

    def __len__(self) -> int:
        return len(self._all())


SOURCES = SourceRegistry()


def register_source(source: ModelSource) -> ModelSource:
    """Add a model source (its module calls this when it is imported); returns it."""
    return SOURCES.register(source)


def is_user_program(source_name: object) -> bool:
    """Whether a spec's (or a sidecar's recorded) `model_source` is a program the user made (ModelSource.given_by)."""
    return isinstance(source_name, str) and getattr(SOURCES.get(source_name), "given_by", None) is not None


def _config_problems(node: Node, values: dict[str, Any]) -> list[tuple[Node, str, str]]:
    """(key node, field, message) for `config` keys a spec may never set, whatever the model's config class."""
    problems = []
    key_nodes = {key.value: key for key, _ in node.value if isinstance(key, ScalarNode)}
    for key, value in values.items():
        where = key_nodes.get(key, node)
        name = field_path("config", key)
        if key == "trust_remote_code":
            message = "a spec file cannot switch on running the model folder's own code; only the command line can"
        elif key in LOADING_OPTIONS:
            message = "is an option of from_pretrained, not a field of the model's config: a spec cannot set it"
        elif key.startswith("_") and key not in CHECKPOINT_RECORDS:
            message = "is internal to transformers, not a field of the model's config: a spec cannot set it"
        elif any(isinstance(v, float) and not math.isfinite(v) for v in leaves(value)):
            message = f"expected a finite number, got {value!r}"
        else:
            continue
        problems.append((where, name, message))
    return problems


def _kwargs_problems(node: Node, values: dict[str, Any], source: ModelSource) -> list[tuple[Node, str, str]]:
    """(key node, field, message) for `kwargs` a spec may never set or that are not JSON scalars."""
    problems = []
    key_nodes = {key.value: key for key, _ in node.value if isinstance(key, ScalarNode)}
    for key, value in values.items():
        where = key_nodes.get(key, node)
        name = field_path("kwargs", key)
        if key in source.refused_kwargs:
            message = (
                f"decides where {source.name}'s weights come from, which a spec cannot: etlab's weights choice "
                "does (pretrained only from a local cache)"
            )
        elif key.startswith("_") and source.refused_kwargs:
            message = f"is internal to {source.name}: a spec cannot set it"
        elif value is None or isinstance(value, dict | list):
            message = f"expected a number, a boolean or a string, got {value!r}"
        elif isinstance(value, float) and not math.isfinite(value):
            message = f"expected a finite number, got {value!r}"
        else:
            continue
        problems.append((where, name, message))
    return problems


def load_spec_file(path: Path) -> ModelSpec:
    """Parse and validate a user spec; every error names the file, the line and the field."""

    def fail(message: str, kind: type[SpecError] = SpecError) -> SpecError:
        return kind(message, hint=SPEC_HINT)

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
        try:
            root = yaml.compose(text_)  # JSON is YAML: the nodes carry the line of every field
        except yaml.YAMLError:  # JSON that PyYAML refuses (tabs): lines are then approximate
            root = yaml.compose(json.dumps(data, indent=0))
    except (RecursionError, yaml.YAMLError) as exc:  # PyYAML recurses once per level of nesting
        raise fail(f"{path}: lists or objects nested too deeply") from exc
    assert isinstance(root, MappingNode)  # a JSON object, checked above
    checker = SpecChecker(path)
    for node, name in huge_integers(root):
        checker.error(node, name, f"a number of {len(str(node.value).lstrip('-'))} digits, beyond any size or id")
    if checker.problems:  # nothing downstream has to guard its arithmetic against them
        raise fail("\n".join(checker.errors))
    source_name = data.get("source", DEFAULT_SOURCE)
    source = SOURCES.get(source_name) if isinstance(source_name, str) else None
    if source is None or source.given_by is not None:  # a program of one's own comes in by its option
        choices = [name for name, each in SOURCES.items() if each.given_by is None]
        close = did_you_mean(source_name, choices) if isinstance(source_name, str) else ""
        message = f"{source_name!r} is not a model source; known: {', '.join(choices)}{close}"
        if source is not None:
            message = f"{source_name!r} is a program of your own, given by {source.given_by}, not a spec file's source"
        checker.error(value_node(root, "source") or root, "source", message)
        raise fail("\n".join(checker.errors))
    found = checker.fields(root, "", _COMMON_FIELDS | source.fields)
    for key in ("name", *source.required):
        if key not in data:
            checker.error(root, key, "is required")
    config_node = value_node(root, "config")
    if "config" in found and isinstance(config_node, MappingNode):
        found["config"] = dict(data["config"])  # as JSON reads them; the nodes give the lines
        for node, name, message in _config_problems(config_node, found["config"]):
            checker.error(node, name, message)
    kwargs_node = value_node(root, "kwargs")
    if "kwargs" in found and isinstance(kwargs_node, MappingNode):
        found["kwargs"] = dict(data["kwargs"])
        for node, name, message in _kwargs_problems(kwargs_node, found["kwargs"], source):
            checker.error(node, name, message)
    if checker.problems:
        remote_code = "trust_remote_code" in found.get("config", {})
        raise fail("\n".join(checker.errors), RemoteCodeInSpec if remote_code else SpecError)
    lines = {key.value: value for key, value in root.value}
    spec_lines = {key: line_of(value) for key, value in lines.items()}
    if isinstance(config_node, MappingNode):
        spec_lines |= {field_path("config", key.value): line_of(key) for key, _ in config_node.value}
    if isinstance(kwargs_node, MappingNode):
        spec_lines |= {field_path("kwargs", key.value): line_of(key) for key, _ in kwargs_node.value}
    inputs_node = value_node(root, "inputs")
    if isinstance(inputs_node, SequenceNode):  # a builder's problem with `inputs[1].shape` names that line
        for index, item in enumerate(inputs_node.value):
            spec_lines[f"inputs[{index}]"] = line_of(item)
            if isinstance(item, MappingNode):
                spec_lines |= {f"inputs[{index}].{key.value}": line_of(value) for key, value in item.value}
    for spec_field, real in source.renames.items():  # the builder blames the spec file's name of the field
        if spec_field in spec_lines:
            spec_lines[real] = spec_lines[spec_field]

    def problem(key: str, message: str) -> SpecError:
        checker.error(field_node(root, key) or root, key, message)
        return fail("\n".join(checker.errors))

    across = source.problem(found, data)
    if across is not None:
        raise problem(*across)
    not_in_files = {"source", "model_source", "lines", "trust_code", "options"}
    option_names = {f.name for f in fields(source.options)} - {"trust_remote_code"}  # the command line's only
    known = ({f.name for f in fields(ModelSpec)} - not_in_files) | option_names
    found = {source.renames.get(key, key): value for key, value in found.items()}
    given = {key: value for key, value in found.items() if key in known} | source.fixed
    for key in ("config", "kwargs"):
        if key in given:
            given[key] = dict(given[key])
    if source.complete is not None:
        given = source.complete(given, data, path.parent)
    options = source.options(**{key: given.pop(key) for key in option_names if key in given})
    return ModelSpec(**given, options=options, source=str(path), model_source=source.name, lines=spec_lines)
