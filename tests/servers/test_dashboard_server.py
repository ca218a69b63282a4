"""The dashboard's server without a browser: its guard (plain HTTP), pages answering while Model Explorer starts
(one for concurrent requests), what the overview and trends take from a real history (SQLite and PostgreSQL), either
source alone, `fab dashboard` at its edge (options, --static, SIGTERM).
The pages in Chromium: test_dashboard_browser.py."""

from __future__ import annotations

import http.client
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from orchestrator.lab.history import History
from orchestrator.paths import PROJECT_ROOT
from orchestrator.servers.dashboard import data, pages
from orchestrator.servers.dashboard.app import DashboardServer, Sources, start_dashboard
from orchestrator.servers.dashboard.records import NightSpan
from orchestrator.servers.explorer import ensure_port_free
from tests.plugins.artifacts import ARTIFACT_CACHE
from tests.plugins.dashboard import EVIL, EVIL_BOARD, LAB_BOARD, RUN_IDS, VERDICTS, DashboardLab, night, write_history
from tests.plugins.explorer import free_port

CELLS = [(EVIL_BOARD, "distilbert-tiny", "xnnpack"), ("pi5", "gpt2-tiny", "portable"), ("pi5", "gpt2-tiny", "xnnpack")]
NIGHTS = 12


@pytest.fixture
def history_file(tmp_path: Path) -> Path:
    write_history(tmp_path / "history.sqlite", CELLS, NIGHTS).close()
    return tmp_path / "history.sqlite"


@pytest.fixture
def server(tmp_path: Path, history_file: Path) -> Iterator[DashboardServer]:
    handle = start_dashboard(Sources(tmp_path / "results", f"sqlite:///{history_file}"), port=free_port())
    try:
        yield handle
    finally:
        handle.stop()


def request(server: DashboardServer, path: str, method: str = "GET", **headers: str) -> tuple[int, str]:
    connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    try:
        connection.request(method, path, headers={"Host": f"127.0.0.1:{server.port}", **headers})
        response = connection.getresponse()
        return response.status, response.read().decode()
    finally:
        connection.close()


def test_guard_serves_own_pages_and_refuses_other_sites(server: DashboardServer) -> None:
    own = f"http://127.0.0.1:{server.port}"
    assert request(server, "/")[0] == 200
    assert request(server, "/", **{"Sec-Fetch-Site": "same-origin"})[0] == 200
    assert request(server, "/assets/plotly.min.js")[0] == 200
    refused = [
        request(server, "/", Host=f"rebound.example:{server.port}"),  # DNS rebinding
        request(server, "/", Host=f"127.0.0.1:{server.port + 1}"),
        request(server, "/", **{"Sec-Fetch-Site": "cross-site"}),
        request(server, "/", **{"Sec-Fetch-Site": "same-site"}),  # another port of this host
        request(server, "/", Origin="http://evil.example"),
        request(server, "/explore/x", "POST"),  # a POST must carry its page's Origin
        request(server, "/explore/x", "POST", Origin="http://evil.example"),
        request(server, "/explore/x", "POST", Origin="null"),
    ]
    assert [status for status, _ in refused] == [403] * len(refused)
    assert all("forbidden" in body for _, body in refused)
    # Its own page's POST passes the guard and reaches the app: no such run.
    assert request(server, "/explore/no-such-run", "POST", Origin=own)[0] == 404
    assert request(server, "/run/no-such-run")[0] == 404
    assert request(server, "/assets/../../etc/passwd")[0] == 404
    assert request(server, "/", "DELETE", Origin=own)[0] == 405


