"""orchestrator/records.py: the one way records are written and read back (typed, ranged, versioned)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

import pytest

from orchestrator.errors import ExitCode
from orchestrator.records import (
    Count,
    Document,
    RecordError,
    Share,
    complete,
    from_data,
    read_document,
    to_data,
    write_document,
)


@dataclass(frozen=True)
class Reason:
    level: Literal["degraded", "invalid"]
    reason: str


@dataclass(frozen=True)
class Verdict(Document):
    SCHEMA: ClassVar[int] = 2
    UPGRADES: ClassVar[dict[int, Callable[[dict[str, Any]], dict[str, Any]]]] = {
        1: lambda old: {**{k: v for k, v in old.items() if k != "state"}, "status": old.get("state")}
    }

    status: str
    reasons: tuple[Reason, ...] = ()
    runs: Count | None = None
    agreement: Share | None = None


def test_a_document_round_trips_with_its_version_first() -> None:
    verdict = Verdict("degraded", (Reason("degraded", "few runs"),), runs=3, agreement=0.5)
    data = write_document(verdict)
    assert next(iter(data)) == "schema" and data["schema"] == 2
    assert read_document(data, Verdict, where="v.json") == verdict


def test_an_older_document_is_upgraded_and_a_newer_one_refused() -> None:
    assert read_document({"state": "valid"}, Verdict, where="v.json") == Verdict("valid")
    with pytest.raises(RecordError, match=r"v\.json: schema: version 3 was written by a newer etlab"):
        read_document({"schema": 3, "status": "valid"}, Verdict, where="v.json")


def test_unknown_fields_are_ignored() -> None:
    assert (
        read_document({"schema": 2, "status": "valid", "added_later": [1]}, Verdict, where="v.json").status == "valid"
    )


@pytest.mark.parametrize(
    ("data", "field", "problem"),
    [
        ({"status": "valid", "runs": -1}, "runs", ">= 0"),
        ({"status": "valid", "runs": True}, "runs", "bool"),
        ({"status": "valid", "runs": 2.5}, "runs", "float"),
        ({"status": "valid", "agreement": 1.5}, "agreement", "<= 1"),
        ({"status": "valid", "reasons": [{"level": "fine", "reason": "x"}]}, "reasons[0].level", "'fine'"),
        ({"status": "valid", "reasons": [{"level": "invalid"}]}, "reasons[0].reason", "is missing"),
        ({"runs": 1}, "status", "is missing"),
        ({"status": 7}, "status", "str"),
        ({"schema": "2", "status": "valid"}, "schema", "version number"),
    ],
)
def test_a_bad_field_is_named_with_its_file_and_exits_65(data: dict[str, Any], field: str, problem: str) -> None:
    with pytest.raises(RecordError) as caught:
        read_document({"schema": 2, **data}, Verdict, where="v.json")
    assert caught.value.field == field and problem in caught.value.problem
    assert str(caught.value).startswith(f"v.json: {field}: ")
    assert caught.value.exit_code == ExitCode.DATA


def test_a_record_inside_a_file_is_named_by_its_path_there() -> None:
    with pytest.raises(RecordError) as caught:
        from_data([{"level": "x", "reason": "r"}], list[Reason], where="s.json", field="validity.reasons")
    assert caught.value.field == "validity.reasons[0].level"
    assert to_data([Reason("invalid", "r")]) == [{"level": "invalid", "reason": "r"}]


def test_a_tuple_field_is_written_as_a_list_equal_to_the_json_read_back() -> None:
    data = to_data({"v": Verdict("degraded", (Reason("degraded", "few runs"),))})
    assert data == {"v": {"status": "degraded", "reasons": [{"level": "degraded", "reason": "few runs"}], "runs": None,
                          "agreement": None}}  # fmt: skip
    assert isinstance(data["v"]["reasons"], list)


def test_a_record_read_without_its_defaults_writes_them_once_completed() -> None:
    read = from_data({"status": "valid", "reasons": [{"level": "invalid", "reason": "r"}]}, Verdict, where="v.json")
    assert read == Verdict("valid", (Reason("invalid", "r"),))
    assert to_data(complete(read)) == to_data(Verdict("valid", (Reason("invalid", "r"),)))
    assert to_data(complete(read))["runs"] is None


def test_a_lone_surrogate_is_a_record_error_not_a_crash() -> None:
    """JSON can spell "\\ud800"; msgspec raises UnicodeEncodeError on it where it wanted an object."""
    with pytest.raises(RecordError, match=r"s\.json: validity: holds a lone surrogate") as caught:
        from_data("a\ud800", Reason, where="s.json", field="validity")
    assert caught.value.exit_code == ExitCode.DATA


def test_a_numpy_number_in_a_record_is_written_as_the_python_number() -> None:
    import numpy as np

    data = to_data(Verdict("valid", runs=np.int64(3), agreement=np.float64(0.25)))
    assert data["runs"] == 3 and type(data["runs"]) is int and type(data["agreement"]) is float
    with pytest.raises(TypeError):
        to_data(Verdict("valid", runs=object()))  # type: ignore[arg-type]
