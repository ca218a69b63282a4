"""The `timm` model source, spec side (no torch): a timm model by name, its keyword arguments (JSON scalars) and
optionally the side of its square input image (default: the model's pretrained_cfg, filled in by the build side).

The build side is `builders/timm.py`'s `TIMM`; pretrained weights only from timm's safetensors in the HuggingFace cache.
"""

from __future__ import annotations

from dataclasses import dataclass

from orchestrator.config import Check, integer, text
from orchestrator.lowering.spec import (
    IMAGE_TASK,
    ClassifierOptions,
    ModelSource,
    ModelSpec,
    register_source,
)
from orchestrator.lowering.spec_fields import mapping
from orchestrator.lowering.weights import Availability, cached_timm_weights, hf_hub_cache


@dataclass(frozen=True)
class TimmOptions(ClassifierOptions):
    """A timm spec's own fields: `timm.create_model`'s keyword arguments and the side of the square input image
    (None in the file: the model's pretrained_cfg input_size, filled in by the build side's defaults)."""


# timm.create_model keywords a spec never sets: they fetch or read weights and configs from files or the hub.
TIMM_REFUSED = frozenset(
    {
        "pretrained", "pretrained_cfg", "pretrained_cfg_overlay", "pretrained_strict", "checkpoint_path",
        "cache_dir", "features_only", "feature_cfg", "device", "dtype",
    }
)  # fmt: skip

_TIMM_FIELDS: dict[str, Check] = {
    "model": text,  # a timm model name (timm.list_models()); checked against timm by the builder
    "kwargs": mapping,
    "image_size": integer(16, 1024),  # default: the model's pretrained_cfg input_size
}


def timm_pretrained(spec: ModelSpec) -> Availability:
    """Whether a timm spec can have its pretrained weights without the network, and why not."""
    kwargs = spec.options_of(TimmOptions).kwargs
    if kwargs:
        reason = f"the spec's kwargs ({', '.join(kwargs)}) change the model timm's weights fit"
        return Availability(False, reason, expected=False)
    if cached_timm_weights(spec.model_type) is None:
        return Availability(
            False, f"no timm/{spec.model_type} weights in {hf_hub_cache()} (etlab never downloads them)"
        )
    return Availability(True, f"found in {hf_hub_cache()}")


TIMM = register_source(
    ModelSource(
        "timm",
        "orchestrator.lowering.sources.builders.timm:TIMM",
        _TIMM_FIELDS,
        ("model",),
        renames={"model": "model_type"},
        fixed={"task": IMAGE_TASK},
        pretrained=timm_pretrained,
        options=TimmOptions,
        refused_kwargs=TIMM_REFUSED,
        defaults="orchestrator.lowering.sources.builders.timm:with_defaults",
    )
)
