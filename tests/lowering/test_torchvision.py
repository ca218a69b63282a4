"""The `torchvision` model source (orchestrator/lowering/sources/builders/torchvision.py): spec files and their errors,
the weights (pretrained only from the torch hub cache, else random loudly), the tiny model lowered and run against its
eager outputs, quantized convolutions, and a warm `fab lower` that imports no torchvision. The end-to-end run on the
local board is tests/e2e/test_model_sources_e2e.py.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from orchestrator.errors import SpecError
from orchestrator.lowering.builtins import BUILTIN_SPECS
from orchestrator.lowering.export import lower as lowering
from orchestrator.lowering.export.lower import LoweringResult
from orchestrator.lowering.sources.torchvision import TorchvisionOptions
from orchestrator.lowering.spec import load_spec_file
from orchestrator.lowering.variants import VARIANTS, Variant
from orchestrator.lowering.weights import PretrainedUnavailable, resolve_weights
from orchestrator.paths import PROJECT_ROOT
from orchestrator.tensorfile import read_tensors
from tests.plugins.artifacts import ARTIFACT_CACHE

TINY = "mobilenet-v2-tiny"
HEAVY = frozenset({"torch", "torchvision", "transformers", "executorch"})


def write_spec(tmp_path: Path, **changes: Any) -> Path:
    """One field per line: `name` on line 2, `source` 3, `model` 4, `kwargs` 5 (its keys from line 6)."""
    data = {"name": "my-net", "source": "torchvision", "model": "mobilenet_v2",
            "kwargs": {"width_mult": 0.25, "num_classes": 10}, "image_size": 32, **changes}  # fmt: skip
    path = tmp_path / "net.json"
    path.write_text(json.dumps({k: v for k, v in data.items() if v is not None}, indent=2))
    return path


def checked(path: Path) -> Any:
    from orchestrator.lowering.sources.builders.models import check_spec

    return check_spec(load_spec_file(path), "random", available=16 << 30)


@pytest.fixture(scope="module")
def tiny() -> LoweringResult:
    """mobilenet-v2-tiny, portable and XNNPACK, in the test artifact cache (reused across sessions)."""
    return lowering.lower(
        BUILTIN_SPECS[TINY], variants=[VARIANTS["portable"], VARIANTS["xnnpack"]], weights="random", root=ARTIFACT_CACHE
    )


def test_a_torchvision_spec_file_reads_and_checks(tmp_path: Path) -> None:
    spec = load_spec_file(write_spec(tmp_path))
    assert (spec.model_source, spec.model_type, spec.task) == ("torchvision", "mobilenet_v2", "image-classification")
    assert spec.options_of(TorchvisionOptions).kwargs == {"width_mult": 0.25, "num_classes": 10}
    assert [(i.name, i.dtype, i.shape) for i in spec.inputs] == [("pixel_values", "float32", (1, 3, 32, 32))]
    assert checked(write_spec(tmp_path)).parameters == 250922


def test_an_unknown_model_gets_a_did_you_mean(tmp_path: Path) -> None:
    path = write_spec(tmp_path, model="mobilenet_v22")
    with pytest.raises(SpecError, match=re.escape(f"{path}:4: field 'model': 'mobilenet_v22' is not a torchvision "
                                                  "classification model (did you mean 'mobilenet_v2'?)")):  # fmt: skip
        checked(path)


def test_a_bad_kwarg_names_its_line(tmp_path: Path) -> None:
    path = write_spec(tmp_path, kwargs={"width_mul": 0.25})
    expected = "field 'kwargs.width_mul': is not a scalar parameter of torchvision's mobilenet_v2 (did you mean"
    with pytest.raises(SpecError, match=re.escape(f"{path}:6: {expected} 'width_mult'?)")):
        checked(path)
    wrong_type = write_spec(tmp_path, kwargs={"num_classes": 2.5})
    with pytest.raises(SpecError, match=r"net\.json:6: field 'kwargs\.num_classes': expected int like the default"):
        checked(wrong_type)
    code = write_spec(tmp_path, kwargs={"block": "os.system"})  # a parameter that takes code is not offered
    with pytest.raises(SpecError, match=r"field 'kwargs\.block': is not a scalar parameter .*; its parameters: "):
        checked(code)
    too_small = write_spec(tmp_path, model="resnet18", kwargs={"groups": 2})
    with pytest.raises(SpecError, match=r"field 'kwargs': the model cannot be built and run this way: ValueError"):
        checked(too_small)


def test_the_file_itself_refuses_weights_and_non_scalars(tmp_path: Path) -> None:
    """Before torchvision is imported: the weights come from --weights, and kwargs are JSON scalars."""
    path = write_spec(tmp_path, kwargs={"weights": "IMAGENET1K_V1", "progress": True, "num_classes": [10]})
    with pytest.raises(SpecError) as excinfo:
        load_spec_file(path)
    message = str(excinfo.value)
    assert f"{path}:6: field 'kwargs.weights': decides where torchvision's weights come from" in message
    assert f"{path}:7: field 'kwargs.progress': decides where torchvision's weights come from" in message
    assert f"{path}:8: field 'kwargs.num_classes': expected a number, a boolean or a string" in message
    with pytest.raises(SpecError, match=r"net\.json:\d+: field 'task': unknown"):
        load_spec_file(write_spec(tmp_path, task="fill-mask"))
    with pytest.raises(SpecError, match=r"field 'image_size': is required"):
        load_spec_file(write_spec(tmp_path, image_size=None))


def test_pretrained_comes_from_the_torch_hub_cache_only(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                        capfd: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    import torch

    from orchestrator.lowering.sources.builders.models import load_model

    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch"))
    spec = BUILTIN_SPECS["mobilenet-v2"]
    choice = resolve_weights(spec, "auto")
    assert (choice.mode, choice.fallback) == ("random", True) and "etlab never downloads one" in choice.reason
    loaded = load_model(spec, "auto")
    assert loaded.weights == "random" and "pretrained unavailable" in loaded.weights_note
    assert "Falling back to RANDOM weights" in capfd.readouterr().err
    with pytest.raises(PretrainedUnavailable, match=r"mobilenet_v2-7ebf99e0\.pth is missing"):
        load_model(spec, "pretrained")
    # The tiny models change the architecture: random is all there is, and nothing to warn about.
    assert not resolve_weights(BUILTIN_SPECS[TINY], "auto").fallback

    # A checkpoint where torch.hub leaves torchvision's download: auto is pretrained, read with weights_only.
    checkpoints = tmp_path / "torch" / "hub" / "checkpoints"
    checkpoints.mkdir(parents=True)
    state = {name: torch.full_like(value, 0.5) for name, value in loaded.module.state_dict().items()}
    torch.save(state, checkpoints / "mobilenet_v2-7ebf99e0.pth")
    assert resolve_weights(spec, "auto").mode == "pretrained"
    pretrained = load_model(spec, "auto")
    assert pretrained.weights == "pretrained" and "mobilenet_v2-7ebf99e0.pth" in pretrained.weights_note
    floats = [value for value in pretrained.module.state_dict().values() if value.is_floating_point()]
    assert floats and all(bool((value == 0.5).all()) for value in floats)


def test_the_tiny_model_lowers_and_its_programs_match_eager(tiny: LoweringResult) -> None:
    import torch
    from executorch.runtime import Runtime

    inputs = read_tensors(tiny.paths.reference_inputs)
    assert [(t.name, t.array.dtype, t.array.shape) for t in inputs] == [("pixel_values", np.float32, (1, 3, 32, 32))]
    # ImageNet-normalised: uniform [0, 1] pixels less the mean, over the std.
    assert -2.2 < inputs[0].array.min() < -1.9 and 2.5 < inputs[0].array.max() < 2.7
    (reference,) = read_tensors(tiny.paths.reference_outputs)
    assert reference.array.shape == (1, 10)
    for backend in ("portable", "xnnpack"):
        sidecar = tiny.variants[VARIANTS[backend]].sidecar
        assert sidecar.task == "image-classification" and sidecar.seq_len is None
        assert sidecar.inputs == [{"name": "pixel_values", "shape": [1, 3, 32, 32], "dtype": "float32"}]
        method = Runtime.get().load_program(tiny.paths.pte(VARIANTS[backend])).load_method("forward")
        (output,) = method.execute([torch.from_numpy(inputs[0].array)])
        scale = float(np.abs(reference.array).max())
        np.testing.assert_allclose(output.numpy(), reference.array, rtol=1e-3, atol=1e-3 * scale)
    assert tiny.variants[VARIANTS["xnnpack"]].sidecar.delegation.delegate_call_sites == 1


@pytest.mark.slow
def test_int8_static_quantizes_every_convolution(tmp_path: Path) -> None:
    """XNNPACK's quantizer annotates convolutions too; int8-dynamic leaves depthwise ones in float."""
    static = Variant.parse("xnnpack-int8-static")
    result = lowering.lower(BUILTIN_SPECS[TINY], variants=[static], weights="random", root=tmp_path, jobs=1)
    quantization = result.variants[static].sidecar.quantization
    assert quantization is not None
    assert quantization.convolution == {"qint8 x qcint8": 52}, quantization.convolution
    assert quantization.fully_connected == {"qint8 x qcint8": 1}
    assert quantization.calibration_source is not None and "images" in quantization.calibration_source


