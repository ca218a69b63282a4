"""Model specs: built-ins, user files, and the errors a bad spec gets."""

from __future__ import annotations

import importlib
import json
from pathlib import Path

import pytest

from orchestrator.errors import SpecError
from orchestrator.lowering.builtins import BUILTIN_SPECS, resolve_spec
from orchestrator.lowering.sources.huggingface import HuggingFaceOptions
from orchestrator.lowering.spec import SOURCES, ModelSource, ModelSpec, load_spec_file


def write_spec(tmp_path: Path, data: object, raw: str | None = None) -> Path:
    path = tmp_path / "model_spec.json"
    path.write_text(raw if raw is not None else json.dumps(data, indent=2))
    return path


VALID = {
    "name": "my-bert",
    "model_type": "distilbert",
    "task": "fill-mask",
    "mask_token_id": 103,
    "config": {"n_layers": 1},
}


def test_builtin_specs_cover_required_models() -> None:
    for name in ("distilbert", "gpt2", "distilbert-tiny", "gpt2-tiny"):
        spec = BUILTIN_SPECS[name]
        assert spec.seq_len == 128
        assert [(i.name, i.dtype, i.shape) for i in spec.inputs] == [
            ("input_ids", "int64", (1, 128)),
            ("attention_mask", "int64", (1, 128)),
        ]
    assert BUILTIN_SPECS["distilbert"].task == "fill-mask"
    assert BUILTIN_SPECS["distilbert"].options_of(HuggingFaceOptions).model_id == "distilbert-base-uncased"
    assert BUILTIN_SPECS["gpt2"].task == "causal-lm"


def test_unknown_model_lists_known_ones() -> None:
    with pytest.raises(SpecError) as excinfo:
        resolve_spec("distilbart")
    message = str(excinfo.value)
    assert "unknown model 'distilbart'" in message
    assert "did you mean 'distilbert'" in message
    for name in BUILTIN_SPECS:
        assert name in message


def test_model_and_spec_are_exclusive(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match="exactly one"):
        resolve_spec("gpt2", write_spec(tmp_path, VALID))
    with pytest.raises(SpecError, match="exactly one"):
        resolve_spec(None, None)


def test_valid_user_spec(tmp_path: Path) -> None:
    spec = resolve_spec(None, write_spec(tmp_path, VALID))
    assert spec.name == "my-bert"
    assert spec.options_of(HuggingFaceOptions).config == {"n_layers": 1}
    assert spec.source.endswith("model_spec.json")


@pytest.mark.parametrize(
    ("change", "field", "fragment"),
    [
        ({"task": "translation"}, "task", "not supported"),
        ({"model_type": "t5 encoder"}, "model_type", "is not a model family name"),
        ({"seq_len": "128"}, "seq_len", "expected an integer 1-4096, got '128'"),
        ({"seq_len": 0}, "seq_len", "expected an integer 1-4096, got 0"),
        ({"name": "bad/name"}, "name", "letters, digits"),
        ({"mask_token_id": None}, "mask_token_id", "required for task 'fill-mask'"),
        ({"config": [1, 2]}, "config", "expected a mapping"),
        ({"sequence_length": 64}, "sequence_length", "did you mean 'seq_len'"),
        ({"inputs": [{"name": "input_ids", "dtype": "int32", "shape": [1, 128]}]}, "inputs[0].dtype", "is int64"),
    ],
)
def test_bad_spec_names_file_and_field(tmp_path: Path, change: dict, field: str, fragment: str) -> None:
    path = write_spec(tmp_path, {**VALID, **change})
    with pytest.raises(SpecError) as excinfo:
        load_spec_file(path)
    message = str(excinfo.value)
    assert str(path) in message
    assert f"field {field!r}" in message
    assert fragment in message


def test_every_mistake_is_reported_with_its_line(tmp_path: Path) -> None:
    path = write_spec(
        tmp_path, None, raw='{\n  "name": "x",\n  "model_type": "t5/x",\n  "task": "fill-mask",\n  "seq_len": -1\n}'
    )
    with pytest.raises(SpecError) as excinfo:
        load_spec_file(path)
    lines = str(excinfo.value).splitlines()
    family = "is not a model family name (like 'bert', 'llama' or 'vit')"
    assert lines[0] == f"{path}:3: field 'model_type': 't5/x' {family}"
    assert lines[1] == f"{path}:5: field 'seq_len': expected an integer 1-4096, got -1"


