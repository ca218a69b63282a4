"""The dashboard on runs it cannot show in full (issue 34.4 and 34.11): a run pulled but not analysed, and runs whose
files hold extreme values (NaN, 400-digit integers, nesting 100,000 deep, a bool for a count) in the analysis's own
files or the board's. A real server answers each run's page with 200, saying what is missing or unreadable (the
file and the field), its JSON block strict JSON (NaN would fail the browser's JSON.parse); `fab dashboard --static`
completes with exit 0 and writes every page, each saying the same. The pages in Chromium: one, without a console
error. The readers at the command line: tests/results/test_extreme_values.py."""

from __future__ import annotations

import html
import http.client
import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from orchestrator.paths import PROJECT_ROOT
from orchestrator.servers.dashboard.app import DashboardServer, Sources, start_dashboard
from tests.plugins.analysis import HUGE_INTEGER, NESTING_BOMB, BundleCase, copy_bundle, plant_json
from tests.plugins.dashboard import LAB_BOARD, pulled_run
from tests.plugins.explorer import free_port

if TYPE_CHECKING:
    from playwright.sync_api import ConsoleMessage

NOT_ANALYSED = "20261203T000000Z-000aaa"
# run id -> (file under the run, field, raw JSON, what its page must say); each run analysed, then planted.
PLANTED = {
    "20261203T000001Z-000b01": ("analysis/summary.json", "latency.warm.median_ms", "NaN",
                                "summary.json: latency.warm.median_ms: NaN is out of range"),
    "20261203T000002Z-000b02": ("analysis/summary.json", "memory.peak_rss_bytes", HUGE_INTEGER,
                                "summary.json: memory.peak_rss_bytes: a number of 400 characters is out of range"),
    "20261203T000003Z-000b03": ("analysis/summary.json", "board_conditions", NESTING_BOMB,
                                "summary.json: nested more than 64 levels"),
    "20261203T000004Z-000b04": ("analysis/summary.json", "latency.iterations", "true",
                                "summary.json: latency.iterations: expected `int`, got `bool`"),
    "20261203T000005Z-000b05": ("analysis/ops.json", "instructions", NESTING_BOMB,
                                "ops.json: nested more than 64 levels"),
    "20261203T000006Z-000b06": ("analysis/advice.json", "findings[0].saving_ms", HUGE_INTEGER,
                                "advice.json: findings[0].saving_ms: a number of 400 characters is out of range"),
    "20261203T000007Z-000b07": ("timings.json", "warmup_ms[0]", HUGE_INTEGER,
                                "timings.json: warmup_ms[0]: a number of 400 characters is out of range"),
    "20261203T000008Z-000b08": ("timings.json", "iterations_ms[1]", "NaN", "timings.json: iterations_ms[1]: NaN"),
}  # fmt: skip
PAGE_DATA = re.compile(r'<script type="application/json" id="page-data">(.*?)</script>', re.S)


def strict_page_data(page: str) -> Any:
    """The page's JSON block, parsed as a browser's JSON.parse would: NaN or Infinity in it fails."""
    (block,) = PAGE_DATA.findall(page)

    def refuse(constant: str) -> None:
        raise ValueError(f"{constant} in the page data")

    return json.loads(block, parse_constant=refuse)


