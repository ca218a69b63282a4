"""Run ids: unique, and sorted by the time they were made, to the millisecond (`--latest` relies on it)."""

from __future__ import annotations

import re
import time

from orchestrator.results.store import new_run_id

RUN_ID = re.compile(r"\d{8}T\d{6}Z-[0-9a-f]{6}")


def test_run_ids_made_within_one_second_sort_by_time() -> None:
    made = []
    for _ in range(30):
        made.append(new_run_id())
        time.sleep(0.002)  # at least 2 ms apart, whatever the load: a different millisecond each time
    assert made == sorted(made) and len(set(made)) == len(made), made
    assert all(RUN_ID.fullmatch(run_id) for run_id in made), made