def test_missing_required_field(tmp_path: Path) -> None:
    data = dict(VALID)
    del data["model_type"]
    with pytest.raises(SpecError, match=r"field 'model_type': is required"):
        load_spec_file(write_spec(tmp_path, data))


def test_invalid_json_reports_line(tmp_path: Path) -> None:
    path = write_spec(tmp_path, None, raw='{\n  "name": "x",\n  "task": fill-mask\n}')
    with pytest.raises(SpecError) as excinfo:
        load_spec_file(path)
    assert str(path) in str(excinfo.value)
    assert "line 3" in str(excinfo.value)


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match="cannot read spec file"):
        load_spec_file(tmp_path / "nope.json")


# ---------------------------------------------------------------- model sources


def test_a_spec_without_source_is_huggingface_and_a_wrong_source_is_named(tmp_path: Path) -> None:
    implicit = load_spec_file(write_spec(tmp_path, VALID))
    assert implicit.model_source == "huggingface"
    assert load_spec_file(write_spec(tmp_path, {"source": "huggingface", **VALID})) == implicit
    path = write_spec(tmp_path, {**VALID, "source": "hugginface"})
    known = r"known: huggingface, factory, timm, torchvision\b.* \(did you mean 'huggingface'\?\)"
    with pytest.raises(
        SpecError, match=r"model_spec\.json:9: field 'source': 'hugginface' is not a model source; " + known
    ):
        load_spec_file(path)
    assert all(spec.model_source in SOURCES for spec in BUILTIN_SPECS.values())


@pytest.mark.parametrize(
    ("named", "option"), [("user-program", "--pte FILE.pte"), ("exported-program", "fab lower --exported FILE.pt2")]
)
def test_a_spec_file_cannot_name_a_users_own_program_as_its_source(tmp_path: Path, named: str, option: str) -> None:
    """A .pte or .pt2 comes in by its option, which checks the file; a spec file naming its source is refused
    (exit 64), and the sources a spec file may name do not list it."""
    assert SOURCES[named].given_by == option
    with pytest.raises(SpecError, match=rf"field 'source': '{named}' is a program of your own, given by {option}, "):
        load_spec_file(write_spec(tmp_path, {**VALID, "source": named}))
    with pytest.raises(SpecError, match=r"'pte' is not a model source; known: huggingface, factory, timm\b") as info:
        load_spec_file(write_spec(tmp_path, {**VALID, "source": "pte"}))
    assert "program" not in str(info.value) and info.value.exit_code == 64


def test_every_model_source_has_a_builder() -> None:
    """spec.py SOURCES is the one registry of model sources, every module of lowering/sources/ in it: each names its
    spec fields and a builder that checks a spec, builds the model, its example inputs and calibration samples
    (models.py dispatches check_spec, load_model and example_inputs to it; lower.py the rest). The spec's own fields
    are shared by every source."""
    import inspect

    from orchestrator.lowering.sources.builders import models
    from orchestrator.paths import PROJECT_ROOT

    modules = {path.stem for path in (PROJECT_ROOT / "orchestrator" / "lowering" / "sources").glob("*.py")}
    for module in modules - {"__init__"}:  # a module there is a source, found without a list to edit
        found = vars(importlib.import_module(f"orchestrator.lowering.sources.{module}")).values()
        assert any(isinstance(v, ModelSource) and SOURCES[v.name] is v for v in found), module
    for name, source in SOURCES.items():
        assert source.name == name
        assert not set(source.fields) & {"name", "source", "description"}, name
        assert set(source.required) <= set(source.fields), name
        if source.given_by is not None:  # a user's own program: made by its option's code, not by a builder
            continue
        builder = models.builder(name)
        for method, parameters in (
            ("check", ["spec", "choice", "available"]),
            ("load", ["spec", "choice"]),
            ("example_inputs", ["spec", "module"]),
            ("known_inputs", ["spec", "config"]),
            ("input_kind", ["spec", "names"]),
            ("calibration", ["spec", "module", "example_args", "kind", "samples"]),
        ):
            assert list(inspect.signature(getattr(builder, method)).parameters) == parameters, (name, method)
    with pytest.raises(SpecError, match="unknown model source 'nope'; known: huggingface"):
        models.builder("nope")


def test_a_huggingface_spec_builds_through_its_source() -> None:
    from orchestrator.lowering.sources.builders.huggingface import HUGGINGFACE
    from orchestrator.lowering.sources.builders.models import check_spec, example_inputs, load_model

    spec = BUILTIN_SPECS["gpt2-tiny"]
    assert models_builder_of(spec) is HUGGINGFACE
    assert check_spec(spec, "random").parameters > 0
    loaded = load_model(spec, "random")
    assert [t.name for t in example_inputs(spec, loaded.module)] == ["input_ids", "attention_mask"]


