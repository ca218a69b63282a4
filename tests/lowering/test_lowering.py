"""`lower`: real ExecuTorch lowering of the tiny models, sidecars, cache, atomicity, weights."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from orchestrator.commands.common import variants
from orchestrator.errors import ArtifactError, SpecError, UsageError
from orchestrator.fsutil import remove_stale_temporaries, sha256_file
from orchestrator.lowering.artifacts import ArtifactPaths, load_artifact, sidecar_problem
from orchestrator.lowering.builtins import BUILTIN_SPECS
from orchestrator.lowering.export import cache
from orchestrator.lowering.export import lower as lowering
from orchestrator.lowering.export.lower import LoweringResult
from orchestrator.lowering.export.numerics import numerics_files
from orchestrator.lowering.export.source_map import source_map_path
from orchestrator.lowering.sidecar import sidecar_data
from orchestrator.lowering.sources.huggingface import HuggingFaceOptions
from orchestrator.lowering.spec import ModelSpec, load_spec_file
from orchestrator.lowering.variants import VARIANTS
from orchestrator.paths import PROJECT_ROOT
from orchestrator.tensorfile import read_tensors
from tests.plugins.artifacts import TINY_MODELS
from tests.plugins.processes import reaped

FAB = [sys.executable, "-m", "fabric"]


def run_fab(*args: str, env: dict[str, str] | None = None, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*FAB, *args], cwd=PROJECT_ROOT, env={**os.environ, **(env or {})}, capture_output=True, text=True, **kwargs
    )


def execution_plan_counts(pte: Path) -> dict[str, int]:
    """Instruction kinds read back from the serialized program, independently of the sidecar."""
    from executorch.exir._serialize._program import deserialize_pte_binary

    program = deserialize_pte_binary(pte.read_bytes())
    program = getattr(program, "program", program)
    plan = next(p for p in program.execution_plan if p.name == "forward")
    counts: dict[str, int] = {}
    for chain in plan.chains:
        for instruction in chain.instructions:
            kind = type(instruction.instr_args).__name__
            counts[kind] = counts.get(kind, 0) + 1
    return counts


@pytest.mark.parametrize("model", TINY_MODELS)
def test_sidecars_describe_the_programs(tiny_artifacts: dict[str, LoweringResult], model: str) -> None:
    result = tiny_artifacts[model]
    portable = result.variants[VARIANTS["portable"]].sidecar
    xnnpack = result.variants[VARIANTS["xnnpack"]].sidecar
    for variant, sidecar in ((VARIANTS["portable"], portable), (VARIANTS["xnnpack"], xnnpack)):
        pte = result.paths.pte(variant)
        for key in ("model", "model_id", "backend", "exported_program", "pte", "pte_size_mb", "seq_len", "weights"):
            assert key in sidecar_data(sidecar), key  # the layout on disk
        assert sidecar.variant == variant and sidecar_data(sidecar)["backend"] == variant.name
        assert sidecar.sha256 == sha256_file(pte)
        assert sidecar.pte_size_mb == pytest.approx(pte.stat().st_size / 1e6, abs=1e-3)
        assert set(sidecar.versions) == {"torch", "executorch", "transformers"}
        assert sidecar.weights == "random"
        assert sidecar.inputs == [
            {"name": "input_ids", "shape": [1, 128], "dtype": "int64"},
            {"name": "attention_mask", "shape": [1, 128], "dtype": "int64"},
        ]
        assert [(o.name, o.kind, o.shape, o.dtype) for o in sidecar.outputs] == [
            ("output_0", "logits", (1, 128, 1000), "float32")  # every position
        ]
        counts = execution_plan_counts(pte)
        instructions = sidecar.delegation.instructions
        assert instructions["KernelCall"] == counts.get("KernelCall", 0)
        assert instructions["DelegateCall"] == counts.get("DelegateCall", 0)
        histogram = sidecar.delegation.fallback_histogram
        assert sum(histogram.values()) == sidecar.delegation.fallback_ops
        assert "memory.alloc" in histogram
        assert (result.paths.folder / sidecar.exported_program).is_file()
        assert sidecar_problem(result.paths, variant) is None

    assert portable.delegation.delegate_call_sites == 0
    assert portable.delegation.instructions["DelegateCall"] == 0
    assert xnnpack.delegation.delegate_call_sites > 0
    assert xnnpack.delegation.delegate_call_sites == xnnpack.delegation.instructions["DelegateCall"]
    assert xnnpack.delegation.delegate_backends == {"XnnpackBackend": xnnpack.delegation.delegate_call_sites}
    # Delegation moves work out of the fallback path.
    assert xnnpack.delegation.fallback_ops < portable.delegation.fallback_ops
    assert "getitem" in xnnpack.delegation.fallback_histogram


@pytest.mark.parametrize("model", TINY_MODELS)
@pytest.mark.parametrize("backend", ["portable", "xnnpack"])
def test_pte_matches_eager_outputs(tiny_artifacts: dict[str, LoweringResult], model: str, backend: str) -> None:
    from executorch.runtime import Runtime

    paths = tiny_artifacts[model].paths
    inputs = [torch.from_numpy(t.array) for t in read_tensors(paths.reference_inputs)]
    (reference,) = read_tensors(paths.reference_outputs)
    method = Runtime.get().load_program(paths.pte(VARIANTS[backend])).load_method("forward")
    (output,) = method.execute(inputs)
    assert list(output.shape) == [1, 128, 1000]  # the model as exported: every position
    np.testing.assert_allclose(output.numpy(), reference.array, atol=1e-4, rtol=1e-4)
    # The logits are not all alike.
    assert float(np.std(reference.array)) > 0


def test_reference_inputs_are_padded_and_masked(tiny_artifacts: dict[str, LoweringResult]) -> None:
    ids, mask = read_tensors(tiny_artifacts["distilbert-tiny"].paths.reference_inputs)
    assert ids.array.dtype == np.int64 and ids.shape == [1, 128]
    assert int(mask.array.sum()) == 96 and mask.array[0, 95] == 1 and mask.array[0, 96] == 0
    assert (ids.array[0] == BUILTIN_SPECS["distilbert-tiny"].options_of(HuggingFaceOptions).mask_token_id).sum() == 1


_TINY_BERT = ModelSpec(
    name="bert-tiny",
    model_type="bert",
    task="fill-mask",
    options=HuggingFaceOptions(
        config={
            "vocab_size": 1000,
            "hidden_size": 64,
            "num_hidden_layers": 1,
            "num_attention_heads": 2,
            "intermediate_size": 128,
            "max_position_embeddings": 256,
        },
        mask_token_id=103,
    ),
)


@pytest.mark.parametrize(
    "spec", [BUILTIN_SPECS["distilbert-tiny"], BUILTIN_SPECS["gpt2-tiny"], _TINY_BERT], ids=lambda spec: spec.name
)
def test_head_at_position_selects_the_position_before_the_head(spec: ModelSpec) -> None:
    from orchestrator.lowering.rewrites.huggingface import head_at_position
    from orchestrator.lowering.sources.builders.huggingface import build_random
    from orchestrator.lowering.sources.builders.huggingface_inputs import reference_inputs
    from orchestrator.lowering.sources.builders.models import load_model

    wrapped = head_at_position(load_model(spec, "random").module, spec)
    inputs = tuple(torch.from_numpy(t.array) for t in reference_inputs(spec, 1000))
    if spec.task == "fill-mask":
        mask_token_id = spec.options_of(HuggingFaceOptions).mask_token_id
        assert mask_token_id is not None
        position = int((inputs[0][0] == mask_token_id).nonzero()[0])
    else:
        position = int(inputs[1].sum()) - 1
    assert position == 95 or spec.task == "fill-mask"
    full = build_random(spec)(input_ids=inputs[0], attention_mask=inputs[1]).logits
    torch.testing.assert_close(wrapped(*inputs), full[:, position, :])
    # The head runs on one row: no tensor in the exported graph spans the sequence and the vocabulary.
    program = torch.export.export(wrapped, inputs, strict=False)
    shapes = [tuple(node.meta["val"].shape) for node in program.graph.nodes if hasattr(node.meta.get("val"), "shape")]
    assert (1, 1, 1000) in shapes
    assert not [shape for shape in shapes if 1000 in shape and spec.seq_len in shape]


def copy_artifacts(tiny_artifacts: dict[str, LoweringResult], tmp_path: Path, model: str) -> Path:
    root = tmp_path / "artifacts"
    shutil.copytree(tiny_artifacts[model].paths.folder, root / model, copy_function=shutil.copy2)
    return root


def test_cache_hit_then_force(tiny_artifacts: dict[str, LoweringResult], tmp_path: Path) -> None:
    root = copy_artifacts(tiny_artifacts, tmp_path, "gpt2-tiny")
    env = {"ETLAB_ARTIFACTS": str(root)}
    pte = ArtifactPaths.for_model("gpt2-tiny", root).pte(VARIANTS["xnnpack"])
    before = pte.stat().st_mtime_ns

    hit = run_fab("lower", "--model", "gpt2-tiny", "--weights", "random", env=env)
    assert hit.returncode == 0, hit.stderr
    assert "using cached artifacts" in hit.stderr
    assert pte.stat().st_mtime_ns == before

    forced = run_fab("lower", "--model", "gpt2-tiny", "--weights", "random", "--backend", "xnnpack", "--force", "-v",
                     env=env)  # fmt: skip
    assert forced.returncode == 0, forced.stderr
    assert "using cached artifacts" not in forced.stderr
    for stage in ("load", "export", "xnnpack: to_edge/partition", "xnnpack: to_executorch", "xnnpack: save"):
        assert f"✓ gpt2-tiny: {stage}" in forced.stderr  # every step under -v
    assert pte.stat().st_mtime_ns != before
    assert load_artifact("gpt2-tiny", VARIANTS["xnnpack"], root).sha256 == sha256_file(pte)


def test_two_lowerings_of_one_model_at_once_lower_it_once(tmp_path: Path) -> None:
    """A second `fab lower` (or a parallel test worker) lowering the same model into the same folder waits for the
    first and then finds its artifacts cached, instead of deleting the first one's temporaries and sidecars."""
    env = {**os.environ, "ETLAB_ARTIFACTS": str(tmp_path / "artifacts")}
    argv = [*FAB, "lower", "--model", "gpt2-tiny", "--weights", "random", "--backend", "portable"]
    start = lambda: subprocess.Popen(argv, cwd=PROJECT_ROOT, env=env, stderr=subprocess.PIPE, text=True)  # noqa: E731
    with reaped(start()) as first, reaped(start()) as second:
        both = (first, second)
        outputs = [process.communicate(timeout=600)[1] for process in both]
    assert [process.returncode for process in both] == [0, 0], outputs
    assert sum("using cached artifacts" in output for output in outputs) == 1, outputs
    pte = ArtifactPaths.for_model("gpt2-tiny", tmp_path / "artifacts").pte(VARIANTS["portable"])
    assert load_artifact("gpt2-tiny", VARIANTS["portable"], tmp_path / "artifacts").sha256 == sha256_file(pte)


