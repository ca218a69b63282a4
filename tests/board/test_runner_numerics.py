"""The native runner's numerics mode (--reference, --numerics-out) and --outputs-cap, on a real program made here:
statistics checked against numpy over the runner's own --outputs file, hostile reference files refused with
their exit code and one line (board/runner/README.md, "Numerics")."""

from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from orchestrator.tensorfile import NamedTensor, read_tensors, write_tensors
from tests.board.test_runner import ERROR_PREFIX, error_line, run_runner

pytestmark = pytest.mark.slow

SCALE, ZERO_POINT = 0.1, 3.0
OUTPUTS = 5  # a [2, 3] float32, b [2] float32, c [2, 3] int8, None, the Int 2
KINDS = ["float32", "float32", "int8", None, None]
DATA_BYTES = {0: 24, 1: 8, 2: 6, 4: 8}  # what --outputs stores of each (output 3, None, is never stored)
# x carries a NaN, an Inf and a value that makes an exact zero of output 0 (2 * -0.5 + 1).
X = np.array([[-0.5, 0.25, np.nan], [np.inf, 3.0, -1.75]], dtype=np.float32)
Y = np.array([[0.71, -2.38, 4.04], [-0.55, 1.26, 9.99]], dtype=np.float32)


@dataclass(frozen=True)
class NumericsProgram:
    pte: Path
    inputs: Path


@pytest.fixture(scope="module")
def program(tmp_path_factory: pytest.TempPathFactory) -> NumericsProgram:
    import torch
    from executorch.exir import to_edge

    class Outputs(torch.nn.Module):
        def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[Any, ...]:
            quantized = torch.clamp(torch.round(y * 10), -128, 127).to(torch.int8)
            return x * 2.0 + 1.0, (y * y).sum(dim=1), quantized, None, x.shape[0]

    example = (torch.zeros(2, 3), torch.zeros(2, 3))
    exported = torch.export.export(Outputs(), example, strict=True)
    folder = tmp_path_factory.mktemp("numerics")
    pte, inputs = folder / "outputs.pte", folder / "inputs.etlt"
    pte.write_bytes(to_edge(exported).to_executorch().buffer)
    write_tensors(inputs, [NamedTensor("x", X), NamedTensor("y", Y)])
    return NumericsProgram(pte, inputs)


def eager_outputs() -> list[np.ndarray]:
    with np.errstate(invalid="ignore"):
        a = X * np.float32(2.0) + np.float32(1.0)
    quantized = np.clip(np.round(Y * np.float32(10)), -128, 127).astype(np.int8)
    return [a, (Y * Y).sum(axis=1), quantized]


def reference_tensors() -> list[NamedTensor]:
    """References near the outputs, output 0's with a NaN and an Inf of its own, output 1's reshaped [1, 2]."""
    a, b, quantized = eager_outputs()
    rng = np.random.default_rng(3)
    ref_a = (a + rng.normal(0, 0.01, a.shape)).astype(np.float32)
    ref_a[0, 2], ref_a[1, 0] = 0.5, 4.0  # finite where the output is NaN and Inf: those pairs are left out all the same
    ref_a[0, 1], ref_a[1, 2] = np.nan, -np.inf  # so the pairs are (0, 0) and (1, 1)
    ref_b = (b + rng.normal(0, 0.01, b.shape)).astype(np.float32).reshape(1, 2)
    ref_c = (quantized.astype(np.float64) - ZERO_POINT) * SCALE + rng.normal(0, 0.02, quantized.shape)
    return [
        NamedTensor("output_0", ref_a),
        NamedTensor("output_1", ref_b),
        NamedTensor("output_2", ref_c.astype(np.float32)),
        NamedTensor("output_2.qparams", np.array([SCALE, ZERO_POINT], dtype=np.float64)),
    ]


def strict_json(text: str) -> Any:
    def refuse(token: str) -> None:
        raise AssertionError(f"{token} in numerics.json")

    return json.loads(text, parse_constant=refuse)


