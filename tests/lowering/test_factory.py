"""The `factory` model source (orchestrator/lowering/sources/builders/factory.py): a user's own module from a Python
file, run only with the command line's permission (`--trust-code`), lowered against its eager outputs, lowered again
when the file changes, and every way a factory can fail ending in a clear message and exit 64 or 65, never 70. The
end-to-end run on the local board is tests/e2e/test_model_sources_e2e.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from orchestrator.errors import ExitCode, SpecError
from orchestrator.lowering.builtins import resolve_spec
from orchestrator.lowering.export import lower as lowering
from orchestrator.lowering.sources.factory import FactoryOptions
from orchestrator.lowering.spec import UntrustedFactory, load_spec_file
from orchestrator.lowering.variants import VARIANTS
from orchestrator.paths import PROJECT_ROOT
from orchestrator.tensorfile import read_tensors

FACTORY = """
import torch


class Small(torch.nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, width, 3)
        self.head = torch.nn.Linear(width, 4)

    def forward(self, image: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
        features = torch.relu(self.conv(image)).mean(dim=(2, 3))
        return self.head(features) * scale


def build(width: int = 8):
    torch.manual_seed(0)
    # given out of order: etlab orders them as forward takes them
    return Small(width), {"scale": torch.full((1, 4), 2.0), "image": torch.rand(1, 3, 16, 16)}
"""


def write_factory(folder: Path, body: str = FACTORY, **spec: object) -> Path:
    """The factory in `folder/models/small.py`, its spec `folder/small.json` naming it relative to itself."""
    (folder / "models").mkdir(exist_ok=True)
    (folder / "models" / "small.py").write_text(body)
    path = folder / "small.json"
    data = {"name": "my-small", "source": "factory", "factory": "models/small.py:build", **spec}
    path.write_text(json.dumps(data, indent=2))
    return path


def fab_lower(spec: Path, tmp_path: Path, *options: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "ETLAB_ARTIFACTS": str(tmp_path / "artifacts")}
    return subprocess.run(
        [sys.executable, "-m", "fabric", "lower", "--spec", str(spec), "--backend", "xnnpack", *options],
        cwd=PROJECT_ROOT, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip


def test_a_factory_spec_reads_its_file_relative_to_the_spec(tmp_path: Path) -> None:
    spec = load_spec_file(write_factory(tmp_path, kwargs={"width": 4}))
    options = spec.options_of(FactoryOptions)
    assert options.factory == f"{tmp_path.resolve()}/models/small.py:build" and options.kwargs == {"width": 4}
    assert (spec.model_source, spec.task, spec.trust_code) == ("factory", "custom", False)
    assert spec.identity()["factory_sha256"] != "missing" and "trust_code" not in spec.identity()
    with pytest.raises(SpecError, match=r"small\.json:4: field 'factory': 'build' is not 'path/to/file\.py:function'"):
        load_spec_file(write_factory(tmp_path, factory="build"))
    with pytest.raises(SpecError, match=r"field 'trust_code': unknown"):  # only the command line can say it
        load_spec_file(write_factory(tmp_path, trust_code=True))


def test_without_trust_code_nothing_runs_and_fab_exits_64(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    path = write_factory(tmp_path, f"open({str(marker)!r}, 'w').write('ran')\n" + FACTORY)
    with pytest.raises(UntrustedFactory, match="is your own Python code"):
        lowering.lower(resolve_spec(spec_path=path), variants=[VARIANTS["xnnpack"]], root=tmp_path / "artifacts")
    proc = fab_lower(path, tmp_path)
    assert proc.returncode == ExitCode.USAGE, proc.stdout + proc.stderr
    assert "pass --trust-code on the command line" in proc.stderr and "Traceback" not in proc.stderr
    assert not marker.exists()


def test_a_factory_lowers_matches_eager_and_an_edit_lowers_again(tmp_path: Path) -> None:
    import torch
    from executorch.runtime import Runtime

    path = write_factory(tmp_path)
    spec = resolve_spec(spec_path=path, trust_code=True)
    root = tmp_path / "artifacts"
    result = lowering.lower(spec, variants=[VARIANTS["xnnpack"]], root=root, jobs=1)
    inputs = read_tensors(result.paths.reference_inputs)
    assert [(t.name, t.array.shape) for t in inputs] == [("image", (1, 3, 16, 16)), ("scale", (1, 4))]
    sidecar = result.variants[VARIANTS["xnnpack"]].sidecar
    assert sidecar.weights == "own" and sidecar.delegation.delegate_call_sites >= 1
    (reference,) = read_tensors(result.paths.reference_outputs)
    method = Runtime.get().load_program(result.paths.pte(VARIANTS["xnnpack"])).load_method("forward")
    (output,) = method.execute([torch.from_numpy(t.array) for t in inputs])
    np.testing.assert_allclose(output.numpy(), reference.array, rtol=1e-4, atol=1e-5)

    assert lowering.lower(spec, variants=[VARIANTS["xnnpack"]], root=root, jobs=1).cached
    write_factory(tmp_path, FACTORY.replace("torch.manual_seed(0)", "torch.manual_seed(1)"))
    edited = lowering.lower(resolve_spec(spec_path=path, trust_code=True), variants=[VARIANTS["xnnpack"]],
                            root=root, jobs=1)  # fmt: skip
    assert not edited.cached


@pytest.mark.parametrize(
    ("body", "code", "message"),
    [
        ("def build(width=8):\n    raise ValueError('no GPU here')\n", ExitCode.DATA,
         "small.py:2): ValueError: no GPU here"),
        ("def build(width=8):\n    return 42\n", ExitCode.DATA, "returned a int; expected (torch.nn.Module"),
        ("import torch\ndef build(width=8):\n    return torch.nn.Linear(2, 2), {'x': [1.0, 2.0]}\n", ExitCode.DATA,
         "example input 'x' is not a parameter of forward"),
        ("import torch\ndef build(width=8):\n    return torch.nn.Linear(2, 2), ([1.0, 2.0],)\n", ExitCode.DATA,
         "example input 'input_0' is a list, not a tensor"),
        ("import nonexistent_package_xyz\n", ExitCode.DATA, "ModuleNotFoundError"),
        ("def make():\n    pass\n", ExitCode.USAGE, "has no function 'build'"),
    ],
)  # fmt: skip
def test_a_failing_factory_is_a_clean_error(tmp_path: Path, body: str, code: int, message: str) -> None:
    from orchestrator.lowering.sources.builders.models import check_spec

    spec = resolve_spec(spec_path=write_factory(tmp_path, body), trust_code=True)
    with pytest.raises(Exception) as excinfo:
        check_spec(spec, "auto", available=16 << 30)
    assert getattr(excinfo.value, "exit_code", None) == code, excinfo.value
    assert message in str(excinfo.value) and "field 'factory'" in str(excinfo.value)


TWO_OUTPUTS = """
import torch

RUNS = __import__("pathlib").Path(__file__).with_name("runs.txt")


class Split(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.features = torch.nn.Linear(6, 5)
        self.head = torch.nn.Linear(5, 3)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        features = torch.tanh(self.features(x))
        return features.unsqueeze(1), {"scores": self.head(features)}


def build():
    with RUNS.open("a") as runs:  # how many times etlab ran this factory
        runs.write("run\\n")
    torch.manual_seed(0)
    return Split(), (torch.rand(2, 6),)
"""


def test_every_output_is_kept_in_pytree_order_and_the_factory_runs_once(tmp_path: Path) -> None:
    """A tuple holding a dict: two reference outputs, in the order the runner writes them; the check before the
    lowering and the lowering share one run of the user's code."""
    import torch
    from executorch.runtime import Runtime

    path = write_factory(tmp_path, TWO_OUTPUTS)
    spec = resolve_spec(spec_path=path, trust_code=True)
    result = lowering.lower(spec, variants=[VARIANTS["xnnpack"]], root=tmp_path / "artifacts", jobs=1)
    assert (tmp_path / "models" / "runs.txt").read_text().count("run") == 1
    references = read_tensors(result.paths.reference_outputs)
    assert [(t.name, t.array.shape) for t in references] == [("output_0", (2, 1, 5)), ("output_1", (2, 3))]
    sidecar = result.variants[VARIANTS["xnnpack"]].sidecar  # no task: the kinds come from the shapes
    assert [(o.name, o.kind) for o in sidecar.outputs] == [("output_0", "values"), ("output_1", "logits")]
    inputs = read_tensors(result.paths.reference_inputs)
    method = Runtime.get().load_program(result.paths.pte(VARIANTS["xnnpack"])).load_method("forward")
    outputs = method.execute([torch.from_numpy(t.array) for t in inputs])
    assert len(outputs) == 2
    for output, reference in zip(outputs, references, strict=True):
        np.testing.assert_allclose(output.numpy(), reference.array, rtol=1e-4, atol=1e-5)


def test_a_module_returning_no_tensor_is_refused(tmp_path: Path) -> None:
    from orchestrator.lowering.sources.builders.models import check_spec

    body = "import torch\ndef build():\n    return torch.nn.Identity(), (torch.ones(2),)\n"
    body = body.replace("torch.nn.Identity()", "type('M', (torch.nn.Module,), {'forward': lambda self, x: 'text'})()")
    spec = resolve_spec(spec_path=write_factory(tmp_path, body), trust_code=True)
    with pytest.raises(Exception, match="returns str besides tensors") as excinfo:
        check_spec(spec, "auto", available=16 << 30)
    assert getattr(excinfo.value, "exit_code", None) == ExitCode.DATA


def fab(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "ETLAB_ARTIFACTS": str(tmp_path / "artifacts"), "ETLAB_RESULTS": str(tmp_path / "results")}
    return subprocess.run(
        [sys.executable, "-m", "fabric", *args], cwd=PROJECT_ROOT, env=env, capture_output=True, text=True, timeout=600
    )


def test_a_factory_model_found_by_name_runs_only_with_this_command_lines_trust_code(tmp_path: Path) -> None:
    """The permission is the command line's, never the sidecar's: after one `--spec --trust-code` lowering,
    `--model NAME` imports the factory only when it says `--trust-code` again; a cache hit imports nothing."""
    marker = tmp_path / "imported"
    touch = f"open({str(marker)!r}, 'w').write('imported')\n"
    path = write_factory(tmp_path, touch + FACTORY)
    lowered = fab(tmp_path, "lower", "--spec", str(path), "--backend", "xnnpack", "--trust-code")
    assert lowered.returncode == 0 and marker.exists(), lowered.stdout + lowered.stderr
    marker.unlink()

    def refused(*args: str) -> None:
        proc = fab(tmp_path, *args)
        said = proc.stdout + proc.stderr
        assert not marker.exists(), f"{args} imported the factory: {said}"
        assert proc.returncode == ExitCode.USAGE and "--trust-code" in proc.stderr, said
        assert "Traceback" not in said

    refused("lower", "--model", "my-small", "--backend", "portable")  # a variant not lowered yet
    refused("lower", "--model", "my-small", "--backend", "xnnpack", "--quantize", "int8-dynamic")
    refused("lower", "--model", "my-small", "--backend", "xnnpack", "--force")
    refused("deploy-and-profile", "--model", "my-small", "--backend", "portable", "--board", "local")

    cached = fab(tmp_path, "lower", "--model", "my-small", "--backend", "xnnpack")  # the same variant: nothing runs
    assert cached.returncode == 0 and "using cached artifacts" in cached.stdout + cached.stderr, cached.stderr
    assert not marker.exists()

    write_factory(tmp_path, touch + FACTORY.replace("torch.manual_seed(0)", "torch.manual_seed(1)"))
    refused("lower", "--model", "my-small", "--backend", "xnnpack")  # edited: lowered again only if trusted
    trusted = fab(tmp_path, "lower", "--model", "my-small", "--backend", "xnnpack", "--trust-code")
    assert trusted.returncode == 0 and marker.exists(), trusted.stdout + trusted.stderr
    # what advise --try and the others read back from the sidecar carries no permission either
    from orchestrator.lowering.lowered import find_lowered, spec_from_record, spec_of_lowered

    found = find_lowered("my-small", tmp_path / "artifacts")
    assert found is not None and found.sidecar.spec["trust_code"] is True  # recorded: that lowering was allowed
    assert not spec_from_record(found.sidecar.spec, "sidecar").trust_code and not spec_of_lowered(found).spec.trust_code
    assert spec_of_lowered(found, trust_code=True).spec.trust_code
