"""Turn a ModelSpec into an exportable torch module, its reference inputs, and its weights story.

`check_spec`, `load_model` and `example_inputs` go to the builder of the spec's source (spec.py SOURCES):
`huggingface_source.HUGGINGFACE` (transformers, any family and task), `torchvision_source.TORCHVISION`, ...
How a builder refuses a spec is spec_errors.py.
"""

from __future__ import annotations

import importlib
import importlib.machinery
import importlib.util
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import torch

from orchestrator.errors import SpecError
from orchestrator.lowering.spec import SOURCES, SPEC_HINT, ModelSpec

# Deciding the weights needs no torch, so it lives in weights.py.
from orchestrator.lowering.weights import WeightsChoice, resolve_weights
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


@dataclass(frozen=True)
class SpecCheck:
    """What `check_spec` found: the config the model will be built from (None for a source without one), its
    parameter count, and what the spec says that is accepted but deserves a look (`file:line: field: message`:
    a config key its class does not declare, one ignored)."""

    config: Any
    parameters: int
    warnings: tuple[str, ...] = ()


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


def vocab_size_of(module: torch.nn.Module) -> int:
    """The vocabulary of a token model's config (the wrapped model's)."""
    inner: Any = getattr(module, "model", module)  # a HuggingFace model: its config's fields differ per family
    return int(inner.config.vocab_size)
