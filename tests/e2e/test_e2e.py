"""End to end through the real `fab` tasks: a lab of three real sshd boards plus the local board.

Board names carry spaces and shell metacharacters on purpose: they travel through quoting, inventory,
remote commands and the results folder.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from orchestrator.boards.inventory import Board
from orchestrator.deploy import provision
from orchestrator.lowering.export.lower import LoweringResult
from orchestrator.paths import PROJECT_ROOT
from orchestrator.transport import connect
from tests.plugins.artifacts import ARTIFACT_CACHE
from tests.plugins.boards import write_inventory
from tests.plugins.processes import reaped

LAB_NAMES = ["pi5-a", "pi 4 b", "rk3588's $HOME"]


@pytest.fixture(scope="module")
def lab(sshd_lab: Any, local_board: Board, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    fakes = [sshd_lab.board(name) for name in LAB_NAMES]
    folder = tmp_path_factory.mktemp("lab")
    boards = [local_board, *(fake.board for fake in fakes)]
    inventory = write_inventory(
        folder / "inventory.yaml", boards, groups={"lab": LAB_NAMES, "default": ["local", *LAB_NAMES]}
    )
    yield {"inventory": inventory, "fakes": fakes, "folder": folder}
    for fake in fakes:
        sshd_lab.discard(fake)


def fab(
    *args: str, lab: dict[str, Any] | None, results: Path, timeout: float = 900
) -> subprocess.CompletedProcess[str]:
    """Run a real `fab` task; board-facing ones get the lab's inventory."""
    env = {**os.environ, "ETLAB_ARTIFACTS": str(ARTIFACT_CACHE), "ETLAB_RESULTS": str(results)}
    inventory = ["--inventory", str(lab["inventory"])] if lab else []
    return subprocess.run(
        [sys.executable, "-m", "fabric", *args, *inventory],
        cwd=PROJECT_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def bundles(results: Path) -> dict[tuple[str, str, str], list[Path]]:
    found: dict[tuple[str, str, str], list[Path]] = {}
    for manifest in results.glob("*/*/*/*/result_manifest.json"):
        run = manifest.parent
        found.setdefault((run.parent.parent.parent.name, run.parent.parent.name, run.parent.name), []).append(run)
    return found


def test_setup_push_run_pull_on_a_lab(
    lab: dict[str, Any], tiny_artifacts: dict[str, LoweringResult], tmp_path: Path
) -> None:
    results = tmp_path / "results"
    setup = fab("setup-board", "--group", "default", lab=lab, results=results)
    assert setup.returncode == 0, setup.stdout + setup.stderr
    for name in LAB_NAMES:
        assert name in setup.stdout
    again = fab("setup-board", "--group", "default", lab=lab, results=results)
    assert again.returncode == 0 and again.stdout.count("already up to date: nothing to do") == 4, again.stdout
    # Before a run, one shell command over SSH settles that a board is up to date (no probe, no Python).
    for fake in lab["fakes"]:
        with connect(fake.board) as conn:
            quick = provision.quick_check(conn)
        assert quick is not None and quick.up_to_date, f"{fake.board.name}: {conn.workdir}"

    push = fab("push", "--model", "distilbert-tiny", "--backend", "portable,xnnpack", lab=lab, results=results)
    assert push.returncode == 0, push.stdout + push.stderr
    repush = fab("push", "--model", "distilbert-tiny", "--backend", "portable,xnnpack", lab=lab, results=results)
    assert repush.stdout.count("already there") == 8, repush.stdout

    run = fab("run", "--model", "distilbert-tiny", "--backend", "portable,xnnpack", "--iterations", "5",
              "--warmup", "1", lab=lab, results=results)  # fmt: skip
    assert run.returncode == 0, run.stdout + run.stderr
    run_ids = set(re.findall(r"\d{8}T\d{6}Z-[0-9a-f]{6}", run.stdout))
    assert len(run_ids) == 8

    pull = fab("pull", lab=lab, results=results)
    assert pull.returncode == 0, pull.stdout + pull.stderr
    found = bundles(results)
    for board in ["local", *LAB_NAMES]:
        for backend in ("portable", "xnnpack"):
            # The session's local board may hold other tests' runs too: this run's bundle is the one with its id.
            (bundle,) = [b for b in found[(board, "distilbert-tiny", backend)] if b.name in run_ids]
            run_json = json.loads((bundle / "run.json").read_text())
            assert run_json["labels"]["board"] == board
            assert (bundle / "etdump.etdp").stat().st_size > 0
    # Pulling again pulls nothing and overwrites nothing.
    again = fab("pull", lab=lab, results=results)
    assert again.returncode == 0 and "nothing new to pull" in again.stdout

    boards = fab("boards", lab=lab, results=results)
    assert boards.returncode == 0, boards.stdout + boards.stderr
    for name in ["local", *LAB_NAMES]:
        assert name in boards.stdout
    assert boards.stdout.count("1.5.1") >= 4 and "free" in boards.stdout


def test_deploy_and_profile_on_local_and_two_sshd_boards(
    lab: dict[str, Any], tiny_artifacts: dict[str, LoweringResult], tmp_path: Path
) -> None:
    results = tmp_path / "results"
    selection = ",".join(["local", *LAB_NAMES[:2]])
    result = fab("deploy-and-profile", "--model", "distilbert-tiny", "--backend", "portable,xnnpack",
                 "--board", selection, "--iterations", "6", "--warmup", "1", "--no-explore",
                 lab=lab, results=results)  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    for board in ["local", *LAB_NAMES[:2]]:  # a line per finished board × variant, with its steps' times
        assert re.search(rf"✓ \[{re.escape(board)}\] distilbert-tiny/xnnpack .*\(push .* · run .* · pull .* · analyze ",
                         result.stderr), result.stderr  # fmt: skip
    found = bundles(results)
    for board in ["local", *LAB_NAMES[:2]]:
        for backend in ("portable", "xnnpack"):
            (bundle,) = found[(board, "distilbert-tiny", backend)]
            summary = json.loads((bundle / "analysis" / "summary.json").read_text())
            assert summary["status"] == "ok" and summary["correctness"]["ok"], summary["correctness"]
            assert list((bundle / "model_explorer").glob("me_overlay_*.json"))
    assert result.stdout.count("×") >= 3, "XNNPACK speedup over portable per board"
    # The advice once for the model, its top findings across the runs one line each; every run's written with its
    # overlays. Findings are ranked by saving, so which one comes first depends on timings: any rank will do.
    assert result.stderr.count("advice for distilbert-tiny (6 runs") == 1, result.stderr
    assert re.search(r"\n  .* ms .*: .* → --rewrites eager-attention", result.stderr), result.stderr
    advised = found[("local", "distilbert-tiny", "xnnpack")][0]
    assert json.loads((advised / "analysis" / "advice.json").read_text())["findings"]
    assert (advised / "model_explorer" / "me_overlay_advice.json").is_file()

    # The pulled runs, offline: re-analyse one, compare two, refuse to compare different programs.
    local_xnn = found[("local", "distilbert-tiny", "xnnpack")][0].name
    remote_xnn = found[(LAB_NAMES[0], "distilbert-tiny", "xnnpack")][0].name
    local_portable = found[("local", "distilbert-tiny", "portable")][0].name
    analyze = fab("analyze", "--run", local_xnn, lab=None, results=results)
    assert analyze.returncode == 0, analyze.stdout + analyze.stderr
    # the nodes inside the delegates, as the dashboard's run page lists them, not the delegate call's backend
    assert "Top operators" in analyze.stdout and "XNNFullyConnected" in analyze.stdout
    advise = fab("advise", "--run", local_xnn, lab=None, results=results)
    assert advise.returncode == 0, advise.stdout + advise.stderr
    # the causes under the table name each finding's detector in full (a table cell may wrap)
    assert f"Advice for run {local_xnn}" in advise.stdout and "(eager-attention):" in advise.stdout
    compare = fab("compare", local_xnn, remote_xnn, lab=None, results=results)
    assert compare.returncode == 0, compare.stdout + compare.stderr
    assert re.search(r"slower|faster|no change|noise", compare.stdout + compare.stderr)
    diff = (
        found[(LAB_NAMES[0], "distilbert-tiny", "xnnpack")][0]
        / "model_explorer"
        / f"me_overlay_diff_vs_{local_xnn}.json"
    )
    assert diff.is_file()
    refused = fab("compare", local_xnn, local_portable, lab=None, results=results)
    assert refused.returncode == 64, refused.stdout + refused.stderr
    assert "different" in refused.stderr

    gc = fab("gc", "--keep", "0", "--board", LAB_NAMES[0], lab=lab, results=results)
    assert gc.returncode == 0, gc.stdout + gc.stderr
    assert not [p for p in (lab["fakes"][0].workdir_path / "bundles").iterdir() if not p.name.startswith(".")]


def test_a_dead_board_does_not_stop_the_others(
    lab: dict[str, Any], tiny_artifacts: dict[str, LoweringResult], tmp_path: Path
) -> None:
    results = tmp_path / "results"
    dead = lab["fakes"][2]
    dead.stop()
    try:
        result = fab("deploy-and-profile", "--model", "distilbert-tiny", "--board", f"local,{LAB_NAMES[2]}",
                     "--iterations", "3", "--no-explore", lab=lab, results=results)  # fmt: skip
    finally:
        dead.start()
    assert result.returncode == 69, result.stdout + result.stderr  # every failure is an unreachable board
    assert f"{LAB_NAMES[2]}: distilbert-tiny/xnnpack failed at connect" in result.stderr
    assert ("local", "distilbert-tiny", "xnnpack") in bundles(results)


def test_deploy_and_profile_launches_model_explorer(
    lab: dict[str, Any], tiny_artifacts: dict[str, LoweringResult], tmp_path: Path
) -> None:
    env = {**os.environ, "ETLAB_ARTIFACTS": str(ARTIFACT_CACHE), "ETLAB_RESULTS": str(tmp_path / "results")}
    process = subprocess.Popen(
        [sys.executable, "-m", "fabric", "deploy-and-profile", "--model", "distilbert-tiny", "--board", "local",
         "--iterations", "3", "--no-browser", "--port", "18081", "--inventory", str(lab["inventory"])],
        cwd=PROJECT_ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True,
    )  # fmt: skip
    with reaped(process):
        url = None
        output = []
        deadline = time.monotonic() + 300
        assert process.stdout is not None
        while time.monotonic() < deadline and url is None:
            line = process.stdout.readline()
            if not line:
                break
            output.append(line)
            match = re.search(r"(http://127\.0\.0\.1:18081/\S*)", line)
            url = match.group(1) if match else None
        try:
            assert url, "".join(output)
            with urllib.request.urlopen("http://127.0.0.1:18081/check_health", timeout=10) as response:
                assert response.status == 200
        finally:
            process.send_signal(signal.SIGINT)
            remaining, _ = process.communicate(timeout=60)
        assert process.returncode == 0, "".join(output) + remaining
        with pytest.raises(OSError):  # Ctrl+C stopped the server too
            urllib.request.urlopen("http://127.0.0.1:18081/check_health", timeout=5)
