"""A spec file cannot switch on code execution, and spec or calibration mistakes are refused before anything loads.

A spec's `config` holds fields of the model's config class only: nothing reaches `from_pretrained` as a keyword
(`trust_remote_code`, `weights_only`), a typo gets a did-you-mean instead of being ignored, and the config is built
(no weights) and checked against the task, the sequence length, the [MASK] id and the available memory. Remote
code runs only with `--trust-remote-code` on the command line. Every mistake is exit 64 naming file, line and field.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st

from orchestrator.errors import ExitCode, SpecError, UsageError
from orchestrator.lowering.spec import RemoteCodeInSpec, load_spec_file
from orchestrator.lowering.variants import VARIANTS
from orchestrator.paths import PROJECT_ROOT
from orchestrator.tensorfile import NamedTensor, write_tensors

pytestmark = pytest.mark.timeout(600)

DISTILBERT_TINY = {"vocab_size": 1000, "dim": 64, "n_layers": 2, "n_heads": 2, "hidden_dim": 128}
GPT2_TINY = {"vocab_size": 1000, "n_embd": 64, "n_layer": 2, "n_head": 2, "n_positions": 128}
BERT_TINY = {"vocab_size": 1000, "hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2,
             "intermediate_size": 64, "max_position_embeddings": 64}  # fmt: skip
BASE = {"distilbert": DISTILBERT_TINY, "gpt2": GPT2_TINY, "bert": BERT_TINY}
GIB = 1 << 30


def spec_data(model_type: str = "distilbert", task: str | None = None, **changes: Any) -> dict[str, Any]:
    task = task or ("causal-lm" if model_type == "gpt2" else "fill-mask")
    data: dict[str, Any] = {"name": "safety", "model_type": model_type, "task": task, "seq_len": 32,
                            "config": dict(BASE[model_type])}  # fmt: skip
    if task == "fill-mask":
        data["mask_token_id"] = 103
    return {**data, **changes}


def write_spec(path: Path, data: dict[str, Any]) -> Path:
    """One field per line, so every field has its own line number."""
    path.write_text(json.dumps(data, indent=2))
    return path


def line_of(path: Path, text: str) -> int:
    """The 1-based line of the first line of `path` containing `text`."""
    return next(n for n, line in enumerate(path.read_text().splitlines(), 1) if text in line)


def checked(path: Path, *, available: int | None = 16 * GIB) -> Any:
    """The spec file loaded and checked as `fab lower` does before it loads anything."""
    from orchestrator.lowering.models import check_spec

    return check_spec(load_spec_file(path), "random", available=available)


def fab(*args: str, tmp_path: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    environment = {
        **os.environ,
        "ETLAB_ARTIFACTS": str(tmp_path / "artifacts"),
        "HF_HUB_OFFLINE": "1",
        "HF_MODULES_CACHE": str(tmp_path / "hf-modules"),  # where transformers copies a folder's own code
        **(env or {}),
    }
    return subprocess.run(
        [sys.executable, "-m", "fabric", *args], cwd=PROJECT_ROOT, env=environment, capture_output=True, text=True,
        timeout=600,
    )  # fmt: skip


# ---------------------------------------------------------------------------------------------------------------
# Model folders that run code when loaded


EVIL_CONFIG = """import pathlib
pathlib.Path({marker!r}).mkdir(exist_ok=True)  # test-only: proves this file ran
from transformers import BertConfig


class EvilConfig(BertConfig):
    model_type = "bert"
"""
EVIL_MODEL = """from transformers import BertForMaskedLM

from .configuration_evil import EvilConfig


class EvilForMaskedLM(BertForMaskedLM):
    config_class = EvilConfig
