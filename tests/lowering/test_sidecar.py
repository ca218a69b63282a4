"""The typed lowering sidecar (a records.py Document): what is on disk reads back into a Sidecar and writes back byte
for byte, and a sidecar of the wrong shape is refused with an ArtifactError (exit 65) naming the file and the field."""

from __future__ import annotations

import copy
import dataclasses
import json
from pathlib import Path
from typing import Any, get_args, get_type_hints

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from orchestrator.commands.common import find_artifact
from orchestrator.errors import ArtifactError, ExitCode
from orchestrator.fsutil import atomic_write_json
from orchestrator.lowering.artifacts import load_artifact
from orchestrator.lowering.export.lower import LoweringResult
from orchestrator.lowering.outputs import OUTPUT_KINDS
from orchestrator.lowering.program import ProgramName
from orchestrator.lowering.sidecar import (
    ABSENT_WHEN_UNKNOWN,
    SIDECAR_SCHEMA,
    OutputRecord,
    Sidecar,
    read_sidecar,
    sidecar_data,
    sidecar_from_data,
    write_sidecar,
)
from orchestrator.lowering.variants import VARIANTS
from orchestrator.programs.memory import program_memory_from_sidecar
from tests.plugins.artifacts import ARTIFACT_CACHE, TINY_MODELS

QUANTIZATION = {
    "scheme": "int8-static",
    "method": "PT2E: XNNPACKQuantizer",
    "conv1d_swapped_to_linear": 8,
    "linear_layers": 9,
    "quantized_linears": 9,
    "float_linears": [],
    "calibration": {"source": "generated: deterministic random token ids (not real text)", "samples": 8},
    "nodes": {"fully_connected": {"qint8 x qcint8": 9}, "quantized_fully_connected": 9},
    "pte_bytes": 514464,
}


@pytest.fixture(scope="module")
def real(tiny_artifacts: dict[str, LoweringResult]) -> dict[str, Any]:
    """One real lowered sidecar (distilbert-tiny, xnnpack), as its JSON."""
    return json.loads(tiny_artifacts["distilbert-tiny"].paths.sidecar(VARIANTS["xnnpack"]).read_text())


def test_real_sidecars_round_trip_byte_for_byte(tiny_artifacts: dict[str, LoweringResult], tmp_path: Path) -> None:
    for name in TINY_MODELS:
        for variant in (VARIANTS["portable"], VARIANTS["xnnpack"]):
            path = tiny_artifacts[name].paths.sidecar(variant)
            sidecar = read_sidecar(path)
            assert sidecar.model == name and sidecar.variant == variant
            assert (
                sidecar
                == tiny_artifacts[name].variants[variant].sidecar
                == load_artifact(name, variant, ARTIFACT_CACHE).sidecar
            )
            assert sidecar.files["pte"].sha256 == sidecar.sha256
            assert sidecar.reference_inputs_sha256 == sidecar.files["reference_inputs"].sha256
            # The same bytes as the lowering wrote: caches and boards keep vouching for the same sidecars.
            copy_path = tmp_path / path.name
            write_sidecar(copy_path, sidecar)
            assert copy_path.read_bytes() == path.read_bytes(), path.name
            assert sidecar_from_data(sidecar_data(sidecar)) == sidecar


def test_convolution_counts_are_typed_and_an_older_section_without_them_still_reads(real: dict[str, Any]) -> None:
    older = sidecar_from_data({**real, "backend": "xnnpack-int8-static", "quantization": copy.deepcopy(QUANTIZATION)})
    assert older.quantization is not None and older.quantization.convolutions == 0
    assert older.quantization.float_convolutions == () and older.quantization.float_notes() == []
    counted = {**QUANTIZATION, "convolutions": 3, "quantized_convolutions": 1, "float_convolutions": ["a", "b"]}
    data = {**real, "backend": "xnnpack-int8-static", "quantization": counted}
    sidecar = sidecar_from_data(data)
    # `counted` appends the new keys; the lowering writes them after float_linears (the record's order).
    assert json.dumps(sidecar_data(sidecar), sort_keys=True) == json.dumps(data, sort_keys=True)
    assert sidecar.quantization is not None and sidecar.quantization.float_convolutions == ("a", "b")
    assert sidecar.quantization.float_notes() == ["2 of 3 convolutions stay in float: a, b"]
    for bad in ({"float_convolutions": "a"}, {"convolutions": "3"}):
        with pytest.raises(ArtifactError, match=r"quantization\.(float_)?convolutions"):
            sidecar_from_data({**data, "quantization": {**counted, **bad}})