@pytest.fixture(scope="module")
def lab(analysis_bundles: dict[str, BundleCase], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """results/: a raw bundle as `fab pull` leaves it (not analysed), and analysed runs with one value planted each."""
    results = tmp_path_factory.mktemp("unreadable") / "results"
    bundle = analysis_bundles["distilbert_xnnpack"]
    model = bundle.model
    copy_bundle(bundle, results / LAB_BOARD / model.sidecar.model / model.backend / NOT_ANALYSED)
    for run_id, (name, field, raw, _) in PLANTED.items():
        run = pulled_run(bundle, results, run_id)
        if name == "analysis/advice.json":
            done = subprocess.run([sys.executable, "-m", "fabric", "advise", "--run", run_id], cwd=PROJECT_ROOT,
                                  env={**os.environ, "ETLAB_RESULTS": str(results)}, capture_output=True, text=True,
                                  timeout=300)  # fmt: skip
            assert done.returncode == 0 and (run / name).is_file(), done.stderr
            document = json.loads((run / name).read_text())
            assert document["findings"], "a finding to plant in"
        plant_json(run / name, field, raw)
    return results


@pytest.fixture(scope="module")
def server(lab: Path) -> Iterator[DashboardServer]:
    handle = start_dashboard(Sources(lab, None), port=free_port(), explorer_port=free_port())
    try:
        yield handle
    finally:
        handle.stop()


def get(server: DashboardServer, path: str) -> tuple[int, str]:
    connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
    try:
        connection.request("GET", path, headers={"Host": f"127.0.0.1:{server.port}"})
        response = connection.getresponse()
        return response.status, response.read().decode()
    finally:
        connection.close()


def says(page: str, text: str) -> bool:
    return text in html.unescape(re.sub(r"<[^>]+>", "", page))


def test_a_pulled_run_not_analysed_has_a_page_saying_how_to_analyse_it(server: DashboardServer) -> None:
    status, page = get(server, f"/run/{NOT_ANALYSED}")
    assert status == 200, page
    assert says(page, "This run was pulled but not analysed") and says(page, f"fab analyze --run {NOT_ANALYSED}")
    data = strict_page_data(page)
    assert data["analyse_command"] == f"fab analyze --run {NOT_ANALYSED}"
    assert data["iterations_ms"] and data["warm"] is None  # the board's iterations are shown already
    assert get(server, "/")[0] == 200


@pytest.mark.parametrize("run_id", list(PLANTED), ids=[f"{v[0]}:{v[1]}" for v in PLANTED.values()])
def test_a_run_with_unreadable_files_has_a_page_naming_file_and_field(server: DashboardServer, run_id: str) -> None:
    status, page = get(server, f"/run/{run_id}")
    assert status == 200, page
    assert says(page, PLANTED[run_id][3]), html.unescape(page)[-3000:]
    strict_page_data(page)


def test_the_static_export_completes_and_every_page_says_why(lab: Path, tmp_path: Path) -> None:
    site = tmp_path / "site"
    env = {**os.environ, "ETLAB_RESULTS": str(lab), "ETLAB_INVENTORY": str(tmp_path / "none.yaml")}
    done = subprocess.run(
        [sys.executable, "-m", "fabric", "dashboard", "--static", str(site), "--history", f"sqlite:///{tmp_path}/no"],
        cwd=PROJECT_ROOT, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Traceback" not in done.stderr
    expected = {NOT_ANALYSED: f"fab analyze --run {NOT_ANALYSED}"} | {run: v[3] for run, v in PLANTED.items()}
    for run_id, text in expected.items():
        page = (site / f"run-{run_id}.html").read_text()
        assert says(page, text), (run_id, text)
        strict_page_data(page)
    for html_file in site.glob("*.html"):  # the overview and the comparisons too
        strict_page_data(html_file.read_text())


def test_the_page_of_a_run_not_analysed_loads_in_chromium(server: DashboardServer, browser_page: Any) -> None:
    problems: list[str] = []

    def on_console(message: ConsoleMessage) -> None:
        if message.type == "error":
            problems.append(message.text)

    browser_page.on("console", on_console)
    browser_page.on("pageerror", lambda error: problems.append(f"uncaught: {error}"))
    response = browser_page.goto(f"{server.url}run/{NOT_ANALYSED}")
    browser_page.wait_for_load_state("load")
    assert response.status == 200 and not problems, problems
    assert browser_page.locator("#not-analysed code").inner_text() == f"fab analyze --run {NOT_ANALYSED}"
    # The board's iterations are plotted from the page's JSON block.
    assert browser_page.evaluate("document.getElementById('run-latency').data[0].y.length") > 0
