"""`fab nightly` over several simulated nights, on a real local board (and a real sshd board that goes away). Its
verdicts on identical, busy, changed and slower nights: tests/lab/test_nightly_verdicts.py."""

from __future__ import annotations

import contextlib
import datetime as dt
import os
import signal
import sqlite3
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from orchestrator.boards.inventory import Board, load_inventory
from orchestrator.deploy.abtest import Interleaved, decide, iterations_for, sign_test
from orchestrator.errors import InventoryError
from orchestrator.lab.history import History
from orchestrator.lab.judging import confirm, judge
from orchestrator.lab.matrix import load_config
from orchestrator.lab.run_record import RunRecord
from orchestrator.paths import PROJECT_ROOT
from orchestrator.results.verdicts import Kind
from tests.plugins.artifacts import TEST_CACHE
from tests.plugins.boards import SHARED_BUILD, provision_board, write_inventory
from tests.plugins.processes import reaped

SPECS = PROJECT_ROOT / "tests" / "data" / "specs"


def nightly_section(tmp_path: Path, matrix: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    return {
        "history": f"sqlite:///{tmp_path / 'history.sqlite'}",
        "reports": str(tmp_path / "reports"),
        "iterations": 25,
        "warmup": 3,
        "cooldown_seconds": 2,  # a degraded cell's re-measure
        "retest_seconds": 20,  # the interleaved re-test's budget
        "retest_rounds": 6,
        "matrix": matrix,
        **extra,
    }


def fab_nightly(
    inventory: Path, night: str, tmp_path: Path, *, artifacts: Path | None = None
) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "ETLAB_ARTIFACTS": str(artifacts or TEST_CACHE / "artifacts"),
        "ETLAB_RESULTS": str(tmp_path / "results"),
    }
    return subprocess.run(
        [sys.executable, "-m", "fabric", "nightly", "--inventory", str(inventory), "--night", night],
        cwd=PROJECT_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=1200,
    )


def stored(tmp_path: Path, night: str | None = None) -> list[RunRecord]:
    history = History(f"sqlite:///{tmp_path / 'history.sqlite'}")
    try:
        return history.runs(night=night)
    finally:
        history.close()


@contextlib.contextmanager
def cpu_hog(workers: int = 2) -> Iterator[None]:
    """Busy-loop processes on every core for the block's duration: a board that is busy with something else."""
    hogs = [
        subprocess.Popen([sys.executable, "-c", "while True: pass"], start_new_session=True) for _ in range(workers)
    ]
    with contextlib.ExitStack() as stack:
        for hog in hogs:
            stack.enter_context(reaped(hog))
        yield


def verdict_of(tmp_path: Path, night: str) -> RunRecord:
    (record,) = stored(tmp_path, night)
    assert record.verdict, "every judged cell keeps its verdict"
    return record


