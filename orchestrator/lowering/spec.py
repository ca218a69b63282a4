"""Model specs: what to lower, from the built-in list or a user's JSON file.

A spec names its source (`SOURCES`: where the model comes from; `huggingface` when a spec does not say), and for
a HuggingFace model the model type (any family transformers knows), the task (which decides the head and what the
graph outputs), the batch size and the inputs (`TASK_INPUTS`: their names, dtypes and shapes, with defaults per
task). It is plain data; the source's builder (`huggingface_source.py` for `huggingface`) turns it into a torch
module.

Reading a spec imports nothing heavy (a cached lowering must stay fast), so the checks that need transformers (the
family, whether it has a head for the task, its config's fields, the sizes) run in `models.check_spec`, before
anything loads. What is refused
here already: the schema, and `config` keys that are loading switches of `from_pretrained` rather than config
fields (`trust_remote_code`, `weights_only`, ...): a spec file must never switch on code execution.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

import yaml
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from orchestrator.config import (
    Check,
    Checker,
    Invalid,
    describe,
    did_you_mean,
    field_path,
    integer,
    line_of,
    string,
    text,
    value_node,
)
from orchestrator.errors import SpecError
from orchestrator.names import is_valid_name
from orchestrator.strictjson import MAX_MAGNITUDE

# fill-mask and causal-lm give the logits the spec's `output` names (below); the others the head's first output as
# the user would export it (logits, or the last hidden state for feature-extraction and speech-encoder).
WRAPPED_TASKS = ("fill-mask", "causal-lm")
# What a fill-mask or causal-lm program returns: the logits at every position [B, seq_len, vocab] ("all", the
# default), the final position's [B, vocab] ("last", causal-lm), or the [MASK] position's [B, vocab], found in the
# graph from input_ids ("mask", fill-mask). Each output -> the tasks it fits.
OUTPUTS: dict[str, tuple[str, ...]] = {"all": WRAPPED_TASKS, "last": ("causal-lm",), "mask": ("fill-mask",)}
ALL_POSITIONS = "all"
OUTPUT_WORDS = {"all": "every position's logits", "last": "the last position's logits",
                "mask": "the [MASK] position's logits"}  # fmt: skip
TEXT_TASKS = (*WRAPPED_TASKS, "text-classification", "token-classification")
IMAGE_TASK = "image-classification"  # also the task of every torchvision spec: the classifier's logits
# A decoder LM as it is used: one program for prefill (a prompt) and decode (a token at a position), with a static
# KV cache as mutable state inside it (generation.py).
GENERATION_TASK = "text-generation"
TASKS = (*TEXT_TASKS, GENERATION_TASK, "feature-extraction", IMAGE_TASK, "audio-classification", "speech-encoder")
DEFAULT_CONTEXT = 256  # a text-generation program's KV cache capacity when the spec does not say
MAX_CONTEXT = 32768  # the largest KV cache a spec or `--context` may ask for
DEFAULT_NEW_TOKENS = 32
IMAGE_INPUT = "pixel_values"
_LONG_INTEGER = re.compile(r"-?\d{19,}")  # may pass int64; shorter ones cannot
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
# torchvision constructor keywords a spec never sets: the weights come from `--weights` (pretrained only from the
# local torch hub cache), and the others decide how they are fetched.
TORCHVISION_REFUSED = frozenset({"weights", "progress", "pretrained", "pretrained_backbone", "weights_backbone"})
# timm.create_model keywords a spec never sets: they fetch or read weights and configs from files or the hub.
TIMM_REFUSED = frozenset(
    {
        "pretrained", "pretrained_cfg", "pretrained_cfg_overlay", "pretrained_strict", "checkpoint_path",
        "cache_dir", "features_only", "feature_cfg", "device", "dtype",
    }
)  # fmt: skip
FACTORY_TASK = "custom"  # a factory's module decides its own inputs and outputs
# `pkg.mod:build` or `path/to/file.py:build`: where a factory is, and the function in it.
_FACTORY = re.compile(r"^(?P<where>[^:]+\.py|[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*):(?P<object>[A-Za-z_]\w*)$")
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
class ModelSpec:
    name: str
    model_type: str
    task: str
    seq_len: int = 128
    model_id: str | None = None
    config: dict[str, Any] = field(default_factory=dict)
    mask_token_id: int | None = None
    description: str = ""
    batch_size: int = 1
    # The spec file's `inputs`, checked against the task (names, dtypes, ranks, batch); empty: the task's defaults.
    declared_inputs: tuple[InputSpec, ...] = ()
    # `torchvision`: the constructor's keyword arguments (JSON scalars, checked against its signature by the builder)
    # and the side of the square input image; `model_type` is then the torchvision model name.
    kwargs: dict[str, Any] = field(default_factory=dict)
    image_size: int | None = None
    # `factory`: "module:function" or "/absolute/file.py:function" (a relative file is resolved against the spec
    # file's folder when it is read); the function returns the module and its example inputs.
    factory: str | None = None
    source: str = "built-in"  # where the spec was read: a file, or built-in
    model_source: str = "huggingface"  # the spec file's `source`: a name in SOURCES, where the model comes from
    # Only the command line sets this (`--trust-remote-code`), never a spec file: with it, `from_pretrained` runs
    # the Python files of the model folder. It is part of the identity: such a program is another program.
    trust_remote_code: bool = False
    # Only the command line sets this (`--trust-code`), never a spec file: a factory spec runs the user's own code.
    # Not part of the identity: without it nothing runs, so there is no other program.
    trust_code: bool = False
    # `text-generation`: the KV cache capacity (positions) baked into the program, and how many tokens a run
    # generates by default after a prompt of `seq_len` tokens (seq_len + new_tokens <= context).
    context: int | None = None
    new_tokens: int = DEFAULT_NEW_TOKENS
    # `text-generation`: a text prompt, tokenized on the workstation when the model's tokenizer is cached (never
    # downloaded); without one, deterministic ids of seq_len tokens.
    prompt: str | None = None
    # fill-mask and causal-lm: which logits the program returns (OUTPUTS); part of the identity.
    output: str = ALL_POSITIONS
    # Where each field was written in the spec file: "seq_len", "config", "config.<key>" -> line.
    lines: dict[str, int] = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self) -> None:  # a recorded spec (a sidecar) is read back through here too
        if self.output not in OUTPUTS:
            raise ValueError(f"output {self.output!r} is not one of {', '.join(OUTPUTS)}")

    @property
    def inputs(self) -> tuple[InputSpec, ...]:
        """The inputs the spec decides: declared, or the task's defaults. The builder adds what the family decides
        (token_type_ids where it takes them, the audio inputs' lengths), so these are the whole story only for
        declared inputs, images and the fill-mask and causal-lm wrappers."""
        if self.declared_inputs:
            return self.declared_inputs
        batch = self.batch_size
        if self.image_size is not None:  # an image model: one normalised RGB image
            return (InputSpec(IMAGE_INPUT, "float32", (batch, 3, self.image_size, self.image_size)),)
        if self.factory is not None:  # the factory's example inputs decide them, known once it ran
            return ()
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

    def with_context(self, context: int) -> ModelSpec:
        """The same model with a KV cache of `context` positions: another program, under its own name
        (`smollm2-135m-gen.ctx1024`) unless it is the spec's own context."""
        if context == self.cache_capacity:
            return self
        return replace(self, context=context, name=f"{self.name}.ctx{context}")

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data.pop("lines")
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
            data.pop(key)
        if self.factory is not None:  # an edited factory is another program
            data["factory_sha256"] = factory_digest(self.factory)
        return data


_MOBILENET_V2_TINY = {"width_mult": 0.25, "num_classes": 10}
_RESNET_18_TINY = {"num_classes": 10}  # BasicBlock is fixed at width 64: small by its input only
_TEST_EFFICIENTNET_TINY = {"num_classes": 10}  # timm's own test-sized EfficientNet: 0.1M parameters
_DISTILBERT_TINY = {"vocab_size": 1000, "dim": 64, "n_layers": 2, "n_heads": 2, "hidden_dim": 128}
_GPT2_TINY = {"vocab_size": 1000, "n_embd": 64, "n_layer": 2, "n_head": 2, "n_positions": 128}
# Wider random weights than GPT-2's own 0.02, or greedy decoding of a tiny random GPT-2 repeats one token forever.
_GPT2_GEN_TINY = {**_GPT2_TINY, "initializer_range": 0.2}
_BERT_TINY = {"vocab_size": 1000, "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2,
              "intermediate_size": 128, "max_position_embeddings": 128}  # fmt: skip
_VIT_TINY = {"image_size": 32, "patch_size": 8, "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2,
             "intermediate_size": 128, "num_labels": 10}  # fmt: skip
# Whisper's encoder takes exactly 2 x max_source_positions log-mel frames: 100 here (1 s), 3000 (30 s) for the real one.
_WHISPER_TINY = {"vocab_size": 1000, "d_model": 64, "encoder_layers": 2, "encoder_attention_heads": 2,
                 "decoder_layers": 1, "decoder_attention_heads": 2, "encoder_ffn_dim": 128, "decoder_ffn_dim": 128,
                 "num_mel_bins": 80, "max_source_positions": 50, "max_target_positions": 64,
                 "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2, "decoder_start_token_id": 1,
                 "suppress_tokens": [], "begin_suppress_tokens": []}  # fmt: skip
_WAV2VEC2_TINY = {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 128,
                  "conv_dim": [32, 32, 32, 32, 32, 32, 32], "num_conv_pos_embeddings": 16,
                  "num_conv_pos_embedding_groups": 2}  # fmt: skip
# HuggingFaceTB/SmolLM2-135M's config, so that random weights (no hub) build the same architecture.
_SMOLLM2_135M = {"hidden_size": 576, "num_hidden_layers": 30, "num_attention_heads": 9, "num_key_value_heads": 3,
                 "intermediate_size": 1536, "vocab_size": 49152, "max_position_embeddings": 8192,
                 "tie_word_embeddings": True, "rms_norm_eps": 1e-5, "bos_token_id": 0, "eos_token_id": 0,
                 "rope_parameters": {"rope_theta": 100000.0, "rope_type": "default"}}  # fmt: skip
_SMOLLM2_TINY = {**_SMOLLM2_135M, "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
                 "num_key_value_heads": 2, "intermediate_size": 128, "vocab_size": 1000,
                 "max_position_embeddings": 128}  # fmt: skip

BUILTIN_SPECS: dict[str, ModelSpec] = {
    spec.name: spec
    for spec in (
        ModelSpec(
            name="distilbert",
            model_type="distilbert",
            task="fill-mask",
            model_id="distilbert-base-uncased",
            mask_token_id=103,
            output="mask",  # the course's program: the [MASK] position's logits, [1, 30522]
            description="DistilBERT base (uncased), masked-LM logits at the [MASK] position",
        ),
        ModelSpec(
            name="gpt2",
            model_type="gpt2",
            task="causal-lm",
            model_id="openai-community/gpt2",
            output="last",  # the course's program: the final position's logits, [1, 50257]
            description="GPT-2 small, next-token logits at the last position",
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
        ModelSpec(
            name="bert-base",
            model_type="bert",
            task="fill-mask",
            model_id="bert-base-uncased",
            mask_token_id=103,
            description="BERT base (uncased), masked-LM logits at every position",
        ),
        ModelSpec(
            name="bert-base-tiny",
            model_type="bert",
            task="fill-mask",
            config=_BERT_TINY,
            mask_token_id=103,
            description="2-layer, 64-dim BERT with random weights, for tests and quick demos",
        ),
        ModelSpec(
            name="vit",
            model_type="vit",
            task=IMAGE_TASK,
            model_id="google/vit-base-patch16-224",
            config={"num_labels": 1000},  # ImageNet's classes, also for random weights (the default config has 2)
            image_size=224,
            description="ViT-B/16 (ImageNet, 1000 classes), 224x224 image",
        ),
        ModelSpec(
            name="vit-tiny",
            model_type="vit",
            task=IMAGE_TASK,
            config=_VIT_TINY,
            image_size=32,
            description="2-layer, 64-dim ViT, 8x8 patches of a 32x32 image, 10 classes, random weights: for tests",
        ),
        ModelSpec(
            name="whisper-tiny-encoder",
            model_type="whisper",
            task="speech-encoder",
            model_id="openai/whisper-tiny",
            description="Whisper tiny's encoder: 30 s of log-mel features [1, 80, 3000] to hidden states",
        ),
        ModelSpec(
            name="whisper-tiny-encoder-tiny",
            model_type="whisper",
            task="speech-encoder",
            config=_WHISPER_TINY,
            description="2-layer, 64-dim Whisper encoder on 1 s of log-mel features [1, 80, 100], random weights",
        ),
        ModelSpec(
            name="wav2vec2",
            model_type="wav2vec2",
            task="speech-encoder",
            model_id="facebook/wav2vec2-base",
            description="wav2vec 2.0 base: 1 s of 16 kHz audio [1, 16000] to hidden states",
        ),
        ModelSpec(
            name="wav2vec2-tiny",
            model_type="wav2vec2",
            task="speech-encoder",
            config=_WAV2VEC2_TINY,
            description="2-layer, 64-dim wav2vec 2.0 on 1 s of 16 kHz audio, random weights: for tests",
        ),
        ModelSpec(
            name="smollm2-135m",
            model_type="llama",
            task="causal-lm",
            model_id="HuggingFaceTB/SmolLM2-135M",
            config=_SMOLLM2_135M,
            description="SmolLM2-135M (Llama family, 30 layers, grouped-query attention), all positions' logits",
        ),
        ModelSpec(
            name="smollm2-tiny",
            model_type="llama",
            task="causal-lm",
            config=_SMOLLM2_TINY,
            description="SmolLM2's architecture at 2 layers, 64 dims, random weights: for tests and quick demos",
        ),
        ModelSpec(
            name="smollm2-135m-gen",
            model_type="llama",
            task=GENERATION_TASK,
            model_id="HuggingFaceTB/SmolLM2-135M",
            config=_SMOLLM2_135M,
            seq_len=64,
            new_tokens=64,
            context=256,
            description="SmolLM2-135M generating: a 64-token prompt, then 64 tokens one at a time, KV cache of 256",
        ),
        ModelSpec(
            name="smollm2-gen-tiny",
            model_type="llama",
            task=GENERATION_TASK,
            config={**_SMOLLM2_TINY, "initializer_range": 0.2},  # as _GPT2_GEN_TINY: ids that vary
            seq_len=8,
            new_tokens=8,
            context=64,
            description="SmolLM2's architecture at 2 layers, generating 8 tokens after 8, random weights: for tests",
        ),
        ModelSpec(
            name="gpt2-gen",
            model_type="gpt2",
            task=GENERATION_TASK,
            model_id="openai-community/gpt2",
            seq_len=64,
            new_tokens=64,
            context=256,
            description="GPT-2 small generating: a 64-token prompt, then 64 tokens one at a time, KV cache of 256",
        ),
        ModelSpec(
            name="gpt2-gen-tiny",
            model_type="gpt2",
            task=GENERATION_TASK,
            config=_GPT2_GEN_TINY,
            seq_len=8,
            new_tokens=8,
            context=64,
            description="2-layer, 64-dim GPT-2 generating 8 tokens after 8, random weights: for tests",
        ),
        ModelSpec(
            name="mobilenet-v2",
            model_type="mobilenet_v2",
            task=IMAGE_TASK,
            image_size=224,
            model_source="torchvision",
            description="torchvision MobileNetV2 (ImageNet, 1000 classes), 224x224 image",
        ),
        ModelSpec(
            name="resnet-18",
            model_type="resnet18",
            task=IMAGE_TASK,
            image_size=224,
            model_source="torchvision",
            description="torchvision ResNet-18 (ImageNet, 1000 classes), 224x224 image",
        ),
        ModelSpec(
            name="mobilenet-v2-tiny",
            model_type="mobilenet_v2",
            task=IMAGE_TASK,
            kwargs=_MOBILENET_V2_TINY,
            image_size=32,
            model_source="torchvision",
            description="MobileNetV2 at width 0.25, 10 classes, 32x32 image, random weights: for tests and quick demos",
        ),
        ModelSpec(
            name="resnet-18-tiny",
            model_type="resnet18",
            task=IMAGE_TASK,
            kwargs=_RESNET_18_TINY,
            image_size=32,
            model_source="torchvision",
            description="ResNet-18 with 10 classes, 32x32 image, random weights: for tests and quick demos",
        ),
        ModelSpec(
            name="efficientnet-b0",
            model_type="efficientnet_b0",
            task=IMAGE_TASK,
            image_size=224,
            model_source="timm",
            description="timm EfficientNet-B0 (ImageNet, 1000 classes), 224x224 image",
        ),
        ModelSpec(
            name="efficientnet-b0-tiny",
            model_type="test_efficientnet",
            task=IMAGE_TASK,
            kwargs=_TEST_EFFICIENTNET_TINY,
            image_size=32,
            model_source="timm",
            description="timm's test_efficientnet (a 0.1M-parameter EfficientNet), 10 classes, 32x32 image, random "
            "weights: for tests and quick demos",
        ),
    )
}


def resolve_spec(
    model: str | None = None,
    spec_path: str | Path | None = None,
    *,
    trust_remote_code: bool = False,
    trust_code: bool = False,
) -> ModelSpec:
    """The spec of a built-in model name or a spec file (exactly one); `trust_remote_code` and `trust_code` from the
    command line only."""
    if (model is None) == (spec_path is None):
        raise SpecError("give exactly one of a built-in model name or a spec file")
    if spec_path is not None:
        spec = load_spec_file(Path(spec_path))
    elif model in BUILTIN_SPECS:
        spec = BUILTIN_SPECS[model]
    else:
        spec = None
    if spec is not None:
        defaults = SOURCES[spec.model_source].defaults
        if defaults is not None:  # imports the source's library: only a spec that leaves a default to it
            import importlib  # only such specs need it

            module, _, name = defaults.partition(":")
            spec = getattr(importlib.import_module(module), name)(spec)
        return replace(spec, trust_remote_code=trust_remote_code, trust_code=trust_code)
    raise UnknownModel(
        f"unknown model {model!r}{did_you_mean(model, BUILTIN_SPECS)}; known models: {', '.join(BUILTIN_SPECS)}"
    )


class UnknownModel(SpecError):
    """A model name that is no built-in; the command layer says how to pass a spec of one's own."""


class UntrustedFactory(SpecError):
    """A factory spec lowered without the command line's permission to run the user's code; the command layer names
    the option."""


class RemoteCodeInSpec(SpecError):
    """A spec file asked to run the model folder's own code, which only the command line can switch on; the command
    layer names the option."""


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


def _model_type(node: Node, _field: str) -> str:
    """Only the spelling here: whether transformers knows the family (with a did-you-mean) is checked with it, in
    `models.check_spec`."""
    value = string(node)
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}", value):
        raise Invalid(f"{value!r} is not a model family name (like 'bert', 'llama' or 'vit')")
    return value


def _name(node: Node, _field: str) -> str:
    value = string(node)
    if not is_valid_name(value):
        raise Invalid("must be 1-64 letters, digits, '.', '_' or '-', starting with a letter or digit")
    return value


def _mapping(node: Node, _field: str) -> dict[str, Any]:
    """Only the shape: the values are taken from the JSON (YAML reads `1e-5` as a string)."""
    if not isinstance(node, MappingNode):
        raise Invalid(f"expected a mapping (JSON object), got {describe(node)}")
    return {}


def _list(node: Node, _field: str) -> list[Any]:
    """Only the shape: the items are taken from the JSON."""
    if not isinstance(node, SequenceNode):
        raise Invalid(f"expected a list, got {describe(node)}")
    return []


# The fields of every spec file, whatever its source.
_COMMON_FIELDS: dict[str, Check] = {"name": _name, "source": text, "description": text}
_HUGGINGFACE_FIELDS: dict[str, Check] = {
    "model_type": _model_type,
    "task": _supported(TASKS),
    "seq_len": integer(1, 4096),
    "model_id": text,
    "config": _mapping,
    "mask_token_id": integer(0),
    "inputs": _list,
    "batch_size": integer(1, 64),
    "image_size": integer(16, 1024),  # image-classification: the side of the square image (the config's image_size)
    "context": integer(2, MAX_CONTEXT),  # text-generation: the KV cache capacity
    "new_tokens": integer(1, 4096),  # text-generation: tokens a run generates by default
    "prompt": text,  # text-generation: the prompt, tokenized when the model's tokenizer is cached
    "output": _supported(tuple(OUTPUTS)),  # fill-mask and causal-lm: which logits the program returns
}


_TORCHVISION_FIELDS: dict[str, Check] = {
    "model": text,  # a torchvision classification model name; checked against torchvision by the builder
    "kwargs": _mapping,
    "image_size": integer(16, 1024),
}


_TIMM_FIELDS: dict[str, Check] = {
    "model": text,  # a timm model name (timm.list_models()); checked against timm by the builder
    "kwargs": _mapping,
    "image_size": integer(16, 1024),  # default: the model's pretrained_cfg input_size
}


def _factory_reference(node: Node, _field: str) -> str:
    value = string(node)
    if not _FACTORY.match(value):
        raise Invalid(f"{value!r} is not 'path/to/file.py:function' or 'package.module:function'")
    return value


_FACTORY_FIELDS: dict[str, Check] = {
    "factory": _factory_reference,
    "kwargs": _mapping,  # passed to the factory function as keyword arguments
}


def _torchvision_problem(found: dict[str, Any], data: dict[str, Any]) -> tuple[str, str] | None:
    """Nothing across fields: the model name and its kwargs are checked against torchvision by the builder."""
    return None


def _huggingface_problem(found: dict[str, Any], data: dict[str, Any]) -> tuple[str, str] | None:
    """The first (field, message) across the fields of a huggingface spec, once each field is valid on its own."""
    task = found["task"]
    if task == "fill-mask" and found.get("mask_token_id") is None:
        return "mask_token_id", "is required for task 'fill-mask' (the [MASK] token id, e.g. 103 for BERT)"
    if "output" in found and task not in OUTPUTS[found["output"]]:
        fits = ", ".join(repr(name) for name, tasks in OUTPUTS.items() if task in tasks)
        return "output", f"{found['output']!r} is not an output of task {task!r}; " + (
            f"its outputs: {fits}" if fits else f"only tasks {', '.join(WRAPPED_TASKS)} choose their output"
        )
    if "image_size" in found and task != IMAGE_TASK:
        return "image_size", f"is for task {IMAGE_TASK!r} only (task {task!r} takes no image)"
    if "seq_len" in found and task not in (*TEXT_TASKS, GENERATION_TASK, "feature-extraction"):
        return "seq_len", f"is for text tasks only (task {task!r} takes no token ids)"
    generation = _generation_problem(found, task)
    if generation is not None:
        return generation
    if "inputs" in found:
        problem = _inputs_problem(data["inputs"], task, found)
        if problem is not None:
            return problem
    elif task == IMAGE_TASK and "image_size" not in found:
        return "image_size", f"is required for task {IMAGE_TASK!r}: the side of the square input image"
    if not found.get("model_id") and not found.get("config") and found["name"] not in BUILTIN_SPECS:
        return "model_id", "give a model_id (HuggingFace id or local folder) or a config for random weights"
    return None


def _fallback_prompt_len(context: int, new_tokens: int) -> int:
    """A text prompt's stand-in when no tokenizer is cached and the spec gives no seq_len: what fits the cache."""
    return max(1, min(ModelSpec.seq_len, context - new_tokens))


def _generation_problem(found: dict[str, Any], task: str) -> tuple[str, str] | None:
    """A text-generation spec's own rules: one sequence, a prompt and its new tokens within the KV cache."""
    for key in ("context", "new_tokens", "prompt"):
        if key in found and task != GENERATION_TASK:
            return key, f"is for task {GENERATION_TASK!r} only (task {task!r} has no KV cache)"
    if task != GENERATION_TASK:
        return None
    if "inputs" in found:
        return "inputs", f"task {GENERATION_TASK!r} takes a prompt of seq_len token ids; give seq_len instead"
    if found.get("batch_size", 1) != 1:
        return "batch_size", f"task {GENERATION_TASK!r} generates one sequence: batch_size must be 1"
    new_tokens = found.get("new_tokens", DEFAULT_NEW_TOKENS)
    context = found.get("context", DEFAULT_CONTEXT)
    prompt = found.get("seq_len", _fallback_prompt_len(context, new_tokens) if "prompt" in found else ModelSpec.seq_len)
    if prompt + new_tokens > context:
        where = "context" if "context" in found else "seq_len" if "seq_len" in found else "new_tokens"
        return where, (
            f"a prompt of seq_len {prompt} and {new_tokens} new tokens need {prompt + new_tokens} positions, more "
            f"than the KV cache's context {context}"
        )
    return None


def _inputs_problem(items: list[Any], task: str, found: dict[str, Any]) -> tuple[str, str] | None:
    """The first (field, message) in a spec's `inputs`: each {name, dtype, shape} one of the task's inputs, with its
    dtype and rank, one batch size, text inputs [batch, seq_len] and an image [batch, C, image_size, image_size]."""
    allowed = TASK_INPUTS[task]
    if not items:
        return "inputs", f"must list at least one input; task {task!r} takes {', '.join(allowed)}"
    seen: list[str] = []
    for index, item in enumerate(items):
        where = f"inputs[{index}]"
        if not isinstance(item, dict) or set(item) != {"name", "dtype", "shape"}:
            return where, 'must be an object with exactly "name", "dtype" and "shape"'
        name, dtype, shape = item["name"], item["dtype"], item["shape"]
        if name not in allowed:
            close = did_you_mean(name, allowed) if isinstance(name, str) else ""
            inputs = ", ".join(allowed)
            return f"{where}.name", f"{name!r} is not an input of task {task!r}; its inputs: {inputs}{close}"
        if name in seen:
            return f"{where}.name", f"{name!r} is declared twice"
        seen.append(name)
        expected_dtype, ranks = INPUT_KINDS[name]
        if dtype != expected_dtype:
            return f"{where}.dtype", f"{name} is {expected_dtype}, got {dtype!r}"
        sizes_ok = isinstance(shape, list) and all(type(size) is int and 1 <= size <= 10**7 for size in shape)
        if not sizes_ok or len(shape) not in ranks:
            rank = " or ".join(str(r) for r in ranks)
            return f"{where}.shape", f"{name} has {rank} dimensions, each from 1 to 10000000, got {shape!r}"
        batch = found.get("batch_size", items[0]["shape"][0] if isinstance(items[0], dict) else 1)
        if shape[0] != batch:
            return f"{where}.shape", f"the first dimension is the batch size, {batch}, got {shape[0]}"
        if name in TEXT_INPUTS and shape[1] != found.get("seq_len", shape[1]):
            return f"{where}.shape", f"{name} is [batch_size, seq_len] = [{batch}, {found['seq_len']}], got {shape}"
        if name in TEXT_INPUTS and shape != next(i["shape"] for i in items if i["name"] in TEXT_INPUTS):
            return f"{where}.shape", "every token input has the shape of the first one"
        if name == IMAGE_INPUT and (shape[2] != shape[3] or shape[2] != found.get("image_size", shape[2])):
            side = found.get("image_size", "image_size")
            return f"{where}.shape", f"the image is square, [batch_size, channels, {side}, {side}], got {shape}"
    if set(allowed) & set(TEXT_INPUTS) and set(seen) & set(TEXT_INPUTS):
        needed = INPUT_NAMES if task in WRAPPED_TASKS else ("input_ids",)
        missing = [name for name in needed if name not in seen]
        if missing:
            return "inputs", f"task {task!r} needs {', '.join(needed)}; missing: {', '.join(missing)}"
    if len({name in TEXT_INPUTS for name in seen}) > 1 or len([n for n in seen if n not in TEXT_INPUTS]) > 1:
        return "inputs", f"one kind of input: token ids (with their mask and types), or one of {', '.join(allowed)}"
    return None


def declared_inputs(items: list[dict[str, Any]]) -> tuple[InputSpec, ...]:
    """A spec file's `inputs` (checked by `_inputs_problem`) as InputSpecs."""
    return tuple(InputSpec(item["name"], item["dtype"], tuple(item["shape"])) for item in items)


@dataclass(frozen=True)
class Source:
    """Where a spec's model comes from: the fields its spec file may set (beyond name, source, description), the
    ones it must, a check across them, and its builder.

    `builder` is "module:object", imported on a cache miss only (it imports torch): an object with
    `check(spec, weights_choice, available) -> SpecCheck`, `load(spec, weights_choice) -> LoadedModel` and
    `example_inputs(spec, module) -> list[NamedTensor]` (models.py dispatches to it; spec_errors.py says how it
    refuses a spec; tests/lowering/test_spec.py ties
    them).
    """

    name: str
    builder: str
    fields: dict[str, Check]
    required: tuple[str, ...]
    problem: Callable[[dict[str, Any], dict[str, Any]], tuple[str, str] | None]
    # Spec-file field -> ModelSpec field where they differ, and ModelSpec fields the source fixes.
    renames: dict[str, str] = field(default_factory=dict)
    fixed: dict[str, Any] = field(default_factory=dict)
    # Whether pretrained weights can be had now without the network: "module:function" of a torch-free function
    # `(spec) -> weights.Availability` (weights.py). None: the source's modules bring their own weights.
    pretrained: str | None = None
    # `kwargs` keys that decide where the weights come from, which only etlab's weights choice decides.
    refused_kwargs: frozenset[str] = frozenset()
    # "module:function" filling in defaults that need the source's library (imported then): `(spec) -> spec`.
    defaults: str | None = None


SOURCES: dict[str, Source] = {
    s.name: s
    for s in (
        Source(
            "huggingface",
            "orchestrator.lowering.huggingface_source:HUGGINGFACE",
            _HUGGINGFACE_FIELDS,
            ("model_type", "task"),
            _huggingface_problem,
            pretrained="orchestrator.lowering.weights:huggingface_pretrained",
        ),
        Source(
            "torchvision",
            "orchestrator.lowering.torchvision_source:TORCHVISION",
            _TORCHVISION_FIELDS,
            ("model", "image_size"),
            _torchvision_problem,
            renames={"model": "model_type"},
            fixed={"task": IMAGE_TASK},
            pretrained="orchestrator.lowering.weights:torchvision_pretrained",
            refused_kwargs=TORCHVISION_REFUSED,
        ),
        Source(
            "timm",
            "orchestrator.lowering.timm_source:TIMM",
            _TIMM_FIELDS,
            ("model",),
            _torchvision_problem,
            renames={"model": "model_type"},
            fixed={"task": IMAGE_TASK},
            pretrained="orchestrator.lowering.weights:timm_pretrained",
            refused_kwargs=TIMM_REFUSED,
            defaults="orchestrator.lowering.timm_source:with_defaults",
        ),
        Source(
            "factory",
            "orchestrator.lowering.factory_source:FACTORY",
            _FACTORY_FIELDS,
            ("factory",),
            _torchvision_problem,
            fixed={"task": FACTORY_TASK, "model_type": "factory"},
        ),
    )
}
DEFAULT_SOURCE = "huggingface"


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
        elif any(isinstance(v, float) and not math.isfinite(v) for v in _leaves(value)):
            message = f"expected a finite number, got {value!r}"
        else:
            continue
        problems.append((where, name, message))
    return problems


def _kwargs_problems(node: Node, values: dict[str, Any], source: Source) -> list[tuple[Node, str, str]]:
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


def _leaves(value: Any) -> list[Any]:
    """The scalars inside nested lists and mappings (iterative: JSON may nest deeper than Python recurses)."""
    leaves, pending = [], [value]
    while pending:
        item = pending.pop()
        if isinstance(item, dict):
            pending.extend(item.values())
        elif isinstance(item, list):
            pending.extend(item)
        else:
            leaves.append(item)
    return leaves


def _field_node(root: Node, key: str) -> Node | None:
    """The node of `name`, `inputs[1]` or `inputs[1].dtype` in the spec file (its line is the field's)."""
    found = re.fullmatch(r"(\w+)(?:\[(\d+)\])?(?:\.(\w+))?", key)
    if found is None:
        return None
    node = value_node(root, found[1])
    if found[2] is not None and isinstance(node, SequenceNode) and int(found[2]) < len(node.value):
        node = node.value[int(found[2])]
        if found[3] is not None:
            node = value_node(node, found[3]) or node
    return node


def _huge_numbers(root: Node) -> list[tuple[Node, str]]:
    """Every integer of the spec beyond ±(2**63-1) (a 400-digit vocab_size), with its field path."""
    found: list[tuple[Node, str]] = []
    pending: list[tuple[Node, str]] = [(root, "")]
    while pending:
        node, name = pending.pop()
        if isinstance(node, MappingNode):
            pending += [(value, f"{name}.{key.value}" if name else str(key.value)) for key, value in node.value]
        elif isinstance(node, SequenceNode):
            pending += [(item, f"{name}[{index}]") for index, item in enumerate(node.value)]
        elif (
            isinstance(node, ScalarNode)
            and _LONG_INTEGER.fullmatch(node.value)
            and abs(int(node.value)) > MAX_MAGNITUDE
        ):
            found.append((node, name))
    return sorted(found, key=lambda item: line_of(item[0]))


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
    checker = _SpecChecker(path)
    for node, name in _huge_numbers(root):
        checker.error(node, name, f"a number of {len(str(node.value).lstrip('-'))} digits, beyond any size or id")
    if checker.problems:  # nothing downstream has to guard its arithmetic against them
        raise fail("\n".join(checker.errors))
    source_name = data.get("source", DEFAULT_SOURCE)
    source = SOURCES.get(source_name) if isinstance(source_name, str) else None
    if source is None:
        where = value_node(root, "source") or root
        known = ", ".join(SOURCES)
        close = did_you_mean(source_name, SOURCES) if isinstance(source_name, str) else ""
        checker.error(where, "source", f"{source_name!r} is not a model source; known: {known}{close}")
        raise fail("\n".join(checker.errors))
    found = checker.fields(root, "", _COMMON_FIELDS | source.fields)
    for key in ("name", *source.required):
        if key not in data:
            checker.error(root, key, "is required")
    config_node = value_node(root, "config")
    if "config" in found and isinstance(config_node, MappingNode):
        found["config"] = dict(data["config"])  # as JSON reads them; the nodes give the lines
        for where, name, message in _config_problems(config_node, found["config"]):
            checker.error(where, name, message)
    kwargs_node = value_node(root, "kwargs")
    if "kwargs" in found and isinstance(kwargs_node, MappingNode):
        found["kwargs"] = dict(data["kwargs"])
        for where, name, message in _kwargs_problems(kwargs_node, found["kwargs"], source):
            checker.error(where, name, message)
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
        checker.error(_field_node(root, key) or root, key, message)
        return fail("\n".join(checker.errors))

    across = source.problem(found, data)
    if across is not None:
        raise problem(*across)
    if "factory" in found:  # a relative file is relative to the spec file's folder
        found["factory"] = _resolved_factory(found["factory"], path.parent)
    known = {f.name for f in fields(ModelSpec)} - {"source", "model_source", "lines", "trust_remote_code", "trust_code"}
    found = {source.renames.get(key, key): value for key, value in found.items()}
    given = {key: value for key, value in found.items() if key in known} | source.fixed
    for key in ("config", "kwargs"):
        if key in given:
            given[key] = dict(given[key])
    if data.get("inputs") and source.name == "huggingface":  # checked: the sizes they fix are the spec's
        inputs = declared_inputs(data["inputs"])
        given["declared_inputs"] = inputs
        given.setdefault("batch_size", inputs[0].shape[0])
        if inputs[0].name in TEXT_INPUTS:
            given.setdefault("seq_len", inputs[0].shape[1])
        if inputs[0].name == IMAGE_INPUT:
            given.setdefault("image_size", inputs[0].shape[2])
    if given.get("task") == GENERATION_TASK and "prompt" in given:  # seq_len: the stand-in without a tokenizer
        context = given.get("context") or DEFAULT_CONTEXT
        given.setdefault("seq_len", _fallback_prompt_len(context, given.get("new_tokens", DEFAULT_NEW_TOKENS)))
    return ModelSpec(**given, source=str(path), model_source=source.name, lines=spec_lines)


def _resolved_factory(reference: str, folder: Path) -> str:
    """`file.py:function` with the file made absolute (against `folder`); a module path as it is."""
    where, _, name = reference.rpartition(":")
    if not where.endswith(".py"):
        return reference
    return f"{(folder / where).resolve()}:{name}"


def factory_file(reference: str) -> Path | None:
    """The file a factory reference names, found without running anything (no package is imported), or None."""
    import importlib.util  # only factory specs need it

    where = reference.rpartition(":")[0]
    if where.endswith(".py"):
        return Path(where)
    top, *rest = where.split(".")
    try:
        found = importlib.util.find_spec(top)  # a top-level name: found, never imported
    except (ImportError, ValueError):
        return None
    if found is None:
        return None
    path = Path(found.origin) if found.origin and found.origin not in ("built-in", "frozen") else None
    folders = [Path(folder) for folder in found.submodule_search_locations or ()]
    for part in rest:
        candidates = [c for f in folders for c in (f / f"{part}.py", f / part / "__init__.py") if c.is_file()]
        if not candidates:
            return None
        path, folders = candidates[0], [candidates[0].parent] if candidates[0].name == "__init__.py" else []
    return path


def factory_digest(reference: str) -> str:
    """sha256 of the factory's file (the one file it names; what it imports is not followed), "missing" if none."""
    import hashlib  # only factory specs need it

    path = factory_file(reference)
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest() if path is not None else "missing"
    except OSError:
        return "missing"