"""


def remote_code_folder(tmp_path: Path) -> tuple[Path, Path]:
    """A tiny BERT whose config.json points at the folder's own Python (auto_map), which creates `marker`."""
    from transformers import BertConfig, BertForMaskedLM

    folder, marker = tmp_path / "remote-bert", tmp_path / "remote-code-ran"
    BertForMaskedLM(BertConfig(**BERT_TINY)).save_pretrained(folder)
    (folder / "configuration_evil.py").write_text(EVIL_CONFIG.format(marker=str(marker)))
    (folder / "modeling_evil.py").write_text(EVIL_MODEL)
    config = json.loads((folder / "config.json").read_text())
    config["auto_map"] = {"AutoConfig": "configuration_evil.EvilConfig",
                          "AutoModelForMaskedLM": "modeling_evil.EvilForMaskedLM"}  # fmt: skip
    (folder / "config.json").write_text(json.dumps(config))
    return folder, marker


class _Payload:
    """Unpickling this creates a folder: what a hostile pytorch_model.bin could do instead."""

    def __init__(self, marker: Path) -> None:
        self.marker = str(marker)

    def __reduce__(self) -> tuple[Any, tuple[str, int, bool]]:
        return os.makedirs, (self.marker, 0o777, True)


def pickled_weights_folder(tmp_path: Path) -> tuple[Path, Path]:
    """A tiny DistilBERT whose pytorch_model.bin holds a pickle payload (only `weights_only=False` unpickles it)."""
    import torch
    from transformers import DistilBertConfig

    folder, marker = tmp_path / "pickled-bert", tmp_path / "pickle-ran"
    folder.mkdir()
    DistilBertConfig(**DISTILBERT_TINY).save_pretrained(folder)
    torch.save({"payload": _Payload(marker)}, folder / "pytorch_model.bin")
    return folder, marker


# ---------------------------------------------------------------------------------------------------------------
# Item 1: a spec file cannot switch on code execution


def test_a_spec_cannot_switch_on_remote_code(tmp_path: Path) -> None:
    folder, marker = remote_code_folder(tmp_path)
    spec = write_spec(tmp_path / "spec.json", spec_data("bert", model_id=str(folder),
                                                       config={"trust_remote_code": True}))  # fmt: skip

    result = fab("lower", "--spec", str(spec), "--weights", "pretrained", "--backend", "portable", tmp_path=tmp_path)

    output = result.stdout + result.stderr
    assert result.returncode == ExitCode.USAGE, output
    assert f"{spec}:{line_of(spec, 'trust_remote_code')}: field 'config.trust_remote_code'" in output, output
    assert "--trust-remote-code" in output, output  # where the opt-in is
    assert "Traceback" not in output, output
    assert not marker.exists(), "the folder's Python ran"


def test_a_spec_cannot_turn_off_weights_only(tmp_path: Path) -> None:
    folder, marker = pickled_weights_folder(tmp_path)
    spec = write_spec(tmp_path / "spec.json", spec_data(model_id=str(folder), config={"weights_only": False}))

    result = fab("lower", "--spec", str(spec), "--weights", "pretrained", "--backend", "portable", tmp_path=tmp_path)

    output = result.stdout + result.stderr
    assert result.returncode == ExitCode.USAGE, output
    assert f"{spec}:{line_of(spec, 'weights_only')}: field 'config.weights_only'" in output, output
    assert "Traceback" not in output, output
    assert not marker.exists(), "the pickle payload ran"


def test_a_config_typo_is_refused_by_fab_with_a_did_you_mean(tmp_path: Path) -> None:
    config = {key: value for key, value in DISTILBERT_TINY.items() if key != "n_layers"} | {"n_layer": 1}
    spec = write_spec(tmp_path / "spec.json", spec_data(config=config))

    result = fab("lower", "--spec", str(spec), "--weights", "random", "--backend", "portable", tmp_path=tmp_path)

    output = result.stdout + result.stderr
    assert result.returncode == ExitCode.USAGE, output  # it was silently ignored: a 6-layer model got lowered
    assert f"{spec}:{line_of(spec, 'n_layer')}: field 'config.n_layer'" in output, output
    assert "did you mean 'n_layers'?" in output, output
    assert "Traceback" not in output, output
    assert not (tmp_path / "artifacts" / "safety").exists(), "nothing may be lowered"


