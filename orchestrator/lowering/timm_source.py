"""The `timm` model source: a timm image model (`timm.create_model`), as a user would export it.

A spec names the model (one of `timm.list_models()`), its keyword arguments (JSON scalars, each a parameter of the
model's class with a scalar default; nothing that fetches or reads files: spec.TIMM_REFUSED), and optionally the
side of its square input image (default: the model's pretrained_cfg input_size, filled in by `with_defaults`). The
program is the model itself, in eval mode, with no rewrite: one float32 input `pixel_values` [1, 3, H, W],
normalised with the model's own pretrained_cfg mean and std, the class logits out.

Weights: random (seeded), or the model's default weights when timm's `model.safetensors` is already in the
HuggingFace cache (read with safetensors: no unpickling); etlab never downloads them.

timm is imported here only, on a cache miss of a timm spec (`spec.SOURCES` names this module), after
models.declare_torchvision_ops (timm imports torchvision).
"""

from __future__ import annotations

import inspect
from dataclasses import replace
from typing import Any

import numpy as np
import torch

from orchestrator import console
from orchestrator.config import did_you_mean, field_path
from orchestrator.errors import SpecError
from orchestrator.lowering.models import LoadedModel, SpecCheck, declare_torchvision_ops
from orchestrator.lowering.spec import IMAGE_INPUT, SPEC_HINT, TIMM_REFUSED, ModelSpec
from orchestrator.lowering.spec_errors import brief, kwarg_problem, spec_failure, too_large
from orchestrator.lowering.weights import (
    RANDOM_SEED,
    TIMM_WEIGHTS_FILE,
    PretrainedUnavailable,
    WeightsChoice,
    cached_hub_file,
    timm_pretrained,
)
from orchestrator.tensorfile import NamedTensor

_FLOAT_BYTES = 4
_SCALARS = (bool, int, float, str)


def _timm() -> Any:
    declare_torchvision_ops()  # timm imports torchvision
    import timm

    return timm


def _known(spec: ModelSpec) -> None:
    names = _timm().list_models()
    if spec.model_type not in names:
        close = did_you_mean(spec.model_type, names)
        raise spec_failure([("model", f"{spec.model_type!r} is not a timm model{close}")], spec)


def pretrained_cfg(name: str) -> dict[str, Any]:
    """The model's default pretrained_cfg (input size, mean, std, hub id), without building it."""
    found = _timm().models.get_pretrained_cfg(name)
    return found.to_dict() if found is not None else {}


def with_defaults(spec: ModelSpec) -> ModelSpec:
    """`image_size` from the model's pretrained_cfg when the spec leaves it out (spec.SOURCES `defaults`)."""
    if spec.image_size is not None:
        return spec
    _known(spec)
    size = pretrained_cfg(spec.model_type).get("input_size") or (3, 224, 224)
    return replace(spec, image_size=int(size[-1]))


def constructor_parameters(spec: ModelSpec) -> dict[str, Any]:
    """The parameters of the model's class a spec may set: name -> default, those whose default is a JSON scalar."""
    with torch.device("meta"):
        model_class = type(_timm().create_model(spec.model_type))
    signature = inspect.signature(model_class.__init__)
    return {
        parameter.name: parameter.default
        for parameter in signature.parameters.values()
        if parameter.name not in TIMM_REFUSED and isinstance(parameter.default, _SCALARS)
    }


def _check(spec: ModelSpec, choice: WeightsChoice, available: int | None) -> SpecCheck:
    _known(spec)
    if spec.image_size is None:
        raise spec_failure([("image_size", "is required")], spec)
    allowed = constructor_parameters(spec)
    problems = []
    for key, value in spec.kwargs.items():
        message = kwarg_problem(key, value, allowed, f"timm's {spec.model_type}")
        if message is not None:
            problems.append((field_path("kwargs", key), message.replace("torchvision's", "timm's")))
    if problems:
        raise spec_failure(problems, spec)
    if choice.mode == "pretrained":
        found = timm_pretrained(spec)
        if not found.available:
            raise PretrainedUnavailable(spec.problem("model", f"no pretrained weights: {found.reason}"))
    try:
        with torch.device("meta"):
            model = _build(spec).eval()
            parameters = _count(model)
            model(torch.empty(1, 3, spec.image_size, spec.image_size))
    except Exception as exc:  # the constructor's own checks, or an image the network does not take
        origin = "kwargs" if spec.kwargs else "image_size"
        raise spec_failure([(origin, f"the model cannot be built and run this way: {brief(exc)}")], spec) from exc
    if available is not None and _FLOAT_BYTES * parameters > available:
        raise spec_failure([("model", too_large(parameters, available, ""))], spec)
    return SpecCheck(None, parameters)


def _build(spec: ModelSpec) -> torch.nn.Module:
    return _timm().create_model(spec.model_type, pretrained=False, **spec.kwargs)


def _pretrained_state(spec: ModelSpec) -> tuple[dict[str, Any], str]:
    """The model's default weights from the HuggingFace cache only (never downloaded), read with safetensors."""
    hub_id = pretrained_cfg(spec.model_type).get("hf_hub_id")
    path = cached_hub_file(hub_id, TIMM_WEIGHTS_FILE) if hub_id else None
    if path is None:
        where = f"timm's {hub_id}" if hub_id else f"{spec.model_type} (timm names no hub weights for it)"
        raise PretrainedUnavailable(f"{where}: {TIMM_WEIGHTS_FILE} is not in the HuggingFace cache")
    from safetensors.torch import load_file  # comes with timm; only pretrained timm models need it

    try:
        return load_file(str(path)), f"timm {hub_id} from {path}"
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
            try:
                module.load_state_dict(state)
            except RuntimeError as exc:  # a cached file of another tag or layout
                message = spec.problem("model", f"timm's weights do not fit: {brief(exc)}")
                raise SpecError(message, hint=SPEC_HINT) from exc
            return LoadedModel(module.eval(), "pretrained", note, _count(module))
    if choice.fallback:
        console.loud_warning(
            f"pretrained weights for timm's {spec.model_type} are unavailable ({choice.reason}).\n"
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


def reference_image(spec: ModelSpec) -> np.ndarray:
    """The deterministic reference image: uniform RGB in [0, 1] normalised with the model's own mean and std, as
    timm's transforms hand it to the model, float32 [1, 3, size, size]."""
    assert spec.image_size is not None
    cfg = pretrained_cfg(spec.model_type)
    channels = 3
    mean = np.asarray(cfg.get("mean") or (0.5,) * channels, dtype=np.float32).reshape(1, channels, 1, 1)
    std = np.asarray(cfg.get("std") or (0.5,) * channels, dtype=np.float32).reshape(1, channels, 1, 1)
    rng = np.random.default_rng(RANDOM_SEED)
    pixels = rng.random((1, channels, spec.image_size, spec.image_size), dtype=np.float32)
    return ((pixels - mean) / std).astype(np.float32)


class Timm:
    """The `timm` source (spec.py SOURCES)."""

    def check(self, spec: ModelSpec, choice: WeightsChoice, available: int | None) -> SpecCheck:
        return _check(spec, choice, available)

    def load(self, spec: ModelSpec, choice: WeightsChoice) -> LoadedModel:
        return _load(spec, choice)

    def example_inputs(self, spec: ModelSpec, module: torch.nn.Module) -> list[NamedTensor]:
        return [NamedTensor(IMAGE_INPUT, reference_image(spec))]


TIMM = Timm()
