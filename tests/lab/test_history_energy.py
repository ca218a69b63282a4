"""Energy and a language model's decode roofline in the nightly history (issue 55): summary.json's `energy` stored
per run (record_from_cell fills it), read back typed through the one record reader (a history row, a pending file),
refused when a row is not an energy record, an older history without the column opening with energy None; and the
report's trend drawing energy (J per inference, a language model's mJ per token) and the roofline share per night,
a night that did not measure them a gap, never 0. The rest of the store: test_history.py; the dashboard's trend
page: tests/servers/test_dashboard_server.py."""

from __future__ import annotations

import json
import math
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from orchestrator.deploy.cells import CellOutcome
from orchestrator.lab.board_night import record_from_cell
from orchestrator.lab.history import History
from orchestrator.lab.report import trend_figure, trend_png
from orchestrator.lab.run_record import RunRecord, read_run_record
from orchestrator.lowering.variants import Variant
from orchestrator.records import to_data
from orchestrator.results.summary import DecodeRoofline, EnergySummary, Generation, read_summary
from orchestrator.strictjson import JsonDataError

SUMMARY = Path(__file__).parents[1] / "data" / "advice" / "smollm2-gen-tiny.sdpa" / "summary.json"
MEASURED = EnergySummary(status="measured", source="vcgencmd pmic_read_adc", samples=40, mean_watts=6.5,
                         joules_per_inference=0.13, joules_per_token=0.0125)  # fmt: skip
NOT_MEASURED = EnergySummary(status="not measured", why="no PMIC on this board (a Raspberry Pi 4)")


def roofline(share: float | None) -> DecodeRoofline:
    return DecodeRoofline(weights_bytes=9_000_000, kv_bytes_per_token=65_536, bytes_per_token=9_065_536,
                          achieved_gb_per_s=4.5, bandwidth_gb_per_s=None if share is None else 4.5 / share,
                          bandwidth_threads=4, share=share,
                          note="the board's read bandwidth is not measured" if share is None else None)  # fmt: skip


def generation(share: float | None = 0.62) -> Generation:
    return Generation(prompt_len=8, new_tokens=8, context=64, generations=3, ttft_ms=2.5,
                      prefill_tokens_per_s=3200.0, decode_tokens_per_s=500.0, roofline=roofline(share))  # fmt: skip


def record(run_id: str, night: str, model: str = "distilbert", **changes: Any) -> RunRecord:
    values: dict[str, Any] = {
        "run_id": run_id, "night": night, "board": "pi5-a", "model": model, "backend": "xnnpack", "status": "ok",
        "validity": "valid", "median_ms": 20.0, "latencies_ms": [20.0, 19.5, 21.0], "peak_rss_bytes": 80_000_000,
    }  # fmt: skip
    values.update(changes)
    return RunRecord(**values)


@pytest.fixture
def history(tmp_path: Path) -> Any:
    store = History(f"sqlite:///{tmp_path / 'history.sqlite'}")
    yield store
    store.close()


def test_energy_and_the_roofline_share_round_trip_typed(history: History) -> None:
    history.record(record("lm", "2026-11-01", model="smollm2", energy=MEASURED, generation=generation(0.62)))
    history.record(record("pi4", "2026-11-01", board="pi4-a", energy=NOT_MEASURED))
    history.record(record("old", "2026-11-01", board="pi3-a"))  # a bundle from before energy was recorded
    for read in (history.runs(night="2026-11-01"), history.records(night="2026-11-01")):
        by_id = {r.run_id: r for r in read}
        assert by_id["lm"].energy == MEASURED
        assert by_id["lm"].generation is not None and by_id["lm"].generation.roofline == roofline(0.62)
        assert (by_id["lm"].mj_per_token, by_id["lm"].joules_per_inference, by_id["lm"].roofline_share) == (
            12.5, 0.13, 0.62
        )  # fmt: skip
        assert by_id["pi4"].energy == NOT_MEASURED and by_id["pi4"].joules_per_inference is None
        assert by_id["old"].energy is None and by_id["old"].joules_per_inference is None
    # a pending file and a worker's reply hold to_data(record): the same record back through the one reader
    lm = record("lm", "2026-11-01", model="smollm2", energy=MEASURED, generation=generation(0.62))
    assert read_run_record(json.loads(json.dumps(to_data(lm))), "pending") == lm


def test_record_from_cell_keeps_the_summary_s_energy_and_roofline() -> None:
    data = json.loads(SUMMARY.read_text())
    data["energy"] = to_data(MEASURED)
    data["generation"]["roofline"] = to_data(roofline(0.62))
    summary = read_summary(data)
    cell = CellOutcome(board="pi5-a", model="smollm2-gen-tiny.sdpa", variant=Variant("xnnpack"), ok=True,
                       run_id="r1", summary=summary)  # fmt: skip
    made = record_from_cell(cell, "2026-11-01", {"torch": "2.13.0"}, threads=4)
    assert made.energy == MEASURED
    assert made.generation is not None and made.generation.roofline == roofline(0.62)


