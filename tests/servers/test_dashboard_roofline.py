"""The run page's `roofline` column (servers/dashboard/where.py, results/op_roofline.py) over plain HTTP from a real
server: on a run of distilbert-tiny analysed with both of its board's limits recorded, every Fully Connected and
batch matmul node among the top operators says "memory-bound N%" or "compute-bound N%" as ops.json's row for that
node has it, and every other row is blank; on a run whose board measured neither, the column is blank throughout
(never 0). The figures: tests/results/test_op_roofline.py."""

from __future__ import annotations

import html
import http.client
import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator.boards.limits import ComputePeak, ReadBandwidth, compute_state_value, state_value
from orchestrator.results.ops_record import load_ops
from orchestrator.servers.dashboard.app import DashboardServer, Sources, start_dashboard
from tests.plugins.analysis import BundleCase, copy_bundle, edit_json
from tests.plugins.dashboard import pulled_run
from tests.plugins.explorer import free_port

pytestmark = pytest.mark.slow  # runs a real tiny model (session fixture)

MEASURED, UNMEASURED = "20261206T010000Z-00r111", "20261206T020000Z-00r222"
ROW = re.compile(r'<tr class="operator-row" data-kind="([^"]*)">(.*?)</tr>', re.S)
CELL = re.compile(r"<td[^>]*>(.*?)</td>", re.S)
LABEL = re.compile(r"^(memory|compute)-bound \d+%( \(in cache\))?$")


def limits_state() -> dict[str, str]:
    """1 GB/s and 15 GFLOP/s: a ridge at 15 ops per byte, between the tiny model's attention matmuls and 64x64
    Fully Connecteds (11-13 ops per byte, memory-bound) and its FFN and head (16-20, compute-bound)."""
    sha, at = "c" * 64, "2026-12-06T00:00:00Z"
    bandwidth = ReadBandwidth(bytes_per_s=1e9, median_bytes_per_s=1e9, threads=1, buffer_bytes=1 << 30,
                              llc_bytes=1 << 20, runner_source_sha256=sha, measured_at=at)  # fmt: skip
    peak = ComputePeak(fp32_flops_per_s=15e9, int8_ops_per_s=45e9, threads=1, gemm=(64, 512, 512),
                       runner_source_sha256=sha, measured_at=at)  # fmt: skip
    return {"limits": state_value(bandwidth), "compute": compute_state_value(peak)}


@pytest.fixture(scope="module")
def results(analysis_bundles: dict[str, BundleCase], tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("roofline-lab")
    source = copy_bundle(analysis_bundles["distilbert_xnnpack"], root / "measured-source")
    edit_json(source.path / "board_info_before.json", state=limits_state())
    folder = root / "results"
    pulled_run(source, folder, MEASURED)
    pulled_run(analysis_bundles["distilbert_xnnpack"], folder, UNMEASURED)
    return folder


@pytest.fixture(scope="module")
def server(results: Path) -> Iterator[DashboardServer]:
    handle = start_dashboard(Sources(results, None), port=free_port(), explorer_port=free_port())
    try:
        yield handle
    finally:
        handle.stop()


def operator_rows(server: DashboardServer, run_id: str) -> list[tuple[str, list[str]]]:
    """(kind, cell texts) of each row of the run page's top operators."""
    connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
    try:
        connection.request("GET", f"/run/{run_id}", headers={"Host": f"127.0.0.1:{server.port}"})
        response = connection.getresponse()
        page = response.read().decode()
    finally:
        connection.close()
    assert response.status == 200, page
    assert "<th title=" in page and ">roofline</th>" in page
    return [
        (kind, [html.unescape(re.sub(r"<[^>]+>", "", cell)).strip() for cell in CELL.findall(row)])
        for kind, row in ROW.findall(page)
    ]


def test_the_run_page_says_each_matmul_s_bound_as_ops_json_has_it(server: DashboardServer, results: Path) -> None:
    run = next(results.glob(f"*/*/*/{MEASURED}"))
    ops = load_ops(run)
    assert ops.roofline is not None and ops.roofline.memory_bound and ops.roofline.compute_bound
    graphs = {d.node_id: d.graph_id for d in ops.delegates}
    rows = operator_rows(server, MEASURED)
    said = 0
    for kind, cells in rows:
        node_id, roofline = cells[0], cells[-1]
        found = None
        if kind == "XNNPACK node":
            call, node = node_id.split("/")
            found = ops.node_roofline(graphs[call], node)
        if found is None:
            assert roofline == "", (node_id, roofline)
        else:
            assert roofline == found.label and LABEL.match(roofline), (node_id, roofline)
            said += 1
    assert said and said < len(rows), "the FC and batch matmul nodes say it, the other rows do not"


def test_a_board_without_its_limits_leaves_the_column_blank(server: DashboardServer, results: Path) -> None:
    run = next(results.glob(f"*/*/*/{UNMEASURED}"))
    ops = load_ops(run)
    assert ops.roofline is not None and ops.roofline.limits.bandwidth_gb_per_s is None  # the work, no limits
    rows = operator_rows(server, UNMEASURED)
    assert rows and all(cells[-1] == "" for _, cells in rows)
    assert json.loads((run / "analysis" / "ops.json").read_text())["roofline"]["rows"][0]["roofline_pct"] is None
