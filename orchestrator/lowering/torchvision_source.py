"""The `torchvision` model source: a torchvision classification model, as a user would export it.

A spec names the model (`torchvision.models.list_models(module=torchvision.models)`), its constructor's keyword
arguments (JSON scalars only, each a parameter of the model class with a scalar default: nothing that names code),
and the side of its square input image. The program is the model itself, in eval mode, with no rewrite: one float32
input `pixel_values` [1, 3, H, W], the class logits [1, classes] out.

Weights: random (seeded), or torchvision's default checkpoint when it is already in the torch hub cache
($TORCH_HOME/hub/checkpoints), read with `torch.load(weights_only=True)`; etlab never downloads one.

torchvision is imported here only, on a cache miss of a torchvision spec (`spec.SOURCES` names this module).
"""

from __future__ import annotations

import inspect
import typing
from typing import Any

import numpy as np
import torch

from orchestrator import console
from orchestrator.config import did_you_mean, field_path
from orchestrator.errors import SpecError
from orchestrator.lowering.models import LoadedModel, SpecCheck
from orchestrator.lowering.spec import IMAGE_INPUT, TORCHVISION_REFUSED, ModelSpec
from orchestrator.lowering.spec_errors import FLOAT_BYTES, brief, kwarg_problem, spec_failure, too_large
from orchestrator.lowering.weights import (
    RANDOM_SEED,
    PretrainedUnavailable,
    WeightsChoice,
    torch_hub_checkpoints,
    torchvision_pretrained,
)
from orchestrator.tensorfile import NamedTensor

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
_SCALARS = (bool, int, float, str)


def _torchvision() -> Any:
    """`torchvision.models`, imported now (models.declare_torchvision_ops, run when models.py loads, made sure a
    torchvision whose C++ operators do not load with this torch imports all the same)."""
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
    signature = inspect.signature(_model_class(name).__init__)
    return {
        parameter.name: parameter.default
        for parameter in signature.parameters.values()
        if parameter.name not in TORCHVISION_REFUSED and isinstance(parameter.default, _SCALARS)
    }


def _check(spec: ModelSpec, choice: WeightsChoice, available: int | None) -> SpecCheck:
    names = classification_models()
    if spec.model_type not in names:
        close = did_you_mean(spec.model_type, names)
        raise spec_failure([("model", f"{spec.model_type!r} is not a torchvision classification model{close}")], spec)
    if spec.image_size is None:
        raise spec_failure([("image_size", "is required")], spec)
    allowed = constructor_parameters(spec.model_type)
    problems = []
    for key, value in spec.kwargs.items():
        message = kwarg_problem(key, value, allowed, f"torchvision's {spec.model_type}")
        if message is not None:
            problems.append((field_path("kwargs", key), message))
    if problems:
        raise spec_failure(problems, spec)
    if choice.mode == "pretrained":
        found = torchvision_pretrained(spec)
        if not found.available:
            raise PretrainedUnavailable(spec.problem("model", f"no pretrained weights: {found.reason}"))
    try:
        with torch.device("meta"):
            model = _build(spec).eval()
            parameters = _count(model)
            model(torch.empty(1, 3, spec.image_size, spec.image_size))
    except Exception as exc:  # the constructor's own checks, or an image too small for the network
        origin = "kwargs" if spec.kwargs else "image_size"
        raise spec_failure([(origin, f"the model cannot be built and run this way: {brief(exc)}")], spec) from exc
    if available is not None and FLOAT_BYTES * parameters > available:
        raise spec_failure([("model", too_large(parameters, available, ""))], spec)
    return SpecCheck(None, parameters)


def _build(spec: ModelSpec) -> torch.nn.Module:
    return _torchvision().get_model(spec.model_type, weights=None, **spec.kwargs)


def _pretrained_state(spec: ModelSpec) -> tuple[dict[str, Any], str]:
    """torchvision's default checkpoint of the model, from the torch hub cache only (never downloaded)."""
    weights = _torchvision().get_model_weights(spec.model_type).DEFAULT
    path = torch_hub_checkpoints() / weights.url.rsplit("/", 1)[-1]
    if not path.is_file():
        raise PretrainedUnavailable(f"{weights} is not in the torch hub cache ({path} is missing)")
    try:
        return torch.load(path, map_location="cpu", weights_only=True), f"{weights} from {path}"
    except Exception as exc:
        raise PretrainedUnavailable(f"cannot read {path}: {brief(exc)}") from exc


def _load(spec: ModelSpec, choice: WeightsChoice) -> LoadedModel:
    if choice.mode == "pretrained":
        try:
            state, note = _pretrained_state(spec)
        except PretrainedUnavailable as exc:
            if choice.requested != "auto":
                raise
            choice = WeightsChoice("auto", "random", str(exc), fallback=True)
        else:
            module = _build(spec)
            module.load_state_dict(state)
            return LoadedModel(module.eval(), "pretrained", note, _count(module))
    if choice.fallback:
        console.loud_warning(
            f"pretrained weights for torchvision's {spec.model_type} are unavailable ({choice.reason}).\n"
            f"Falling back to RANDOM weights (seed {RANDOM_SEED}): timings are representative, outputs are not."
        )
    torch.manual_seed(RANDOM_SEED)
    module = _build(spec)
    note = f"random (seed {RANDOM_SEED})"
    if choice.requested == "auto" and choice.fallback:
        note += f"; pretrained unavailable: {choice.reason}"
    return LoadedModel(module.eval(), "random", note, _count(module))


def _count(module: torch.nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def _random_image(rng: np.random.Generator, size: int) -> np.ndarray:
    """Uniform RGB in [0, 1] as torchvision's transforms hand it to the model: normalised with the ImageNet mean
    and std, float32 [1, 3, size, size]."""
    pixels = rng.random((1, 3, size, size), dtype=np.float32)
    mean = np.asarray(IMAGENET_MEAN, dtype=np.float32).reshape(1, 3, 1, 1)
    std = np.asarray(IMAGENET_STD, dtype=np.float32).reshape(1, 3, 1, 1)
    return ((pixels - mean) / std).astype(np.float32)


def reference_image(size: int) -> np.ndarray:
    """The deterministic reference image."""
    return _random_image(np.random.default_rng(RANDOM_SEED), size)


def generated_images(size: int, samples: int) -> list[tuple[torch.Tensor]]:
    """Calibration samples (int8-static): the reference image, then other seeded normalised images."""
    rng = np.random.default_rng(RANDOM_SEED + 1)
    images = [reference_image(size), *(_random_image(rng, size) for _ in range(samples - 1))]
    return [(torch.from_numpy(image),) for image in images]


class Torchvision:
    """The `torchvision` source (spec.py SOURCES)."""

    def check(self, spec: ModelSpec, choice: WeightsChoice, available: int | None) -> SpecCheck:
        return _check(spec, choice, available)

    def load(self, spec: ModelSpec, choice: WeightsChoice) -> LoadedModel:
        return _load(spec, choice)

    def example_inputs(self, spec: ModelSpec, module: torch.nn.Module) -> list[NamedTensor]:
        assert spec.image_size is not None
        return [NamedTensor(IMAGE_INPUT, reference_image(spec.image_size))]


TORCHVISION = Torchvision()