@pytest.mark.parametrize(
    ("energy", "problem"),
    [
        ({"status": "measured", "mean_watts": -1.0}, "energy.mean_watts"),
        ({"status": "guessed"}, "energy.status"),
        ([6.5], "energy"),
    ],
)
def test_a_row_s_energy_that_is_no_energy_record_is_refused(tmp_path: Path, energy: Any, problem: str) -> None:
    path = tmp_path / "history.sqlite"
    store = History(f"sqlite:///{path}")
    try:
        store.record(record("r1", "2026-11-01", energy=MEASURED))
        with sqlite3.connect(path) as connection:
            connection.execute("UPDATE runs SET energy = ?", (json.dumps(energy),))
        with pytest.raises(JsonDataError, match=f"run r1: {problem}"):
            store.records()
    finally:
        store.close()
    with pytest.raises(JsonDataError, match=f"pending: {problem}"):
        read_run_record({**to_data(record("r1", "2026-11-01")), "energy": energy}, "pending")


def test_an_older_history_without_energy_gains_the_column(tmp_path: Path) -> None:
    path = tmp_path / "old.sqlite"
    old = History(f"sqlite:///{path}")
    old.record(record("before", "2026-10-01"))
    old.close()
    with sqlite3.connect(path) as connection:  # the schema before energy
        connection.execute("alter table runs drop column energy")
        assert "energy" not in {row[1] for row in connection.execute("pragma table_info(runs)")}
    store = History(f"sqlite:///{path}")
    try:
        (before,) = store.runs()
        assert before.run_id == "before" and before.energy is None and before.joules_per_inference is None
        store.record(record("after", "2026-10-02", energy=MEASURED))
        assert store.runs(night="2026-10-02")[0].energy == MEASURED
    finally:
        store.close()


def _panel(figure: Any, unit: str) -> tuple[list[str], list[float]]:
    (axis,) = [axis for axis in figure.axes if axis.get_ylabel() == unit]
    (line,) = axis.get_lines()
    assert axis.get_ylim()[0] == 0
    return [str(x) for x in line.get_xdata()], [float(y) for y in line.get_ydata()]


def _same(values: list[float], expected: list[float | None]) -> bool:
    """Equal, a None expected where the value is NaN: a gap in the line, never 0."""
    return len(values) == len(expected) and all(
        math.isnan(value) if want is None else math.isclose(value, want)
        for value, want in zip(values, expected, strict=True)
    )


def test_the_report_s_trend_draws_energy_with_gaps_for_nights_not_measured() -> None:
    import matplotlib.pyplot as plt

    nights = ["2026-11-01", "2026-11-02", "2026-11-03", "2026-11-04"]
    energies = [MEASURED, NOT_MEASURED, None, EnergySummary(status="measured", mean_watts=6.0,
                                                             joules_per_inference=0.15)]  # fmt: skip
    records = [record(f"r{i}", night, energy=e) for i, (night, e) in enumerate(zip(nights, energies, strict=True))]
    figure = trend_figure(records[0].cell, records, nights[-1])
    try:
        assert [axis.get_ylabel() for axis in figure.axes] == ["latency (ms)", "peak MB", "J per inference"]
        xs, ys = _panel(figure, "J per inference")
        assert xs == nights and _same(ys, [0.13, None, None, 0.15]), ys
    finally:
        plt.close(figure)
    # no night measured: no energy panel (a board without the sensor draws what it drew before)
    figure = trend_figure(records[0].cell, [records[1], records[2]], nights[2])
    try:
        assert [axis.get_ylabel() for axis in figure.axes] == ["latency (ms)", "peak MB"]
    finally:
        plt.close(figure)
    assert trend_png(records[0].cell, records, nights[-1]).startswith(b"\x89PNG")


def test_a_language_model_s_trend_draws_mj_per_token_and_the_roofline_share() -> None:
    import matplotlib.pyplot as plt

    nights = ["2026-11-01", "2026-11-02", "2026-11-03"]
    records = [
        record("a", nights[0], model="smollm2", energy=MEASURED, generation=generation(0.62)),
        record("b", nights[1], model="smollm2", energy=NOT_MEASURED, generation=generation(None)),
        record("c", nights[2], model="smollm2", energy=MEASURED, generation=generation(0.64)),
    ]
    figure = trend_figure(records[0].cell, records, nights[-1])
    try:
        assert [axis.get_ylabel() for axis in figure.axes][2:] == ["mJ per token", "% of roofline"]
        assert _same(_panel(figure, "mJ per token")[1], [12.5, None, 12.5])
        assert _same(_panel(figure, "% of roofline")[1], [62.0, None, 64.0])
    finally:
        plt.close(figure)
