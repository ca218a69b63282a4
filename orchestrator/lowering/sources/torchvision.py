"""The `torchvision` model source, spec side (no torch): a torchvision classification model by name, its
constructor's keyword arguments (JSON scalars) and the side of its square input image.

The build side is `builders/torchvision.py`'s `TORCHVISION`; pretrained weights only from the local torch hub cache.
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
from orchestrator.lowering.weights import Availability, cached_torchvision_checkpoint, torch_hub_checkpoints


@dataclass(frozen=True)
class TorchvisionOptions(ClassifierOptions):
    """A torchvision spec's own fields: the constructor's keyword arguments and the side of the square input image
    (both required of the spec file: torchvision has no default size)."""


# torchvision constructor keywords a spec never sets: the weights come from `--weights` (pretrained only from the
# local torch hub cache), and the others decide how they are fetched.
TORCHVISION_REFUSED = frozenset({"weights", "progress", "pretrained", "pretrained_backbone", "weights_backbone"})

_TORCHVISION_FIELDS: dict[str, Check] = {
    "model": text,  # a torchvision classification model name; checked against torchvision by the builder
    "kwargs": mapping,
    "image_size": integer(16, 1024),
}


def torchvision_pretrained(spec: ModelSpec) -> Availability:
    """Whether a torchvision spec can have its pretrained weights without the network, and why not."""
    kwargs = spec.options_of(TorchvisionOptions).kwargs
    if kwargs:  # the tiny ones: random is all there is
        reason = f"the spec's kwargs ({', '.join(kwargs)}) change the model torchvision's checkpoint fits"
        return Availability(False, reason, expected=False)
    if cached_torchvision_checkpoint(spec.model_type) is None:
        return Availability(
            False, f"no {spec.model_type} checkpoint in {torch_hub_checkpoints()} (etlab never downloads one)"
        )
    return Availability(True, f"found in {torch_hub_checkpoints()}")


TORCHVISION = register_source(
    ModelSource(
        "torchvision",
        "orchestrator.lowering.sources.builders.torchvision:TORCHVISION",
        _TORCHVISION_FIELDS,
        ("model", "image_size"),
        renames={"model": "model_type"},
        fixed={"task": IMAGE_TASK},
        pretrained=torchvision_pretrained,
        options=TorchvisionOptions,
        refused_kwargs=TORCHVISION_REFUSED,
    )
)
