"""Where in the model, on the dashboard (servers/dashboard/where.py), in Chromium: on runs of distilbert-tiny by the
real native runner on the local board, the run page's top operators are the XNNPACK nodes inside the delegate with
their module and line, its module chart's largest top-level element is the module the analysis ranks first, and the
compare page of an xnnpack run against a portable one has a row per common module with the sign of its change. A
results folder from before source maps (summary.json without `modules`) still renders, saying so once."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from orchestrator.results.compare_modules import module_medians
from orchestrator.results.documents import load_summary
from orchestrator.results.modules import rolled_up
from orchestrator.results.ops_record import load_ops
from orchestrator.servers.dashboard.app import DashboardServer, Sources, start_dashboard
from tests.plugins.analysis import BundleCase
from tests.plugins.artifacts import ARTIFACT_CACHE
from tests.plugins.browser import SCREENSHOTS
from tests.plugins.dashboard import LAB_BOARD, pulled_run
from tests.plugins.explorer import free_port

if TYPE_CHECKING:
    from playwright.sync_api import ConsoleMessage

XNNPACK, PORTABLE, OLD = "20261201T020000Z-00x111", "20261201T030000Z-00p222", "20261201T040000Z-00o333"
MARKUP = "20261201T050000Z-00m444"
# A module name with markup Plotly would render (bold, a link): a model's names are shown as text, never as HTML.
MARKUP_NAME = "<b>emb</b><a href='/elsewhere'>link</a>"


@dataclass(frozen=True)
class ModulesLab:
    runs: dict[str, Path]
    server: DashboardServer


@pytest.fixture(scope="module")
def modules_lab(
    runner_bundles: dict[str, BundleCase], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ModulesLab]:
    results = tmp_path_factory.mktemp("modules-lab") / "results"
    runs = {
        XNNPACK: pulled_run(runner_bundles["runner_distilbert_xnnpack"], results, XNNPACK),
        PORTABLE: pulled_run(runner_bundles["runner_distilbert_portable"], results, PORTABLE),
        OLD: pulled_run(runner_bundles["runner_distilbert_xnnpack"], results, OLD),
        MARKUP: pulled_run(runner_bundles["runner_distilbert_xnnpack"], results, MARKUP),
    }
    marked = runs[MARKUP] / "analysis" / "summary.json"
    text = marked.read_text()
    assert ".embeddings" in text
    marked.write_text(text.replace(".embeddings", "." + json.dumps(MARKUP_NAME)[1:-1]))
    # A results folder from before source maps: its summary has no `modules`, its operators none.
    summary = runs[OLD] / "analysis" / "summary.json"
    document = json.loads(summary.read_text())
    del document["modules"]
    summary.write_text(json.dumps(document))
    ops = runs[OLD] / "analysis" / "ops.json"
    document = json.loads(ops.read_text())
    for row in [*document["instructions"], *(node for d in document["delegates"] for node in d["nodes"])]:
        row["module"] = row["module_type"] = None
    ops.write_text(json.dumps(document))
    handle = start_dashboard(Sources(results, None, ARTIFACT_CACHE, (LAB_BOARD,)), port=free_port(),
                             explorer_port=free_port())  # fmt: skip
    try:
        yield ModulesLab(runs, handle)
    finally:
        handle.stop()


def opened(page: Any, url: str) -> list[str]:
    problems: list[str] = []

    def on_console(message: ConsoleMessage) -> None:
        if message.type == "error":
            problems.append(message.text)

    page.on("console", on_console)
    page.on("pageerror", lambda error: problems.append(f"uncaught: {error}"))
    page.goto(url)
    page.wait_for_load_state("load")
    return problems


def test_the_run_page_shows_the_xnnpack_nodes_and_the_module_tree(modules_lab: ModulesLab, browser_page: Any) -> None:
    page = browser_page
    problems = opened(page, modules_lab.server.url + f"run/{XNNPACK}")
    rows = page.locator("#operators-table tr.operator-row[data-kind='XNNPACK node']")
    assert rows.count() > 0
    modules = set(
        page.locator("#operators-table tr.operator-row[data-kind='XNNPACK node'] td.module").all_inner_texts()
    )
    tree = load_summary(modules_lab.runs[XNNPACK]).modules
    assert tree is not None
    known = {row.module for row in tree.modules}
    assert modules & known and modules <= known | {"–"}, modules
    assert any(text.startswith("XNN") for text in rows.locator("td:nth-child(3)").all_inner_texts())
    # each node with the dims of its output, as the delegate's graph has them: the ops record's, drawn as 1×128×64
    ops = load_ops(modules_lab.runs[XNNPACK])
    shapes = {"×".join(map(str, n.shape)) for d in ops.delegates for n in d.nodes if n.shape and n.mean_ms > 0}
    shown = set(rows.locator("td:nth-child(3) .shape").all_inner_texts())
    assert shown and shown <= shapes, (shown, shapes)
    assert page.locator("#delegate-groups tbody tr").count() >= 1  # the delegate call: a group, not a row
    # The chart: Plotly's treemap of the module tree; its largest top-level element is the analysis's first.
    page.wait_for_function("document.getElementById('run-modules') && document.getElementById('run-modules').data")
    (trace,) = page.evaluate("document.getElementById('run-modules').data")
    assert trace["type"] == "treemap"
    own = dict(zip(trace["ids"], trace["values"], strict=True))
    parents = dict(zip(trace["ids"], trace["parents"], strict=True))

    def subtree(module: str) -> float:
        return own[module] + sum(subtree(child) for child, parent in parents.items() if parent == module)

    roots = [module for module, parent in parents.items() if parent == ""]
    largest = max(roots, key=subtree)
    assert len(roots) > 1 and largest == rolled_up(tree, 1)[0].module, (largest, roots)
    drawn = page.locator("#run-modules g.slice").all_text_contents()
    assert any(text.startswith(largest.rsplit(".", 1)[-1]) for text in drawn), drawn  # drawn with its name on it
    assert page.locator("#modules-table td.module").first.inner_text() == largest
    assert page.locator("#modules-missing").count() == 0
    page.screenshot(path=str(SCREENSHOTS / "dashboard-run-modules.png"), full_page=True)
    assert not problems, problems


def test_compare_shows_the_modules_change(modules_lab: ModulesLab, browser_page: Any) -> None:
    page = browser_page
    problems = opened(page, modules_lab.server.url + f"compare?a={XNNPACK}&b={PORTABLE}")
    # by medians, as every other figure of a comparison (summary.json's module tree is of means)
    times_a = module_medians(load_ops(modules_lab.runs[XNNPACK]))
    times_b = module_medians(load_ops(modules_lab.runs[PORTABLE]))
    assert times_a is not None and times_b is not None
    common = set(times_a) & set(times_b)
    rows = page.locator("#modules-compare tr.module-delta")
    shown = {row.get_attribute("data-module"): float(row.get_attribute("data-delta")) for row in rows.all()}
    assert set(shown) == common and len(common) > 3
    for module, delta in shown.items():
        assert (delta > 0) == (times_b[module] > times_a[module]), module
    # portable's kernels are far slower than XNNPACK's: the model as a whole got slower, by far
    assert shown["distilbert"] > 0 and times_b["distilbert"] > 2 * times_a["distilbert"]
    deltas = [abs(delta) for delta in shown.values()]
    assert deltas == sorted(deltas, reverse=True)
    assert not problems, problems


def test_a_run_from_before_source_maps_still_renders(modules_lab: ModulesLab, browser_page: Any) -> None:
    page = browser_page
    problems = opened(page, modules_lab.server.url + f"run/{OLD}")
    assert page.locator("#modules-missing").count() == 1
    assert "source map" in page.locator("#modules-missing").inner_text()
    assert page.locator("#run-modules").count() == 0 and page.locator("#operators-table tr").count() > 1
    opened(page, modules_lab.server.url + f"compare?a={OLD}&b={XNNPACK}")
    assert page.locator("#modules-missing").count() == 1 and page.locator("#modules-compare").count() == 0
    assert "run A" in page.locator("#modules-missing").inner_text()
    assert not problems, problems


def test_the_module_chart_shows_a_modules_markup_as_text(modules_lab: ModulesLab, browser_page: Any) -> None:
    """Plotly renders <b> and <a href> in its text: a module named with them is drawn as the characters it has."""
    page = browser_page
    problems = opened(page, modules_lab.server.url + f"run/{MARKUP}")
    page.wait_for_function("document.getElementById('run-modules') && document.getElementById('run-modules').data")
    page.wait_for_selector("#run-modules g.slice")
    drawn = page.locator("#run-modules g.slice").all_text_contents()
    assert any(MARKUP_NAME in text for text in drawn), drawn
    assert page.locator("#run-modules svg a").count() == 0, "a module's name became a link"
    bold = page.evaluate(
        "Array.from(document.querySelectorAll('#run-modules tspan'))"
        ".filter((t) => (t.getAttribute('style') || '').includes('bold')).map((t) => t.textContent)"
    )
    assert "emb" not in bold, bold
    assert not problems, problems
