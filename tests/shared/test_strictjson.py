"""The strict JSON reader every file etlab reads back goes through, and the strict writer (orchestrator/strictjson.py).

Hostile documents as a board or an edited file would send them: nesting bombs, 400-digit integers, NaN and
Infinity, oversized files. Each is refused as JsonDataError (exit 65) naming the file and the field; hypothesis
checks that nothing else ever escapes the reader and that what etlab writes reads back unchanged.
"""

from __future__ import annotations

import contextlib
import json
import math
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from orchestrator import strictjson
from orchestrator.errors import ExitCode
from orchestrator.fsutil import atomic_write_json, read_json
from orchestrator.strictjson import JsonDataError


def refused(text: str | bytes, **kwargs: object) -> JsonDataError:
    with pytest.raises(JsonDataError) as caught:
        strictjson.loads(text, where="board/timings.json", **kwargs)  # type: ignore[arg-type]
    assert caught.value.exit_code == ExitCode.DATA
    assert str(caught.value).startswith("board/timings.json: ")
    return caught.value


@pytest.mark.parametrize("depth", [65, 1_000, 100_000])
def test_a_nesting_bomb_is_refused_without_recursing(depth: int) -> None:
    error = refused("[" * depth + "]" * depth)
    assert "nested more than 64 levels" in error.problem
    error = refused('{"a":' * depth + "1" + "}" * depth)
    assert "nested more than 64 levels" in error.problem


def test_brackets_inside_strings_are_not_nesting() -> None:
    text = json.dumps({"name": "[" * 500 + "{" * 500, "quoted": '\\"[[[['})
    assert strictjson.loads(text, where="x") == json.loads(text)


def test_nesting_up_to_the_limit_reads() -> None:
    assert strictjson.loads("[" * 64 + "]" * 64, where="x") is not None


@pytest.mark.parametrize(
    ("text", "field", "shown"),
    [
        ('{"peak_rss_bytes": ' + "9" * 400 + "}", "peak_rss_bytes", "a number of 400 characters"),
        ('{"generation": {"prompt_len": -' + "1" * 400 + "}}", "generation.prompt_len", "a number of 401 characters"),
        ('{"warmup_ms": [1.0, 2.0, 1e400]}', "warmup_ms[2]", "1e400"),
        ('{"saving_ms": 9223372036854775808}', "saving_ms", "9223372036854775808"),
        ('{"instructions": [{"samples": [1, NaN]}]}', "instructions[0].samples[1]", "NaN"),
        ('{"a": {"b": Infinity}}', "a.b", "Infinity"),
        ('{"a": -Infinity}', "a", "-Infinity"),
        ('{"a": 1E+19}', "a", "1E+19"),
    ],
)
def test_numbers_out_of_range_are_refused_by_field(text: str, field: str, shown: str) -> None:
    error = refused(text)
    assert error.field == field
    assert error.problem.startswith(f"{shown} is out of range")
    assert f": {field}: " in str(error)


def test_the_largest_numbers_in_range_read() -> None:
    text = '{"a": 9223372036854775807, "b": -9223372036854775807, "c": 1e18, "d": 1e-300, "e": 0.1}'
    assert strictjson.loads(text, where="x") == json.loads(text)


def test_a_field_may_allow_non_finite_numbers() -> None:
    text = '{"check": {"max_rel_error": Infinity, "x": 1}}'
    document = strictjson.loads(text, where="x", nonfinite={"max_rel_error"})
    assert document == {"check": {"max_rel_error": math.inf, "x": 1}}
    nan = strictjson.loads('{"max_rel_error": [NaN]}', where="x", nonfinite={"max_rel_error"})["max_rel_error"][0]
    assert math.isnan(nan)
    assert refused('{"other": NaN}', nonfinite={"max_rel_error"}).field == "other"
    assert refused('{"max_rel_error": 1e400}', nonfinite={"max_rel_error"}).field == "max_rel_error"


@pytest.mark.parametrize(("text", "problem"), [("{", "not valid JSON"), (b"\xff\xfe", "not UTF-8"), ("NaN", "NaN is")])
def test_malformed_documents_are_refused(text: str | bytes, problem: str) -> None:
    assert refused(text).problem.startswith(problem)


def test_read_caps_the_size_and_names_the_path(tmp_path: Path) -> None:
    path = tmp_path / "ops.json"
    path.write_text(json.dumps({"x": "y" * 2000}))
    with pytest.raises(JsonDataError, match=r"ops\.json: larger than 1,000 bytes"):
        strictjson.read(path, max_bytes=1000)
    assert strictjson.read(path, max_bytes=10_000) == {"x": "y" * 2000}
    path.write_text('{"generation": {"ttft_ms": NaN}}')
    with pytest.raises(JsonDataError, match=rf"{path}: generation.ttft_ms: NaN is out of range"):
        read_json(path)


def test_etlab_writes_strict_json(tmp_path: Path) -> None:
    path = tmp_path / "summary.json"
    atomic_write_json(path, {"a": math.nan, "b": [math.inf, 1.5], "c": (-math.inf,)})
    assert "NaN" not in path.read_text() and "Infinity" not in path.read_text()
    assert read_json(path) == {"a": None, "b": [None, 1.5], "c": [None]}
    assert strictjson.dumps({"a": math.nan}) == '{"a": null}'


_finite = st.floats(allow_nan=False, allow_infinity=False, min_value=-1e18, max_value=1e18)
_int = st.integers(min_value=-(2**63) + 1, max_value=2**63 - 1)
_documents = st.recursive(
    st.none() | st.booleans() | _int | _finite | st.text(),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=30,
)


@given(_documents)
def test_what_etlab_writes_reads_back_unchanged(document: object) -> None:
    for text in (strictjson.dumps(document), strictjson.dumps(document, indent=2)):
        assert strictjson.loads(text, where="x") == document


@given(st.one_of(st.text(max_size=300), st.binary(max_size=300)))
def test_anything_else_is_a_value_or_a_json_data_error(text: str | bytes) -> None:
    with contextlib.suppress(JsonDataError):  # anything else escaping fails the test
        strictjson.loads(text, where="x")


@given(_documents, st.sampled_from(["NaN", "Infinity", "-Infinity", "1e999", "-" + "7" * 30]))
def test_one_odd_number_anywhere_is_found(document: object, odd: str) -> None:
    text = json.dumps([document, {"odd": json.loads("0")}]).replace('"odd": 0', f'"odd": {odd}')
    error = refused(text)
    assert error.field is not None and error.field.endswith(".odd")
