"""A user's .pt2 read the way torch reads it (lowering/exported_archive.py): entries torch would unpickle under a
name of another case, a duplicate, `./` or backslashes; shape expressions sympy would eval; guards torch would
exec. Each hostile archive is a real torch.export.save file rewritten; `fab lower --exported` must refuse it with
exit 65 and its code must not run (its marker file stays absent). The pickles refused by exact name, and the
lowering of a plain .pt2, are in tests/lowering/test_user_programs.py.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import zipfile
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from orchestrator.lowering.export.exported import lower_exported_program
from orchestrator.lowering.export.exported_archive import checked_archive, normalised_name, safe_expression
from orchestrator.lowering.export.user_programs import UserProgramError
from orchestrator.lowering.variants import Variant
from orchestrator.paths import PROJECT_ROOT


class Small(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.linear = torch.nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.linear(x))


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("pt2") / "small.pt2"
    torch.export.save(torch.export.export(Small().eval(), (torch.randn(1, 4),)), str(path))
    return path


def touching(marker: Path) -> bytes:
    """A torch.save file whose unpickling creates `marker`: the proof that a pickle ran."""

    class Touch:
        def __reduce__(self) -> tuple:
            return (Path.touch, (marker,))

    buffer = io.BytesIO()
    torch.save((Touch(),), buffer)
    return buffer.getvalue()


Entries = list[tuple[str, bytes]]


def rewritten(source: Path, target: Path, change: Callable[[Entries], Entries]) -> Path:
    """A copy of a .pt2 whose (name, data) entries went through `change`; names may repeat."""
    with zipfile.ZipFile(source) as old:
        entries = [(info.filename, old.read(info)) for info in old.infolist()]
    with zipfile.ZipFile(target, "w") as new:
        for name, data in change(entries):
            new.writestr(name, data)
    return target


def renamed_inputs(new_name: Callable[[str], str], payload: bytes) -> Callable[[Entries], Entries]:
    """The sample inputs entry renamed and holding `payload`."""
    return lambda entries: [
        (new_name(name), payload) if name.endswith("sample_inputs/model.pt") else (name, data) for name, data in entries
    ]


def duplicated_inputs(payload: bytes, *, hostile_first: bool) -> Callable[[Entries], Entries]:
    """A second sample inputs entry of the same name holding `payload`, before or after the real one."""

    def change(entries: Entries) -> Entries:
        out: Entries = []
        for name, data in entries:
            if name.endswith("sample_inputs/model.pt"):
                pair = [(name, payload), (name, data)]
                out.extend(pair if hostile_first else pair[::-1])
            else:
                out.append((name, data))
        return out

    return change


def with_entry(name: str, data: bytes) -> Callable[[Entries], Entries]:
    """The entries and one more: `name` holding `data`."""
    return lambda entries: [*entries, (name, data)]


def upper_inputs(name: str) -> str:
    return name.replace("sample_inputs", "SAMPLE_INPUTS")


VARIANTS: dict[str, Callable[[bytes], Callable[[Entries], Entries]]] = {
    "upper case": lambda p: renamed_inputs(upper_inputs, p),
    "mixed case": lambda p: renamed_inputs(lambda n: n.replace("sample_inputs", "Sample_Inputs"), p),
    "all upper": lambda p: renamed_inputs(lambda n: n.split("/", 1)[0] + "/" + n.split("/", 1)[1].upper(), p),
    "duplicate, hostile first": lambda p: duplicated_inputs(p, hostile_first=True),
    "duplicate, hostile last": lambda p: duplicated_inputs(p, hostile_first=False),
    "case duplicate": lambda p: (
        lambda entries: [
            *entries,
            *((upper_inputs(name), p) for name, _ in entries if name.endswith("sample_inputs/model.pt")),
        ]
    ),
    "dot slash": lambda p: renamed_inputs(lambda n: n.replace("/data/", "/./data/"), p),
    "backslashes": lambda p: renamed_inputs(lambda n: n.replace("/", "\\").replace("\\", "/", 1), p),
}


def fab_lower(pt2: Path, artifacts: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "ETLAB_ARTIFACTS": str(artifacts), "ETLAB_RESULTS": str(artifacts.parent / "results")}
    return subprocess.run(
        [sys.executable, "-m", "fabric", "lower", "--exported", str(pt2), "--backend", "portable"],
        cwd=PROJECT_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


def test_names_are_normalised_as_any_reader_might_take_them() -> None:
    assert normalised_name("small/data/sample_inputs/model.pt") == ("small", "data/sample_inputs/model.pt")
    assert normalised_name("Small/DATA/Sample_Inputs/MODEL.PT") == ("small", "data/sample_inputs/model.pt")
    assert normalised_name("small\\data\\.\\sample_inputs//model.pt") == ("small", "data/sample_inputs/model.pt")
    assert normalised_name("./small/data/sample_inputs/model.pt") == ("small", "data/sample_inputs/model.pt")
    assert normalised_name("small/data/../x") is None and normalised_name("version") is None


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_sample_inputs_torch_would_unpickle_under_another_name_are_refused(
    variant: str, saved: Path, tmp_path: Path
) -> None:
    marker = tmp_path / "pickle-ran"
    hostile = rewritten(saved, tmp_path / "hostile.pt2", VARIANTS[variant](touching(marker)))
    with pytest.raises(UserProgramError) as caught:
        lower_exported_program(hostile, "hostile", variants=[Variant("portable")], root=tmp_path / "artifacts")
    assert not marker.exists()
    assert caught.value.exit_code == 65
    assert "weights_only=True" in str(caught.value) or "one name for torch's reader" in str(caught.value)
    assert not (tmp_path / "artifacts" / "hostile").exists()


@pytest.mark.slow
@pytest.mark.parametrize("variant", ["upper case", "duplicate, hostile first", "all upper"])
def test_fab_lower_refuses_them_with_65_and_runs_nothing(variant: str, saved: Path, tmp_path: Path) -> None:
    marker = tmp_path / "pickle-ran"
    hostile = rewritten(saved, tmp_path / "hostile.pt2", VARIANTS[variant](touching(marker)))
    proc = fab_lower(hostile, tmp_path / "artifacts")
    said = proc.stdout + proc.stderr
    assert not marker.exists()
    assert proc.returncode == 65, said
    assert "Traceback" not in said and "would run code" in said, said


def _model_json(change: Callable[[dict], None]) -> Callable[[Entries], Entries]:
    def rewrite(entries: Entries) -> Entries:
        out = []
        for name, data in entries:
            if name.endswith("models/model.json"):
                program = json.loads(data)
                change(program)
                data = json.dumps(program).encode()
            out.append((name, data))
        return out

    return rewrite


def test_a_shape_expression_sympy_would_eval_is_refused(saved: Path, tmp_path: Path) -> None:
    marker = tmp_path / "expression-ran"

    def hostile_size(program: dict) -> None:
        values = program["graph_module"]["graph"]["tensor_values"]
        first = next(iter(values.values()))
        first["sizes"][0] = {"as_expr": {"expr_str": f"__import__('pathlib').Path('{marker}').touch()", "hint": None}}

    hostile = rewritten(saved, tmp_path / "expression.pt2", _model_json(hostile_size))
    proc = fab_lower(hostile, tmp_path / "artifacts")
    said = proc.stdout + proc.stderr
    assert not marker.exists()
    assert proc.returncode == 65 and "sympy would eval" in said, said


def test_guards_torch_would_exec_are_left_out(saved: Path, tmp_path: Path) -> None:
    marker = tmp_path / "guard-ran"

    def hostile_guard(program: dict) -> None:
        program["guards_code"] = [f"__import__('pathlib').Path('{marker}').touch() is None"]

    hostile = rewritten(saved, tmp_path / "guard.pt2", _model_json(hostile_guard))
    result = lower_exported_program(hostile, "guarded", variants=[Variant("portable")], root=tmp_path / "artifacts")
    assert result.variants[Variant("portable")].pte.is_file()
    assert not marker.exists()
    kept = zipfile.ZipFile(tmp_path / "artifacts" / "guarded" / "guarded_exported.pt2")
    (model,) = [name for name in kept.namelist() if name.endswith("models/model.json")]
    assert json.loads(kept.read(model))["guards_code"] == []  # the copy Model Explorer loads holds no guards


def test_what_torch_loads_is_only_what_was_checked(saved: Path, tmp_path: Path) -> None:
    extra = rewritten(saved, tmp_path / "extra.pt2", lambda e: [*e, ("small/extra/notes.txt", b"hi")])
    rebuilt = zipfile.ZipFile(io.BytesIO(checked_archive(extra.read_bytes(), extra)))
    names = {name.split("/", 1)[1] for name in rebuilt.namelist()}
    assert "extra/notes.txt" not in names and "models/model.json" in names
    program = torch.export.load(io.BytesIO(checked_archive(saved.read_bytes(), saved)))
    x = torch.randn(1, 4)
    assert torch.equal(program.module()(x), Small().eval()(x))

    compiled = rewritten(
        saved, tmp_path / "aoti.pt2", lambda e: [*e, ("small/data/aotinductor/model/x.so", b"\x7fELF")]
    )
    with pytest.raises(UserProgramError, match="compiled AOTInductor code"):
        checked_archive(compiled.read_bytes(), compiled)
    # torch's reader fails on an entry outside the first entry's folder, and torch.export.load then falls back to
    # the pre-2.8 format, which reads `version` and unpickles `serialized_*.pt` at the top
    for outside, why in (("version", "not a path inside"), ("other/version", "2 top folders")):
        elsewhere = rewritten(saved, tmp_path / "outside.pt2", with_entry(outside, b"3"))
        with pytest.raises(UserProgramError, match=why):
            checked_archive(elsewhere.read_bytes(), elsewhere)


def test_a_tensor_that_claims_more_than_its_file_holds_is_refused(saved: Path, tmp_path: Path) -> None:
    def huge(entries: Entries) -> Entries:
        out = []
        for name, data in entries:
            if name.endswith("model_weights_config.json"):
                config = json.loads(data)
                config["config"]["linear.weight"]["tensor_meta"]["sizes"] = [{"as_int": 100000}, {"as_int": 100000}]
                data = json.dumps(config).encode()
            out.append((name, data))
        return out

    claimed = rewritten(saved, tmp_path / "huge.pt2", huge)
    with pytest.raises(UserProgramError, match=r"'linear\.weight' of shape \[100000, 100000\] needs"):
        checked_archive(claimed.read_bytes(), claimed)


@pytest.mark.parametrize(
    ("entry", "text", "problem"),
    [
        ("models/model.json", "[" * 100_000 + "]" * 100_000, "nested more than 64 levels"),
        ("model_weights_config.json", '{"config": {"w": {"x": ' + "9" * 400 + "}}}", "config.w.x: a number of 400"),
        ("model_constants_config.json", '{"config": NaN}', "config: NaN is out of range"),
    ],
)
def test_its_json_entries_are_read_strictly(saved: Path, tmp_path: Path, entry: str, text: str, problem: str) -> None:
    """A nesting bomb or an odd number in the archive's JSON is bad data (65), never a RecursionError (70)."""
    swapped = rewritten(
        saved,
        tmp_path / "odd.pt2",
        lambda entries: [(name, text.encode() if name.endswith(entry) else data) for name, data in entries],
    )
    with pytest.raises(UserProgramError, match=rf"unreadable \.pt2 archive: .*{entry}: {problem}"):
        checked_archive(swapped.read_bytes(), swapped)


def test_shape_expressions_torch_writes_pass_and_code_does_not() -> None:
    assert safe_expression("Symbol('s77', positive=True, integer=True)") is None
    assert safe_expression("Add(Mul(Integer(2), Symbol('s77', positive=True, integer=True)), Integer(1))") is None
    assert safe_expression("GreaterThan(Symbol('u0', integer=True), Integer(0))") is None
    assert safe_expression("FloorDiv(Symbol('s0', integer=True), Integer(2))") is None
    assert safe_expression("Pow(Symbol('s0', integer=True), Integer(2))") is None
    for hostile in (
        "__import__('os').system('true')",
        "eval('1')",
        "getattr(Integer(1), 'x')",
        "Integer(1).__class__",
        "Max('__import__(\"os\")')",
        "S('x')",
        "preview(Integer(1))",
        "(lambda: 1)()",
        "[Integer(1)][0]",
        "Pow(Integer(9), Integer(99999999999))",
        "Integer(9) ** Mul(Integer(9), Integer(9))",
    ):
        assert safe_expression(hostile) is not None, hostile