def test_remote_code_runs_only_with_the_command_line_opt_in(tmp_path: Path) -> None:
    folder, marker = remote_code_folder(tmp_path)
    spec = write_spec(tmp_path / "spec.json", spec_data("bert", model_id=str(folder), config={}))
    base = ("lower", "--spec", str(spec), "--weights", "pretrained", "--backend", "portable")

    without = fab(*base, tmp_path=tmp_path)
    assert without.returncode == 0, without.stdout + without.stderr
    assert not marker.exists(), "the folder's Python ran without --trust-remote-code"

    opted_in = fab(*base, "--trust-remote-code", tmp_path=tmp_path)
    output = opted_in.stdout + opted_in.stderr
    assert opted_in.returncode == 0, output
    assert marker.exists(), "--trust-remote-code did not run the folder's code"
    assert "WARNING" in output and "--trust-remote-code" in output and str(folder) in output, output


def test_loading_options_are_refused_without_importing_transformers(tmp_path: Path) -> None:
    """Refused on reading the file, so even a cached lowering (which imports nothing heavy) refuses them."""
    config = {**DISTILBERT_TINY, "trust_remote_code": True, "weights_only": False, "_name_or_path": "x"}
    path = write_spec(tmp_path / "spec.json", spec_data(config=config))
    with pytest.raises(SpecError) as excinfo:
        load_spec_file(path)
    lines = str(excinfo.value).splitlines()
    assert lines[0].startswith(f"{path}:{line_of(path, 'trust_remote_code')}: field 'config.trust_remote_code': ")
    assert "only the command line can" in lines[0] and "--" not in str(excinfo.value)  # the library names no option
    assert isinstance(excinfo.value, RemoteCodeInSpec)
    assert lines[1].startswith(f"{path}:{line_of(path, 'weights_only')}: field 'config.weights_only': ")
    assert lines[2].startswith(f"{path}:{line_of(path, '_name_or_path')}: field 'config._name_or_path': ")


