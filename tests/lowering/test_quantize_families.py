"""Quantization beyond transformers: linears and convolutions counted from the exported graph for conv nets, audio
models and a user's .pt2, checked against the XNNPACK graphs of the lowered programs, and calibration for models
whose inputs are not token ids (images, audio, a factory). Token-model schemes and the accuracy gate are in
test_quantize.py, parallel lowering in test_quantize_parallel.py.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from orchestrator.commands.render_lowering import _quantized_cell
from orchestrator.lowering.builtins import BUILTIN_SPECS
from orchestrator.lowering.export.lower import LoweringResult, lower
from orchestrator.lowering.quantize.calibration import CalibrationError
from orchestrator.lowering.quantize.quantized import quantize
from orchestrator.lowering.quantize.schemes import SCHEMES
from orchestrator.lowering.quantize.xnn_types import xnn_node_types
from orchestrator.lowering.sidecar import Quantization
from orchestrator.lowering.variants import VARIANTS
from orchestrator.paths import PROJECT_ROOT
from orchestrator.tensorfile import NamedTensor, write_tensors

pytestmark = pytest.mark.slow

SCHEME_NAMES = ("int8-dynamic", "int8-static", "8da4w")


def fab_lower(tmp_path: Path, *options: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "ETLAB_ARTIFACTS": str(tmp_path / "artifacts"), "ETLAB_RESULTS": str(tmp_path / "results")}
    return subprocess.run(
        [sys.executable, "-m", "fabric", "lower", *options], cwd=PROJECT_ROOT, env=env, capture_output=True,
        text=True, timeout=600,
    )  # fmt: skip


def eager_layers(name: str) -> tuple[list[str], list[str]]:
    """The built-in model's own nn.Linear and nn.ConvNd module names: what the graph's counts must match."""
    import torch

    from orchestrator.lowering.sources.builders.models import load_model

    module = load_model(BUILTIN_SPECS[name], "random").module
    linears = [n for n, m in module.named_modules() if isinstance(m, torch.nn.Linear)]
    convolutions = [n for n, m in module.named_modules() if isinstance(m, torch.nn.modules.conv._ConvNd)]
    return linears, convolutions


def images(path: Path, samples: int, shape: tuple[int, ...] = (1, 3, 32, 32), name: str = "pixel_values") -> Path:
    array = np.random.default_rng(7).standard_normal((samples, *shape)).astype(np.float32)
    write_tensors(path, [NamedTensor(name, array)])
    return path


def lowered(name: str, root: Path, calibration: Path | None = None) -> LoweringResult:
    variants = [VARIANTS[f"xnnpack-{scheme}"] for scheme in SCHEME_NAMES]
    return lower(BUILTIN_SPECS[name], variants=variants, root=root, calibration=calibration)


def quantization_of(result: LoweringResult, scheme: str) -> tuple[Quantization, Path]:
    item = result.variants[VARIANTS[f"xnnpack-{scheme}"]]
    assert item.sidecar.quantization is not None
    return item.sidecar.quantization, item.pte


@pytest.fixture(scope="module")
def mobilenet(tmp_path_factory: pytest.TempPathFactory) -> tuple[LoweringResult, Path]:
    """mobilenet-v2-tiny lowered to every scheme, int8-static calibrated on an ETLT file of 4 images."""
    root = tmp_path_factory.mktemp("mobilenet")
    calibration = images(root / "images.etlt", 4)
    return lowered("mobilenet-v2-tiny", root / "artifacts", calibration), calibration


def test_a_conv_net_reports_every_convolution_and_the_xnnpack_graph_agrees(
    mobilenet: tuple[LoweringResult, Path],
) -> None:
    result, _ = mobilenet
    linears, convolutions = eager_layers("mobilenet-v2-tiny")
    assert len(convolutions) == 52 and len(linears) == 1
    for scheme in SCHEME_NAMES:
        quantization, pte = quantization_of(result, scheme)
        assert quantization.convolutions == len(convolutions), scheme
        assert quantization.linear_layers == quantization.quantized_linears == len(linears), scheme
        assert set(quantization.float_convolutions) <= set(convolutions), scheme  # named as the module names them
        # What the graph says stayed float is what the serialized XNNPACK Convolution nodes are.
        _, in_program = xnn_node_types(pte)
        assert dict(in_program) == quantization.convolution
        float_nodes = sum(n for kind, n in in_program.items() if kind.endswith("fp32"))
        assert float_nodes == quantization.convolutions - quantization.quantized_convolutions, scheme
        assert result.variants[VARIANTS[f"xnnpack-{scheme}"]].sidecar.seq_len is None  # an image has no seq_len
    static, _ = quantization_of(result, "int8-static")
    assert static.quantized_convolutions == 52 and static.float_convolutions == ()
    assert static.convolution == {SCHEMES["int8-static"].convolution: 52}
    four_bit, _ = quantization_of(result, "8da4w")  # quantize_ takes linears only
    assert four_bit.quantized_convolutions == 0 and set(four_bit.float_convolutions) == set(convolutions)
    assert four_bit.float_notes() == [
        "52 of 52 convolutions stay in float: " + ", ".join(sorted(convolutions)[:8]) + " … (44 more)"
    ]
    dynamic, _ = quantization_of(result, "int8-dynamic")  # the depthwise convolutions stay float
    assert 0 < dynamic.quantized_convolutions < 52 and dynamic.float_convolutions
    assert all(name.endswith(".conv.1.0") or name == "features.1.conv.0.0" for name in dynamic.float_convolutions)


def test_the_lowering_table_shows_convolutions_and_what_stayed_float(mobilenet: tuple[LoweringResult, Path]) -> None:
    result, _ = mobilenet
    item = result.variants[VARIANTS["xnnpack-8da4w"]]
    cell = _quantized_cell(item.sidecar)
    assert cell is not None and "1/1 linears, 0/52 convolutions" in cell and "FLOAT: features.0.0" in cell
    static = _quantized_cell(result.variants[VARIANTS["xnnpack-int8-static"]].sidecar)
    assert static is not None and "52/52 convolutions" in static and "FLOAT" not in static


def test_an_image_model_is_calibrated_on_the_etlt_file_it_was_given(mobilenet: tuple[LoweringResult, Path]) -> None:
    result, calibration = mobilenet
    static, _ = quantization_of(result, "int8-static")
    assert static.calibration_source is not None and static.calibration_source.startswith(f"file {calibration.name}")
    assert static.calibration_samples == 4


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        ("json", "token-id lists are for token models"),
        ("wrong name", "holds images"),
        ("wrong shape", "pixel_values is float32 [4, 1, 3, 16, 16]"),
        ("one sample", "give several samples (found 1)"),
    ],
)
def test_a_calibration_file_that_is_not_the_models_inputs_is_refused_before_loading(
    tmp_path: Path, content: str, problem: str
) -> None:
    if content == "json":
        path = tmp_path / "ids.json"
        path.write_text("[[1, 2, 3], [4, 5, 6]]")
    elif content == "wrong name":
        path = images(tmp_path / "c.etlt", 4, name="images")
    elif content == "wrong shape":
        path = images(tmp_path / "c.etlt", 4, shape=(1, 3, 16, 16))
    else:
        path = images(tmp_path / "c.etlt", 1)
    with pytest.raises(CalibrationError) as refused:
        lower(BUILTIN_SPECS["mobilenet-v2-tiny"], variants=[VARIANTS["xnnpack-int8-static"]], root=tmp_path / "a",
              calibration=path)  # fmt: skip
    message = str(refused.value.args[0])
    assert message.startswith(str(path)) and problem in message
    if content != "one sample":
        assert "pixel_values float32 [N, 1, 3, 32, 32]" in message  # says what the model takes
    assert not (tmp_path / "a").exists()  # refused before anything was loaded or written


@pytest.mark.parametrize(
    ("name", "takes"),
    [
        ("wav2vec2-tiny", "input_values float32 [N, 1, 16000]"),
        ("whisper-tiny-encoder-tiny", "input_features float32 [N, 1, 80, 100]"),
        ("vit-tiny", "pixel_values float32 [N, 1, 3, 32, 32]"),
    ],
)
def test_token_ids_are_refused_for_audio_and_vision_models_naming_their_inputs(
    tmp_path: Path, name: str, takes: str
) -> None:
    path = tmp_path / "ids.json"
    path.write_text("[[1, 2, 3], [4, 5, 6]]")
    with pytest.raises(CalibrationError, match="token-id lists are for token models") as refused:
        lower(BUILTIN_SPECS[name], variants=[VARIANTS["xnnpack-int8-static"]], root=tmp_path / "a", calibration=path)
    assert f"{name} takes 1 input(s); its calibration file is an ETLT file of {takes}" in refused.value.args[0]
    assert not (tmp_path / "a").exists()


def test_fab_lower_names_the_calibration_option_and_exits_64(tmp_path: Path) -> None:
    path = tmp_path / "ids.json"
    path.write_text("[[1, 2, 3], [4, 5, 6]]")
    done = fab_lower(tmp_path, "--model", "mobilenet-v2-tiny", "--quantize", "int8-static", "--calibration", str(path))
    assert done.returncode == 64, done.stderr
    assert f"--calibration {path}" in done.stderr and "Traceback" not in done.stderr


def test_an_audio_model_int8_dynamic_leaves_its_convolutions_float_and_says_so(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    result = lowered("wav2vec2-tiny", tmp_path)
    output = capfd.readouterr().err
    assert "generated audio, a chord and noise" in output and "token ids" not in output  # the pre-lowering warning
    linears, convolutions = eager_layers("wav2vec2-tiny")
    assert len(convolutions) == 8  # 7 in the feature extractor, 1 positional
    dynamic, _ = quantization_of(result, "int8-dynamic")
    assert dynamic.convolutions == 8 and dynamic.quantized_convolutions == 0
    assert set(dynamic.float_convolutions) == set(convolutions)
    assert "model.feature_extractor.conv_layers.0.conv" in dynamic.float_convolutions
    assert dynamic.linear_layers == dynamic.quantized_linears == len(linears)
    assert "8 of 8 convolutions stay in float: model.encoder.pos_conv_embed.conv" in output  # warned when lowered
    static, _ = quantization_of(result, "int8-static")
    assert static.convolutions == 8 and static.quantized_convolutions == 8 and static.float_convolutions == ()
    assert static.calibration_source is not None and "synthetic audio" in static.calibration_source
    assert result.variants[VARIANTS["xnnpack-int8-static"]].sidecar.seq_len is None


# What each scheme quantizes of a model's convolutions: all of them, none, or some (int8-dynamic: a resnet's first
# convolution of each block and its stem stay float; a Whisper encoder's two 1-D convolutions stay float).
CONVOLUTIONS = {"int8-static": "all", "8da4w": "none"}


@pytest.mark.parametrize("scheme", SCHEME_NAMES)
@pytest.mark.parametrize(("name", "dynamic"), [("whisper-tiny-encoder-tiny", "none"), ("resnet-18-tiny", "some")])
def test_convolutions_are_counted_from_the_graph_for_every_scheme(name: str, dynamic: str, scheme: str) -> None:
    import torch

    from orchestrator.lowering.sources.builders.models import example_inputs, load_model

    spec = BUILTIN_SPECS[name]
    module = load_model(spec, "random").module
    args = tuple(torch.from_numpy(t.array) for t in example_inputs(spec, module))
    linears, convolutions = eager_layers(name)
    report = quantize(module, args, SCHEMES[scheme], calibration=[args]).report
    assert report["convolutions"] == len(convolutions) > 0
    assert report["linear_layers"] == report["quantized_linears"] == len(linears)
    quantized, floating = report["quantized_convolutions"], report["float_convolutions"]
    assert set(floating) <= set(convolutions)
    assert quantized + len(floating) == len(convolutions)  # each layer runs once
    expected = CONVOLUTIONS.get(scheme, dynamic)
    assert {"all": quantized == len(convolutions), "none": quantized == 0, "some": 0 < quantized < len(convolutions)}[
        expected
    ], (quantized, floating)


def test_a_users_exported_program_reports_its_linears_and_convolutions(tmp_path: Path) -> None:
    import torch

    from orchestrator.lowering.export.exported import lower_exported_program

    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3), torch.nn.ReLU(), torch.nn.Flatten(), torch.nn.Linear(8 * 6 * 6, 10)
    ).eval()
    pt2 = tmp_path / "mine.pt2"
    torch.export.save(torch.export.export(model, (torch.randn(1, 3, 8, 8),)), str(pt2))
    dynamic, four_bit = VARIANTS["xnnpack-int8-dynamic"], VARIANTS["xnnpack-8da4w"]
    result = lower_exported_program(pt2, "mine", variants=[dynamic, four_bit], root=tmp_path / "a")
    for variant in (dynamic, four_bit):
        item = result.variants[variant]
        quantization = item.sidecar.quantization
        assert quantization is not None
        assert quantization.linear_layers == 1 and quantization.convolutions == 1  # not "0/0 linears"
        fully_connected, convolution = xnn_node_types(item.pte)
        assert sum(n for kind, n in fully_connected.items() if kind.endswith("fp32")) == (
            quantization.linear_layers - quantization.quantized_linears
        )
        assert sum(n for kind, n in convolution.items() if kind.endswith("fp32")) == (
            quantization.convolutions - quantization.quantized_convolutions
        )
    assert result.variants[dynamic].sidecar.quantization.quantized_linears == 1  # type: ignore[union-attr]
    # quantize_ swaps nn.Linear modules, and an exported program unlifted has none: said, not hidden.
    four_bit_report = result.variants[four_bit].sidecar.quantization
    assert four_bit_report is not None and four_bit_report.float_linears == ("3",)
    assert four_bit_report.float_notes()[0] == "1 of 1 linears stay in float: 3"


def test_a_factory_is_calibrated_on_a_file_of_its_own_inputs_and_a_wrong_one_is_refused(tmp_path: Path) -> None:
    from orchestrator.lowering.builtins import resolve_spec
    from tests.lowering.test_factory import write_factory

    spec = resolve_spec(spec_path=write_factory(tmp_path), trust_code=True)
    static = VARIANTS["xnnpack-int8-static"]
    rng = np.random.default_rng(3)
    good = tmp_path / "good.etlt"
    write_tensors(good, [NamedTensor("image", rng.random((3, 1, 3, 16, 16), dtype=np.float32)),
                         NamedTensor("scale", np.full((3, 1, 4), 2.0, dtype=np.float32))])  # fmt: skip
    result = lower(spec, variants=[static], root=tmp_path / "a", calibration=good, jobs=1)
    quantization = result.variants[static].sidecar.quantization
    assert quantization is not None and quantization.calibration_samples == 3
    assert quantization.calibration_source is not None and quantization.calibration_source.startswith("file good.etlt")
    assert quantization.convolutions == quantization.quantized_convolutions == 1
    assert quantization.linear_layers == quantization.quantized_linears == 1
    bad = images(tmp_path / "bad.etlt", 3, shape=(1, 3, 16, 16), name="image")  # no `scale`
    with pytest.raises(CalibrationError, match="holds image; my-small takes 2 input"):
        lower(spec, variants=[static], root=tmp_path / "b", calibration=bad, jobs=1)


@pytest.mark.parametrize("calibrated_on", ["generated", "file"])
def test_int8_static_calibrates_a_batch_of_token_ids_with_token_type_ids(tmp_path: Path, calibrated_on: str) -> None:
    """A text classifier whose family takes token_type_ids, batch 2: the samples take every input at the batch."""
    import dataclasses

    from orchestrator.tensorfile import read_tensors

    spec = dataclasses.replace(BUILTIN_SPECS["bert-base-tiny"].with_options(mask_token_id=None), name="bert-classifier",
                               task="text-classification", seq_len=16, batch_size=2)  # fmt: skip
    path = None
    if calibrated_on == "file":
        path = tmp_path / "ids.json"
        path.write_text("[[101, 7, 8, 102], [101, 9, 10, 11, 12, 102], [101, 5, 102]]")
    static = VARIANTS["xnnpack-int8-static"]
    result = lower(spec, variants=[static], root=tmp_path / "a", calibration=path, jobs=1)
    names = [t.name for t in read_tensors(result.paths.reference_inputs)]
    assert names == ["input_ids", "attention_mask", "token_type_ids"]
    sidecar = result.variants[static].sidecar
    assert sidecar.seq_len == 16
    quantization = sidecar.quantization
    assert quantization is not None and quantization.calibration_samples == (3 if path else 8)
    assert quantization.linear_layers == quantization.quantized_linears > 0
