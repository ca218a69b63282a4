"""A model source added in one module, this one: its spec-side record registered with `register_source` and its
builder beside it, no other file touched. A spec file of it is read and checked like any other (its own fields kept
in the options record it declares, typed, part of the identity), and lowers end to end: a .pte that ExecuTorch runs
and that matches eager, cached by its key, calibrated (int8-static) on the samples the source makes."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from orchestrator.config import integer
from orchestrator.errors import SpecError
from orchestrator.lowering.builtins import BUILTIN_SPECS, resolve_spec
from orchestrator.lowering.export import cache
from orchestrator.lowering.export import lower as lowering
from orchestrator.lowering.lowered import spec_from_record
from orchestrator.lowering.sources.builders.models import OWN, LoadedModel, SourceBuilder, SpecCheck
from orchestrator.lowering.spec import SOURCES, ModelSource, ModelSpec, SourceOptions, load_spec_file, register_source
from orchestrator.lowering.variants import VARIANTS
from orchestrator.lowering.weights import WeightsChoice
from orchestrator.tensorfile import NamedTensor, read_tensors


@dataclass(frozen=True)
class TinyMlpOptions(SourceOptions):
    """The source's own fields, declared here: its hidden width (required) and its input features."""

    width: int
    features: int = 4


def _mlp(spec: ModelSpec) -> torch.nn.Module:
    options = spec.options_of(TinyMlpOptions)  # typed: a spec of another source is refused here
    width, features = options.width, options.features
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(features, width), torch.nn.ReLU(), torch.nn.Linear(width, 3)).eval()


class TinyMlp(SourceBuilder):
    """The build side: a two-layer perceptron of the spec's width, seeded weights, one float input."""

    def check(self, spec: ModelSpec, choice: WeightsChoice, available: int | None) -> SpecCheck:
        return SpecCheck(config=None, parameters=sum(p.numel() for p in _mlp(spec).parameters()))

    def load(self, spec: ModelSpec, choice: WeightsChoice) -> LoadedModel:
        module = _mlp(spec)
        return LoadedModel(module, "own", "seeded", sum(p.numel() for p in module.parameters()))

    def example_inputs(self, spec: ModelSpec, module: torch.nn.Module) -> list[NamedTensor]:
        features = spec.options_of(TinyMlpOptions).features
        return [NamedTensor("x", np.linspace(-1, 1, 2 * features, dtype=np.float32).reshape(2, features))]

    def input_kind(self, spec: ModelSpec, names: Sequence[str]) -> str:
        return OWN

    def calibration(
        self, spec: ModelSpec, module: torch.nn.Module, example_args: tuple[torch.Tensor, ...], kind: str, samples: int
    ) -> tuple[list[tuple[torch.Tensor, ...]], str]:
        CALIBRATED.append(samples)
        return [tuple(arg * (1 + index) for arg in example_args) for index in range(samples)], "tiny-mlp's own samples"


BUILDER = TinyMlp()
CALIBRATED: list[int] = []
SOURCE = register_source(
    ModelSource(
        "tiny-mlp",
        f"{__name__}:BUILDER",
        {"width": integer(1, 64), "features": integer(1, 16)},
        ("width",),
        fixed={"task": "custom", "model_type": "tiny-mlp"},
        options=TinyMlpOptions,
    )
)


def write_spec(folder: Path, **fields: Any) -> Path:
    path = folder / "tiny_mlp.json"
    path.write_text(json.dumps({"name": "tiny-mlp", "source": "tiny-mlp", **fields}, indent=2))
    return path


def test_the_registered_source_is_read_and_checked_like_any_other(tmp_path: Path) -> None:
    assert SOURCES["tiny-mlp"] is SOURCE
    # Its builder's module joins its own specs' cache key only: a process without it keys the others alike.
    assert Path(__file__).resolve() in cache.code_files("tiny-mlp")
    assert cache.code_files("huggingface") == cache.code_files()
    spec = load_spec_file(write_spec(tmp_path, width=8))
    assert (spec.model_source, spec.task, spec.options) == ("tiny-mlp", "custom", TinyMlpOptions(width=8))
    assert type(spec.options_of(TinyMlpOptions).width) is int
    assert load_spec_file(write_spec(tmp_path, width=8, features=2)).options == TinyMlpOptions(8, 2)
    # Recorded in the sidecar under "source_options" (the built-in sources' at the top level, as before), and read
    # back as the record: a sidecar's spec is the spec.
    assert spec.to_dict()["source_options"] == {"width": 8, "features": 4}
    assert spec.identity()["source_options"] == {"width": 8, "features": 4}
    assert spec_from_record(spec.to_dict(), "sidecar").options == spec.options
    with pytest.raises(SpecError, match=r"sidecar: .*spec\.width"):
        spec_from_record({**spec.to_dict(), "source_options": {"width": "8"}}, "sidecar")
    with pytest.raises(TypeError, match="TinyMlpOptions"):
        BUILTIN_SPECS["distilbert-tiny"].options_of(TinyMlpOptions)
    with pytest.raises(SpecError, match=r"tiny_mlp\.json:4: field 'width': .*64"):
        load_spec_file(write_spec(tmp_path, width=100))
    with pytest.raises(SpecError, match="field 'width': is required"):
        load_spec_file(write_spec(tmp_path, features=2))


def test_the_registered_source_lowers_to_a_program_that_matches_eager(tmp_path: Path) -> None:
    from executorch.runtime import Runtime

    spec = resolve_spec(spec_path=write_spec(tmp_path, width=8))
    root = tmp_path / "artifacts"
    variants = [VARIANTS["xnnpack"], VARIANTS["xnnpack-int8-static"]]
    result = lowering.lower(spec, variants=variants, root=root, jobs=1)
    assert CALIBRATED == [8]  # int8-static was calibrated on the source's own samples
    inputs = [torch.from_numpy(t.array) for t in read_tensors(result.paths.reference_inputs)]
    (reference,) = read_tensors(result.paths.reference_outputs)
    assert reference.array.shape == (2, 3)
    for variant in variants:
        (output,) = Runtime.get().load_program(result.paths.pte(variant)).load_method("forward").execute(inputs)
        tolerance = 1e-4 if variant.name == "xnnpack" else 0.1
        np.testing.assert_allclose(output.numpy(), reference.array, atol=tolerance, rtol=tolerance)
    assert lowering.lower(spec, variants=variants, root=root, jobs=1).cached
    wider = resolve_spec(spec_path=write_spec(tmp_path, width=16))  # its own field decides the program
    assert cache.cache_key(wider, variants[0], "own", False) != cache.cache_key(spec, variants[0], "own", False)