def test_a_quantization_section_round_trips_and_is_typed(real: dict[str, Any]) -> None:
    data = {**real, "backend": "xnnpack-int8-static", "quantization": copy.deepcopy(QUANTIZATION)}
    sidecar = sidecar_from_data(data)
    assert json.dumps(sidecar_data(sidecar)) == json.dumps(data)
    quantization = sidecar.quantization
    assert quantization is not None and quantization.scheme == "int8-static"
    assert quantization.fully_connected == {"qint8 x qcint8": 9} and quantization.float_linears == ()
    assert quantization.calibration_source is not None
    assert quantization.calibration_samples == 8 and quantization.calibration_source.startswith("generated")


def test_an_old_sidecar_without_output_kinds_reads_and_writes_back_unchanged(real: dict[str, Any]) -> None:
    """Sidecars written before kinds were recorded: the kind is guessed from the shape, and not written back."""
    old = copy.deepcopy(real)
    old["outputs"] = [
        {"name": "output_0", "shape": [1, 1000], "dtype": "float32"},  # [batch, classes]: logits
        {"name": "output_1", "shape": [1, 8, 64], "dtype": "float32"},  # hidden states: values
        {"name": "output_2", "shape": [1, 5], "dtype": "int64"},  # ids: values
    ]
    sidecar = sidecar_from_data(old)
    assert [(o.kind, o.kind_recorded) for o in sidecar.outputs] == [
        ("logits", False), ("values", False), ("values", False)
    ]  # fmt: skip
    assert json.dumps(sidecar_data(sidecar)) == json.dumps(old)
    assert [(o.kind, o.kind_recorded) for o in sidecar_from_data(real).outputs] == [("logits", True)]


@pytest.mark.parametrize(
    ("mutate", "field"),
    [
        (lambda d: d.pop("sha256"), "sha256"),
        (lambda d: d.update(schema=2), "schema"),
        (lambda d: d.update(weights=None), "weights"),
        (lambda d: d.update(pte_size_mb="1 MB"), "pte_size_mb"),
        (lambda d: d.update(files=[]), "files"),
        (lambda d: d["files"].pop("pte"), "files.pte"),
        (lambda d: d["files"].pop("reference_inputs"), "files.reference_inputs"),
        (lambda d: d["files"]["pte"].update(size="12"), "files[...].size"),  # msgspec names no dict key
        (lambda d: d["files"]["reference_inputs"].pop("sha256"), "files[...].sha256"),
        (lambda d: d["delegation"]["instructions"].pop("KernelCall"), "delegation: instructions.KernelCall"),
        (lambda d: d["delegation"].update(fallback_ops=True), "delegation.fallback_ops"),
        (lambda d: d["memory"]["planned_arenas"].append("big"), "memory.planned_arenas[1]"),
        (lambda d: d["memory"]["live_bytes"].update(forward_0_0=1.5), "memory.live_bytes"),
        (lambda d: d["lowering"].update(seconds=float("nan")), "lowering.seconds"),
        (lambda d: d.update(quantization={**QUANTIZATION, "float_linears": "none"}), "quantization.float_linears"),
        (lambda d: d.update(quantization={**QUANTIZATION, "calibration": {"samples": 8}}), "calibration.source"),
        (lambda d: d.update(versions={"torch": 2}), "versions"),
        (lambda d: d.update(inputs=[["input_ids"]]), "inputs[0]"),
        (lambda d: d["outputs"][0].update(kind="hidden"), "outputs[0].kind"),
        (lambda d: d["outputs"][0].update(kind=None), "outputs[0].kind"),
        (lambda d: d["outputs"][0].update(shape=[1, "vocab"]), "outputs[0].shape"),
    ],
)
def test_a_bad_shape_is_refused_naming_the_file_and_the_field(
    real: dict[str, Any], tmp_path: Path, mutate: Any, field: str
) -> None:
    data = copy.deepcopy(real)
    mutate(data)
    path = tmp_path / "distilbert-tiny_xnnpack.json"
    atomic_write_json(path, data)
    with pytest.raises(ArtifactError) as refused:
        read_sidecar(path)
    assert str(path) in str(refused.value) and field in str(refused.value), str(refused.value)
    assert refused.value.exit_code == ExitCode.DATA == 65


