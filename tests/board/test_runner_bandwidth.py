"""The board's memory read bandwidth (issue 55): the native runner's `--probe-bandwidth`, read by the workstation
(boards/limits.py) as untrusted board data. Real probe runs here; hostile answers refused (65) naming the field.
Its figure against an independent tool is bench/bench_bandwidth.py's, not a test's: timings are not asserted."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from orchestrator.boards.limits import (
    MAX_BYTES_PER_S,
    current,
    read_probe,
    recorded_bandwidth,
    state_value,
)
from orchestrator.errors import BoardDataError, ExitCode
from orchestrator.records import RecordError
from tests.board.test_runner import error_line, run_runner

RUNNER_SOURCE = "a" * 64
MIB = 1 << 20


def probe(binary: Path, *args: str | int) -> dict[str, Any]:
    completed = run_runner(binary, "--probe-bandwidth", *args)
    assert completed.returncode == 0, completed.stderr
    answer: dict[str, Any] = json.loads(completed.stdout)
    return answer


@pytest.mark.parametrize("threads", [1, 2])
def test_the_probe_reads_the_buffer_it_was_given_on_every_thread(runner_binary: Path, threads: int) -> None:
    answer = probe(runner_binary, "--threads", threads, "--probe-bytes", 64 * MIB + 5, "--probe-rounds", 3)
    # equal slices of whole 8-byte words: the buffer read is the one asked for, rounded down to them
    assert answer["threads"] == threads and answer["buffer_bytes"] == (64 * MIB // 8 // threads) * threads * 8
    assert answer["rounds"] == 3 == len(answer["round_seconds"]) and all(s > 0 for s in answer["round_seconds"])
    best, median = answer["best_bytes_per_s"], answer["median_bytes_per_s"]
    # the seconds are printed to the microsecond
    assert best == pytest.approx(answer["buffer_bytes"] / min(answer["round_seconds"]), rel=1e-3)
    assert 0 < median <= best < MAX_BYTES_PER_S
    read = read_probe(json.dumps(answer), "local", RUNNER_SOURCE)
    assert read.bytes_per_s == best and read.threads == threads and read.runner_source_sha256 == RUNNER_SOURCE
    # kept in the board's state as text, and read back the same
    state = {"limits": state_value(read)}
    assert recorded_bandwidth(state, "state.json") == read
    assert current(state, RUNNER_SOURCE) and not current(state, "b" * 64) and not current({}, RUNNER_SOURCE)


def test_the_default_buffer_is_far_larger_than_the_last_level_cache(runner_binary: Path) -> None:
    answer = probe(runner_binary, "--threads", 1, "--probe-rounds", 1)
    assert answer["buffer_bytes"] >= min(4 * answer["llc_bytes"], 1024 * MIB) and answer["buffer_bytes"] >= 16 * MIB


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--probe-bytes", "1024"], "--probe-bytes needs --probe-bandwidth"),
        (["--probe-bandwidth", "--probe-rounds", "0"], "--probe-rounds needs an integer >= 1"),
        (["--probe-bandwidth", "--probe-bytes", "-5"], "--probe-bytes needs a number of bytes"),
        (["--probe-bandwidth", "--threads", "4", "--probe-bytes", "8"], "smaller than one word per thread"),
    ],
)
def test_bad_probe_options_are_refused_in_one_line(runner_binary: Path, args: list[str], words: str) -> None:
    completed = run_runner(runner_binary, *args)
    assert completed.returncode == 2
    assert words in error_line(completed)


GOOD = {
    "probe": "read_bandwidth", "threads": 2, "buffer_bytes": 268435456, "llc_bytes": 2097152, "rounds": 2,
    "round_seconds": [0.05, 0.04], "best_bytes_per_s": 6.7e9, "median_bytes_per_s": 6.0e9, "checksum": 12,
}  # fmt: skip


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"best_bytes_per_s": -1.0}, "best_bytes_per_s"),  # negative
        ({"best_bytes_per_s": None}, "best_bytes_per_s"),  # NaN, as the runner writes a non-finite number
        ({"best_bytes_per_s": 2e12}, "best_bytes_per_s"),  # absurd: above 1 TB/s
        ({"median_bytes_per_s": 0.0}, "median_bytes_per_s"),
        ({"threads": 0}, "threads"),
        ({"round_seconds": [0.05, "fast"]}, "round_seconds"),
        ({"rounds": 3}, "read-bandwidth"),  # three rounds said, two timed
        ({"probe": "write_bandwidth"}, "read-bandwidth"),
        ({"median_bytes_per_s": 9e9}, "median_bytes_per_s is above"),
        ({"checksum": "x"}, "checksum"),
    ],
)
def test_a_hostile_probe_answer_is_refused_naming_the_field(change: dict[str, Any], field: str) -> None:
    answer = {**GOOD, **change}
    with pytest.raises(BoardDataError) as refused:
        read_probe(json.dumps(answer), "pi5-lab", RUNNER_SOURCE)
    assert refused.value.exit_code == ExitCode.DATA == 65
    assert "pi5-lab" in str(refused.value) and field in str(refused.value)


@pytest.mark.parametrize("text", ["", "{", "NaN", '{"probe": "read_bandwidth"}', "[1, 2]", '{"best_bytes_per_s": NaN}'])
def test_a_malformed_probe_answer_is_refused(text: str) -> None:
    with pytest.raises(BoardDataError) as refused:
        read_probe(text, "pi5-lab", RUNNER_SOURCE)
    assert refused.value.exit_code == 65


def test_a_malformed_recorded_bandwidth_is_refused_by_field() -> None:
    read = read_probe(json.dumps(GOOD), "pi5-lab", RUNNER_SOURCE)
    assert math.isclose(read.gb_per_s, 6.7)
    for state in ({"limits": 5}, {"limits": "{"}, {"limits": state_value(read).replace("6700000000", "-1")}):
        with pytest.raises(RecordError) as refused:
            recorded_bandwidth(state, "board_info_before.json")
        assert refused.value.exit_code == 65 and "limits" in str(refused.value)
        assert not current(state, RUNNER_SOURCE)
