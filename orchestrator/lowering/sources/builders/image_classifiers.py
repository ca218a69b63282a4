"""What the image-classifier sources (torchvision, timm) share: the spec check, the weights, the reference image.

A library's source subclasses `ImageClassifierSource` with what differs: its name, the models it knows, the
constructor parameters a spec may set, how it builds a model, where its pretrained weights are cached and how they
are read, and the mean and std its transforms normalise with. The program is the model itself, in eval mode, with
no rewrite: one float32 input `pixel_values` [1, 3, H, W], the class logits out.
"""

from __future__ import annotations

import inspect
from typing import Any

import numpy as np
import torch

from orchestrator import console
from orchestrator.config import did_you_mean, field_path
from orchestrator.errors import SpecError
from orchestrator.lowering.sources.builders.models import LoadedModel, SourceBuilder, SpecCheck
from orchestrator.lowering.spec import IMAGE_INPUT, SPEC_HINT, ClassifierOptions, ModelSpec
from orchestrator.lowering.spec_errors import FLOAT_BYTES, brief, kwarg_problem, spec_failure, too_large
from orchestrator.lowering.weights import RANDOM_SEED, Availability, PretrainedUnavailable, WeightsChoice
from orchestrator.tensorfile import NamedTensor

_SCALARS = (bool, int, float, str)


def scalar_parameters(model_class: type[torch.nn.Module], refused: frozenset[str]) -> dict[str, Any]:
    """The constructor parameters a spec may set: name -> default, those whose default is a JSON scalar."""
    signature = inspect.signature(model_class.__init__)
    return {
        parameter.name: parameter.default
        for parameter in signature.parameters.values()
        if parameter.name not in refused and isinstance(parameter.default, _SCALARS)
    }


def normalised_image(rng: np.random.Generator, size: int, mean: Any, std: Any) -> np.ndarray:
    """Uniform RGB in [0, 1] as the library's transforms hand it to the model: normalised with `mean` and `std`,
    float32 [1, 3, size, size]."""
    pixels = rng.random((1, 3, size, size), dtype=np.float32)
    mean = np.asarray(mean, dtype=np.float32).reshape(1, 3, 1, 1)
    std = np.asarray(std, dtype=np.float32).reshape(1, 3, 1, 1)
    return ((pixels - mean) / std).astype(np.float32)


class ImageClassifierSource(SourceBuilder):
    """A model source whose models are image classifiers built by a library from a name and keyword arguments."""

    library = ""  # "torchvision", "timm": how messages name it
    catalogue = ""  # what `models()` lists: "torchvision classification model"

    # What differs per library.
    def models(self) -> list[str]:
        raise NotImplementedError

    def parameters(self, spec: ModelSpec) -> dict[str, Any]:
        raise NotImplementedError

    def build(self, spec: ModelSpec) -> torch.nn.Module:
        raise NotImplementedError

    def pretrained_found(self, spec: ModelSpec) -> Availability:
        raise NotImplementedError

    def pretrained_state(self, spec: ModelSpec) -> tuple[dict[str, Any], str]:
        """The default weights from the local cache only (never downloaded), and where they came from."""
        raise NotImplementedError

    def mean_std(self, spec: ModelSpec) -> tuple[Any, Any]:
        raise NotImplementedError

    # The same for every library.
    def known(self, spec: ModelSpec) -> None:
        names = self.models()
        if spec.model_type not in names:
            close = did_you_mean(spec.model_type, names)
            raise spec_failure([("model", f"{spec.model_type!r} is not a {self.catalogue}{close}")], spec)

    def check(self, spec: ModelSpec, choice: WeightsChoice, available: int | None) -> SpecCheck:
        """The name, the image size, each keyword against the constructor, the weights asked for, and the model
        built and run on the meta device (no memory), before anything loads."""
        self.known(spec)
        options = spec.options_of(ClassifierOptions)
        side = options.image_size
        if side is None:
            raise spec_failure([("image_size", "is required")], spec)
        allowed = self.parameters(spec)
        problems = []
        for key, value in options.kwargs.items():
            message = kwarg_problem(key, value, allowed, f"{self.library}'s {spec.model_type}")
            if message is not None:
                problems.append((field_path("kwargs", key), message))
        if problems:
            raise spec_failure(problems, spec)
        if choice.mode == "pretrained":
            found = self.pretrained_found(spec)
            if not found.available:
                raise PretrainedUnavailable(spec.problem("model", f"no pretrained weights: {found.reason}"))
        try:
            with torch.device("meta"):
                model = self.build(spec).eval()
                parameters = _count(model)
                model(torch.empty(1, 3, side, side))
        except Exception as exc:  # the constructor's own checks, or an image the network does not take
            origin = "kwargs" if options.kwargs else "image_size"
            raise spec_failure([(origin, f"the model cannot be built and run this way: {brief(exc)}")], spec) from exc
        if available is not None and FLOAT_BYTES * parameters > available:
            raise spec_failure([("model", too_large(parameters, available, ""))], spec)
        return SpecCheck(None, parameters)

    def load(self, spec: ModelSpec, choice: WeightsChoice) -> LoadedModel:
        """Pretrained weights from the local cache when asked for and there, else seeded random ones, loudly."""
        if choice.mode == "pretrained":
            try:
                state, note = self.pretrained_state(spec)
            except PretrainedUnavailable as exc:
                if choice.requested != "auto":
                    raise
                choice = WeightsChoice("auto", "random", str(exc), fallback=True)
            else:
                module = self.build(spec)
                try:
                    module.load_state_dict(state)
                except RuntimeError as exc:  # a cached file of another tag or layout
                    message = spec.problem("model", f"{self.library}'s weights do not fit: {brief(exc)}")
                    raise SpecError(message, hint=SPEC_HINT) from exc
                return LoadedModel(module.eval(), "pretrained", note, _count(module))
        if choice.fallback:
            console.loud_warning(
                f"pretrained weights for {self.library}'s {spec.model_type} are unavailable ({choice.reason}).\n"
                f"Falling back to RANDOM weights (seed {RANDOM_SEED}): timings are representative, outputs are not."
            )
        torch.manual_seed(RANDOM_SEED)
        module = self.build(spec)
        note = f"random (seed {RANDOM_SEED})"
        if choice.requested == "auto" and choice.fallback:
            note += f"; pretrained unavailable: {choice.reason}"
        return LoadedModel(module.eval(), "random", note, _count(module))

    def example_inputs(self, spec: ModelSpec, module: torch.nn.Module) -> list[NamedTensor]:
        """The deterministic reference image, normalised as the library's transforms would."""
        side = spec.options_of(ClassifierOptions).image_size
        assert side is not None  # checked by `check`
        mean, std = self.mean_std(spec)
        image = normalised_image(np.random.default_rng(RANDOM_SEED), side, mean, std)
        return [NamedTensor(IMAGE_INPUT, image)]


def _count(module: torch.nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())
