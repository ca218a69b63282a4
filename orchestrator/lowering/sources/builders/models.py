"""Turn a ModelSpec into an exportable torch module, its reference inputs, and its weights story.

`check_spec`, `load_model` and `example_inputs` go to the builder of the spec's source (its record: sources/):
`builders/huggingface.py`'s `HUGGINGFACE` (transformers, any family and task), `builders/torchvision.py`'s
`TORCHVISION`, ...
How a builder refuses a spec is spec_errors.py; what a source decides beyond loading (its inputs before it loads,
their kind, generated calibration samples) is its builder's too, with `SourceBuilder`'s defaults.
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from orchestrator.errors import SpecError
from orchestrator.lowering.spec import IMAGE_INPUT, SOURCES, SPEC_HINT, InputSpec, ModelSpec

# Deciding the weights needs no torch, so it lives in weights.py.
from orchestrator.lowering.weights import WeightsChoice, resolve_weights
from orchestrator.tensorfile import NamedTensor


@dataclass
class LoadedModel:
    module: torch.nn.Module
    weights: str  # "pretrained" or "random"
    weights_note: str
    parameters: int


@dataclass(frozen=True)
class SpecCheck:
    """What `check_spec` found: the config the model will be built from (None for a source without one), its
    parameter count, and what the spec says that is accepted but deserves a look (`file:line: field: message`:
    a config key its class does not declare, one ignored)."""

    config: Any
    parameters: int
    warnings: tuple[str, ...] = ()


# What a model takes, for its calibration (lower.py says what int8-static is calibrated on without a file, per
# kind): token ids, images, audio, or the source's own example inputs (a module etlab knows nothing of).
TOKENS, IMAGES, AUDIO, OWN = "tokens", "images", "audio", "own"


class ModelBuilder(Protocol):
    """What a model source's builder does (`spec.ModelSource.builder` names one); `SourceBuilder` gives the defaults
    of the last three."""

    def check(self, spec: ModelSpec, choice: WeightsChoice, available: int | None) -> SpecCheck: ...
    def load(self, spec: ModelSpec, choice: WeightsChoice) -> LoadedModel: ...
    def example_inputs(self, spec: ModelSpec, module: torch.nn.Module) -> list[NamedTensor]: ...
    def known_inputs(self, spec: ModelSpec, config: Any) -> tuple[InputSpec, ...]: ...
    def input_kind(self, spec: ModelSpec, names: Sequence[str]) -> str: ...
    def calibration(
        self, spec: ModelSpec, module: torch.nn.Module, example_args: tuple[torch.Tensor, ...], kind: str, samples: int
    ) -> tuple[list[tuple[torch.Tensor, ...]], str]: ...


class SourceBuilder:
    """The build side's defaults: a source overrides what it decides itself."""

    def known_inputs(self, spec: ModelSpec, config: Any) -> tuple[InputSpec, ...]:
        """The model's inputs as far as the spec and its config decide them, before it loads."""
        return spec.inputs

    def input_kind(self, spec: ModelSpec, names: Sequence[str]) -> str:
        """What the model takes (TOKENS, IMAGES, AUDIO or OWN), from its inputs' names."""
        if spec.image_side is not None or IMAGE_INPUT in names:
            return IMAGES
        if {"input_values", "input_features"} & set(names):
            return AUDIO
        return TOKENS

    def calibration(
        self, spec: ModelSpec, module: torch.nn.Module, example_args: tuple[torch.Tensor, ...], kind: str, samples: int
    ) -> tuple[list[tuple[torch.Tensor, ...]], str]:
        """Generated calibration samples for inputs that are not token ids (lower.py makes those), and what they
        are (`kind`: what `input_kind` said); the default: the example inputs, one sample."""
        return [example_args], f"the {spec.model_source} source's example inputs (one sample)"


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


def vocab_size_of(module: torch.nn.Module) -> int:
    """The vocabulary of a token model's config (the wrapped model's)."""
    inner: Any = getattr(module, "model", module)  # a HuggingFace model: its config's fields differ per family
    return int(inner.config.vocab_size)
