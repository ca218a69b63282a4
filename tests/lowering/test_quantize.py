"""Quantized variants: the schemes, what the lowered programs really hold, the accuracy gate, the nightly matrix.
Parallel lowering: test_quantize_parallel.py.

Real tiny models, real torchao/ExecuTorch quantization and lowering, the real runner on the local board and on an
sshd board, driven through `fab` where users drive it.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from orchestrator.boards.inventory import Board, load_inventory
from orchestrator.commands.common import variants
from orchestrator.commands.options import ACCURACY_DEFAULTS, accuracy_thresholds
from orchestrator.errors import InventoryError, UsageError
from orchestrator.fsutil import atomic_write_json, read_json
from orchestrator.lab.history import History
from orchestrator.lab.matrix import load_config
from orchestrator.lowering.artifacts import ArtifactPaths, file_record, sidecar_problem
from orchestrator.lowering.builtins import BUILTIN_SPECS
from orchestrator.lowering.export.lower import LoweringResult
from orchestrator.lowering.quantize.schemes import SCHEMES
from orchestrator.lowering.quantize.xnn_types import fully_connected_types
from orchestrator.lowering.sources.huggingface import HuggingFaceOptions
from orchestrator.lowering.spec import ModelSpec
from orchestrator.lowering.variants import VARIANTS
from orchestrator.paths import PROJECT_ROOT
from orchestrator.results.validity import accuracy_figures, judge_accuracy
from orchestrator.tensorfile import NamedTensor, read_tensors, write_tensors
from tests.plugins.analysis import adapter_graphs
from tests.plugins.artifacts import ARTIFACT_CACHE, TINY_MODELS
from tests.plugins.boards import SHARED_BUILD, write_inventory
from tests.plugins.quantized import TINY_SCHEMES, break_weight_scales


def fab(*args: str, artifacts: Path, results: Path, timeout: float = 1800) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "ETLAB_ARTIFACTS": str(artifacts), "ETLAB_RESULTS": str(results)}
    return subprocess.run(
        [sys.executable, "-m", "fabric", *args], cwd=PROJECT_ROOT, env=env, capture_output=True, text=True,
        timeout=timeout,
    )  # fmt: skip


def eager_linear_count(name: str) -> int:
    """How many linear layers the eager model has (nn.Linear and HF Conv1D), counted without our code."""
    import torch

    from orchestrator.lowering.sources.builders.huggingface import build_random

    model = build_random(BUILTIN_SPECS[name])
    return sum(isinstance(m, torch.nn.Linear) or type(m).__name__ == "Conv1D" for m in model.modules())


def summaries(results: Path) -> dict[tuple[str, str], list[dict[str, Any]]]:
    found: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for path in results.glob("*/*/*/*/analysis/summary.json"):
        run = path.parent.parent
        found.setdefault((run.parent.parent.parent.name, run.parent.name), []).append(
            {**json.loads(path.read_text()), "_path": str(run)}
        )
    return found


# ----------------------------------------------------------------------------------------------------------------
# Options and names


def test_quantize_option_and_backend_names() -> None:
    def names(backend: str, quantize: str = "none") -> list[str]:
        return [variant.name for variant in variants(backend, quantize)]

    assert names("xnnpack", "none,int8-dynamic,int8-dynamic") == ["xnnpack", "xnnpack-int8-dynamic"]
    assert names("xnnpack", "none,8da4w") == ["xnnpack", "xnnpack-8da4w"]
    assert names("portable,xnnpack", "int8-static") == ["xnnpack-int8-static"]
    assert names("xnnpack-int8-dynamic") == ["xnnpack-int8-dynamic"]
    with pytest.raises(UsageError, match="--quantize: unknown scheme int4"):
        variants("xnnpack", "int4")
    with pytest.raises(UsageError, match="--min-top5"):
        accuracy_thresholds(min_top5="1.5")
    with pytest.raises(UsageError, match="--min-sqnr"):
        accuracy_thresholds(min_sqnr="nan")
    assert accuracy_thresholds(min_sqnr="25")["min_sqnr_db"] == 25.0


def test_a_bad_quantize_option_exits_64_before_anything_is_lowered(tmp_path: Path) -> None:
    result = fab("lower", "--model", "distilbert-tiny", "--quantize", "int3", artifacts=tmp_path / "a",
                 results=tmp_path / "r", timeout=300)  # fmt: skip
    assert result.returncode == 64, result.stdout + result.stderr
    assert "int3" in result.stderr and "int8-dynamic" in result.stderr
    assert not (tmp_path / "a").exists()


def test_calibration_files_json_and_etlt(tmp_path: Path) -> None:
    from orchestrator.lowering.quantize.calibration import calibration_from_file

    good = tmp_path / "samples.json"
    good.write_text(json.dumps([[101, 7, 8, 102], {"input_ids": [101, 9, 102]}]))
    samples = calibration_from_file(good, seq_len=8, vocab_size=200)
    assert len(samples) == 2
    ids, mask = samples[1]
    assert ids.shape == (1, 8) and ids[0, :3].tolist() == [101, 9, 102] and mask[0].tolist() == [1, 1, 1, 0, 0, 0, 0, 0]

    etlt = tmp_path / "samples.etlt"
    ids_array = np.array([[5, 6, 0, 0], [7, 8, 9, 0]], dtype=np.int64)
    masks = np.array([[1, 1, 0, 0], [1, 1, 1, 0]], dtype=np.int64)
    write_tensors(etlt, [NamedTensor("input_ids", ids_array), NamedTensor("attention_mask", masks)])
    from_etlt = calibration_from_file(etlt, seq_len=4, vocab_size=200)
    assert [int(m.sum()) for _, m in from_etlt] == [2, 3]

    for content, message in (
        ("[[1, 2]]", "several samples"),
        ("[[1, 2], [3, 999]]", "outside 0..199"),
        ('[[1, "a"]]', "not a non-empty list of integer token ids"),
        ("{not json", "not valid JSON"),
    ):
        bad = tmp_path / "bad.json"
        bad.write_text(content)
        with pytest.raises(UsageError, match=message):
            calibration_from_file(bad, seq_len=8, vocab_size=200)
    with pytest.raises(UsageError, match="no such file"):
        calibration_from_file(tmp_path / "missing.json", seq_len=8, vocab_size=200)


# ----------------------------------------------------------------------------------------------------------------
# The integer-scalar workaround


@pytest.mark.parametrize("name", TINY_MODELS)
def test_the_shipped_quantizer_breaks_integer_index_arithmetic_and_ours_does_not(name: str) -> None:
    """Without the workaround (the XNNPACK quantizer as shipped) calibration fails; with it, int8 quantizes."""
    import torch
    from torchao.quantization.pt2e.quantize_pt2e import prepare_pt2e

    from orchestrator.lowering.quantize.methods import shipped_quantizer, swap_conv1d
    from orchestrator.lowering.quantize.quantized import quantize as quantize_module
    from orchestrator.lowering.sources.builders.huggingface_inputs import reference_inputs
    from orchestrator.lowering.sources.builders.models import load_model, vocab_size_of

    spec = BUILTIN_SPECS[name]
    module = load_model(spec, "random").module
    args = tuple(torch.from_numpy(t.array) for t in reference_inputs(spec, vocab_size_of(module)))

    import copy

    plain = copy.deepcopy(module)
    swap_conv1d(plain)
    prepared = prepare_pt2e(torch.export.export(plain, args, strict=False).module(), shipped_quantizer(True))
    with pytest.raises((IndexError, RuntimeError), match=r"indices|Long"):
        prepared(*args)

    quantized = quantize_module(module, args, SCHEMES["int8-dynamic"])
    assert quantized.report["quantized_linears"] == quantized.report["linear_layers"] == eager_linear_count(name)
    assert quantized.report["float_linears"] == []
    with torch.no_grad():
        out, ref = quantized.program.module()(*args), module(*args)
    assert int(out.argmax()) == int(ref.argmax())


def test_int8_static_keeps_the_attention_mask_add_in_float(monkeypatch: pytest.MonkeyPatch) -> None:
    """Eager attention (`--rewrites eager-attention`) adds a mask of about -3.4e38 before softmax: quantized per
    tensor, it zeroes every score."""
    import torch

    from orchestrator.lowering.quantize import methods
    from orchestrator.lowering.quantize.quantized import quantize
    from orchestrator.lowering.rewrites.huggingface import eager_attention
    from orchestrator.lowering.sources.builders.huggingface_inputs import reference_inputs
    from orchestrator.lowering.sources.builders.models import load_model, vocab_size_of

    spec = BUILTIN_SPECS["gpt2-tiny"]
    module = eager_attention(load_model(spec, "random").module, spec)
    args = tuple(torch.from_numpy(t.array) for t in reference_inputs(spec, vocab_size_of(module)))

    def softmax_inputs() -> list[str]:
        program = quantize(module, args, SCHEMES["int8-static"], calibration=[args]).program
        softmaxes = [node for node in program.graph.nodes if "softmax" in str(node.target)]
        assert softmaxes
        return [str(node.args[0].target) for node in softmaxes]

    assert not [target for target in softmax_inputs() if "dequantize" in target]
    monkeypatch.setattr(methods, "keep_softmax_inputs_float", lambda model: None)
    assert all("dequantize" in target for target in softmax_inputs()), "without the guard the mask add is int8"


def test_layers_8da4w_cannot_group_are_named_as_float() -> None:
    """A user's spec whose widths are not multiples of the group size: the float layers are listed, never hidden."""
    import torch

    from orchestrator.lowering.quantize.quantized import quantize as quantize_module
    from orchestrator.lowering.sources.builders.huggingface_inputs import reference_inputs
    from orchestrator.lowering.sources.builders.models import load_model, vocab_size_of

    spec = ModelSpec(
        name="odd-bert", model_type="distilbert", task="fill-mask", seq_len=16,
        options=HuggingFaceOptions(config={"vocab_size": 500, "dim": 48, "n_layers": 1, "n_heads": 2, "hidden_dim": 64},
                                   mask_token_id=103),
    )  # fmt: skip
    module = load_model(spec, "random").module
    args = tuple(torch.from_numpy(t.array) for t in reference_inputs(spec, vocab_size_of(module)))
    report = quantize_module(module, args, SCHEMES["8da4w"]).report
    # dim 48 is no multiple of 32: every linear reading 48 features stays float; lin2 reads 64 and is quantized.
    assert report["linear_layers"] == 8
    assert report["quantized_linears"] == 1
    assert len(report["float_linears"]) == 7
    assert "model.distilbert.transformer.layer.0.attention.q_lin" in report["float_linears"]