def test_cache_key_covers_everything_that_matters() -> None:
    spec = BUILTIN_SPECS["gpt2-tiny"]
    base = cache.cache_key(spec, VARIANTS["xnnpack"], "random", False)
    assert base == cache.cache_key(spec, VARIANTS["xnnpack"], "random", False)
    variants = {
        cache.cache_key(spec, VARIANTS["portable"], "random", False),
        cache.cache_key(spec, VARIANTS["xnnpack"], "pretrained", False),
        cache.cache_key(spec, VARIANTS["xnnpack"], "random", True),
        cache.cache_key(BUILTIN_SPECS["distilbert-tiny"], VARIANTS["xnnpack"], "random", False),
    }
    assert base not in variants and len(variants) == 4


def test_the_cache_key_hashes_every_model_source_builder() -> None:
    from orchestrator.lowering.spec import SOURCES

    hashed = {path.resolve() for path in cache.code_files()}
    lowering_folder = PROJECT_ROOT / "orchestrator" / "lowering"
    # Every module of the package, in subpackages too: none is left out of a hand-kept list.
    assert set(lowering_folder.rglob("*.py")) <= hashed
    for source in SOURCES.values():  # a source's builder joins its specs' key, wherever it lives
        module = source.builder.partition(":")[0]
        own = {path.resolve() for path in cache.code_files(source.name)}
        assert PROJECT_ROOT.joinpath(*module.split(".")).with_suffix(".py") in own, source.name


