"""Mixed precision (`--keep-float LAYER,...`): a quantized program that keeps some layers in float is a program of
its own (`<model>.kf-<8 hex>`, lowering/program.py), its layers the spec's `keep_float` and its cache key's; every
scheme leaves exactly those layers fp32 (checked in the quantized graph), a layer the model does not have is refused
with the names it has (exit 64), and so are an fp32 variant of it, a text-generation model and a malformed name."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from orchestrator.lowering.builtins import BUILTIN_SPECS
from orchestrator.lowering.export.cache import cache_key
from orchestrator.lowering.program import KEEP_FLOAT, ProgramChoice, ProgramName, programs, refusals, with_
from orchestrator.lowering.quantize.quantized import KeptLayerUnknown, kept_layer_paths, quantize
from orchestrator.lowering.quantize.schemes import SCHEMES
from orchestrator.lowering.variants import VARIANTS
from orchestrator.names import is_valid_name
from orchestrator.paths import PROJECT_ROOT


def test_a_mixed_precision_program_has_a_name_of_its_own_read_back_by_the_one_parse() -> None:
    bert = BUILTIN_SPECS["distilbert-tiny"]
    kept = with_(bert, keep_float=("vocab_projector", "distilbert.transformer.layer.1.ffn.lin2", "vocab_projector"))
    assert kept.keep_float == ("distilbert.transformer.layer.1.ffn.lin2", "vocab_projector")  # sorted, once each
    parts = ProgramName.parse(kept.name)
    assert parts.base == "distilbert-tiny" and parts.keep_float_digest is not None and str(parts) == kept.name
    # the order the layers are given in does not make another program
    again = with_(bert, keep_float=("distilbert.transformer.layer.1.ffn.lin2", "vocab_projector"))
    assert again.name == kept.name
    other = with_(bert, keep_float=("vocab_projector",))
    assert other.name != kept.name
    # with rewrites, and with a base long enough to need the short form: still a valid name, read back
    gpt2 = programs(BUILTIN_SPECS["gpt2-tiny"], ProgramChoice(keep_float=("lm_head",)))[0].spec
    assert ProgramName.parse(gpt2.name).keep_float_digest is not None
    long = with_(BUILTIN_SPECS["distilbert-tiny"], keep_float=("a",))
    named = ProgramName("x" * 60, keep_float_digest=ProgramName.parse(long.name).keep_float_digest)
    assert is_valid_name(str(named)) and ProgramName.parse(str(named)).keep_float_digest == named.keep_float_digest
    # nothing kept: the model itself, its cache key as before the field existed
    assert with_(bert) is bert and "keep_float" not in bert.to_dict()
    variant = VARIANTS["xnnpack-int8-dynamic"]
    assert cache_key(kept, variant, "random", False) != cache_key(bert, variant, "random", False)


def test_what_cannot_keep_a_layer_in_float_is_refused_with_its_choice() -> None:
    gen = BUILTIN_SPECS["smollm2-gen-tiny"]
    (refused,) = refusals(gen, ProgramChoice(keep_float=("lm_head",)))
    assert refused.choice == KEEP_FLOAT and "text-generation" in refused.reason
    (malformed,) = refusals(BUILTIN_SPECS["distilbert-tiny"], ProgramChoice(keep_float=("ok.name", "../etc", "a b")))
    assert malformed.choice == KEEP_FLOAT and malformed.value == "../etc, a b"


def _three_linears() -> tuple[Any, tuple[Any, ...]]:
    import torch

    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 32)
    ).eval()
    return model, (torch.randn(2, 64),)


@pytest.mark.parametrize("scheme", ["int8-dynamic", "int8-static", "8da4w"])
def test_every_scheme_keeps_exactly_the_layers_asked_in_float(scheme: str) -> None:
    model, args = _three_linears()
    report = quantize(model, args, SCHEMES[scheme], calibration=[args], keep_float=("2",)).report
    assert report["kept_float"] == ["2"]
    assert report["float_linears"] == ["2"] and report["quantized_linears"] == 2  # read from the quantized graph
    everything = quantize(model, args, SCHEMES[scheme], calibration=[args]).report
    assert everything["float_linears"] == [] and everything["quantized_linears"] == 3 and "kept_float" not in everything


def test_a_layer_the_model_does_not_have_is_refused_with_the_ones_it_has() -> None:
    model, args = _three_linears()
    with pytest.raises(KeptLayerUnknown) as refused:
        quantize(model, args, SCHEMES["int8-dynamic"], keep_float=("1",))  # the ReLU: no linear
    assert refused.value.unknown == ["1"] and refused.value.layers == ["0", "2", "4"]
    # an etlab wrapper holds the user's model as `model`: the user's own path is enough
    assert kept_layer_paths(("encoder.fc",), ["model.encoder.fc", "model.head"]) == ("model.encoder.fc",)
    assert kept_layer_paths(("model.head",), ["model.encoder.fc", "model.head"]) == ("model.head",)


def _fab_lower(tmp_path: Path, *options: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "ETLAB_ARTIFACTS": str(tmp_path / "artifacts")}
    return subprocess.run(
        [sys.executable, "-m", "fabric", "lower", *options], cwd=PROJECT_ROOT, env=env, capture_output=True,
        text=True, timeout=600,
    )  # fmt: skip


def test_fab_lower_refuses_a_bad_keep_float_with_64_and_what_it_takes(tmp_path: Path) -> None:
    unknown = _fab_lower(tmp_path, "--model", "distilbert-tiny", "--quantize", "int8-dynamic", "--keep-float",
                         "distilbert.transformer.layer.9.ffn.lin2")  # fmt: skip
    said = " ".join((unknown.stdout + unknown.stderr).split())
    assert unknown.returncode == 64, said
    assert said.count("--keep-float") >= 2  # the option, named by the command layer, in the error and its hint
    assert "has no linear or convolution named" in said and "distilbert.transformer.layer.1.ffn.lin2" in said
    assert "Traceback" not in said
    fp32 = _fab_lower(tmp_path, "--model", "distilbert-tiny", "--backend", "xnnpack", "--quantize", "none,int8-dynamic",
                      "--keep-float", "vocab_projector")  # fmt: skip
    assert fp32.returncode == 64 and "fp32 throughout already" in fp32.stdout + fp32.stderr
    generating = _fab_lower(tmp_path, "--model", "smollm2-gen-tiny", "--quantize", "8da4w", "--keep-float", "lm_head")
    assert generating.returncode == 64 and "--keep-float lm_head" in generating.stdout + generating.stderr
    # nothing of a refused program was left to look lowered
    assert not list((tmp_path / "artifacts").rglob("*.pte"))
