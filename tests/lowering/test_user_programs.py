"""Programs the user made: a .pte given an artifacts folder (lowering/user_programs.py; its declared input shapes
checked before inputs are made), a .pt2 checked for pickles and lowered (lowering/exported.py; the archive read as
torch reads it: tests/lowering/test_exported_archive.py), and `--model NAME` finding a model lowered from a spec file
(lowering/lowered.py).
The command line's refusals are in tests/commands/test_own_programs.py, the local board in
tests/e2e/test_own_programs_e2e.py.
"""

from __future__ import annotations

import io
import json
import os
import pickle
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch

from orchestrator.fsutil import atomic_write_json, sha256_file
from orchestrator.lowering.artifacts import ArtifactPaths, load_artifact
from orchestrator.lowering.export.exported import lower_exported_program
from orchestrator.lowering.export.exported_archive import checked_archive
from orchestrator.lowering.export.user_programs import (
    NameTaken,
    ReferenceMismatch,
    UserProgramError,
    generated_inputs,
    import_program,
    reference_outputs_of,
)
from orchestrator.lowering.lowered import find_lowered, spec_of_lowered
from orchestrator.lowering.program import ProgramName
from orchestrator.lowering.sources.exported import ExportedOptions
from orchestrator.lowering.spec import ModelSpec, load_spec_file
from orchestrator.lowering.variants import Variant
from orchestrator.paths import PROJECT_ROOT
from orchestrator.programs.signature import MethodSignature, TensorSlot, read_signature
from orchestrator.tensorfile import NamedTensor, read_tensors, write_tensors


