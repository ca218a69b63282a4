"""A night cell's findings on the dashboard's overview and in the nightly report: the findings an analysis prints
(advice/findings.py's shown_findings), counted as listed ("4 of 8 findings"), with where the rest are. Built on the
advisor's recorded gpt2-tiny run (8 findings, 4 of them worth a line): no board, no model."""

from __future__ import annotations

import re
from pathlib import Path

from orchestrator.advice.advisor import advise
from orchestrator.advice.documents import write_advice
from orchestrator.commands.render_advice import advice_lines
from orchestrator.lab.report import _findings_html
from orchestrator.servers.dashboard import data, pages
from orchestrator.servers.dashboard.records import Column, Grid, GridCell, OverviewPage
from tests.advice.advice_helpers import facts_of, recorded

RUN_ID = "20261206T000000Z-000f54"


def test_a_cells_findings_are_counted_as_listed_on_the_overview_and_in_the_report(tmp_path: Path) -> None:
    advice = advise(facts_of(recorded("gpt2-tiny")))
    run = tmp_path / "results" / "local" / "gpt2-tiny" / "xnnpack" / RUN_ID
    (run / "analysis").mkdir(parents=True)
    (run / "result_manifest.json").write_text("{}")
    write_advice(run, advice)
    printed = [line.split()[0] for line in advice_lines(advice)[:-1]]  # the ids an analysis prints (then the total)
    assert 0 < len(printed) < len(advice.findings)  # some are left to `fab advise`: the case that was miscounted

    rows, _ = data._advice(run)  # the run page lists them all, the printed ones marked
    assert len(rows) == len(advice.findings) and [row.id for row in rows if row.printed] == printed
    found = data._findings(data.Lab(tmp_path / "results"), RUN_ID)
    assert [line.split()[0] for line in found["findings"]] == printed
    more = len(advice.findings) - len(printed)
    assert found["findings_said"] == f"{len(printed)} of {len(advice.findings)} findings"
    assert found["findings_more"] == f"{more} more: fab advise --run {advice.run_id}"
    cell = GridCell(board="local", model="gpt2-tiny", backend="xnnpack", key="k", verdict="ok", median_ms=1.0,
                    decode_tokens_per_s=None, run_id=RUN_ID, has_run=True, detail="", **found)  # fmt: skip
    page = OverviewPage(night="2026-12-06", boards=[], looked=False, counts={}, runs=[],
                        grid=Grid(boards=["local"], columns=[Column(model="gpt2-tiny", backend="xnnpack")],
                                  rows=[[cell]]))  # fmt: skip
    overview = pages.render("overview.html", pages.Links(), "overview", page)
    (details,) = re.findall(r'<details class="findings">(.*?)</details>', overview, re.S)
    for html in (details, _findings_html(str(run))):
        said = re.search(r"<summary>(.*?)</summary>", html)
        assert said is not None and said.group(1) == f"{len(printed)} of {len(advice.findings)} findings"
        items = re.findall(r"<li[^>]*>(.*?)</li>", html)
        assert [item.split()[0] for item in items[:-1]] == printed  # each listed finding, then where the rest are
        assert items[-1] == f"{more} more: fab advise --run {advice.run_id}"
