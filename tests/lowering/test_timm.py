"""The `timm` model source (orchestrator/lowering/sources/builders/timm.py): spec files and their errors (unknown model,
refused and unknown kwargs, by file, line and field), the default image size, the weights (pretrained only from the
HuggingFace cache, else random), and the tiny model lowered to XNNPACK against its eager outputs. The end-to-end run
on the local board is tests/e2e/test_model_sources_e2e.py.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from orchestrator.errors import SpecError
from orchestrator.lowering.builtins import BUILTIN_SPECS, resolve_spec
from orchestrator.lowering.export import lower as lowering
from orchestrator.lowering.sources.timm import TimmOptions
from orchestrator.lowering.spec import load_spec_file
from orchestrator.lowering.variants import VARIANTS
from orchestrator.lowering.weights import resolve_weights
from orchestrator.tensorfile import read_tensors
from tests.plugins.artifacts import ARTIFACT_CACHE

TINY = "efficientnet-b0-tiny"


def write_spec(tmp_path: Path, **changes: Any) -> Path:
    """One field per line: `name` on line 2, `source` 3, `model` 4, `kwargs` 5 (its keys from line 6)."""
    data = {"name": "my-timm", "source": "timm", "model": "test_efficientnet", "kwargs": {"num_classes": 10},
            "image_size": 32, **changes}  # fmt: skip
    path = tmp_path / "net.json"
    path.write_text(json.dumps({k: v for k, v in data.items() if v is not None}, indent=2))
    return path


def checked(path: Path) -> Any:
    from orchestrator.lowering.sources.builders.models import check_spec

    return check_spec(load_spec_file(path), "random", available=16 << 30)


def test_a_timm_spec_file_reads_and_checks(tmp_path: Path) -> None:
    spec = load_spec_file(write_spec(tmp_path))
    assert (spec.model_source, spec.model_type, spec.task) == ("timm", "test_efficientnet", "image-classification")
    assert [(i.name, i.dtype, i.shape) for i in spec.inputs] == [("pixel_values", "float32", (1, 3, 32, 32))]
    assert 50_000 < checked(write_spec(tmp_path)).parameters < 200_000


def test_the_image_size_defaults_to_the_models_pretrained_cfg(tmp_path: Path) -> None:
    spec = resolve_spec(spec_path=write_spec(tmp_path, model="efficientnet_b0", kwargs=None, image_size=None))
    assert spec.options_of(TimmOptions).image_size == 224 and spec.inputs[0].shape == (1, 3, 224, 224)


def test_an_unknown_model_gets_a_did_you_mean(tmp_path: Path) -> None:
    path = write_spec(tmp_path, model="efficientnet_b00")
    with pytest.raises(SpecError, match=re.escape(f"{path}:4: field 'model': 'efficientnet_b00' is not a timm model "
                                                  "(did you mean 'efficientnet_b0'?)")):  # fmt: skip
        checked(path)


def test_kwargs_that_load_files_are_refused_by_file_line_and_field(tmp_path: Path) -> None:
    """Before timm is imported: the weights come from etlab's weights choice."""
    path = write_spec(tmp_path, kwargs={"pretrained": True, "checkpoint_path": "/tmp/x.pth", "num_classes": [10]})
    with pytest.raises(SpecError) as excinfo:
        load_spec_file(path)
    message = str(excinfo.value)
    assert f"{path}:6: field 'kwargs.pretrained': decides where timm's weights come from" in message
    assert f"{path}:7: field 'kwargs.checkpoint_path': decides where timm's weights come from" in message
    assert f"{path}:8: field 'kwargs.num_classes': expected a number, a boolean or a string" in message
    unknown = write_spec(tmp_path, kwargs={"num_clases": 10})
    with pytest.raises(SpecError, match=re.escape(f"{unknown}:6: field 'kwargs.num_clases': is not a scalar "
                                                  "parameter of timm's test_efficientnet (did you mean")):  # fmt: skip
        checked(unknown)
    wrong_type = write_spec(tmp_path, kwargs={"num_classes": "ten"})
    with pytest.raises(SpecError, match=r"net\.json:6: field 'kwargs\.num_classes': expected int like the default"):
        checked(wrong_type)


def test_pretrained_comes_from_the_huggingface_cache_only(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    choice = resolve_weights(BUILTIN_SPECS["efficientnet-b0"], "auto")
    assert (choice.mode, choice.fallback) == ("random", True) and "etlab never downloads them" in choice.reason
    assert not resolve_weights(BUILTIN_SPECS[TINY], "auto").fallback  # kwargs: random is all there is
    snapshot = tmp_path / "hub" / "models--timm--efficientnet_b0.ra_in1k" / "snapshots" / "abc"
    snapshot.mkdir(parents=True)
    (tmp_path / "hub" / "models--timm--efficientnet_b0.ra_in1k" / "refs").mkdir()
    (tmp_path / "hub" / "models--timm--efficientnet_b0.ra_in1k" / "refs" / "main").write_text("abc")
    (snapshot / "model.safetensors").write_bytes(b"")
    assert resolve_weights(BUILTIN_SPECS["efficientnet-b0"], "auto").mode == "pretrained"


def test_the_tiny_model_lowers_to_xnnpack_and_matches_eager() -> None:
    import torch
    from executorch.runtime import Runtime

    result = lowering.lower(BUILTIN_SPECS[TINY], variants=[VARIANTS["xnnpack"]], weights="random", root=ARTIFACT_CACHE)
    (image,) = read_tensors(result.paths.reference_inputs)
    assert (image.name, image.array.dtype, image.array.shape) == ("pixel_values", np.float32, (1, 3, 32, 32))
    assert -2.2 < image.array.min() < -1.9 and 2.5 < image.array.max() < 2.7  # ImageNet mean and std (its cfg)
    (reference,) = read_tensors(result.paths.reference_outputs)
    assert reference.array.shape == (1, 10)
    sidecar = result.variants[VARIANTS["xnnpack"]].sidecar
    assert sidecar.task == "image-classification" and sidecar.weights == "random"
    assert sidecar.delegation.delegate_call_sites >= 1
    method = Runtime.get().load_program(result.paths.pte(VARIANTS["xnnpack"])).load_method("forward")
    (output,) = method.execute([torch.from_numpy(image.array)])
    scale = float(np.abs(reference.array).max())
    np.testing.assert_allclose(output.numpy(), reference.array, rtol=1e-3, atol=1e-3 * scale)