# ----------------------------------------------------------------------------------------------------------------
# What the lowered programs hold


@pytest.mark.parametrize("name", TINY_MODELS)
def test_quantized_node_counts_are_what_the_sidecar_claims(
    name: str, quantized_artifacts: dict[str, LoweringResult]
) -> None:
    result = quantized_artifacts[name]
    linears = eager_linear_count(name)
    fp32 = result.variants[VARIANTS["xnnpack"]]
    assert dict(fully_connected_types(fp32.pte)) == {"fp32 x fp32": linears}
    for scheme in (s.name for s in TINY_SCHEMES):
        item = result.variants[VARIANTS[f"xnnpack-{scheme}"]]
        assert item.sidecar.quantization is not None
        quantization = item.sidecar.quantization
        in_program = dict(fully_connected_types(item.pte))  # read from the serialized XNNPACK graphs
        assert in_program == {SCHEMES[scheme].fully_connected: linears}, (scheme, in_program)
        assert quantization.fully_connected == in_program
        assert quantization.nodes is not None and quantization.nodes.quantized_fully_connected == linears
        assert quantization.quantized_linears == quantization.linear_layers == linears
        assert quantization.float_linears == ()
        assert quantization.scheme == scheme and quantization.method
        assert quantization.conv1d_swapped_to_linear == (8 if name == "gpt2-tiny" else 0)
        assert item.sidecar.pte_size_mb < fp32.sidecar.pte_size_mb
        assert item.pte.name == f"{name}_xnnpack-{scheme}.pte"
        assert "exported_program" not in item.sidecar.files  # lowered from the eager model
    calibration = result.variants[VARIANTS["xnnpack-int8-static"]].sidecar.quantization
    assert calibration is not None and calibration.calibration_source is not None
    assert calibration.calibration_source.startswith("generated") and (calibration.calibration_samples or 0) >= 2


