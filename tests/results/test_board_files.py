"""What a bundle may hold (issue 34.3): only the files a board writes (results/bundle.py BOARD_FILES, checked against
a real run with a counters pass in test_counters.py). A board whose bundle brings its own analysis (analysis/,
model_explorer/, listed in its manifest with correct hashes) or any other file or folder is refused by `fab pull`
with exit 65 naming it, and nothing of it lands in results/; an analysis a board supplied to an older etlab is never
read by advise, compare or the dashboard."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest

from orchestrator.errors import AnalysisError, ExitCode
from orchestrator.fsutil import TMP_PREFIX
from orchestrator.results.bundle import MANIFEST
from orchestrator.servers.dashboard import data
from orchestrator.servers.explorer import run_overlays
from tests.advice.advice_helpers import DATA
from tests.plugins.boards import write_inventory
from tests.plugins.sshd import SshdBoard
from tests.results.board_data_helpers import board_bundle, fab, files_under, install_agent

LABELS = {"model": "tiny", "backend": "xnnpack"}


def board_summary(run_id: str) -> bytes:
    """A summary.json as a board would forge it: a valid run at 0.010 ms."""
    document = json.loads((DATA / "gpt2-tiny" / "summary.json").read_text())
    document["run_id"] = run_id
    document["latency"]["warm"] = dict.fromkeys(("min_ms", "median_ms", "mean_ms", "p90_ms", "max_ms"), 0.010)
    document["latency"]["warm"]["cv"] = 0.0
    document["validity"] = {"status": "valid", "reasons": []}
    return json.dumps(document).encode()


FORGED = {
    "its own summary": ("analysis/summary.json", "analysis/summary.json: analysis results are etlab's own"),
    "its own overlay": ("model_explorer/me_overlay_median_ms.json", "model_explorer/me_overlay_median_ms.json"),
    "a file no board writes": ("summary.json", "summary.json: not a file a board writes"),
}


@pytest.mark.parametrize("case", list(FORGED), ids=list(FORGED))
def test_fab_pull_refuses_a_bundle_with_files_a_board_does_not_write(
    sshd_board: SshdBoard, tmp_path: Path, case: str
) -> None:
    name, message = FORGED[case]
    install_agent(sshd_board)
    forged = board_bundle(sshd_board, "run-forged", LABELS, {"timings.json": b"{}", name: board_summary("run-forged")})
    good = board_bundle(sshd_board, "run-good", LABELS, {"timings.json": b"{}"})
    before = files_under(forged)
    results = tmp_path / "results"
    inventory = write_inventory(tmp_path / "inventory.yaml", [sshd_board.board])

    pull = fab("pull", "--board", sshd_board.name, "--inventory", str(inventory), results=results)

    output = pull.stdout + pull.stderr
    assert pull.returncode == ExitCode.DATA, output
    assert message in output and "Traceback" not in output, output
    # The other bundle is pulled; of the forged one nothing is kept, not even a temporary folder.
    folder = results / sshd_board.name / "tiny" / "xnnpack"
    assert sorted(p.name for p in folder.iterdir()) == ["run-good"], sorted(folder.iterdir())
    assert files_under(folder) == {f"run-good/{n}" for n in ("run.json", "timings.json", MANIFEST)}
    assert files_under(forged) == before and good.is_dir()  # the raw bundles stay on the board


def test_fab_pull_refuses_a_bundle_holding_a_folder(sshd_board: SshdBoard, tmp_path: Path) -> None:
    """An empty analysis/ is listed nowhere in a manifest: the archive still brings it, and it is refused."""
    install_agent(sshd_board)
    forged = board_bundle(sshd_board, "run-forged", LABELS, {"timings.json": b"{}"})
    (forged / "analysis").mkdir()
    results = tmp_path / "results"
    inventory = write_inventory(tmp_path / "inventory.yaml", [sshd_board.board])

    pull = fab("pull", "--board", sshd_board.name, "--inventory", str(inventory), results=results)

    output = pull.stdout + pull.stderr
    assert pull.returncode == ExitCode.DATA, output
    assert "'analysis' is a folder" in output, output
    assert files_under(results) == set() and not any(p.name.startswith(TMP_PREFIX) for p in results.rglob("*"))


# ---------------------------------------------------------------- a board's analysis pulled by an older etlab


def legacy_run(results: Path, run_id: str) -> Path:
    """A run an older etlab pulled with the board's own analysis/summary.json (and ops.json) in it, each listed in
    the manifest with its hash, as that etlab accepted it."""
    run = results / "pi" / "gpt2-tiny" / "xnnpack" / run_id
    (run / "analysis").mkdir(parents=True)
    (run / "analysis" / "summary.json").write_bytes(board_summary(run_id))
    shutil.copy(DATA / "gpt2-tiny" / "ops.json", run / "analysis" / "ops.json")
    (run / "run.json").write_text(json.dumps({"run_id": run_id, "labels": {"model": "gpt2-tiny"}}))
    files = {
        name: {"sha256": hashlib.sha256((run / name).read_bytes()).hexdigest(), "size": (run / name).stat().st_size}
        for name in ("run.json", "analysis/summary.json", "analysis/ops.json")
    }
    (run / MANIFEST).write_text(json.dumps({"schema": 1, "run_id": run_id, "status": "ok", "files": files}))
    return run


def test_an_analysis_a_board_supplied_is_never_read(tmp_path: Path) -> None:
    results = tmp_path / "results"
    first, second = "20261201T000000Z-000aaa", "20261202T000000Z-000bbb"
    legacy_run(results, first)
    legacy_run(results, second)

    for command in (
        ("advise", "--run", second),
        ("compare", first, second),
        ("explore", "--run", second, "--no-browser"),
    ):
        done = fab(*command, results=results)
        output = done.stdout + done.stderr
        assert done.returncode == ExitCode.DATA, output
        assert "listed analysis/ops.json, analysis/summary.json in result_manifest.json" in output, output
        assert "0.010" not in done.stdout and "Traceback" not in output

    with pytest.raises(AnalysisError, match="an analysis a board supplies is never read"):  # the dashboard's explore
        run_overlays(results / "pi" / "gpt2-tiny" / "xnnpack" / second, required=False)

    page = data.run_page(data.Lab(results), second)  # the dashboard shows why, and no figure of the board's
    assert page.problem and "an analysis a board supplies is never read" in page.problem
    assert page.warm is None and page.validity is None