def test_a_warm_lower_imports_no_torchvision(tiny: LoweringResult) -> None:
    proc = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "fabric", "lower", "--model", TINY],
        cwd=PROJECT_ROOT, env={**os.environ, "ETLAB_ARTIFACTS": str(ARTIFACT_CACHE)},
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "using cached artifacts for portable, xnnpack" in proc.stderr
    found = re.findall(r"^import time:\s+\d+ \|\s+\d+ \|\s*([\w.]+)\s*$", proc.stderr, flags=re.MULTILINE)
    assert not {name.split(".")[0] for name in found} & HEAVY


def test_a_token_calibration_file_is_refused_for_an_image_model(tmp_path: Path) -> None:
    """An image model's calibration file holds images (an ETLT file of pixel_values): token ids are refused before
    anything loads, nothing is written, and the message says what the model takes."""
    from orchestrator.lowering.quantize.calibration import CalibrationError

    samples = tmp_path / "samples.jsonl"
    samples.write_text('{"input_ids": [1, 2, 3]}\n')
    static = Variant.parse("xnnpack-int8-static")
    with pytest.raises(CalibrationError, match=r"samples\.jsonl: .*pixel_values float32 \[N, 1, 3, 32, 32\]"):
        lowering.lower(BUILTIN_SPECS[TINY], variants=[static], root=tmp_path / "artifacts", calibration=samples)
    assert not (tmp_path / "artifacts").exists()