# ----------------------------------------------------------------------------------------------------------------
# The accuracy gate


def _etlt(path: Path, array: np.ndarray) -> Path:
    write_tensors(path, [NamedTensor("output_0", array.astype(np.float32))])
    return path


def test_accuracy_figures_and_gate(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    reference = rng.normal(size=(1, 100)) * 5
    ref = _etlt(tmp_path / "ref.etlt", reference)
    same = accuracy_figures(_etlt(tmp_path / "same.etlt", reference), ref)
    assert isinstance(same, dict) and same["max_abs_error"] == 0 and same["top1_agreement"] == 1.0
    assert same["top5_overlap"] == 1.0 and same["sqnr_db"] >= 900

    noisy = reference + rng.normal(size=reference.shape) * 0.05  # noise 1/100 of the signal: 40 dB
    figures = accuracy_figures(_etlt(tmp_path / "noisy.etlt", noisy), ref)
    assert isinstance(figures, dict) and 35 < figures["sqnr_db"] < 45
    good = judge_accuracy(tmp_path / "noisy.etlt", ref, "int8-dynamic", dict(ACCURACY_DEFAULTS), "random")
    assert good.verdict == "pass" and not good.meaningful and "not meaningful" in (good.note or "")

    shuffled = reference[:, rng.permutation(100)]
    bad = judge_accuracy(_etlt(tmp_path / "bad.etlt", shuffled), ref, "8da4w", dict(ACCURACY_DEFAULTS), "pretrained")
    assert bad.verdict == "fail" and bad.meaningful
    assert any("SQNR" in r for r in bad.reasons) and any("top-5" in r for r in bad.reasons)

    # A top-1 flip between two reference logits closer than the noise is a tie; a clear one is not.
    tied = reference.copy()
    tied[0, :2] = [100.0, 99.99]
    flipped = tied + rng.normal(size=tied.shape) * 0.05  # quantization noise on every logit
    flipped[0, :2] = [99.99, 100.0]
    tie = judge_accuracy(_etlt(tmp_path / "flip.etlt", flipped), _etlt(tmp_path / "tied.etlt", tied), "int8-static",
                         dict(ACCURACY_DEFAULTS), "pretrained")  # fmt: skip
    assert tie.top1_agreement == 0.0 and tie.top1_within_noise == 1.0 and tie.verdict == "pass", tie
    clear = tied.copy()
    clear[0, 1] = 50.0
    flipped_clear = clear.copy()
    flipped_clear[0, :2] = [50.0, 100.0]
    wrong = judge_accuracy(_etlt(tmp_path / "wrong.etlt", flipped_clear), _etlt(tmp_path / "clear.etlt", clear),
                           "int8-static", {**ACCURACY_DEFAULTS, "min_sqnr_db": -100.0}, "pretrained")  # fmt: skip
    assert wrong.verdict == "fail" and any("top-1" in r for r in wrong.reasons), wrong

    strict = {**ACCURACY_DEFAULTS, "min_sqnr_db": 50.0}
    assert judge_accuracy(tmp_path / "noisy.etlt", ref, "int8-dynamic", strict, "pretrained").verdict == "fail"


@pytest.fixture(scope="module")
def quant_lab(sshd_lab: Any, local_board: Board, tmp_path_factory: pytest.TempPathFactory) -> Any:
    fake = sshd_lab.board("pi5-quant", **SHARED_BUILD)
    folder = tmp_path_factory.mktemp("quant-lab")
    inventory = write_inventory(folder / "inventory.yaml", [local_board, fake.board])
    yield {"inventory": inventory, "fake": fake, "folder": folder}
    sshd_lab.discard(fake)


def test_deploy_and_profile_every_scheme_side_by_side_then_compare_across_schemes(
    quant_lab: dict[str, Any], quantized_artifacts: dict[str, LoweringResult], tmp_path: Path
) -> None:
    results = tmp_path / "results"
    result = fab("deploy-and-profile", "--model", "distilbert-tiny", "--quantize",
                 "none,int8-dynamic,int8-static,8da4w", "--board", "local,pi5-quant", "--iterations", "5",
                 "--warmup", "1", "--no-explore", "--inventory", str(quant_lab["inventory"]),
                 artifacts=ARTIFACT_CACHE, results=results)  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    table = " ".join(result.stdout.split())  # rich wraps cells to the terminal's width
    # the compact accuracy cell: "pass 38.9dB t1 99% t5 98% †" (render.py), one per quantized cell
    assert "accuracy vs" in table and "fp32" in table and len(re.findall(r"\bpass [\d.-]+dB", table)) >= 6, table
    found = summaries(results)
    for board in ("local", "pi5-quant"):
        fp32 = found[(board, "xnnpack")][0]
        assert fp32.get("accuracy") is None and fp32["correctness"]["ok"]
        for scheme in (s.name for s in TINY_SCHEMES):
            (summary,) = found[(board, f"xnnpack-{scheme}")]
            accuracy = summary["accuracy"]
            assert accuracy["scheme"] == scheme and accuracy["verdict"] == "pass", accuracy
            assert accuracy["meaningful"] is False and "not meaningful" in accuracy["note"]
            for figure in ("max_abs_error", "top1_agreement", "sqnr_db", "top5_overlap"):
                assert isinstance(accuracy[figure], float), (figure, accuracy)
            assert accuracy["sqnr_db"] > ACCURACY_DEFAULTS["min_sqnr_db"]
            assert summary["validity"]["status"] != "invalid", summary["validity"]
            assert summary["model"]["size_bytes"] < fp32["model"]["size_bytes"]
            # Model Explorer paints inside the quantized delegates as inside the fp32 ones.
            coverage = summary["profile"]["overlay_coverage"]
            assert coverage["delegates"] > 0 and coverage["delegates_placed"] == coverage["delegates"], coverage
            if board == "local":  # the real PTE adapter opens the quantized program; the overlays hit its nodes
                graphs = adapter_graphs(
                    quantized_artifacts["distilbert-tiny"].variants[VARIANTS[f"xnnpack-{scheme}"]].pte
                )
                overlay = json.loads(
                    (Path(summary["_path"]) / "model_explorer" / "me_overlay_median_ms.json").read_text()
                )
                inside = [graph for graph in overlay if "::" in graph]
                assert len(inside) == coverage["delegates"]
                for graph_id, data in overlay.items():
                    assert data["results"] and set(data["results"]) <= graphs[graph_id], graph_id

    fp32_run = Path(found[("local", "xnnpack")][0]["_path"]).name
    int8_run = Path(found[("pi5-quant", "xnnpack-int8-dynamic")][0]["_path"]).name
    compare = fab("compare", fp32_run, int8_run, artifacts=ARTIFACT_CACHE, results=results, timeout=600)
    assert compare.returncode == 0, compare.stdout + compare.stderr
    text = compare.stdout + compare.stderr
    assert "different quantization schemes (fp32 vs int8-dynamic)" in text
    # ok with the speed ratio, or inconclusive when this shared machine degraded a run: never a regression.
    assert "overall: ok:" in text or "overall: inconclusive:" in text, text
    assert "regression" not in text.replace("not a regression", "")

    from orchestrator.servers.explorer import program_models

    present, _ = program_models(ArtifactPaths.for_model("distilbert-tiny", ARTIFACT_CACHE))
    names = {path.name for path in present}
    assert {f"distilbert-tiny_xnnpack-{s.name}.pte" for s in TINY_SCHEMES} <= names
    assert "distilbert-tiny_xnnpack.pte" in names


def test_a_broken_scale_program_fails_the_accuracy_gate(
    quant_lab: dict[str, Any], quantized_artifacts: dict[str, LoweringResult], tmp_path: Path
) -> None:
    import torch
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.exir import to_edge_transform_and_lower

    from orchestrator.lowering.quantize.quantized import quantize as quantize_module
    from orchestrator.lowering.sources.builders.models import load_model

    # A copy of the artifacts whose int8-dynamic program has wrong weight scales, its sidecar vouching for it.
    artifacts = tmp_path / "artifacts"
    shutil.copytree(ARTIFACT_CACHE / "distilbert-tiny", artifacts / "distilbert-tiny")
    paths = ArtifactPaths.for_model("distilbert-tiny", artifacts)
    args = tuple(torch.from_numpy(t.array) for t in read_tensors(paths.reference_inputs))
    quantized = quantize_module(
        load_model(BUILTIN_SPECS["distilbert-tiny"], "random").module, args, SCHEMES["int8-dynamic"]
    )
    assert break_weight_scales(quantized.program) == eager_linear_count("distilbert-tiny")
    program = to_edge_transform_and_lower(quantized.program, partitioner=[XnnpackPartitioner()]).to_executorch()
    variant = VARIANTS["xnnpack-int8-dynamic"]
    paths.pte(variant).write_bytes(program.buffer)
    sidecar = read_json(paths.sidecar(variant))
    sidecar["files"]["pte"] = file_record(paths.pte(variant))
    sidecar["sha256"] = sidecar["files"]["pte"]["sha256"]
    atomic_write_json(paths.sidecar(variant), sidecar)
    assert sidecar_problem(paths, variant) is None

    results = tmp_path / "results"
    result = fab("deploy-and-profile", "--model", "distilbert-tiny", "--quantize", "int8-dynamic",
                 "--board", "local", "--iterations", "3", "--warmup", "1", "--no-explore",
                 "--inventory", str(quant_lab["inventory"]), artifacts=artifacts, results=results)  # fmt: skip
    text = result.stdout + result.stderr
    (summary,) = summaries(results)[("local", variant.name)]
    accuracy = summary["accuracy"]
    assert accuracy["verdict"] == "fail", accuracy
    assert accuracy["sqnr_db"] < ACCURACY_DEFAULTS["min_sqnr_db"]
    assert any("SQNR" in reason for reason in accuracy["reasons"])
    assert "accuracy gate failed" in text and re.search(r"\bfail [\d.-]+dB", " ".join(result.stdout.split()))
    # Random weights: the gate's verdict is recorded and shown, but not enforced (README: accuracy gate).
    assert result.returncode == 0, text
    assert summary["validity"]["status"] != "invalid"


# ----------------------------------------------------------------------------------------------------------------
# Nightly


def test_nightly_matrix_quantize_key_and_history_keys_carry_the_scheme(
    local_board: Board, quantized_artifacts: dict[str, LoweringResult], tmp_path: Path
) -> None:
    section = {
        "history": f"sqlite:///{tmp_path / 'history.sqlite'}",
        "reports": str(tmp_path / "reports"),
        "iterations": 3,
        "warmup": 1,
        "min_sqnr_db": 12.5,
        "cooldown_seconds": 1,  # 3 iterations often come out degraded: the re-measure need not wait a minute
        "matrix": [{"models": ["distilbert-tiny"], "backends": ["xnnpack"], "quantize": ["none", "int8-dynamic"],
                    "boards": ["local"]}],
    }  # fmt: skip
    inventory = write_inventory(tmp_path / "inventory.yaml", [local_board], nightly=section)
    config = load_config(load_inventory(inventory))
    assert config.entries[0].variants == (VARIANTS["xnnpack"], VARIANTS["xnnpack-int8-dynamic"])
    assert config.accuracy["min_sqnr_db"] == 12.5

    bad = write_inventory(
        tmp_path / "bad.yaml", [local_board],
        nightly={**section, "matrix": [{"models": ["distilbert-tiny"], "backends": ["xnnpack"],
                                        "quantize": ["int4"]}]},
    )  # fmt: skip
    with pytest.raises(InventoryError, match=r"bad\.yaml:\d+: nightly\.matrix\[0\]\.quantize: unknown scheme 'int4'"):
        load_config(load_inventory(bad))

    env = {**os.environ, "ETLAB_ARTIFACTS": str(ARTIFACT_CACHE), "ETLAB_RESULTS": str(tmp_path / "results")}
    night = subprocess.run(
        [sys.executable, "-m", "fabric", "nightly", "--inventory", str(inventory), "--night", "2026-11-01"],
        cwd=PROJECT_ROOT, env=env, capture_output=True, text=True, timeout=1800,
    )  # fmt: skip
    assert night.returncode == 0, night.stdout + night.stderr
    history = History(f"sqlite:///{tmp_path / 'history.sqlite'}")
    try:
        cells = {(run.board, run.model, run.backend) for run in history.runs(night="2026-11-01")}
    finally:
        history.close()
    assert cells == {("local", "distilbert-tiny", "xnnpack"), ("local", "distilbert-tiny", "xnnpack-int8-dynamic")}
