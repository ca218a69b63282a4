"""The history's JSON columns (conditions, reasons, verdict_info, generation: board values among them) are strict JSON
both ways (issue 34.4): NaN and Infinity are stored as null, so a dashboard's page data built from them always
parses, and a row an older etlab wrote with NaN or a 400-digit integer is refused on reading as JsonDataError
(exit 65) naming the history and the field, never a crash later. The rest of the store: test_history.py."""

from __future__ import annotations

import math
import sqlite3
from pathlib import Path

import pytest

from orchestrator.errors import ExitCode
from orchestrator.lab.history import History
from orchestrator.lab.run_record import RunRecord
from orchestrator.strictjson import JsonDataError


def test_json_columns_are_strict_json_both_ways(tmp_path: Path) -> None:
    path = tmp_path / "history.sqlite"
    history = History(f"sqlite:///{path}")
    try:
        history.record(
            RunRecord(
                run_id="r1", night="2026-11-01", board="pi", model="tiny", backend="xnnpack", status="ok",
                validity="valid", conditions={"temperature_c_after": math.nan}, verdict_info={"ratio": math.inf},
            )
        )  # fmt: skip
        with sqlite3.connect(path) as connection:
            stored = connection.execute("SELECT conditions, verdict_info FROM runs").fetchone()
        assert stored == ('{"temperature_c_after": null}', '{"ratio": null}')
        (record,) = history.records()
        assert record.conditions == {"temperature_c_after": None} and record.verdict_info == {"ratio": None}

        for written_by_an_older_etlab, field in (
            ('{"temperature_c_after": NaN}', "temperature_c_after: NaN is out of range"),
            ('{"cores_online": ' + "9" * 400 + "}", "cores_online: a number of 400 characters is out of range"),
        ):
            with sqlite3.connect(path) as connection:
                connection.execute("UPDATE runs SET conditions = ?", (written_by_an_older_etlab,))
            with pytest.raises(JsonDataError, match=f"the history {path}: {field}") as caught:
                history.records()
            assert caught.value.exit_code == ExitCode.DATA
    finally:
        history.close()