def test_pretrained_overrides_never_reach_from_pretrained_as_keywords(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Overrides are set on the config object, which is what `from_pretrained` gets."""
    import transformers

    from orchestrator.lowering import models

    folder, _ = pickled_weights_folder(tmp_path)
    seen: dict[str, Any] = {}

    def fake_from_pretrained(model_id: str, **kwargs: Any) -> Any:
        seen.update(kwargs)
        raise RuntimeError("stop here")

    monkeypatch.setattr(transformers.AutoModelForMaskedLM, "from_pretrained", fake_from_pretrained)
    spec = load_spec_file(write_spec(tmp_path / "spec.json", spec_data(model_id=str(folder), config={"n_layers": 1})))
    with pytest.raises(RuntimeError, match="stop here"):
        models.build_pretrained(spec)
    assert set(seen) == {"config", "trust_remote_code"}, seen
    assert seen["trust_remote_code"] is False and seen["config"].n_layers == 1


# ---------------------------------------------------------------------------------------------------------------
# Item 3: mistakes that used to load for seconds and then exit 70, refused up front


@pytest.mark.parametrize(
    ("data", "field", "fragment"),
    [
        (spec_data(config={**DISTILBERT_TINY, "n_layer": 1}), "config.n_layer", "did you mean 'n_layers'?"),
        (spec_data("gpt2", config={**GPT2_TINY, "n_layers": 1}), "config.n_layers", "did you mean 'n_layer'?"),
        (spec_data(config={**DISTILBERT_TINY, "return_dict": False}), "config.return_dict", "not part of"),
        (spec_data(config={**DISTILBERT_TINY, "dim": "64"}), "config.dim", "expected int, got str"),
        (spec_data(config={**DISTILBERT_TINY, "hidden_size": "64"}), "config.hidden_size", "expected int, got str"),
        (spec_data(config={**DISTILBERT_TINY, "n_layers": True}), "config.n_layers", "expected int, got bool"),
        (spec_data(config={**DISTILBERT_TINY, "n_layers": 0}), "config.n_layers", "at least 1"),
        (spec_data(config={**DISTILBERT_TINY, "n_layers": -2}), "config.n_layers", "at least 1"),
        (spec_data(config={**DISTILBERT_TINY, "dim": 65}), "config.dim", "divisible"),
        (spec_data(config={**DISTILBERT_TINY, "dropout": 1e400}), "config.dropout", "finite"),
        (spec_data(mask_token_id=1000), "mask_token_id", "vocabulary"),
        (spec_data("gpt2", seq_len=256), "seq_len", "position embeddings"),
        (spec_data(task="causal-lm"), "task", "fill-mask"),
        (spec_data("gpt2", task="fill-mask", mask_token_id=3), "task", "causal-lm"),
        (spec_data(config={**DISTILBERT_TINY, "activation": "swishy"}), "config", "cannot be built"),
        (spec_data(config={**DISTILBERT_TINY, "vocab_size": 10**9}), "config.vocab_size", "available memory"),
        (spec_data(config={**DISTILBERT_TINY, "vocab_size": 10**30}), "config.vocab_size", "available memory"),
        (spec_data(config={**DISTILBERT_TINY, "n_layers": 10**9}), "config.n_layers", "available memory"),
    ],
)
def test_mistakes_are_refused_before_loading(tmp_path: Path, data: dict[str, Any], field: str, fragment: str) -> None:
    path = write_spec(tmp_path / "spec.json", data)
    key = field.split(".")[-1]
    with pytest.raises(SpecError) as excinfo:
        checked(path)
    message = str(excinfo.value)
    assert f"{path}:{line_of(path, json.dumps(key))}: field {field!r}: " in message, message
    assert fragment in message, message


def test_a_model_too_large_for_the_memory_is_refused(tmp_path: Path) -> None:
    path = write_spec(tmp_path / "spec.json", spec_data(config={"n_layers": 6}))  # DistilBERT base: 67M parameters
    assert checked(path, available=GIB).parameters == pytest.approx(67.0e6, rel=0.01)
    with pytest.raises(SpecError, match=r"67\.0M parameters .* more than the 0\.20 GiB of available memory"):
        checked(path, available=200 << 20)


def test_a_model_type_gets_no_did_you_mean_to_another_family(tmp_path: Path) -> None:
    """`roberta` → `bert` would build a different model; a different spelling of the same family is fine."""
    with pytest.raises(SpecError) as excinfo:
        load_spec_file(write_spec(tmp_path / "spec.json", spec_data() | {"model_type": "roberta"}))
    assert "'roberta' is not supported" in str(excinfo.value) and "did you mean" not in str(excinfo.value)
    with pytest.raises(SpecError, match="did you mean 'gpt2'"):
        load_spec_file(write_spec(tmp_path / "spec.json", spec_data("gpt2") | {"model_type": "GPT-2"}))


def test_a_valid_spec_builds_what_it_says(tmp_path: Path) -> None:
    """An alias of the config class (hidden_size for DistilBERT's dim) is a field too."""
    from orchestrator.lowering.models import load_model

    config = {**DISTILBERT_TINY, "n_layers": 1, "hidden_size": 32}
    del config["dim"]
    path = write_spec(tmp_path / "spec.json", spec_data(config=config))
    report = checked(path)
    assert report.config.n_layers == 1 and report.config.dim == 32
    loaded = load_model(load_spec_file(path), "random")
    assert loaded.parameters == report.parameters


# ---------------------------------------------------------------------------------------------------------------
# Calibration files


def calibration(path: Path, seq_len: int = 8, vocab_size: int = 200) -> list[tuple]:
    from orchestrator.lowering.quantize import calibration_from_file

    return calibration_from_file(path, seq_len, vocab_size)


def etlt(path: Path, **arrays: np.ndarray) -> Path:
    write_tensors(path, [NamedTensor(name, array) for name, array in arrays.items()])
    return path


IDS = np.array([[5, 6, 7, 0], [8, 9, 0, 0]], dtype=np.int64)


@pytest.mark.parametrize(
    ("write", "fragment"),
    [
        (lambda p: p.with_suffix(".json").write_text("[" * 100_000 + "]" * 100_000), "nested"),
        (lambda p: etlt(p, input_ids=IDS, attention_mask=np.array([1, 1, 0, 0], dtype=np.int64)), "attention_mask"),
        (lambda p: etlt(p, input_ids=IDS, attention_mask=IDS[:1] * 0 + 1), "attention_mask"),
        (lambda p: etlt(p, input_ids=IDS, attention_mask=np.full((2, 4), np.nan, dtype=np.float32)), "attention_mask"),
        (lambda p: etlt(p, input_ids=IDS, attention_mask=np.array([[1, 1, 1, 0], [1, 0, 1, 0]])), "attention_mask"),
        (lambda p: etlt(p, input_ids=IDS, attention_mask=IDS), "attention_mask"),
        (lambda p: etlt(p, input_ids=np.zeros((2, 0), dtype=np.int64)), "input_ids"),
    ],
)
def test_calibration_mistakes_are_usage_errors(tmp_path: Path, write: Any, fragment: str) -> None:
    path = tmp_path / "calibration.etlt"
    write(path)
    target = path if path.exists() else path.with_suffix(".json")
    with pytest.raises(UsageError) as excinfo:
        calibration(target)
    assert str(excinfo.value).startswith(f"{target}: ") and fragment in str(excinfo.value)


def test_calibration_is_checked_before_anything_loads(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Against the vocabulary of the spec's config, in this process, before the model is built or a worker starts."""
    from orchestrator.lowering import models
    from orchestrator.lowering.lower import lower

    def no_loading(*_args: Any, **_kwargs: Any) -> Any:
        raise AssertionError("the model was loaded before the calibration file was checked")

    monkeypatch.setattr(models, "load_model", no_loading)
    spec = load_spec_file(write_spec(tmp_path / "spec.json", spec_data()))  # vocabulary 1000
    samples = tmp_path / "samples.json"
    samples.write_text(json.dumps([[101, 7, 8], [101, 1000, 102]]))
    # The library names the file; the command layer adds its option (naming_calibration).
    with pytest.raises(UsageError, match=rf"^{samples}: sample 1 has token ids outside 0\.\.999"):
        lower(spec, variants=[VARIANTS["xnnpack-int8-static"]], weights="random", root=tmp_path / "artifacts",
              calibration=samples, jobs=2)  # fmt: skip
    assert not (tmp_path / "artifacts").exists()


def test_the_command_layer_names_the_calibration_option(tmp_path: Path) -> None:
    """`fab lower` and `deploy-and-profile` say which option gave the file; the library below names only the file."""
    from orchestrator.commands.common import lowering_options, naming_calibration

    missing = tmp_path / "missing.json"
    with pytest.raises(UsageError, match=rf"^--calibration {missing}: no such file"):
        lowering_options(calibration=missing)
    samples = tmp_path / "samples.json"
    samples.write_text(json.dumps([[101, 7, 8]]))
    with pytest.raises(UsageError, match=rf"^--calibration {samples}: give several samples"), naming_calibration():
        calibration(samples)


# ---------------------------------------------------------------------------------------------------------------
# Property: any spec file or calibration file validates (and then builds) or is refused as a usage error

FUZZ = settings(max_examples=120, derandomize=True, database=None, deadline=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])  # fmt: skip

ANY_FIELD = sorted({*DISTILBERT_TINY, *GPT2_TINY, *BERT_TINY, "n_layer", "dims", "hidden_dim", "intermediate_size",
                    "activation", "dropout", "pad_token_id", "sinusoidal_pos_embds", "return_dict", "dtype",
                    "trust_remote_code", "weights_only", "layer_norm_eps", "n_inner", "type_vocab_size", "",
                    "hidden_size", "max_position_embeddings"})  # fmt: skip
scalar = st.one_of(
    st.integers(-3, 300),
    st.sampled_from([0, 1, 2, 4, 64, 1000, 10**6, 10**9, 2**63, 10**30, -(2**63)]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.booleans(),
    st.none(),
    st.text(max_size=8),
    st.sampled_from(["64", "gelu", "relu", "float16", "1e-5"]),
)
json_value = st.recursive(
    scalar,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=6,
)
spec_changes = st.one_of(
    st.just({}),
    st.dictionaries(st.sampled_from(["seq_len", "mask_token_id"]), st.integers(1, 1100), max_size=2),
    st.dictionaries(
        st.sampled_from(
            ["model_type", "task", "seq_len", "mask_token_id", "config", "name", "model_id", "inputs", "x"]
        ),
        st.one_of(json_value, st.sampled_from(["bert", "gpt2", "distilbert", "fill-mask", "causal-lm", "roberta"])),
        max_size=2,
    ),
)
# Mostly plausible values, so that a good share of the specs validate and their models get built and run.
plausible = st.one_of(st.integers(1, 130), st.sampled_from([0.0, 0.1, 1e-5, "gelu", "relu", True, False, None]))
config_changes = st.one_of(
    st.just({}),
    st.dictionaries(st.sampled_from(ANY_FIELD), plausible, max_size=2),
    st.dictionaries(st.sampled_from(ANY_FIELD), st.one_of(scalar, json_value), max_size=3),
)
small = st.sampled_from(["distilbert", "gpt2", "bert"])


def validates_or_refuses(path: Path) -> bool:
    """True when the spec validated and its model then built and ran; False when refused with a SpecError."""
    import torch

    from orchestrator.lowering.models import load_model, reference_inputs, vocab_size_of

    try:
        spec = load_spec_file(path)
        report = checked(path, available=64 << 20)  # 16M parameters at most: validated models stay cheap to build
    except SpecError:
        return False
    loaded = load_model(spec, "random")  # must not raise now
    assert loaded.parameters == report.parameters
    inputs = reference_inputs(spec, vocab_size_of(loaded.module))
    with torch.no_grad():
        output = loaded.module(*(torch.from_numpy(t.array) for t in inputs))
    assert output.shape == (1, report.config.vocab_size)
    return True


@FUZZ
@given(model_type=small, changes=spec_changes, config=config_changes)
@example(model_type="distilbert", changes={}, config={"n_layer": 1})
@example(model_type="gpt2", changes={"seq_len": 4096}, config={})
@example(model_type="bert", changes={"mask_token_id": 10**6}, config={})
def test_any_spec_file_validates_or_is_refused(
    tmp_path_factory: pytest.TempPathFactory, model_type: str, changes: dict[str, Any], config: dict[str, Any]
) -> None:
    data = spec_data(model_type)
    data["config"] = {**data["config"], **config}
    data.update(changes)
    folder = tmp_path_factory.mktemp("spec")
    path = folder / "spec.json"
    path.write_text(json.dumps(data, indent=2))
    event("validated and built" if validates_or_refuses(path) else "refused")


def nested_config(depth: int) -> str:
    """A JSON nesting bomb inside a spec: a RecursionError in a parser that recurses."""
    return '{"name": "x", "config": ' + "[" * depth + "]" * depth + "}"


@FUZZ
@given(raw=st.one_of(st.binary(max_size=200).map(lambda b: b.decode("latin-1")), json_value.map(json.dumps),
                     st.integers(1, 50_000).map(nested_config)))  # fmt: skip
def test_any_spec_text_validates_or_is_refused(tmp_path_factory: pytest.TempPathFactory, raw: str) -> None:
    path = tmp_path_factory.mktemp("spec") / "spec.json"
    path.write_text(raw, encoding="utf-8", errors="surrogateescape")
    assert validates_or_refuses(path) is False  # none of these is a whole spec


token_rows = st.one_of(
    st.lists(st.lists(st.integers(0, 199), min_size=1, max_size=12), min_size=2, max_size=5),  # usable
    st.lists(st.fixed_dictionaries({"input_ids": st.lists(st.integers(0, 210), min_size=1, max_size=6)},
                                   optional={"attention_mask": st.lists(st.integers(0, 1), max_size=6)}),
             min_size=2, max_size=4),
    st.lists(st.one_of(st.lists(st.one_of(st.integers(-2, 250), scalar), max_size=10), json_value), max_size=5),
)  # fmt: skip
DTYPES = [np.int64, np.int32, np.uint8, np.float32, np.bool_]


@st.composite
def etlt_arrays(draw: st.DrawFn) -> dict[str, np.ndarray]:
    """Half the files well formed (input_ids [N, seq] in the vocabulary, perhaps a right-padded mask), half anything."""
    if draw(st.booleans()):
        samples, seq = draw(st.integers(1, 4)), draw(st.integers(1, 10))
        ids = np.array(draw(st.lists(st.integers(0, 199), min_size=samples * seq, max_size=samples * seq)))
        arrays = {"input_ids": ids.reshape(samples, seq).astype(draw(st.sampled_from([np.int64, np.int32])))}
        if draw(st.booleans()):
            lengths = draw(st.lists(st.integers(1, seq), min_size=samples, max_size=samples))
            arrays["attention_mask"] = (np.arange(seq)[None, :] < np.array(lengths)[:, None]).astype(np.int64)
        return arrays
    arrays = {}
    for name in draw(st.lists(st.sampled_from(["input_ids", "attention_mask", "other"]), max_size=3, unique=True)):
        shape = tuple(draw(st.lists(st.integers(0, 5), max_size=3)))
        dtype = draw(st.sampled_from(DTYPES))
        values = draw(st.lists(st.sampled_from([0, 1, 2, 7, 199, 200, -1, 255]), min_size=math.prod(shape),
                               max_size=math.prod(shape)))  # fmt: skip
        array = np.array(values, dtype=np.int64).reshape(shape)
        if dtype is np.float32 and array.size and draw(st.booleans()):
            array = array.astype(np.float32)
            array.flat[0] = np.nan
        arrays[name] = array.astype(dtype)
    return arrays


def usable_or_refused(path: Path) -> None:
    try:
        samples = calibration(path)
    except UsageError as exc:
        assert str(exc).startswith(f"{path}: ")
        event("refused")
        return
    event("usable")
    assert len(samples) >= 2
    for ids, mask in samples:
        assert ids.shape == mask.shape == (1, 8)
        assert int(ids.min()) >= 0 and int(ids.max()) < 200
        real = int(mask.sum())
        assert real >= 1 and mask[0, :real].tolist() == [1] * real


@FUZZ
@given(samples=st.one_of(token_rows, st.fixed_dictionaries({"samples": token_rows}), json_value),
       nesting=st.sampled_from([0, 0, 0, 50_000]))  # fmt: skip
def test_any_json_calibration_file_is_usable_or_refused(
    tmp_path_factory: pytest.TempPathFactory, samples: Any, nesting: int
) -> None:
    path = tmp_path_factory.mktemp("calibration") / "samples.json"
    text = json.dumps(samples, allow_nan=True)
    path.write_text("[" * nesting + text + "]" * nesting)
    usable_or_refused(path)


@FUZZ
@given(arrays=etlt_arrays())
def test_any_etlt_calibration_file_is_usable_or_refused(
    tmp_path_factory: pytest.TempPathFactory, arrays: dict[str, np.ndarray]
) -> None:
    path = tmp_path_factory.mktemp("calibration") / "samples.etlt"
    write_tensors(path, [NamedTensor(name, array) for name, array in arrays.items()])
    usable_or_refused(path)