def expected_stats(values: np.ndarray, reference: np.ndarray | None) -> dict[str, Any]:
    """The documented statistics, from numpy in double precision."""
    v = values.astype(np.float64).ravel()
    finite = v[np.isfinite(v)]
    stats: dict[str, Any] = {
        "numel": v.size,
        "nan": int(np.isnan(v).sum()),
        "inf": int(np.isinf(v).sum()),
        "zeros": int((v == 0).sum()),
        "min": float(finite.min()) if finite.size else None,
        "max": float(finite.max()) if finite.size else None,
        "sum_squares": float((finite**2).sum()),
        "reference": None,
    }
    if reference is not None:
        r = reference.astype(np.float64).ravel()
        r_finite = r[np.isfinite(r)]
        both = np.isfinite(v) & np.isfinite(r)
        errors = np.abs(v[both] - r[both])
        stats["reference"] = {
            "min": float(r_finite.min()) if r_finite.size else None,
            "max": float(r_finite.max()) if r_finite.size else None,
            "sum_squares": float((r_finite**2).sum()),
            "nan": int(np.isnan(r).sum()),
            "inf": int(np.isinf(r).sum()),
            "noise": float((errors**2).sum()),
            "dot": float((v[both] * r[both]).sum()),
            "max_abs_error": float(errors.max()) if errors.size else None,
            "pairs": int(both.sum()),
        }
    return stats


def assert_close(actual: dict[str, Any], expected: dict[str, Any], where: str) -> None:
    for key, want in expected.items():
        got = actual[key]
        if isinstance(want, dict):
            assert isinstance(got, dict), (where, key, got)
            assert_close(got, want, f"{where}.{key}")
        elif isinstance(want, float):
            assert isinstance(got, (int, float)) and got == pytest.approx(want, rel=1e-6, abs=0), (where, key, got)
        else:
            assert got == want and type(got) is type(want), (where, key, got, want)


def run(binary: Path, program: NumericsProgram, *extra: str | Path) -> subprocess.CompletedProcess[str]:
    return run_runner(
        binary, "--model", program.pte, "--inputs", program.inputs, "--warmup", "0", "--iterations", "2",
        "--threads", "1", *extra,
    )  # fmt: skip


def numerics_of(binary: Path, program: NumericsProgram, folder: Path, *extra: str | Path) -> dict[str, Any]:
    """numerics.json of a run against reference_tensors()."""
    reference, numerics = folder / "reference.etlt", folder / "numerics.json"
    write_tensors(reference, reference_tensors())
    completed = run(binary, program, "--reference", reference, "--numerics-out", numerics, *extra)
    assert completed.returncode == 0, completed.stderr
    document = strict_json(numerics.read_text())
    assert isinstance(document, dict)
    return document


def test_statistics_match_numpy_over_the_runners_own_outputs(
    runner_binary: Path, program: NumericsProgram, tmp_path: Path
) -> None:
    outputs = tmp_path / "outputs.etlt"
    document = numerics_of(runner_binary, program, tmp_path, "--outputs", outputs)
    assert document["schema"] == 1 and document["outputs"] == OUTPUTS
    tensors = document["tensors"]
    assert [entry["index"] for entry in tensors] == list(range(OUTPUTS))
    assert [entry["dtype"] for entry in tensors] == KINDS

    stored = {tensor.name: tensor.array for tensor in read_tensors(outputs)}
    assert sorted(stored) == ["output_0", "output_1", "output_2", "output_4"]
    for ran, eager in zip((stored["output_0"], stored["output_1"], stored["output_2"]), eager_outputs(), strict=True):
        np.testing.assert_allclose(ran, eager, rtol=1e-6)  # the program is the module
    references = {tensor.name: tensor.array for tensor in reference_tensors()}
    dequantized = (stored["output_2"].astype(np.float64) - ZERO_POINT) * SCALE
    for index, values in ((0, stored["output_0"]), (1, stored["output_1"]), (2, dequantized)):
        entry = tensors[index]
        assert entry["dims"] == list(stored[f"output_{index}"].shape)
        assert entry["kept"] is True
        assert_close(entry, expected_stats(values, references[f"output_{index}"]), f"output {index}")
    assert tensors[0]["qparams"] is None and tensors[1]["qparams"] is None
    assert tensors[2]["qparams"] == {"scale": SCALE, "zero_point": ZERO_POINT}

    # Output 0: a NaN, an Inf and an exact zero of its own, a NaN and an Inf in the reference at other places.
    first = tensors[0]
    assert (first["nan"], first["inf"], first["zeros"]) == (1, 1, 1)
    assert (first["reference"]["nan"], first["reference"]["inf"], first["reference"]["pairs"]) == (1, 1, 2)
    assert tensors[1]["reference"]["pairs"] == 2  # a [1, 2] reference for a [2] output: the same 2 values
    # None and the Int: no tensor, no statistics; the Int is in the --outputs file (a 0-dim int64), None is not.
    for index, kept in ((3, False), (4, True)):
        assert tensors[index] == {
            "index": index, "dtype": None, "dims": None, "numel": 0, "nan": 0, "inf": 0, "zeros": 0,
            "min": None, "max": None, "sum_squares": 0, "qparams": None, "kept": kept, "reference": None,
        }  # fmt: skip