def test_an_unreadable_sidecar_is_an_artifact_error(tmp_path: Path) -> None:
    path = tmp_path / "broken.json"
    path.write_text("{not json")
    with pytest.raises(ArtifactError, match=r"broken\.json"):
        read_sidecar(path)
    with pytest.raises(ArtifactError, match=r"list\.json: expected an object"):
        sidecar_from_data([1, 2], "list.json")


# Sidecars the previous etlab wrote (before records.py): a quantized one and a text-generation one, as lowered, and
# the advisor's recorded ones.
WRITTEN_BEFORE = sorted((Path(__file__).parents[1] / "data" / "sidecars").glob("*.json"))
RECORDED = sorted((Path(__file__).parents[1] / "data" / "advice").glob("*/sidecar.json"))


@pytest.mark.parametrize("path", WRITTEN_BEFORE + RECORDED, ids=lambda path: f"{path.parent.name}/{path.name}")
def test_a_sidecar_the_previous_etlab_wrote_reads_back_and_writes_back_unchanged(path: Path, tmp_path: Path) -> None:
    sidecar = read_sidecar(path)
    assert sidecar.variant.name == sidecar.backend and sidecar.files["pte"].sha256 == sidecar.sha256
    write_sidecar(tmp_path / path.name, sidecar)
    assert json.dumps(json.loads((tmp_path / path.name).read_text())) == json.dumps(json.loads(path.read_text()))
    if path in WRITTEN_BEFORE:
        assert (tmp_path / path.name).read_bytes() == path.read_bytes()
    assert len(WRITTEN_BEFORE) == 2 and len(RECORDED) >= 4


def test_the_typed_sections_of_an_older_sidecar() -> None:
    quantized, generating = (read_sidecar(path) for path in WRITTEN_BEFORE)
    assert quantized.quantization is not None and quantized.quantization.scheme == quantized.variant.scheme.name
    assert quantized.quantization.fully_connected and quantized.quantization.nodes is not None
    assert generating.generation is not None and generating.generation.context >= 2
    assert generating.applied_rewrites == () and generating.outside_delegates is not None
    assert all(output.kind_recorded for output in generating.outputs)
    assert set(get_args(get_type_hints(OutputRecord)["kind"].__args__[0])) == set(OUTPUT_KINDS)


def test_a_sidecar_from_a_newer_etlab_is_refused_by_name(tmp_path: Path) -> None:
    data = json.loads(WRITTEN_BEFORE[0].read_text())
    path = tmp_path / WRITTEN_BEFORE[0].name
    atomic_write_json(path, {**data, "schema": SIDECAR_SCHEMA + 1})
    with pytest.raises(ArtifactError, match=r"schema: version 2 was written by a newer etlab") as refused:
        read_sidecar(path)
    assert str(path) in str(refused.value) and refused.value.exit_code == ExitCode.DATA


def test_a_sidecar_of_the_wrong_shape_is_no_artifact(tiny_artifacts: dict[str, LoweringResult], tmp_path: Path) -> None:
    """load_artifact says which field is wrong (and how to re-lower), rather than failing later with a KeyError."""
    source = tiny_artifacts["distilbert-tiny"].paths.folder
    folder = tmp_path / "distilbert-tiny"
    folder.mkdir()
    for file in source.iterdir():
        (folder / file.name).hardlink_to(file)  # hard links keep size and mtime: the records still match
    data = json.loads((folder / "distilbert-tiny_xnnpack.json").read_text())
    data["delegation"] = "all of it"
    (folder / "distilbert-tiny_xnnpack.json").unlink()
    atomic_write_json(folder / "distilbert-tiny_xnnpack.json", data)
    assert load_artifact("distilbert-tiny", VARIANTS["portable"], tmp_path).sidecar.variant == VARIANTS["portable"]
    with pytest.raises(ArtifactError, match="delegation: expected `object`") as refused:
        load_artifact("distilbert-tiny", VARIANTS["xnnpack"], tmp_path)
    assert "distilbert-tiny_xnnpack.json" in str(refused.value) and "--" not in str(refused.value)
    # The command layer names the `fab lower` that makes it (the library names no option).
    with pytest.raises(ArtifactError, match="delegation: expected `object`") as named:
        find_artifact("distilbert-tiny", VARIANTS["xnnpack"], tmp_path)
    assert named.value.hint == "run: fab lower --model distilbert-tiny --backend xnnpack"


# Values a mutation may put anywhere in the document.
_VALUES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=5),
    st.lists(st.integers(), max_size=2),
    st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
)