def test_a_new_module_in_the_lowering_package_changes_the_cache_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    package = tmp_path / "lowering"
    shutil.copytree(PROJECT_ROOT / "orchestrator" / "lowering", package, ignore=shutil.ignore_patterns("__pycache__"))
    monkeypatch.setattr(cache, "LOWERING_PACKAGE", package)
    spec = BUILTIN_SPECS["gpt2-tiny"]
    before = cache.cache_key(spec, VARIANTS["xnnpack"], "random", False)
    (package / "rewrites" / "more").mkdir()  # a module one level deeper than any today
    (package / "rewrites" / "more" / "fuse_more.py").write_text("def rewrite(graph):\n    return graph\n")
    assert cache.cache_key(spec, VARIANTS["xnnpack"], "random", False) != before


def test_edited_pte_invalidates_the_artifact(tiny_artifacts: dict[str, LoweringResult], tmp_path: Path) -> None:
    root = copy_artifacts(tiny_artifacts, tmp_path, "distilbert-tiny")
    pte = ArtifactPaths.for_model("distilbert-tiny", root).pte(VARIANTS["portable"])
    data = bytearray(pte.read_bytes())
    data[len(data) // 2] ^= 0xFF
    pte.write_bytes(bytes(data))
    with pytest.raises(ArtifactError, match="changed or is missing"):
        load_artifact("distilbert-tiny", VARIANTS["portable"], root)
    # The other backend is untouched and still valid.
    assert load_artifact("distilbert-tiny", VARIANTS["xnnpack"], root).variant == VARIANTS["xnnpack"]


def test_interrupted_lowering_leaves_nothing_valid(tiny_artifacts: dict[str, LoweringResult], tmp_path: Path) -> None:
    root = copy_artifacts(tiny_artifacts, tmp_path, "distilbert-tiny")
    paths = ArtifactPaths.for_model("distilbert-tiny", root)
    proc = subprocess.Popen(
        [*FAB, "lower", "--model", "distilbert-tiny", "--weights", "random", "--force"],
        cwd=PROJECT_ROOT,
        env={**os.environ, "ETLAB_ARTIFACTS": str(root)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    fp32 = [VARIANTS["portable"], VARIANTS["xnnpack"]]
    with reaped(proc):
        # Interrupt once the first fp32 program has been rewritten, while the other is being lowered. Which goes
        # first follows the variants' recorded lowering times (the longest first), so either may.
        old = {variant: paths.pte(variant).stat().st_mtime_ns for variant in fp32}
        first = None
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and proc.poll() is None and first is None:
            first = next((v for v in fp32 if paths.pte(v).stat().st_mtime_ns != old[v]), None)
            time.sleep(0.02)
        assert proc.poll() is None and first is not None, "the lowering finished before it could be interrupted"
        proc.send_signal(signal.SIGINT)
        _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 130, stderr
    assert "interrupted" in stderr
    (second,) = [variant for variant in fp32 if variant != first]
    with pytest.raises(ArtifactError):
        load_artifact("distilbert-tiny", second, root)
    # The one written first is either complete and vouched for by its new sidecar, or not an artifact at all.
    try:
        written = load_artifact("distilbert-tiny", first, root)
    except ArtifactError:
        written = None
    if written is not None:
        assert written.sha256 == sha256_file(paths.pte(first))
    # Whatever the interrupted writer left is a temporary, and the next lowering sweeps it away.
    names = {p.name for p in paths.folder.iterdir()}
    finals = {paths.exported_program.name, paths.reference_inputs.name, paths.reference_outputs.name}
    # The shared test cache also holds the quantized variants (tests/plugins/quantized.py): they are finals too.
    finals |= {paths.pte(v).name for v in VARIANTS.values()} | {paths.sidecar(v).name for v in VARIANTS.values()}
    finals |= {source_map_path(paths.pte(v)).name for v in VARIANTS.values()}  # each program's source map
    # and its numerics program, where a test with --numerics made one in the shared cache (tests/testing/test_pi.py)
    finals |= {path.name for v in VARIANTS.values() for path in numerics_files(paths.pte(v))}
    assert all(name in finals or name.startswith(".etlab-tmp-") for name in names), names
    remove_stale_temporaries(paths.folder)
    assert not [name for name in os.listdir(paths.folder) if name.startswith(".etlab-tmp-")]


def test_user_spec_with_local_pretrained_weights(tmp_path: Path) -> None:
    """The pretrained path for real: from_pretrained on a saved model folder (no hub here)."""
    from transformers import DistilBertConfig, DistilBertForMaskedLM

    torch.manual_seed(123)
    saved = tmp_path / "my-model"
    DistilBertForMaskedLM(
        DistilBertConfig(vocab_size=500, dim=32, n_layers=1, n_heads=2, hidden_dim=64)
    ).save_pretrained(saved)
    spec_path = tmp_path / "spec.json"
    spec_path.write_text(
        json.dumps(
            {
                "name": "local-bert",
                "model_type": "distilbert",
                "task": "fill-mask",
                "mask_token_id": 103,
                "model_id": str(saved),
                "seq_len": 32,
            }
        )
    )
    spec = load_spec_file(spec_path)
    result = lowering.lower(spec, variants=[VARIANTS["portable"]], weights="pretrained", root=tmp_path / "artifacts")
    sidecar = result.variants[VARIANTS["portable"]].sidecar
    assert sidecar.weights == "pretrained"
    assert sidecar.model_id == str(saved)
    assert sidecar.inputs[0]["shape"] == [1, 32]
    # The outputs come from the saved weights, not from a fresh random init.
    reloaded = DistilBertForMaskedLM.from_pretrained(saved).eval()
    ids, mask = (torch.from_numpy(t.array) for t in read_tensors(result.paths.reference_inputs))
    expected = reloaded(input_ids=ids, attention_mask=mask).logits.detach().numpy()  # the model as exported
    np.testing.assert_allclose(read_tensors(result.paths.reference_outputs)[0].array, expected, atol=1e-5)


def test_auto_weights_fall_back_loudly(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from orchestrator.lowering.sources.builders.models import load_model

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    spec = BUILTIN_SPECS["distilbert-tiny"].with_options(model_id="nobody/none")
    loaded = load_model(spec, "auto")
    assert loaded.weights == "random"
    assert "HF_HUB_OFFLINE" in loaded.weights_note


def test_pretrained_unavailable_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    from orchestrator.commands.handling import _naming_options
    from orchestrator.lowering.sources.builders.models import load_model
    from orchestrator.lowering.weights import PretrainedUnavailable

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    spec = BUILTIN_SPECS["distilbert-tiny"].with_options(model_id="nobody/none")
    with pytest.raises(PretrainedUnavailable, match="cannot load pretrained weights for 'nobody/none'") as excinfo:
        load_model(spec, "pretrained")
    assert "--" not in str(excinfo.value)  # the library names no option; the command layer adds it:
    assert "--weights random" in str(_naming_options(excinfo.value))
    with pytest.raises(SpecError, match="no pretrained weights"):
        load_model(BUILTIN_SPECS["gpt2-tiny"], "pretrained")


def test_cli_errors_have_exit_codes(tmp_path: Path) -> None:
    unknown = run_fab("lower", "--model", "gpt3")
    assert unknown.returncode == 64
    assert "unknown model 'gpt3'" in unknown.stderr and "distilbert-tiny" in unknown.stderr
    assert "hint: or pass your own spec with --spec" in unknown.stderr  # the command layer names the option
    bad = tmp_path / "spec.json"
    bad.write_text('{"name": "x", "model_type": "gpt2", "task": "causal-lm", "seqlen": 3}')
    result = run_fab("lower", "--spec", str(bad))
    assert result.returncode == 64
    assert f"{bad}:1: field 'seqlen'" in result.stderr and "did you mean 'seq_len'" in result.stderr
    backend = run_fab("lower", "--model", "gpt2-tiny", "--backend", "vulkan")
    assert backend.returncode == 64 and "unknown backend vulkan" in backend.stderr


def test_parse_backends() -> None:
    assert [variant.name for variant in variants("xnnpack, portable,xnnpack")] == ["xnnpack", "portable"]
    with pytest.raises(UsageError, match="--backend: unknown backend coreml"):
        variants("coreml")


def test_etrecord_only_on_request(tmp_path: Path) -> None:
    from executorch.devtools.etrecord import parse_etrecord

    result = lowering.lower(
        BUILTIN_SPECS["gpt2-tiny"], variants=[VARIANTS["xnnpack"]], weights="random", etrecord=True, root=tmp_path
    )
    sidecar = result.variants[VARIANTS["xnnpack"]].sidecar
    etrecord = result.paths.etrecord(VARIANTS["xnnpack"])
    assert sidecar.etrecord == etrecord.name and sidecar.files["etrecord"].sha256 == sha256_file(etrecord)
    assert etrecord.stat().st_size > result.paths.exported_program.stat().st_size
    parsed = parse_etrecord(str(etrecord))
    assert parsed.edge_dialect_program is not None
    # Without the option there is none, and it is a different cache entry.
    plain = lowering.lower(BUILTIN_SPECS["gpt2-tiny"], variants=[VARIANTS["portable"]], weights="random", root=tmp_path)
    assert plain.variants[VARIANTS["portable"]].sidecar.etrecord is None
    assert not result.paths.etrecord(VARIANTS["portable"]).exists()