def test_pages_answer_while_model_explorer_starts_and_two_posts_start_one(
    dashboard_lab: DashboardLab, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Model Explorer starts (seconds) outside the page lock: an asset and a page asked for meanwhile answer before
    that start is over. Two concurrent POSTs of one run start one Model Explorer; the second reuses it."""
    from orchestrator.servers.dashboard import app

    launching, launches = threading.Event(), []
    launch = app.launch_explorer

    def counted(*args: Any, **kwargs: Any) -> Any:  # the real launch, counted
        launches.append(args)
        launching.set()
        return launch(*args, **kwargs)

    monkeypatch.setattr(app, "launch_explorer", counted)
    sources = Sources(dashboard_lab.results, dashboard_lab.history_url, ARTIFACT_CACHE, (LAB_BOARD,))
    server = start_dashboard(sources, port=free_port(), explorer_port=free_port())
    done: dict[str, tuple[float, int, str | None]] = {}

    def timed(name: str, path: str, method: str = "GET", **headers: str) -> None:
        connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=300)
        try:
            connection.request(method, path, headers={"Host": f"127.0.0.1:{server.port}", **headers})
            response = connection.getresponse()
            response.read()
            done[name] = (time.monotonic(), response.status, response.getheader("Location"))
        finally:
            connection.close()

    try:
        own = {"Origin": f"http://127.0.0.1:{server.port}"}
        posts = [threading.Thread(target=timed, args=(f"post {n}", f"/explore/{RUN_IDS['distilbert_a']}", "POST"),
                                  kwargs=own) for n in (1, 2)]  # fmt: skip
        for post in posts:
            post.start()
        assert launching.wait(120), "no Model Explorer was started"
        timed("asset", "/assets/dashboard.css")
        timed("page", "/")
        for post in posts:
            post.join(300)
        assert [done[name][1] for name in ("asset", "page", "post 1", "post 2")] == [200, 200, 303, 303], done
        first_post = min(done["post 1"][0], done["post 2"][0])
        assert done["asset"][0] < first_post and done["page"][0] < first_post, done  # not behind the start
        assert len(launches) == 1, launches
        assert done["post 1"][2] == done["post 2"][2] == server.app.explorer.handle.url  # type: ignore[union-attr]
        assert server.app.explorer.handle is not None and server.app.explorer.handle.running
    finally:
        server.stop()


def test_overview_is_the_latest_night_of_the_history(server: DashboardServer, history_file: Path) -> None:
    status, page = request(server, "/")
    assert status == 200
    history = History(f"sqlite:///{history_file}")
    try:
        latest = history.records(night=night(NIGHTS - 1))
    finally:
        history.close()
    overview = data.overview(data.Lab(None, History(f"sqlite:///{history_file}")))
    assert overview.night == night(NIGHTS - 1)
    shown = {(c.board, c.model, c.backend): c for row in overview.grid.rows for c in row if c}
    assert {cell: c.verdict for cell, c in shown.items()} == {r.cell: r.verdict for r in latest}
    assert {cell: c.median_ms for cell, c in shown.items()} == {r.cell: r.median_ms for r in latest}
    for cell in CELLS:  # every cell links to its trend page
        assert f'href="/trend/{data.cell_key(cell)}"' in page
    assert EVIL not in page  # board text is escaped: no markup of its own
    assert "&lt;img src=x onerror=alert(1)&gt;" in page


def test_trend_holds_every_night_and_marks_changes(history_file: Path) -> None:
    history = History(f"sqlite:///{history_file}")
    try:
        trend = data.trend(data.Lab(None, history), CELLS[1])
        stored = list(reversed(history.records(cell=CELLS[1])))
    finally:
        history.close()
    points = trend.points
    assert [p.night for p in points] == [r.night for r in stored] == [night(i) for i in range(NIGHTS)]
    assert [p.median_ms for p in points] == [r.median_ms for r in stored]
    assert [p.p90_ms for p in points] == [r.p90_ms for r in stored]
    assert [p.peak_mb for p in points] == [r.peak_rss_bytes / 1e6 for r in stored]  # type: ignore[operator]
    assert [p.verdict for p in points] == [VERDICTS[(i + 1) % len(VERDICTS)] for i in range(NIGHTS)]
    assert [p.night for p in points if p.new_program] == [night(6)]  # the .pte hash changed that night
    # The latest night's baseline: the 7 nights before it that may be one (the inconclusive night is not).
    eligible = [p.night for p in points[:-1] if p.verdict != "inconclusive"]
    assert trend.baseline == NightSpan(first=eligible[-7], last=eligible[-1])


def test_trend_shows_energy_and_the_roofline_share_with_gaps_for_nights_not_measured(tmp_path: Path) -> None:
    """Energy per night (J per inference; a language model's mJ per token) and the decode's roofline share, in the
    trend's table and its plot data: a night that did not measure them is a dash and null (a gap), never 0."""
    import json
    import re

    from orchestrator.lab.run_record import RunRecord
    from orchestrator.results.summary import DecodeRoofline, EnergySummary, Generation

    measured = EnergySummary(status="measured", mean_watts=6.5, joules_per_inference=0.13, joules_per_token=0.0125)
    not_measured = EnergySummary(status="not measured", why="no PMIC on this board")
    history = History(f"sqlite:///{tmp_path / 'history.sqlite'}")
    vision, lm = ("pi5", "distilbert-tiny", "xnnpack"), ("pi5", "smollm2", "xnnpack")
    for index, (energy, share) in enumerate([(measured, 0.62), (not_measured, None), (None, None)]):
        roofline = DecodeRoofline(weights_bytes=9, kv_bytes_per_token=1, bytes_per_token=10, achieved_gb_per_s=4.5,
                                  bandwidth_gb_per_s=share and 4.5 / share, share=share)  # fmt: skip
        generation = Generation(prompt_len=8, new_tokens=8, context=64, generations=3, ttft_ms=2.5,
                                prefill_tokens_per_s=3200.0, decode_tokens_per_s=500.0, roofline=roofline)  # fmt: skip
        for cell in (vision, lm):
            history.record(RunRecord(run_id=f"{index}-{cell[1]}", night=night(index), board=cell[0], model=cell[1],
                                     backend=cell[2], status="ok", validity="valid", median_ms=20.0, energy=energy,
                                     generation=generation if cell == lm else None))  # fmt: skip
    try:
        pages_of = {cell: data.trend(data.Lab(None, history), cell) for cell in (vision, lm)}
    finally:
        history.close()
    shown = pages_of[vision]
    assert shown.measures_energy and [p.joules_per_inference for p in shown.points] == [0.13, None, None]
    assert [p.roofline_share for p in pages_of[lm].points] == [0.62, None, None]
    assert [p.mj_per_token for p in pages_of[lm].points] == [12.5, None, None]

    def column(page: str, name: str) -> list[str]:
        return [re.sub(r"<[^>]+>", "", cell) for cell in re.findall(rf'<td class="{name}">(.*?)</td>', page)]

    page = pages.render_page("trend", shown, pages.Links())
    assert "<th>J/inference</th>" in page and "<th>roofline</th>" not in page and 'id="trend-energy"' in page
    assert column(page, "energy") == ["–", "–", "0.13"]  # newest night first
    plotted = json.loads(re.findall(r'id="page-data">(.*?)</script>', page, re.S)[0])
    assert [p["joules_per_inference"] for p in plotted["points"]] == [0.13, None, None]
    page = pages.render_page("trend", pages_of[lm], pages.Links())
    assert "<th>mJ/token</th>" in page and "<th>roofline</th>" in page and 'id="trend-roofline"' in page
    assert column(page, "energy") == ["–", "–", "12.5"] and column(page, "roofline") == ["–", "–", "62 %"]


def test_either_source_alone(tmp_path: Path, history_file: Path) -> None:
    absent = tmp_path / "nothing" / "history.sqlite"
    empty = Sources(tmp_path / "no-results", f"sqlite:///{absent}")
    page = pages.render_page("overview", data.overview(empty.lab()), pages.Links())
    assert "No nightly history" in page and "No pulled runs" in page
    assert not absent.exists()  # the dashboard reads: it never creates a history
    only_history = Sources(tmp_path / "no-results", f"sqlite:///{history_file}")
    assert data.overview(only_history.lab()).night == night(NIGHTS - 1)
    only_history.close()


def test_postgresql_history(postgres_url: str) -> None:
    history = History(postgres_url)
    try:
        with history.engine.begin() as connection:
            connection.exec_driver_sql("DELETE FROM runs")
    finally:
        history.close()
    write_history(Path("unused"), CELLS[:1], 3, url=postgres_url).close()
    sources = Sources(None, postgres_url)
    try:
        points = data.trend(sources.lab(), CELLS[0]).points
    finally:
        sources.close()
    assert [p.median_ms for p in points] == [10.0, 10.5, 11.0]


def test_stop_frees_the_port(tmp_path: Path, history_file: Path) -> None:
    port = free_port()
    handle = start_dashboard(Sources(None, f"sqlite:///{history_file}"), port=port)
    handle.stop()
    ensure_port_free("127.0.0.1", port)  # raises PortBusy if the socket were still open


def fab(*args: str, tmp_path: Path) -> list[str]:
    return [sys.executable, "-m", "fabric", "dashboard", *args]


def fab_env(tmp_path: Path) -> dict[str, str]:
    return {**os.environ, "ETLAB_RESULTS": str(tmp_path / "results"), "ETLAB_INVENTORY": str(tmp_path / "none.yaml")}


def test_fab_dashboard_options_and_static(tmp_path: Path, history_file: Path) -> None:
    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            fab(*args, tmp_path=tmp_path), cwd=PROJECT_ROOT, env=fab_env(tmp_path), capture_output=True, text=True,
            timeout=300,
        )  # fmt: skip

    bad_port = run("--port", "70000")
    assert bad_port.returncode == 64 and "--port" in bad_port.stderr
    (tmp_path / "a-file").write_text("")
    bad_folder = run("--static", str(tmp_path / "a-file"))
    assert bad_folder.returncode == 64 and "--static" in bad_folder.stderr
    assert "Traceback" not in bad_port.stderr + bad_folder.stderr
    done = run("--static", str(tmp_path / "site"), "--history", f"sqlite:///{history_file}")
    assert done.returncode == 0, done.stderr
    written = {p.name for p in (tmp_path / "site").iterdir()}
    assert {"index.html", "assets", *(f"trend-{data.cell_key(cell)}.html" for cell in CELLS)} <= written
    assert (tmp_path / "site" / "assets" / "plotly.min.js").stat().st_size > 1_000_000


def test_the_readme_says_a_server_stopped_on_purpose_exits_0() -> None:
    """The test below (and tests/servers/test_explorer.py's) see a server stopped by SIGTERM exit 0; the README's
    exit-code table once said 130 for every task. It says why a server differs."""
    rows = [line for line in (PROJECT_ROOT / "README.md").read_text().splitlines() if line.startswith("| 130 |")]
    assert len(rows) == 1, rows
    assert "A server stopped while it serves" in rows[0] and "exits 0" in rows[0], rows[0]
    assert "`fab dashboard`" in rows[0] and "`fab explore`" in rows[0]


def test_fab_dashboard_stops_on_sigterm_and_frees_its_port(tmp_path: Path, history_file: Path) -> None:
    port = free_port()
    args = fab("--port", str(port), "--no-browser", "--history", f"sqlite:///{history_file}", tmp_path=tmp_path)
    process = subprocess.Popen(
        args, cwd=PROJECT_ROOT, env=fab_env(tmp_path), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    try:
        assert process.stdout is not None
        lines = []
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            line = process.stdout.readline()
            lines.append(line)
            if f"http://127.0.0.1:{port}/" in line or not line:
                break
        assert any(f"http://127.0.0.1:{port}/" in line for line in lines), "".join(lines)
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        connection.request("GET", "/", headers={"Host": f"127.0.0.1:{port}"})
        assert connection.getresponse().status == 200
        connection.close()
        process.send_signal(signal.SIGTERM)
        assert process.wait(30) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    ensure_port_free("127.0.0.1", port)


def test_the_nightly_writes_the_static_dashboard_and_survives_its_failure(
    tmp_path: Path, history_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from orchestrator.commands.dashboard import nightly_dashboard

    folder = tmp_path / "reports" / f"dashboard-{night(NIGHTS - 1)}"
    index = nightly_dashboard(Sources(tmp_path / "results", f"sqlite:///{history_file}"), folder)
    assert index == folder / "index.html" and night(NIGHTS - 1) in index.read_text()
    (tmp_path / "a-file").write_text("")
    assert nightly_dashboard(Sources(None, f"sqlite:///{history_file}"), tmp_path / "a-file") is None
    assert "the static dashboard was not written" in capsys.readouterr().err