def test_a_layout_conversion_xnnpack_inserts_takes_the_module_of_its_reader(tiny: LoweringResult) -> None:
    """The input's NCHW -> NHWC transpose XNNPACK's lowering adds carries no handle of the graph: it is there for the
    first convolution, so the source map gives it that convolution's module (full-size MobileNetV2: 3% of a run
    was on no module before, bench_attribution.py)."""
    from orchestrator.lowering.export.source_map import source_map_path
    from orchestrator.programs.plan import read_program_plan
    from orchestrator.programs.xnn import read_xnn_nodes

    pte = tiny.variants[VARIANTS["xnnpack"]].pte
    data = json.loads(source_map_path(pte).read_text())
    (delegate,) = [d for d in read_program_plan(pte, "forward").delegates() if d.delegate is not None][:1]
    assert delegate.delegate is not None
    xnodes = read_xnn_nodes(delegate.delegate, pte)
    inserted = [node for node in xnodes if node.debug_handle == 65535]
    assert inserted and inserted[0].type == "XNNStaticTranspose"  # the input's layout conversion
    reader = next(node for node in xnodes if inserted[0].output in node.inputs)
    rows = {row["node"]: row for row in data["delegates"][0]["nodes"]}
    assert rows[inserted[0].index]["sources"] == rows[reader.index]["sources"] != []
    modules = {data["sources"][i]["module"] for i in rows[reader.index]["sources"]}
    assert modules == {"features.0.0"}, modules  # the stem's convolution