def _paths(node: Any, prefix: tuple = ()) -> list[tuple]:
    """Every place in a JSON document: dict keys and list indices, nested."""
    found = [prefix]
    if isinstance(node, dict):
        for key, value in node.items():
            found += _paths(value, (*prefix, key))
    elif isinstance(node, list):
        for index, value in enumerate(node):
            found += _paths(value, (*prefix, index))
    return found


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_a_mutated_sidecar_loads_or_is_an_artifact_error(real: dict[str, Any], data: st.DataObject) -> None:
    document = copy.deepcopy(real)
    places = _paths(document)
    for _ in range(data.draw(st.integers(min_value=1, max_value=3))):
        place = data.draw(st.sampled_from(places))
        if not place:
            document = data.draw(_VALUES)
            break
        parent = document
        try:
            for step in place[:-1]:
                parent = parent[step]
            if data.draw(st.booleans()) and isinstance(parent, dict):
                parent.pop(place[-1], None)
            else:
                parent[place[-1]] = data.draw(_VALUES)
        except (KeyError, IndexError, TypeError):
            continue  # an earlier mutation replaced this place's parent
    try:
        sidecar = sidecar_from_data(document, "mutated.json")
    except ArtifactError as exc:
        assert "mutated.json" in str(exc)
        return
    # What loads writes back what it read (in the file's key order: a mutation may have moved a key to the end);
    # a section older sidecars lack reads null as unknown, and unknown is written as absent.
    unknown_is_absent = {k: v for k, v in document.items() if not (k in ABSENT_WHEN_UNKNOWN and v is None)}
    unknown_is_absent.setdefault("schema", SIDECAR_SCHEMA)  # a document without one is version 1 (records.py)
    assert json.dumps(sidecar_data(sidecar), sort_keys=True) == json.dumps(unknown_is_absent, sort_keys=True)


def test_the_artifact_cache_holds_typed_sidecars(tiny_artifacts: dict[str, LoweringResult]) -> None:
    for name in TINY_MODELS:
        artifact = load_artifact(name, VARIANTS["xnnpack"], ARTIFACT_CACHE)
        assert isinstance(artifact.sidecar, Sidecar) and artifact.sha256 == artifact.sidecar.sha256
        assert artifact.sidecar.memory.planned_bytes == sum(artifact.sidecar.memory.planned_arenas)


def test_a_warm_analysis_reads_the_plans_memory_from_the_typed_sidecar() -> None:
    """results/analysis.py hands programs/ the sidecar's data (tuples, as to_data writes them): the recorded plan is
    used, not re-read from the .pte."""
    sidecar = read_sidecar(WRITTEN_BEFORE[0])
    memory = program_memory_from_sidecar(sidecar_data(sidecar))
    assert memory is not None and memory.planned_arenas == list(sidecar.memory.planned_arenas)


def test_what_readers_take_from_the_spec_is_typed_and_a_bad_sidecar_is_never_written(tmp_path: Path) -> None:
    quantized, generating = (read_sidecar(path) for path in WRITTEN_BEFORE)
    assert quantized.origin.model_source == "huggingface" and quantized.origin.source == "built-in"
    # an older sidecar records no program: its name says what it is
    assert generating.program is None and generating.identity == ProgramName(generating.model)
    # a recorded program must be the one the sidecar names (a file that says otherwise is refused, naming it)
    with pytest.raises(ValueError, match=r"program: smollm2-gen-tiny\.ctx64 is not the program 'gpt2-gen-tiny'"):
        dataclasses.replace(generating, program=ProgramName("smollm2-gen-tiny", context=64))
    data = {**sidecar_data(generating), "program": {"base": "gpt2-gen-tiny", "context": 64}}
    with pytest.raises(ArtifactError, match=r"x.json: program: gpt2-gen-tiny\.ctx64 is not the program"):
        sidecar_from_data(data, "x.json")
    recorded = sidecar_from_data({**sidecar_data(generating), "program": {"base": "gpt2-gen-tiny"}})
    assert recorded.program == ProgramName("gpt2-gen-tiny") == recorded.identity
    odd = dataclasses.replace(generating, spec={**generating.spec, "model_source": 7})
    with pytest.raises(ArtifactError, match=r"sidecar: spec.model_source: expected `str \| null`, got `int`"):
        _ = odd.origin
    # built with a value its types refuse (a lowering's bug): refused before it becomes an artifact
    negative = dataclasses.replace(generating, parameters=-1)
    with pytest.raises(ArtifactError, match=r"parameters: expected `int` >= 0"):
        write_sidecar(tmp_path / "bad.json", negative)
    assert not (tmp_path / "bad.json").exists()