def test_outputs_without_a_reference_have_statistics_and_kept_is_null_without_outputs(
    runner_binary: Path, program: NumericsProgram, tmp_path: Path
) -> None:
    reference, numerics = tmp_path / "reference.etlt", tmp_path / "numerics.json"
    write_tensors(reference, [reference_tensors()[1]])
    completed = run(runner_binary, program, "--reference", reference, "--numerics-out", numerics)
    assert completed.returncode == 0, completed.stderr
    tensors = strict_json(numerics.read_text())["tensors"]
    assert [entry["kept"] for entry in tensors] == [None] * OUTPUTS
    assert [entry["reference"] is None for entry in tensors] == [True, False, True, True, True]
    a, _, quantized = eager_outputs()
    assert_close(tensors[0], expected_stats(a, None), "output 0")
    # Without qparams an int8 output's statistics are of its integers.
    assert_close(tensors[2], expected_stats(quantized, None), "output 2")
    assert tensors[2]["qparams"] is None
    assert tensors[0]["min"] == -2.5 and tensors[0]["max"] == 7.0


@pytest.mark.parametrize(
    ("cap", "kept"),
    [
        (None, [True, True, True, False, True]),
        (0, [False] * OUTPUTS),
        (20, [False, True, True, False, False]),  # 24 does not fit; 8 + 6 do; the Int's 8 more would not
        (30, [True, False, True, False, False]),  # 24, then 8 would pass 30, then 6 makes exactly 30
        (46, [True, True, True, False, True]),  # all of it: 24 + 8 + 6 + 8
    ],
)
def test_outputs_cap_keeps_exactly_what_fits_and_kept_says_so(
    runner_binary: Path, program: NumericsProgram, tmp_path: Path, cap: int | None, kept: list[bool]
) -> None:
    outputs = tmp_path / "outputs.etlt"
    extra: list[str | Path] = ["--outputs", outputs, *([] if cap is None else ["--outputs-cap", str(cap)])]
    tensors = numerics_of(runner_binary, program, tmp_path, *extra)["tensors"]
    assert [entry["kept"] for entry in tensors] == kept
    stored = read_tensors(outputs)
    assert [tensor.name for tensor in stored] == [f"output_{i}" for i in range(OUTPUTS) if kept[i]]
    assert sum(tensor.array.nbytes for tensor in stored) == sum(DATA_BYTES[i] for i in range(OUTPUTS) if kept[i])
    assert cap is None or sum(tensor.array.nbytes for tensor in stored) <= cap
    expected = dict(zip(("output_0", "output_1", "output_2"), eager_outputs(), strict=True))
    for tensor in stored:  # what is kept is whole
        if tensor.name in expected:
            np.testing.assert_allclose(tensor.array, expected[tensor.name], rtol=1e-6)


def _hostile(case: str, folder: Path) -> Path:
    """A reference file broken in one way."""
    good = reference_tensors()
    path = folder / "reference.etlt"
    if case == "missing":
        return folder / "absent.etlt"
    replaced = {
        "not output_<i>": [NamedTensor("logits", good[0].array)],
        "leading zero": [NamedTensor("output_01", good[1].array)],
        "index past the outputs": [NamedTensor("output_5", good[0].array)],
        "float64 reference": [NamedTensor("output_0", good[0].array.astype(np.float64))],
        "float32 qparams": [good[2], NamedTensor("output_2.qparams", np.array([SCALE, ZERO_POINT], np.float32))],
        "three qparams": [good[2], NamedTensor("output_2.qparams", np.array([SCALE, ZERO_POINT, 1.0]))],
        "zero scale": [good[2], NamedTensor("output_2.qparams", np.array([0.0, ZERO_POINT]))],
        "qparams alone": [good[3]],
        "qparams of a float output": [good[0], NamedTensor("output_0.qparams", np.array([SCALE, ZERO_POINT]))],
        "reference of None": [NamedTensor("output_3", good[0].array)],
        "reference of an Int": [NamedTensor("output_4", np.zeros((), np.float32))],
        "twice": [good[0], good[0]],
        "numel differs": [good[0], NamedTensor("output_1", np.zeros(3, np.float32))],
    }
    if case in replaced:
        write_tensors(path, replaced[case])
    else:
        write_tensors(path, good)
        path.write_bytes(path.read_bytes()[:-5] if case == "truncated" else b"NOTETLT!" + bytes(8))
    return path


