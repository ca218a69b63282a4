"""A small real lab for the dashboard tests: analysed runs of the tiny models under a results folder, and a nightly
history written through the real History API whose latest nights are those runs; the board-controlled strings
that must stay inert in every page."""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from orchestrator.advice.documents import write_advice
from orchestrator.advice.findings import Advice, Finding
from orchestrator.lab.history import History
from orchestrator.lab.run_record import RunRecord
from tests.plugins.analysis import BundleCase, analyze, copy_bundle, write_manifest

# Board-controlled text: a board name, a reason, a condition. Any of them run as markup would open a dialog.
EVIL = "<img src=x onerror=alert(1)></script><script>alert(2)</script>"
EVIL_BOARD = f"pi{EVIL}"
VERDICTS = ("new", "new", "ok", "ok", "drift", "ok", "unconfirmed", "regression", "inconclusive", "improvement")


def night(index: int) -> str:
    return (dt.date(2026, 11, 1) + dt.timedelta(days=index)).isoformat()


def write_history(
    path: Path,
    cells: list[tuple[str, str, str]],
    nights: int,
    *,
    run_ids: dict[tuple[tuple[str, str, str], int], str] | None = None,
    url: str | None = None,
) -> History:
    """`nights` nights of every cell: medians rising 0.5 ms a night, a new program from night 6 on, the verdicts of
    VERDICTS in turn (shifted by the cell's number), and board text (reasons, conditions) holding EVIL. `run_ids`
    names chosen runs (pulled ones); `url`: another history than the SQLite file `path`."""
    history = History(url or f"sqlite:///{path}")
    for index in range(nights):
        for number, cell in enumerate(cells):
            board, model, backend = cell
            median = 10.0 + number + 0.5 * index
            verdict = VERDICTS[(index + number) % len(VERDICTS)]
            record = RunRecord(
                run_id=(run_ids or {}).get((cell, index)) or f"{night(index)}-{number}-{backend}",
                night=night(index),
                board=board,
                model=model,
                backend=backend,
                status="ok",
                validity="degraded" if verdict == "inconclusive" else "valid",
                reasons=[f"reason {EVIL}"] if verdict == "inconclusive" else [],
                pte_sha256=("b" if index >= 6 else "a") * 64,
                median_ms=median,
                p90_ms=median * 1.2,
                mean_ms=median * 1.05,
                cv=0.02,
                conditions={"governor_after": f"performance{EVIL}", "temperature_c_after": 45.0 + index},
                latencies_ms=[median] * 3,
                peak_rss_bytes=int((100 + index) * 1e6),
                planned_bytes=int(50e6),
            )
            history.record(record)
            history.set_verdict(record.run_id, verdict, {"detail": f"detail {EVIL}"})
    return history


LAB_BOARD = "pi5-lab"
NIGHTS = 10
# Sorted by time, as real run ids are: the two distilbert runs are one cell's last two nights.
RUN_IDS = {
    "distilbert_a": "20261109T020000Z-000aaa",
    "distilbert_b": "20261110T020000Z-000bbb",
    "gpt2": "20261110T030000Z-000ccc",
}


@dataclass(frozen=True)
class DashboardLab:
    results: Path
    history_path: Path
    cells: list[tuple[str, str, str]]
    runs: dict[str, Path]  # RUN_IDS key -> bundle folder

    @property
    def history_url(self) -> str:
        return f"sqlite:///{self.history_path}"

    def history(self) -> History:
        return History(self.history_url)


def pulled_run(bundle: BundleCase, results: Path, run_id: str) -> Path:
    """`bundle` as a pulled run under results/<board>/<model>/<backend>/<run-id>/, its board's hostname holding
    board-controlled markup, analysed for real."""
    model = bundle.model
    folder = results / LAB_BOARD / model.sidecar.model / model.backend / run_id
    case = copy_bundle(bundle, folder)
    for name in ("run.json", "board_info_before.json", "board_info_after.json"):
        path = folder / name
        if path.is_file():
            document = json.loads(path.read_text())
            if name == "run.json":
                document.update(run_id=run_id, labels={**document["labels"], "board": LAB_BOARD})
            else:
                document["hostname"] = f"host{EVIL}"
            path.write_text(json.dumps(document))
    write_manifest(folder, run_id=run_id, model_sha256=model.sidecar.sha256)
    analyze(case)
    return folder


@pytest.fixture(scope="session")
def dashboard_lab(analysis_bundles: dict[str, BundleCase], tmp_path_factory: pytest.TempPathFactory) -> DashboardLab:
    root = tmp_path_factory.mktemp("dashboard-lab")
    results = root / "results"
    runs = {
        "distilbert_a": pulled_run(analysis_bundles["distilbert_xnnpack"], results, RUN_IDS["distilbert_a"]),
        "distilbert_b": pulled_run(analysis_bundles["distilbert_xnnpack"], results, RUN_IDS["distilbert_b"]),
        "gpt2": pulled_run(analysis_bundles["gpt2_xnnpack"], results, RUN_IDS["gpt2"]),
    }
    # The advisor's findings as `fab advise` writes them (analysis/advice.json), a title holding markup.
    finding = Finding(id="F1", kind="threads", title=f"use 4 threads {EVIL}", operators=(), nodes={}, calls=0,
                      measured_ms=2.0, share=0.5, cause="idle cores", saving_ms=1.25, fix_kind="option",
                      fix="--threads 4")  # fmt: skip
    write_advice(runs["distilbert_a"], Advice(RUN_IDS["distilbert_a"], "distilbert-tiny", "xnnpack", LAB_BOARD, 4.0,
                                              (finding,)))  # fmt: skip
    real = (LAB_BOARD, "distilbert-tiny", "xnnpack")
    evil = (EVIL_BOARD, "gpt2-tiny", "xnnpack")
    cells = [real, evil, ("pi4-lab", "distilbert-tiny", "portable")]
    named = {(real, NIGHTS - 2): RUN_IDS["distilbert_a"], (real, NIGHTS - 1): RUN_IDS["distilbert_b"]}
    named[(evil, NIGHTS - 1)] = RUN_IDS["gpt2"]
    write_history(root / "history.sqlite", cells, NIGHTS, run_ids=named).close()
    return DashboardLab(results, root / "history.sqlite", cells, runs)


@pytest.fixture
def lab_history(dashboard_lab: DashboardLab) -> Iterator[History]:
    history = dashboard_lab.history()
    try:
        yield history
    finally:
        history.close()
