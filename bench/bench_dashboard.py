"""The dashboard on a large history: the overview and a trend page of a 10,000-run history, and what the
cell-night index is worth.

    python bench/bench_dashboard.py                        # 100 cells x 100 nights = 10,000 runs
    python bench/bench_dashboard.py --cells 50 --nights 40 # a quick check

The history is a SQLite file in a temporary folder, filled through the history's own tables (bulk inserts: the
nightly's one-transaction-per-run write would take minutes here and is not what is measured), 20 samples per run.
Each figure is the median of `--repeat` page renders (data assembled from the history, then the HTML), each with
a freshly opened history, as every page load of the server reads afresh. Target: the overview < 1 s.
"""

from __future__ import annotations

import argparse
import datetime as dt
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from sqlalchemy import create_engine

PROJECT_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(PROJECT_ROOT))

from orchestrator.lab.history import CELL_NIGHTS, History, runs, samples  # noqa: E402
from orchestrator.lab.run_record import versions_key  # noqa: E402
from orchestrator.servers.dashboard import data, pages  # noqa: E402

VERDICTS = ("ok", "ok", "ok", "drift", "ok", "unconfirmed", "ok", "regression", "inconclusive", "improvement")


def fill(url: str, cells: int, nights: int) -> list[tuple[str, str, str]]:
    history = History(url)
    grid = [(f"pi5-{c % 10:02d}", f"model-{c // 10 % 10}", ("xnnpack", "portable")[c // 100 % 2]) for c in range(cells)]
    created = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)
    rows, sample_rows, row_id = [], [], 0
    for night in range(nights):
        date = (dt.date(2026, 1, 1) + dt.timedelta(days=night)).isoformat()
        for number, (board, model, backend) in enumerate(grid):
            row_id += 1
            median = 10.0 + number % 7 + 0.01 * night
            rows.append({
                "id": row_id, "run_id": f"{date}-{number}", "night": date, "board": board, "model": model,
                "backend": backend, "status": "ok", "validity": "valid", "reasons": [], "versions": {},
                "versions_key": versions_key({}), "pte_sha256": "a" * 64, "median_ms": median, "p90_ms": median * 1.1,
                "mean_ms": median, "cv": 0.02, "conditions": {"governor_after": "performance",
                "temperature_c_after": 50.0}, "created_at": created, "environment": {},
                "verdict": VERDICTS[(night + number) % len(VERDICTS)], "verdict_info": {"detail": ""},
                "peak_rss_bytes": 100_000_000, "planned_bytes": 50_000_000,
            })  # fmt: skip
            sample_rows += [{"run": row_id, "iteration": i, "latency_ms": median} for i in range(20)]
    with history.engine.begin() as connection:
        connection.execute(runs.insert(), rows)
        connection.execute(samples.insert(), sample_rows)
    history.close()
    return grid


def timed(render: Callable[[], None], repeat: int) -> float:
    durations = []
    for _ in range(repeat):
        started = time.perf_counter()
        render()
        durations.append(time.perf_counter() - started)
    return statistics.median(durations)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cells", type=int, default=100)
    parser.add_argument("--nights", type=int, default=100)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="etlab-bench-dashboard-") as folder:
        url = f"sqlite:///{Path(folder) / 'history.sqlite'}"
        started = time.perf_counter()
        grid = fill(url, args.cells, args.nights)
        print(f"history: {args.cells * args.nights} runs ({args.cells} cells x {args.nights} nights), "
              f"written in {time.perf_counter() - started:.1f} s")  # fmt: skip
        links = pages.Links()

        def overview() -> None:
            history = History(url)
            pages.render_page("overview", data.overview(data.Lab(None, history)), links)
            history.close()

        def trend() -> None:
            history = History(url)
            pages.render_page("trend", data.trend(data.Lab(None, history), grid[-1]), links)
            history.close()

        first = timed(overview, 1)  # the templates compiled too, as on a server's first page
        figures = {"overview": timed(overview, args.repeat), "trend": timed(trend, args.repeat)}
        history = History(url)
        CELL_NIGHTS.drop(history.engine)
        history.close()
        engine = create_engine(url)  # not History(): it puts the index back when it opens
        with engine.connect() as connection:
            started = time.perf_counter()
            for _ in range(args.repeat):
                list(connection.execute(runs.select().where(
                    (runs.c.board == grid[-1][0]) & (runs.c.model == grid[-1][1]) & (runs.c.backend == grid[-1][2])
                ).order_by(runs.c.night.desc())))  # fmt: skip
            without = (time.perf_counter() - started) / args.repeat
            CELL_NIGHTS.create(connection)
            connection.commit()
            started = time.perf_counter()
            for _ in range(args.repeat):
                list(connection.execute(runs.select().where(
                    (runs.c.board == grid[-1][0]) & (runs.c.model == grid[-1][1]) & (runs.c.backend == grid[-1][2])
                ).order_by(runs.c.night.desc())))  # fmt: skip
            with_index = (time.perf_counter() - started) / args.repeat
        engine.dispose()
    print(f"overview page (boards + the latest night's {args.cells} cells): {figures['overview'] * 1000:.0f} ms "
          f"(target < 1000 ms: {'ok' if max(first, figures['overview']) < 1 else 'MISSED'}); the first one "
          f"{first * 1000:.0f} ms")  # fmt: skip
    print(f"trend page of one cell ({args.nights} nights): {figures['trend'] * 1000:.0f} ms")
    print(f"a cell's nights: {without * 1000:.1f} ms without the cell-night index, {with_index * 1000:.1f} ms with it")


if __name__ == "__main__":
    main()