@pytest.mark.parametrize(
    ("case", "message"),
    [
        ("missing", "--reference: cannot read tensor file {folder}/absent.etlt: No such file or directory"),
        ("truncated", "--reference: tensor file {file}: tensor 'output_2.qparams' truncated"),
        ("not an ETLT file", "--reference: tensor file {file}: not an ETLT file (bad magic)"),
        ("not output_<i>", "{ref}'logits' is neither output_<i> nor output_<i>.qparams"),
        ("leading zero", "{ref}'output_01' is neither output_<i> nor output_<i>.qparams"),
        ("index past the outputs", "{ref}'output_5' names output 5, but method 'forward' has 5 outputs"),
        ("float64 reference", "{ref}'output_0' is float64; a reference must be float32"),
        ("float32 qparams", "{ref}'output_2.qparams' is float32 [2]; qparams must be float64 [2] (scale, zero_point)"),
        ("three qparams", "{ref}'output_2.qparams' is float64 [3]; qparams must be float64 [2] (scale, zero_point)"),
        ("zero scale", "{ref}'output_2.qparams' holds scale 0 and zero_point 3; the scale must be finite and > 0"),
        ("qparams alone", "{ref}'output_2.qparams' has no tensor 'output_2' to go with it"),
        ("qparams of a float output", "{ref}'output_0.qparams' dequantizes output 0, which is float32; only int8"),
        ("reference of None", "{ref}'output_3' names output 3, which is a None, not a tensor"),
        ("reference of an Int", "{ref}'output_4' names output 4, which is a Int, not a tensor"),
        ("twice", "{ref}'output_0' appears twice"),
        ("numel differs", "{ref}'output_1' has shape [3] (3 values), but output 1 has shape [2] (2 values)"),
    ],
)
def test_a_bad_reference_is_exit_6_with_one_line_naming_it(
    runner_binary: Path, program: NumericsProgram, tmp_path: Path, case: str, message: str
) -> None:
    reference = _hostile(case, tmp_path)
    outputs, numerics = tmp_path / "outputs.etlt", tmp_path / "numerics.json"
    completed = run(runner_binary, program, "--reference", reference, "--numerics-out", numerics, "--outputs", outputs)
    assert completed.returncode == 6, completed.stderr
    expected = message.format(folder=tmp_path, file=reference, ref=f"reference file {reference}: tensor ")
    assert error_line(completed).startswith(ERROR_PREFIX + expected), completed.stderr
    assert not numerics.exists() and not outputs.exists()  # nothing written, even after the run (numel differs)


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--numerics-out", "{folder}/numerics.json"], "--numerics-out needs --reference"),
        (["--reference", "{folder}/reference.etlt"], "--reference needs --numerics-out"),
        (["--outputs-cap", "100"], "--outputs-cap needs --outputs"),
        (["--outputs", "{folder}/o.etlt", "--outputs-cap", "-1"], "--outputs-cap needs a number of bytes >= 0"),
        (["--outputs", "{folder}/o.etlt", "--outputs-cap", "1k"], "--outputs-cap needs a number of bytes >= 0"),
        (
            ["--generate", "--reference", "{folder}/reference.etlt", "--numerics-out", "{folder}/numerics.json"],
            "--reference cannot be used with --generate",
        ),
    ],
)
def test_option_misuse_is_exit_2(
    runner_binary: Path, program: NumericsProgram, tmp_path: Path, extra: list[str], message: str
) -> None:
    write_tensors(tmp_path / "reference.etlt", reference_tensors())
    completed = run_runner(runner_binary, "--model", program.pte, *(arg.format(folder=tmp_path) for arg in extra))
    assert completed.returncode == 2, completed.stderr
    assert error_line(completed).startswith(ERROR_PREFIX + message)
    assert not (tmp_path / "numerics.json").exists()


def test_usage_documents_the_options(runner_binary: Path) -> None:
    usage = run_runner(runner_binary, "--help").stdout
    for option in ("--reference PATH", "--numerics-out PATH", "--outputs-cap BYTES"):
        assert usage.count(option) == 2, option  # the synopsis and its line