class Small(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.linear = torch.nn.Linear(8, 4)

    def forward(self, x: torch.Tensor, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.relu(self.linear(x)), ids + 1


EXAMPLE = (torch.randn(2, 8), torch.ones(3, dtype=torch.int64))
pytestmark = pytest.mark.slow  # every test lowers with ExecuTorch (the module's programs, made once)


@pytest.fixture(scope="module")
def programs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The same module as a .pt2, an XNNPACK .pte and a portable .pte, made with torch's and ExecuTorch's API."""
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.exir import to_edge, to_edge_transform_and_lower

    folder = tmp_path_factory.mktemp("programs")
    exported = torch.export.export(Small().eval(), EXAMPLE)
    torch.export.save(exported, str(folder / "small.pt2"))
    made = {"pt2": folder / "small.pt2", "xnnpack": folder / "small_x.pte", "portable": folder / "small_p.pte"}
    with open(made["xnnpack"], "wb") as handle:
        to_edge_transform_and_lower(exported, partitioner=[XnnpackPartitioner()]).to_executorch().write_to_file(handle)
    with open(made["portable"], "wb") as handle:
        to_edge(exported).to_executorch().write_to_file(handle)
    return made


def test_the_signature_is_read_from_the_program_without_torch(programs: dict[str, Path]) -> None:
    signature = read_signature(programs["xnnpack"])
    assert [(s.dtype, s.shape) for s in signature.inputs] == [("float32", (2, 8)), ("int64", (3,))]
    assert [(s.dtype, s.shape) for s in signature.outputs] == [("float32", (2, 4)), ("int64", (3,))]


def test_a_pte_gets_an_artifacts_folder_with_generated_inputs(programs: dict[str, Path], tmp_path: Path) -> None:
    artifact = import_program(programs["xnnpack"], "mine", root=tmp_path)
    assert artifact.variant == Variant("xnnpack")
    source = str(programs["xnnpack"].resolve())
    recorded = {"name": "mine", "model_source": "user-program", "source": source, "sha256": artifact.sha256}
    assert artifact.sidecar.spec == recorded | {"reference_outputs": None}  # the file, as etlab always recorded it
    assert artifact.sidecar.delegation.delegate_backends == {"XnnpackBackend": 1}
    assert reference_outputs_of(artifact) is None  # nothing to compare with: correctness is not checked
    inputs = read_tensors(artifact.paths.reference_inputs)
    assert [t.shape for t in inputs] == [[2, 8], [3]]
    assert not inputs[1].array.any()  # integer inputs are zeros: valid as ids or indices of any size
    again = import_program(programs["xnnpack"], "mine", root=tmp_path)
    assert again.sidecar.created == artifact.sidecar.created  # the same file: taken as it is
    assert load_artifact("mine", Variant("xnnpack"), tmp_path).sha256 == artifact.sha256

    portable = import_program(programs["portable"], "mine-portable", root=tmp_path)
    assert portable.variant == Variant("portable") and portable.sidecar.delegation.delegate_call_sites == 0
    # a name with dots etlab's own programs use is the user's, whole: the sidecar records it so
    dotted = import_program(programs["xnnpack"], "mine.sdpa.ctx64", root=tmp_path)
    assert dotted.sidecar.program == dotted.sidecar.identity == ProgramName("mine.sdpa.ctx64")


def test_reference_outputs_must_match_the_programs_outputs(programs: dict[str, Path], tmp_path: Path) -> None:
    good = tmp_path / "good.etlt"
    write_tensors(good, [NamedTensor("a", np.zeros((2, 4), "float32")), NamedTensor("b", np.zeros(3, "int64"))])
    artifact = import_program(programs["xnnpack"], "mine", reference=good, root=tmp_path / "a")
    assert reference_outputs_of(artifact) == artifact.paths.reference_outputs

    wrong_shape = tmp_path / "shape.etlt"
    write_tensors(wrong_shape, [NamedTensor("a", np.zeros((2, 5), "float32")), NamedTensor("b", np.zeros(3, "int64"))])
    with pytest.raises(ReferenceMismatch, match=r"tensor 0 .* float32 \[2, 5\], but output 0 .* float32 \[2, 4\]"):
        import_program(programs["xnnpack"], "mine", reference=wrong_shape, root=tmp_path / "a")
    one = tmp_path / "one.etlt"
    write_tensors(one, [NamedTensor("a", np.zeros((2, 4), "float32"))])
    with pytest.raises(ReferenceMismatch, match=r"1 tensors, but small_x\.pte has 2 outputs"):
        import_program(programs["xnnpack"], "mine", reference=one, root=tmp_path / "a")
    garbage = tmp_path / "garbage.etlt"
    garbage.write_bytes(b"not a tensor file")
    with pytest.raises(ReferenceMismatch, match="not an ETLT file") as caught:
        import_program(programs["xnnpack"], "mine", reference=garbage, root=tmp_path / "a")
    assert caught.value.exit_code == 65


def test_a_file_that_is_no_program_and_a_taken_name_are_refused(programs: dict[str, Path], tmp_path: Path) -> None:
    fake = tmp_path / "fake.pte"
    fake.write_bytes(b"\x00" * 64)
    with pytest.raises(UserProgramError, match="not an ExecuTorch program") as caught:
        import_program(fake, "fake", root=tmp_path)
    assert caught.value.exit_code == 65
    taken = import_program(programs["xnnpack"], "taken", root=tmp_path)
    record = json.loads(taken.paths.sidecar(taken.variant).read_text())
    record["spec"] = {"name": "taken", "model_source": "huggingface", "source": "built-in"}
    atomic_write_json(taken.paths.sidecar(taken.variant), record)
    with pytest.raises(NameTaken, match="holds the lowering of model 'taken'"):
        import_program(programs["portable"], "taken", root=tmp_path)


def _declaring(source: Path, target: Path, sizes: list[int]) -> Path:
    """A copy of a .pte whose first input declares `sizes`, rewritten with ExecuTorch's own serializer."""
    from executorch.exir._serialize._program import deserialize_pte_binary, serialize_pte_binary

    pte = deserialize_pte_binary(source.read_bytes())
    plan = pte.program.execution_plan[0]
    plan.values[plan.inputs[0]].val.sizes = sizes
    target.write_bytes(bytes(serialize_pte_binary(pte)))
    return target


@pytest.mark.parametrize(
    ("sizes", "said"),
    [
        ([-1, 8], r"input 0 of forward declares the shape \[-1, 8\], which has a negative size"),
        ([2**31 - 1, 2**31 - 1], r"input 0 of forward declares float32 \[2147483647, 2147483647\], [\d,.]+ GiB to"),
        ([10000, 10000], r"input 0 of forward declares float32 \[10000, 10000\], 381\.5 MiB to generate: more than "
         r"etlab's limit of 256\.0 MiB"),
    ],
)  # fmt: skip
def test_declared_input_shapes_are_checked_before_inputs_are_made(
    programs: dict[str, Path], tmp_path: Path, sizes: list[int], said: str
) -> None:
    hostile = _declaring(programs["portable"], tmp_path / "declared.pte", sizes)
    env = {**os.environ, "ETLAB_ARTIFACTS": str(tmp_path / "artifacts"), "ETLAB_RESULTS": str(tmp_path / "results")}
    proc = subprocess.run(
        [sys.executable, "-m", "fabric", "push", "--pte", str(hostile), "--board", "local"],
        cwd=PROJECT_ROOT, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 65, proc.stdout + proc.stderr
    assert re.search(said, proc.stderr) and "Traceback" not in proc.stderr, proc.stderr
    assert not (tmp_path / "artifacts").exists()  # no inputs file, no copy: nothing was generated


def test_generated_inputs_fit_the_limit_and_the_memory_available() -> None:
    def signature(*shapes: tuple[int, ...]) -> MethodSignature:
        slots = tuple(TensorSlot(i, "tensor", "float32", shape) for i, shape in enumerate(shapes))
        return MethodSignature("forward", slots, ())

    where = Path("mine.pte")
    assert [t.shape for t in generated_inputs(signature((2, 3)), where, available=1 << 30)] == [[2, 3]]
    with pytest.raises(UserProgramError, match=r"\(input 0: float32 \[8192, 6144\]; input 1: float32 \[8192, 6144\]\) "
                       r"take 384\.0 MiB together"):  # fmt: skip
        generated_inputs(signature((8192, 6144), (8192, 6144)), where)
    with pytest.raises(UserProgramError, match=r"needs about 48\.0 MiB, more than half of the 64\.0 MiB") as caught:
        generated_inputs(signature((1024, 4096)), where, available=64 << 20)  # 16 MiB, drawn as float64
    assert caught.value.exit_code == 65


def _rewritten(source: Path, target: Path, replace: dict[str, bytes | str]) -> Path:
    """A copy of a .pt2 archive with some members' content replaced (by the end of their name)."""
    with zipfile.ZipFile(source) as old, zipfile.ZipFile(target, "w") as new:
        for info in old.infolist():
            data = next((v for k, v in replace.items() if info.filename.endswith(k)), old.read(info.filename))
            new.writestr(info, data)
    return target


class _Touch:
    """Unpickling this creates a file: the proof that a pickle ran."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple:
        return (Path.touch, (self.marker,))


def test_a_pt2_that_would_unpickle_code_is_refused_before_torch_loads_it(
    programs: dict[str, Path], tmp_path: Path
) -> None:
    marker = tmp_path / "pickle-ran"
    buffer = io.BytesIO()
    torch.save((_Touch(marker),), buffer)
    hostile = _rewritten(programs["pt2"], tmp_path / "hostile.pt2", {"sample_inputs/model.pt": buffer.getvalue()})
    with pytest.raises(UserProgramError, match="weights_only=True") as caught:
        lower_exported_program(hostile, "hostile", variants=[Variant("portable")], root=tmp_path / "artifacts")
    assert caught.value.exit_code == 65
    assert not marker.exists()

    config = json.loads(zipfile.ZipFile(programs["pt2"]).read("small/data/weights/model_weights_config.json"))
    config["config"]["linear.weight"]["use_pickle"] = True
    pickled = _rewritten(programs["pt2"], tmp_path / "pickled.pt2", {"model_weights_config.json": json.dumps(config)})
    with pytest.raises(UserProgramError, match=r"'linear\.weight' is stored pickled"):
        checked_archive(pickled.read_bytes(), pickled)
    with pytest.raises(UserProgramError, match=r"not a \.pt2 archive"):
        checked_archive(pickle.dumps([1, 2]), tmp_path / "list.pt2")


def test_an_exported_program_is_lowered_with_its_example_inputs(programs: dict[str, Path], tmp_path: Path) -> None:
    variants = [Variant("portable"), Variant("xnnpack")]
    result = lower_exported_program(programs["pt2"], "small", variants=variants, root=tmp_path)
    assert not result.cached and list(result.variants) == variants
    paths = ArtifactPaths.for_model("small", tmp_path)
    inputs = read_tensors(paths.reference_inputs)
    assert np.array_equal(inputs[0].array, EXAMPLE[0].numpy())  # the program's own example inputs
    expected = Small().eval()(*EXAMPLE)
    outputs = read_tensors(paths.reference_outputs)
    assert np.allclose(outputs[0].array, expected[0].detach().numpy()) and outputs[1].array.tolist() == [2, 2, 2]
    sidecar = result.variants[Variant("xnnpack")].sidecar
    assert sidecar.spec["model_source"] == "exported-program" and sidecar.parameters == 8 * 4 + 4
    # a ModelSpec of the exported-program source, its options the file's; recorded as etlab always did
    sha256 = result.spec.options_of(ExportedOptions).sha256
    assert isinstance(result.spec, ModelSpec) and sha256 == sha256_file(programs["pt2"])
    declared = [{"name": "x", "shape": [2, 8], "dtype": "float32"}, {"name": "ids", "shape": [3], "dtype": "int64"}]
    source = str(programs["pt2"].resolve())
    assert sidecar.spec == {"name": "small", "model_source": "exported-program", "source": source, "sha256": sha256,
                            "inputs": declared}  # fmt: skip
    assert lower_exported_program(programs["pt2"], "small", variants=variants, root=tmp_path).cached

    with pytest.raises(UserProgramError, match="calibrated scheme needs calibration samples"):
        lower_exported_program(programs["pt2"], "small", variants=[Variant.parse("xnnpack-int8-static")], root=tmp_path)
    found = find_lowered("small", tmp_path)
    assert found is not None and found.user_file and found.spec_file is None


def test_a_model_lowered_from_a_spec_file_is_found_by_name(programs: dict[str, Path], tmp_path: Path) -> None:
    spec_file = tmp_path / "tiny.json"
    tiny = {"name": "my-tiny", "model_type": "gpt2", "task": "causal-lm", "config": {"n_layer": 1}}
    spec_file.write_text(json.dumps({**tiny, "seq_len": 16}))
    spec = load_spec_file(spec_file)
    # Artifacts as a spec lowering leaves them: its sidecar records the spec (a user .pte stands in for the program).
    artifact = import_program(programs["portable"], "my-tiny", root=tmp_path)
    record = json.loads(artifact.paths.sidecar(artifact.variant).read_text())
    record["spec"] = spec.to_dict()
    atomic_write_json(artifact.paths.sidecar(artifact.variant), record)

    found = find_lowered("my-tiny", tmp_path)
    assert found is not None and found.spec_file == str(spec_file)
    lowered = spec_of_lowered(found)
    assert lowered.stale is None and lowered.spec.to_dict() == spec.to_dict()

    spec_file.write_text(json.dumps({**tiny, "seq_len": 32}))
    lowered = spec_of_lowered(find_lowered("my-tiny", tmp_path))  # type: ignore[arg-type]
    assert lowered.stale == "changed since" and lowered.spec.seq_len == 16  # the spec the artifacts are from
    spec_file.unlink()
    assert spec_of_lowered(find_lowered("my-tiny", tmp_path)).stale == "is gone"  # type: ignore[arg-type]
    assert find_lowered("gpt2-tiny", tmp_path) is None  # a built-in stays a built-in
    assert find_lowered("nothing", tmp_path) is None