def models_builder_of(spec: ModelSpec) -> object:
    from orchestrator.lowering.sources.builders.models import builder

    return builder(spec.model_source)


# What every ModelSpec.to_dict wrote before the sources' own fields moved to their options records: the sidecar's
# recorded spec and the cache key keep these keys, so older sidecars read back and compare alike.
RECORDED_KEYS = ["name", "model_type", "task", "seq_len", "model_id", "config", "mask_token_id", "description",
                 "batch_size", "declared_inputs", "kwargs", "image_size", "factory", "source", "model_source",
                 "trust_remote_code", "trust_code", "context", "new_tokens", "prompt", "output", "inputs"]  # fmt: skip


def test_a_sources_own_fields_are_its_options_record(tmp_path: Path) -> None:
    from orchestrator.lowering.lowered import spec_from_record
    from orchestrator.lowering.sources.torchvision import TorchvisionOptions
    from orchestrator.lowering.spec import IMAGE_TASK

    distilbert, mobilenet = BUILTIN_SPECS["distilbert"], BUILTIN_SPECS["mobilenet-v2-tiny"]
    assert distilbert.options == HuggingFaceOptions(model_id="distilbert-base-uncased", mask_token_id=103)
    assert mobilenet.options == TorchvisionOptions(image_size=32, kwargs={"width_mult": 0.25, "num_classes": 10})
    assert not hasattr(mobilenet.options, "model_id") and not hasattr(distilbert, "model_id")
    assert resolve_spec(None, write_spec(tmp_path, VALID)).options == HuggingFaceOptions(
        config={"n_layers": 1}, mask_token_id=103
    )
    assert list(distilbert.to_dict()) == list(mobilenet.to_dict()) == RECORDED_KEYS
    assert mobilenet.to_dict()["model_id"] is None and distilbert.to_dict()["kwargs"] == {}
    # An option decides the program (the identity); the command line's --trust-remote-code is one, never a record's.
    assert distilbert.with_options(mask_token_id=4).identity() != distilbert.identity()
    trusted = resolve_spec("distilbert", trust_remote_code=True)
    assert trusted.options == HuggingFaceOptions(
        model_id="distilbert-base-uncased", mask_token_id=103, trust_remote_code=True
    )
    assert trusted.identity()["trust_remote_code"] and trusted.identity() != distilbert.identity()
    assert spec_from_record(trusted.to_dict(), "sidecar").options == distilbert.options
    assert resolve_spec("mobilenet-v2-tiny", trust_remote_code=True) == mobilenet  # no folder's code to run
    for spec in (distilbert, mobilenet):  # a recorded spec reads back as the spec
        assert spec_from_record(spec.to_dict(), "sidecar").to_dict() == spec.to_dict()
    recorded = json.loads((Path(__file__).parents[1] / "data/advice/distilbert-tiny/sidecar.json").read_text())["spec"]
    assert spec_from_record(recorded, "an older sidecar").options == BUILTIN_SPECS["distilbert-tiny"].options
    with pytest.raises(SpecError, match=r"sidecar.*spec\.mask_token_id"):
        spec_from_record({**distilbert.to_dict(), "mask_token_id": "103"}, "sidecar")
    with pytest.raises(ValueError, match="TorchvisionOptions"):
        ModelSpec("x", "resnet18", IMAGE_TASK, model_source="torchvision", options=HuggingFaceOptions())
    with pytest.raises(TypeError, match="HuggingFaceOptions"):
        mobilenet.options_of(HuggingFaceOptions)


def test_a_users_own_program_is_a_spec_identified_by_its_file(tmp_path: Path) -> None:
    """A .pte's spec (sources/pte.py) is recorded by its file and what came with it, and has an identity."""
    from orchestrator.lowering.sources.pte import PteOptions, pte_spec

    spec = pte_spec("mine", tmp_path / "mine.pte", "0" * 64, reference=tmp_path / "out.etlt")
    assert spec.options_of(PteOptions).sha256 == "0" * 64 and not spec.generates
    recorded = {"name": "mine", "model_source": "user-program", "source": str(tmp_path / "mine.pte")}
    recorded |= {"sha256": "0" * 64, "reference_outputs": str(tmp_path / "out.etlt")}
    assert spec.to_dict() == recorded
    assert spec.identity() == {key: value for key, value in recorded.items() if key != "source"}
