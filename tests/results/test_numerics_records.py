"""The numerics pass's board file (numerics.json) read against the numerics program's record: SQNR, cosine and the
error each operator introduced computed as documented (checked against numpy), a collapse and NaN/Inf found, and every
hostile file refused by field with exit 65 (never a traceback). The pass itself, end to end: tests/e2e/
test_numerics_e2e.py.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from orchestrator.errors import AnalysisError, ExitCode
from orchestrator.lowering.export.numerics import NUMERICS_SCHEMA, TAP_RULE, NumericsProgram, NumericsRecord, Tap
from orchestrator.results.numerics import (
    EXACT_DB,
    MAX_NUMERICS_BYTES,
    ROUNDING_DB,
    numerics_of,
    read_numerics_file,
    sqnr_db,
)

SHA = "a" * 64


def record(shapes: list[tuple[int, ...]], reads: list[tuple[int, ...]]) -> NumericsProgram:
    taps = tuple(
        Tap(index=1 + i, node=f"op_{i}", op="aten.linear", shape=shape, dtype="float32", module=f"layer{i}",
            file="model.py", line=10 + i, reads=tuple(1 + r for r in read))
        for i, (shape, read) in enumerate(zip(shapes, reads, strict=True))
    )  # fmt: skip
    made = NumericsRecord(NUMERICS_SCHEMA, TAP_RULE, "p.pte", SHA, "r.etlt", SHA, SHA, 1, taps)
    return NumericsProgram(Path("."), made)


def stats(index: int, board: np.ndarray, fp32: np.ndarray) -> dict[str, Any]:
    """What the runner writes for one output (board/runner/README.md, "Numerics")."""
    finite = np.isfinite(board)
    both = finite & np.isfinite(fp32)
    x, r = board[both].astype(np.float64), fp32[both].astype(np.float64)
    return {
        "index": index, "dtype": "float32", "dims": list(board.shape), "numel": int(board.size),
        "nan": int(np.isnan(board).sum()), "inf": int(np.isinf(board).sum()), "zeros": int((board == 0).sum()),
        "min": float(board[finite].min()) if finite.any() else None,
        "max": float(board[finite].max()) if finite.any() else None,
        "sum_squares": float((board[finite].astype(np.float64) ** 2).sum()), "kept": None,
        "reference": {"min": float(fp32.min()), "max": float(fp32.max()), "sum_squares": float((r**2).sum()),
                      "noise": float(((x - r) ** 2).sum()), "dot": float((x * r).sum()),
                      "max_abs_error": float(np.abs(x - r).max()) if both.any() else None, "pairs": int(both.sum())},
    }  # fmt: skip


def write(path: Path, tensors: list[dict[str, Any]], **extra: Any) -> Path:
    path.write_text(json.dumps({"schema": 1, "outputs": len(tensors), "tensors": tensors, **extra}))
    return path


@pytest.fixture
def chain(tmp_path: Path) -> tuple[Path, NumericsProgram, list[np.ndarray], list[np.ndarray]]:
    """Three operators in a chain: the first nearly exact, the second adds a large error, the third adds little."""
    rng = np.random.default_rng(0)
    fp32 = [rng.standard_normal((2, 8)).astype(np.float32) for _ in range(4)]
    board = [
        fp32[0],
        fp32[1] + np.float32(1e-6) * rng.standard_normal((2, 8)).astype(np.float32),
        fp32[2] + np.float32(0.3) * rng.standard_normal((2, 8)).astype(np.float32),
        fp32[3] + np.float32(0.31) * rng.standard_normal((2, 8)).astype(np.float32),
    ]
    tensors = [stats(i, b, r) for i, (b, r) in enumerate(zip(board, fp32, strict=True))]
    path = write(tmp_path / "numerics.json", tensors)
    return path, record([(2, 8)] * 3, [(), (0,), (1,)]), board, fp32


def test_errors_per_operator_are_numpys(chain: tuple) -> None:
    path, program, board, fp32 = chain
    numerics = numerics_of(read_numerics_file(path), program, "numerics.json")
    expected = [
        10 * math.log10(float((r.astype(np.float64) ** 2).sum() / ((b - r).astype(np.float64) ** 2).sum()))
        for b, r in zip(board[1:], fp32[1:], strict=False)
    ]
    assert [row.sqnr_db for row in numerics.operators] == pytest.approx(expected, abs=0.01)
    assert numerics.output_sqnr_db == (EXACT_DB,)  # the model's own output: identical here
    introduced = [row.introduced_db for row in numerics.operators]
    assert expected[0] > ROUNDING_DB and introduced[0] == EXACT_DB  # fp32's rounding adds nothing
    assert introduced[1] == pytest.approx(expected[1], abs=0.01)  # its inputs exact: all its error is its own
    added = 10 ** (-expected[2] / 10) - 10 ** (-expected[1] / 10)
    assert introduced[2] == pytest.approx(-10 * math.log10(added), abs=0.01)
    assert numerics.operators[2].introduced_share == pytest.approx(added / 10 ** (-expected[2] / 10), abs=1e-3)
    assert numerics.losing_most(1)[0].tap.node == "op_1"
    cosine = float((board[2] * fp32[2]).sum() / math.sqrt((board[2] ** 2).sum() * (fp32[2] ** 2).sum()))
    assert numerics.operators[1].cosine == pytest.approx(cosine, abs=1e-5)
    assert numerics.collapse is None and numerics.nonfinite is None


def test_a_collapse_and_nan_are_findings_not_failures(tmp_path: Path) -> None:
    fp32 = [np.ones((4,), np.float32), np.full((4,), 2.0, np.float32), np.full((4,), 3.0, np.float32)]
    board = [fp32[0], np.zeros((4,), np.float32), np.array([1.0, np.nan, np.inf, 3.0], np.float32)]
    tensors = [stats(i, b, r) for i, (b, r) in enumerate(zip(board, fp32, strict=True))]
    path = write(tmp_path / "numerics.json", tensors)
    numerics = numerics_of(read_numerics_file(path), record([(4,), (4,)], [(), (0,)]), "numerics.json")
    assert numerics.collapse is not None and numerics.collapse.tap.node == "op_0"
    assert numerics.nonfinite is not None and (numerics.nonfinite.nan, numerics.nonfinite.inf) == (1, 1)
    assert numerics.operators[1].sqnr_db == -EXACT_DB


def test_sqnr_edges() -> None:
    assert sqnr_db(1.0, 0.0) == EXACT_DB
    assert sqnr_db(0.0, 1.0) == -EXACT_DB
    assert sqnr_db(100.0, 1.0) == pytest.approx(20.0)


def _hostile(data: dict[str, Any]) -> list[tuple[str, Any]]:
    """Each way a board could garble the file: (what, the mangled document)."""
    tensors = data["tensors"]

    def second(**change: Any) -> dict[str, Any]:
        return {**data, "tensors": [tensors[0], {**tensors[1], **change}, *tensors[2:]]}

    cases: list[tuple[str, Any]] = [
        ("one tensor short", {**data, "tensors": tensors[:-1], "outputs": len(tensors) - 1}),
        ("indices swapped", {**data, "tensors": [tensors[1], tensors[0], *tensors[2:]]}),
        ("a shape that is not the program's", second(dims=[4, 4])),
        ("no reference for a tap", second(reference=None)),
        ("a negative count", second(nan=-1)),
        ("a string for a number", second(sum_squares="big")),
        ("another schema", {**data, "schema": 7}),
        ("not an object", [1, 2, 3]),
    ]
    return cases


def test_hostile_files_are_refused_by_field(chain: tuple, tmp_path: Path) -> None:
    path, program, _, _ = chain
    data = json.loads(path.read_text())
    for what, mangled in _hostile(data):
        bad = tmp_path / "bad.json"
        bad.write_text(json.dumps(mangled))
        with pytest.raises(AnalysisError) as caught:
            numerics_of(read_numerics_file(bad), program, str(bad))
        assert caught.value.exit_code == ExitCode.DATA, what
        assert "bad.json" in str(caught.value), (what, str(caught.value))
    nan_literal = tmp_path / "nan.json"
    nan_literal.write_text(path.read_text().replace('"noise": ', '"noise": NaN, "x": ', 1))
    with pytest.raises(AnalysisError):
        read_numerics_file(nan_literal)
    huge = tmp_path / "huge.json"
    with open(huge, "wb") as handle:
        handle.truncate(MAX_NUMERICS_BYTES + 1)
    with pytest.raises(AnalysisError, match="larger than"):
        read_numerics_file(huge)