def _record(
    night: str,
    latencies: list[float],
    *,
    validity: str = "valid",
    status: str = "ok",
    sha: str = "a" * 64,
    **extra: Any,
) -> RunRecord:
    return RunRecord(
        run_id=f"run-{night}-{validity}",
        night=night,
        board="b",
        model="m",
        backend="xnnpack",
        status=status,
        validity=validity,
        median_ms=sorted(latencies)[len(latencies) // 2],
        latencies_ms=latencies,
        versions={"torch": "1"},
        pte_sha256=sha,
        environment={"runtime": "1.0", "runner": "1", "board_image": "Debian 12"},
        **extra,
    )


NEW_SHA = "b" * 64


def test_invalid_runs_are_never_a_baseline(tmp_path: Path) -> None:
    history = History(f"sqlite:///{tmp_path / 'h.sqlite'}")
    try:
        base = [10.0 + 0.01 * i for i in range(20)]
        history.record(_record("2026-10-31", base))
        history.record(_record("2026-11-01", base))
        history.record(_record("2026-11-02", [x * 2 for x in base], validity="invalid"))  # throttled night
        history.record(
            RunRecord(
                **{
                    **_record("2026-11-03", base).__dict__,
                    "run_id": "failed",
                    "status": "failed",
                    "validity": "invalid",
                }
            )
        )
        baseline = history.runs(cell=("b", "m", "xnnpack"), before_night="2026-11-04", versions={"torch": "1"},
                                valid_only=True)  # fmt: skip
        assert [r.night for r in baseline] == ["2026-11-01", "2026-10-31"]
        # Same as the valid baseline: no change, even though the invalid night was twice as slow.
        assert judge(_record("2026-11-04", base, sha=NEW_SHA), baseline, 0.05).verdict == Kind.OK
        # A changed program that looks 30% slower is only a suspicion until the interleaved re-test confirms it.
        suspected = judge(_record("2026-11-04", [x * 1.3 for x in base], sha=NEW_SHA), baseline, 0.05)
        assert suspected.verdict == Kind.UNCONFIRMED and suspected.suspect == "slower"
        assert suspected.reference is not None and suspected.reference.night == "2026-11-01"
        # Other versions are another baseline.
        assert history.runs(cell=("b", "m", "xnnpack"), versions={"torch": "2"}, valid_only=True) == []
    finally:
        history.close()


def test_an_inconclusive_night_never_raises_the_bar(tmp_path: Path) -> None:
    """A night under a CPU hog (3x slower, degraded twice: inconclusive) must not hide tomorrow's real slowdown."""
    history = History(f"sqlite:///{tmp_path / 'h.sqlite'}")
    try:
        base = [10.0 + 0.01 * i for i in range(25)]
        for night in ("2026-11-01", "2026-11-02"):
            history.record(_record(night, base))
        hogged = _record("2026-11-03", [x * 3 for x in base], validity="degraded", reasons=["unstable timings"])
        history.record(hogged)
        verdict = judge(hogged, history.runs(cell=hogged.cell, before_night="2026-11-03", valid_only=True), 0.05)
        assert verdict.verdict == Kind.INCONCLUSIVE
        history.set_verdict(hogged.run_id, verdict.verdict, verdict.info())
        baseline = history.runs(cell=hogged.cell, before_night="2026-11-04", valid_only=True)
        assert [r.night for r in baseline] == ["2026-11-02", "2026-11-01"]
        assert history.baseline_programs(7) == {"a" * 64}
        # 2.4x slower tonight, a changed program: with the hogged night (a 200% spread) it would pass as normal.
        slower = judge(_record("2026-11-04", [x * 2.4 for x in base], sha=NEW_SHA), baseline, 0.05)
        assert slower.verdict == Kind.UNCONFIRMED and slower.suspect == "slower", slower.detail
        with_hog = judge(_record("2026-11-04", [x * 2.4 for x in base], sha=NEW_SHA), [*baseline, hogged], 0.05)
        assert with_hog.suspect is None, "the rule under test: the hogged night is what would have hidden it"
    finally:
        history.close()


def test_unchanged_program_is_drift_never_a_regression() -> None:
    steady = {"governor_before": "performance"}
    base = [_record(f"2026-11-0{n}", [10.0 + 0.01 * i for i in range(30)], conditions=steady) for n in (1, 2)]
    busy = _record("2026-11-03", [13.0 + 0.01 * i for i in range(30)], conditions={"governor_before": "ondemand"})
    verdict = judge(busy, base, 0.05)
    assert verdict.verdict == Kind.DRIFT and verdict.suspect is None
    assert "no program change" in verdict.detail and "governor performance → ondemand" in verdict.detail
    assert verdict.drift == pytest.approx(1.3, rel=0.01)
    still_degraded = _record("2026-11-03", busy.latencies_ms, validity="degraded", reasons=["unstable timings"])
    assert judge(still_degraded, base, 0.05).verdict == Kind.INCONCLUSIVE
    # A new runner is a changed program, even with the same .pte: then the re-test decides.
    rebuilt = _record("2026-11-03", busy.latencies_ms)
    rebuilt.environment = {**rebuilt.environment, "runner": "2"}
    assert judge(rebuilt, base, 0.05).suspect == "slower"


def test_interleaved_retest_confirms_only_a_shift_that_survives() -> None:
    rng = np.random.default_rng(7)
    base = [_record(f"2026-11-0{n}", [10.0 + 0.01 * i for i in range(30)]) for n in (1, 2)]
    suspected = judge(_record("2026-11-03", [12.0 + 0.01 * i for i in range(30)], sha=NEW_SHA), base, 0.05)
    # The board drifts during the re-test (round by round), equally for A and B: nothing to confirm.
    a, b, ratios = [], [], []
    for load in (1.0, 1.4, 1.1, 1.6, 1.2, 1.3):
        round_a = list(10.0 * load * rng.lognormal(0, 0.02, 6))
        round_b = list(10.0 * load * rng.lognormal(0, 0.02, 6))
        a += round_a
        b += round_b
        ratios.append(float(np.median(round_b) / np.median(round_a)))
    change, confirmed, reason = decide(a, b, ratios, min_effect=0.05, expect="slower")
    assert not confirmed, reason
    result = Interleaved(rounds=6, seconds=3.0, a_ms=a, b_ms=b, round_ratios=ratios, change=change, reason=reason)
    settled = confirm(suspected, result)
    assert settled.verdict == Kind.UNCONFIRMED and "not confirmed by the interleaved re-test" in settled.detail
    # B really is 3x slower in every round: confirmed, whatever the board did.
    slow_b = [x * 3 for x in b]
    change, confirmed, reason = decide(a, slow_b, [r * 3 for r in ratios], min_effect=0.05, expect="slower")
    assert confirmed and change == "slower", reason
    suspected = judge(_record("2026-11-03", [12.0 + 0.01 * i for i in range(30)], sha=NEW_SHA), base, 0.05)
    result = Interleaved(rounds=6, seconds=3.0, a_ms=a, b_ms=slow_b, round_ratios=[r * 3 for r in ratios],
                         change=change, confirmed=True, reason=reason)  # fmt: skip
    assert confirm(suspected, result).verdict == Kind.REGRESSION
    # Fewer than five rounds never confirm anything, however slow B is.
    assert not decide(a[:24], slow_b[:24], [r * 3 for r in ratios[:4]], min_effect=0.05)[1]


def test_a_busy_board_that_switches_between_two_speeds_confirms_nothing() -> None:
    # Measured under a CPU hog: a short run lands wholly at ~14 or ~29 ms per iteration, at random. Five of six
    # rounds (or 75%) can then favour A by chance (p = 0.11): the sign test keeps that from being a regression.
    rng = np.random.default_rng(3)
    a, b, ratios = [], [], []
    for slow_a, slow_b in ((0, 1), (1, 0), (0, 1), (0, 1), (0, 1), (0, 1)):
        round_a = list((29.0 if slow_a else 14.0) * rng.lognormal(0, 0.03, 5))
        round_b = list((29.0 if slow_b else 14.0) * rng.lognormal(0, 0.03, 5))
        a += round_a
        b += round_b
        ratios.append(float(np.median(round_b) / np.median(round_a)))
    assert sum(r > 1 for r in ratios) == 5, "the pattern under test: 5 of 6 rounds slower, pooled +50% or more"
    change, confirmed, reason = decide(a, b, ratios, min_effect=0.05, expect="slower")
    assert change == "slower" and not confirmed and "sign test p=0.11" in reason, reason
    assert sign_test(5, 5) < 0.05 < sign_test(5, 6) and sign_test(7, 8) < 0.05 < sign_test(6, 8)
    # A run lasts about a second at the probe's pace, within bounds.
    assert iterations_for(8.0, 1.0) == 125 and iterations_for(400.0, 1.0) == 5 and iterations_for(0.01, 1.0) == 200


def test_one_baseline_night_is_not_enough() -> None:
    night = _record("2026-11-01", [10.0 + 0.01 * i for i in range(20)])
    verdict = judge(_record("2026-11-02", [x * 2 for x in night.latencies_ms]), [night], 0.05)
    assert verdict.verdict == "new" and "1 valid night(s) so far, 2 needed" in verdict.detail


def test_min_baseline_nights_takes_effect(local_board: Board, tmp_path: Path) -> None:
    matrix = [{"models": ["distilbert-tiny"], "backends": ["xnnpack"], "boards": ["local"]}]
    inventory = write_inventory(
        tmp_path / "inventory.yaml", [local_board],
        nightly=nightly_section(tmp_path, matrix, min_baseline_nights=3, baseline_nights=5),
    )  # fmt: skip
    config = load_config(load_inventory(inventory))
    assert (config.min_baseline_nights, config.baseline_nights) == (3, 5)
    nights = [_record(f"2026-11-0{n}", [10.0 + 0.01 * i for i in range(20)]) for n in (1, 2)]
    tonight = _record("2026-11-03", [x * 2 for x in nights[0].latencies_ms])
    assert judge(tonight, nights, 0.05, min_nights=config.min_baseline_nights).verdict == Kind.NEW
    assert judge(tonight, nights, 0.05, min_nights=2).verdict == Kind.DRIFT
    too_many = write_inventory(
        tmp_path / "bad.yaml", [local_board],
        nightly=nightly_section(tmp_path, matrix, min_baseline_nights=9, baseline_nights=5),
    )  # fmt: skip
    with pytest.raises(InventoryError, match="min_baseline_nights: must be <= baseline_nights"):
        load_config(load_inventory(too_many))


def test_night_to_night_spread_raises_the_bar() -> None:
    # Baseline nights 8% apart: a further 7% is within what nights do, 20% is not.
    nights = [_record(f"2026-11-0{n}", [m + 0.01 * i for i in range(30)]) for n, m in ((1, 10.0), (2, 10.8))]
    within = _record("2026-11-03", [11.0 + 0.01 * i for i in range(30)], sha=NEW_SHA)
    assert judge(within, nights, 0.05).verdict == Kind.OK
    beyond = _record("2026-11-03", [12.6 + 0.01 * i for i in range(30)], sha=NEW_SHA)
    assert judge(beyond, nights, 0.05).suspect == "slower"


def test_small_shifts_and_noise_are_not_regressions() -> None:
    base = [_record(f"2026-11-0{n}", [10.0 + 0.3 * ((i * 7 + n) % 5) for i in range(30)]) for n in (1, 2, 3)]
    noisy = _record("2026-11-04", [10.0 + 0.3 * ((i * 3) % 5) for i in range(30)], sha=NEW_SHA)
    assert judge(noisy, base, 0.05).verdict == Kind.OK
    slightly = _record("2026-11-04", [x * 1.03 for x in base[0].latencies_ms], sha=NEW_SHA)  # real but below 5 %
    assert judge(slightly, base, 0.05).verdict == Kind.OK
    faster = judge(_record("2026-11-04", [x * 0.7 for x in base[0].latencies_ms], sha=NEW_SHA), base, 0.05)
    assert faster.suspect == "faster"


def test_board_that_goes_away_is_exit_2(local_board: Board, sshd_board: Any, tmp_path: Path) -> None:
    remote = sshd_board.board.replace(name="pi-lab-1", **SHARED_BUILD)
    provision_board(remote)
    matrix = [{"models": ["distilbert-tiny"], "backends": ["xnnpack"], "boards": ["local", "pi-lab-1"]}]
    inventory = write_inventory(
        tmp_path / "inventory.yaml", [local_board, remote], nightly=nightly_section(tmp_path, matrix)
    )
    first = fab_nightly(inventory, "2026-11-01", tmp_path)
    assert first.returncode == 0, first.stdout + first.stderr
    assert {r.board for r in stored(tmp_path, "2026-11-01") if r.status == "ok"} == {"local", "pi-lab-1"}

    sshd_board.stop()
    second = fab_nightly(inventory, "2026-11-02", tmp_path)
    assert second.returncode == 2, second.stdout + second.stderr
    records = {r.board: r for r in stored(tmp_path, "2026-11-02")}
    assert records["local"].status == "ok" and records["local"].latencies_ms, "the other board's cell is recorded"
    assert records["pi-lab-1"].status == "infra" and records["pi-lab-1"].stage in ("connect", "setup")
    assert "pi-lab-1" in second.stderr
    junit = ET.parse(tmp_path / "reports" / "nightly-2026-11-02.junit.xml").getroot()
    assert junit.get("errors") == "1"
    page = (tmp_path / "reports" / "nightly-2026-11-02.html").read_text()
    failures = page.split("<table id='failures'>", 1)[1].split("</table>", 1)[0]
    assert "pi-lab-1" in failures and "infra" in failures and "local" not in failures

    # The board is back: re-running the night retries only the infrastructure failure.
    sshd_board.start()
    third = fab_nightly(inventory, "2026-11-02", tmp_path)
    assert third.returncode == 0, third.stdout + third.stderr
    assert "1 cell(s) already recorded" in third.stderr
    assert {r.board: r.status for r in stored(tmp_path, "2026-11-02")} == {"local": "ok", "pi-lab-1": "ok"}


def test_killed_nightly_resumes(local_board: Board, tmp_path: Path) -> None:
    matrix: list[dict[str, Any]] = [
        {"models": ["distilbert-tiny"], "backends": ["xnnpack"], "boards": ["local"]},
        {"models": [str(SPECS / "distilbert-small.json")], "backends": ["portable"], "boards": ["local"],
         "iterations": 10, "max_seconds": 600},  # long enough to be killed in, short enough to run twice
    ]  # fmt: skip
    inventory = write_inventory(tmp_path / "inventory.yaml", [local_board], nightly=nightly_section(tmp_path, matrix))
    env = {**os.environ, "ETLAB_ARTIFACTS": str(TEST_CACHE / "artifacts"), "ETLAB_RESULTS": str(tmp_path / "results")}
    # Lower first, so the kill lands while the board runs the second cell.
    subprocess.run([sys.executable, "-m", "fabric", "lower", "--spec", str(SPECS / "distilbert-small.json"),
                    "--backend", "portable"], cwd=PROJECT_ROOT, env=env, check=True, capture_output=True)  # fmt: skip
    process = subprocess.Popen(
        [sys.executable, "-m", "fabric", "nightly", "--inventory", str(inventory), "--night", "2026-11-05"],
        cwd=PROJECT_ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    with reaped(process):
        database = tmp_path / "history.sqlite"
        deadline = time.monotonic() + 600
        recorded = 0
        while time.monotonic() < deadline and process.poll() is None:
            if database.exists():
                with sqlite3.connect(database) as connection, contextlib.suppress(sqlite3.OperationalError):
                    recorded = connection.execute("select count(*) from runs").fetchone()[0]  # once the schema exists
                if recorded:
                    break
            time.sleep(0.05)
        assert recorded == 1 and process.poll() is None, "expected to kill the nightly between its two cells"
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()

    with sqlite3.connect(database) as connection:
        assert connection.execute("pragma integrity_check").fetchone()[0] == "ok"
    resumed = fab_nightly(inventory, "2026-11-05", tmp_path)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert "1 cell(s) already recorded for 2026-11-05: skipped" in resumed.stderr
    cells = sorted((r.model, r.backend, r.status) for r in stored(tmp_path, "2026-11-05"))
    assert cells == [("distilbert-small", "portable", "ok"), ("distilbert-tiny", "xnnpack", "ok")]


def test_malformed_nightly_section_names_line_and_field(local_board: Board, tmp_path: Path) -> None:
    inventory = write_inventory(
        tmp_path / "inventory.yaml",
        [local_board],
        nightly={"matrix": [{"models": ["distilbert-tiny"], "backend": ["xnnpack"], "boards": ["local"]}]},
    )
    result = fab_nightly(inventory, dt.date.today().isoformat(), tmp_path)
    assert result.returncode == 64
    assert f"{inventory}:" in result.stderr and "nightly.matrix[0].backend" in result.stderr
    assert "did you mean 'backends'" in result.stderr


def test_memory_growth_is_judged_like_latency() -> None:
    """A growth of peak memory past min_effect, beyond every baseline night: drift for the same program, a regression
    for a changed one; less, or within the baseline nights, is nothing."""
    from orchestrator.lab.judging import judge_memory

    steady = [10.0 + 0.01 * i for i in range(30)]
    base = [_record(f"2026-11-0{n}", steady, peak_rss_bytes=100_000_000 + n * 1_000_000) for n in (1, 2, 3)]

    def verdict(peak: int, sha: str = "a" * 64) -> Any:
        record = _record("2026-11-04", steady, sha=sha, peak_rss_bytes=peak)
        return judge_memory(judge(record, base, 0.05), base, 0.05)

    grown = verdict(120_000_000, sha=NEW_SHA)
    assert grown.verdict == Kind.REGRESSION and "peak memory 120.0 MB" in grown.detail
    assert grown.memory["growth"] == pytest.approx(120 / 102 - 1)
    assert grown.info()["memory"] == grown.memory  # kept in the history with the verdict
    drifted = verdict(120_000_000)
    assert drifted.verdict == Kind.DRIFT and "board drift" in drifted.detail
    assert verdict(104_000_000, sha=NEW_SHA).verdict == Kind.OK  # +2%: under min_effect
    assert verdict(90_000_000, sha=NEW_SHA).verdict == Kind.OK  # smaller is never a regression
    # Too few baseline nights with a memory figure (older history rows): not judged.
    old = [_record(f"2026-11-0{n}", steady) for n in (1, 2, 3)]
    record = _record("2026-11-04", steady, sha=NEW_SHA, peak_rss_bytes=500_000_000)
    assert judge_memory(judge(record, old, 0.05), old, 0.05).verdict == Kind.OK


def test_a_board_s_degraded_cells_share_one_cool_down(
    local_board: Board, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every cell of the board degraded (its governor reads "powersave", through the agent's injectable sysroot): the
    board cools down once, then re-measures each cell, and each cell's figures say the cool-down was shared."""
    governor = tmp_path / "sysroot" / "sys" / "devices" / "system" / "cpu" / "cpufreq" / "policy0" / "scaling_governor"
    governor.parent.mkdir(parents=True)
    governor.write_text("powersave\n")
    monkeypatch.setenv("ETLAB_AGENT_SYSROOT", str(tmp_path / "sysroot"))  # the local board's agent inherits it
    matrix = [{"models": ["distilbert-tiny", "gpt2-tiny"], "backends": ["xnnpack"], "boards": ["local"]}]
    section = nightly_section(tmp_path, matrix, iterations=5, warmup=1, cooldown_seconds=0.5)
    inventory = write_inventory(tmp_path / "inventory.yaml", [local_board], nightly=section)

    result = fab_nightly(inventory, "2026-11-01", tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    output = " ".join((result.stdout + result.stderr).split())  # the console wraps long lines
    assert output.count("cool-down") == 1, output
    assert "2 degraded cell(s)" in output and "one 0.5 s cool-down shared by 2 cell(s)" in output
    records = stored(tmp_path, "2026-11-01")
    assert sorted(r.model for r in records) == ["distilbert-tiny", "gpt2-tiny"]
    for record in records:
        remeasured = (record.verdict_info or {})["remeasured"]
        assert remeasured["cooldown_seconds"] == 0.5 and remeasured["cooldown_shared_by"] == 2
        assert any("governor 'powersave'" in reason for reason in remeasured["first_reasons"])
        assert remeasured["first_run"] != remeasured["second_run"] == record.run_id
        assert record.validity == remeasured["second_validity"] == "degraded"
