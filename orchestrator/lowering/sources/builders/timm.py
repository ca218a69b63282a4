"""The `timm` model source: a timm image model (`timm.create_model`), as a user would export it.

A spec names the model (one of `timm.list_models()`), its keyword arguments (JSON scalars, each a parameter of the
model's class with a scalar default; nothing that fetches or reads files: spec.TIMM_REFUSED), and optionally the
side of its square input image (default: the model's pretrained_cfg input_size, filled in by `with_defaults`). The
program is the model itself, in eval mode, with no rewrite: one float32 input `pixel_values` [1, 3, H, W],
normalised with the model's own pretrained_cfg mean and std, the class logits out.

Weights: random (seeded), or the model's default weights when timm's `model.safetensors` is already in the
HuggingFace cache (read with safetensors: no unpickling); etlab never downloads them.

timm is imported here only, on a cache miss of a timm spec (`sources/timm.py` names this module), after
torchvision.declare_torchvision_ops (timm imports torchvision).
"""

from __future__ import annotations

from typing import Any

import torch

from orchestrator.lowering.sources.builders.image_classifiers import ImageClassifierSource, scalar_parameters
from orchestrator.lowering.sources.builders.torchvision import declare_torchvision_ops, image_calibration
from orchestrator.lowering.sources.timm import TIMM_REFUSED, TimmOptions, timm_pretrained
from orchestrator.lowering.spec import ModelSpec
from orchestrator.lowering.spec_errors import brief
from orchestrator.lowering.weights import (
    TIMM_WEIGHTS_FILE,
    Availability,
    PretrainedUnavailable,
    cached_hub_file,
)


def _timm() -> Any:
    declare_torchvision_ops()  # timm imports torchvision
    import timm

    return timm


def pretrained_cfg(name: str) -> dict[str, Any]:
    """The model's default pretrained_cfg (input size, mean, std, hub id), without building it."""
    found = _timm().models.get_pretrained_cfg(name)
    return found.to_dict() if found is not None else {}


def with_defaults(spec: ModelSpec) -> ModelSpec:
    """`image_size` from the model's pretrained_cfg when the spec leaves it out (spec.SOURCES `defaults`)."""
    if spec.options_of(TimmOptions).image_size is not None:
        return spec
    TIMM.known(spec)
    size = pretrained_cfg(spec.model_type).get("input_size") or (3, 224, 224)
    return spec.with_options(image_size=int(size[-1]))


def constructor_parameters(spec: ModelSpec) -> dict[str, Any]:
    """The parameters of the model's class a spec may set: name -> default, those whose default is a JSON scalar."""
    with torch.device("meta"):
        model_class = type(_timm().create_model(spec.model_type))
    return scalar_parameters(model_class, TIMM_REFUSED)


class Timm(ImageClassifierSource):
    """The `timm` source's build side (its record: sources/timm.py)."""

    library = "timm"
    catalogue = "timm model"

    def models(self) -> list[str]:
        return list(_timm().list_models())

    def parameters(self, spec: ModelSpec) -> dict[str, Any]:
        return constructor_parameters(spec)

    def build(self, spec: ModelSpec) -> torch.nn.Module:
        return _timm().create_model(spec.model_type, pretrained=False, **spec.options_of(TimmOptions).kwargs)

    def pretrained_found(self, spec: ModelSpec) -> Availability:
        return timm_pretrained(spec)

    def pretrained_state(self, spec: ModelSpec) -> tuple[dict[str, Any], str]:
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

    def calibration(
        self, spec: ModelSpec, module: torch.nn.Module, example_args: tuple[torch.Tensor, ...], kind: str, samples: int
    ) -> tuple[list[tuple[torch.Tensor, ...]], str]:
        return image_calibration(spec, example_args, samples)

    def mean_std(self, spec: ModelSpec) -> tuple[Any, Any]:
        """The model's own, from its pretrained_cfg (ImageNet's for most)."""
        cfg = pretrained_cfg(spec.model_type)
        return cfg.get("mean") or (0.5, 0.5, 0.5), cfg.get("std") or (0.5, 0.5, 0.5)


TIMM = Timm()
