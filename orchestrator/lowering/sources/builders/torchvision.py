"""The `torchvision` model source: a torchvision classification model, as a user would export it.

A spec names the model (`torchvision.models.list_models(module=torchvision.models)`), its constructor's keyword
arguments (JSON scalars only, each a parameter of the model class with a scalar default: nothing that names code),
and the side of its square input image. The program is the model itself, in eval mode, with no rewrite: one float32
input `pixel_values` [1, 3, H, W], the class logits [1, classes] out.

Weights: random (seeded), or torchvision's default checkpoint when it is already in the torch hub cache
($TORCH_HOME/hub/checkpoints), read with `torch.load(weights_only=True)`; etlab never downloads one.

torchvision is imported here only, on a cache miss of a torchvision spec (`sources/torchvision.py` names this module).
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import inspect
import sys
import typing
from pathlib import Path
from typing import Any

import numpy as np
import torch

from orchestrator.errors import SpecError
from orchestrator.lowering.quantize.calibration import shaped_like
from orchestrator.lowering.sources.builders.image_classifiers import (
    ImageClassifierSource,
    normalised_image,
    scalar_parameters,
)
from orchestrator.lowering.sources.torchvision import TORCHVISION_REFUSED, TorchvisionOptions, torchvision_pretrained
from orchestrator.lowering.spec import ClassifierOptions, ModelSpec
from orchestrator.lowering.spec_errors import brief
from orchestrator.lowering.weights import (
    RANDOM_SEED,
    Availability,
    PretrainedUnavailable,
    torch_hub_checkpoints,
)

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


IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


def _torchvision() -> Any:
    """`torchvision.models`, imported now (declare_torchvision_ops first: a torchvision whose C++ operators do not
    load with this torch imports all the same)."""
    declare_torchvision_ops()
    import torchvision.models

    return torchvision.models


def classification_models() -> list[str]:
    models = _torchvision()
    return list(models.list_models(module=models))


def _model_class(name: str) -> type:
    """The class the builder `torchvision.models.<name>` returns (its keyword arguments go to its constructor)."""
    builder = _torchvision().get_model_builder(name)
    try:
        returned = typing.get_type_hints(builder).get("return")
    except Exception:  # an annotation that does not resolve
        returned = inspect.signature(builder).return_annotation
    if not isinstance(returned, type):
        raise SpecError(f"torchvision.models.{name} does not say which class it builds")
    return returned


def constructor_parameters(name: str) -> dict[str, Any]:
    """The constructor parameters a spec may set: name -> default, those whose default is a JSON scalar."""
    return scalar_parameters(_model_class(name), TORCHVISION_REFUSED)


def reference_image(size: int) -> np.ndarray:
    """The deterministic reference image, ImageNet-normalised as torchvision's transforms hand it to the model."""
    return normalised_image(np.random.default_rng(RANDOM_SEED), size, IMAGENET_MEAN, IMAGENET_STD)


def generated_images(size: int, samples: int) -> list[tuple[torch.Tensor]]:
    """Calibration samples (int8-static): the reference image, then other seeded normalised images."""
    rng = np.random.default_rng(RANDOM_SEED + 1)
    others = (normalised_image(rng, size, IMAGENET_MEAN, IMAGENET_STD) for _ in range(samples - 1))
    return [(torch.from_numpy(image),) for image in (reference_image(size), *others)]


def image_calibration(
    spec: ModelSpec, example_args: tuple[torch.Tensor, ...], samples: int
) -> tuple[list[tuple[torch.Tensor, ...]], str]:
    """An image classifier's calibration without a file (torchvision's and timm's alike)."""
    side = spec.options_of(ClassifierOptions).image_size
    assert side is not None  # both sources require or default it
    generated = shaped_like(generated_images(side, samples), example_args)
    return generated, "generated: deterministic random images, ImageNet-normalised (not real photos)"


class Torchvision(ImageClassifierSource):
    """The `torchvision` source's build side (its record: sources/torchvision.py)."""

    library = "torchvision"
    catalogue = "torchvision classification model"

    def models(self) -> list[str]:
        return classification_models()

    def parameters(self, spec: ModelSpec) -> dict[str, Any]:
        return constructor_parameters(spec.model_type)

    def build(self, spec: ModelSpec) -> torch.nn.Module:
        return _torchvision().get_model(spec.model_type, weights=None, **spec.options_of(TorchvisionOptions).kwargs)

    def pretrained_found(self, spec: ModelSpec) -> Availability:
        return torchvision_pretrained(spec)

    def pretrained_state(self, spec: ModelSpec) -> tuple[dict[str, Any], str]:
        """torchvision's default checkpoint of the model, from the torch hub cache only (never downloaded)."""
        weights = _torchvision().get_model_weights(spec.model_type).DEFAULT
        path = torch_hub_checkpoints() / weights.url.rsplit("/", 1)[-1]
        if not path.is_file():
            raise PretrainedUnavailable(f"{weights} is not in the torch hub cache ({path} is missing)")
        try:
            return torch.load(path, map_location="cpu", weights_only=True), f"{weights} from {path}"
        except Exception as exc:
            raise PretrainedUnavailable(f"cannot read {path}: {brief(exc)}") from exc

    def calibration(
        self, spec: ModelSpec, module: torch.nn.Module, example_args: tuple[torch.Tensor, ...], kind: str, samples: int
    ) -> tuple[list[tuple[torch.Tensor, ...]], str]:
        return image_calibration(spec, example_args, samples)

    def mean_std(self, spec: ModelSpec) -> tuple[Any, Any]:
        return IMAGENET_MEAN, IMAGENET_STD


TORCHVISION = Torchvision()
