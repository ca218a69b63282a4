"""The dashboard's pages: Jinja2 templates (autoescaped) over the plain data of data.py.

Data for the plots travels in `<script type="application/json">` blocks written with Jinja2's `tojson`, which
escapes `<`, `>`, `&` and `'`, so no board-controlled string can close the block or become markup, and writes NaN
and Infinity as null (strictjson.dumps), so the block always parses; the page's one script (assets/dashboard.js)
parses the block and hands the values to Plotly. No value is ever concatenated into JavaScript. Links come from a
`Links` object, so the same templates serve the live server and the static export.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode

import jinja2

from orchestrator import strictjson
from orchestrator.servers.dashboard.data import VERDICT_ORDER

ASSETS_DIR = Path(__file__).parent / "assets"
TEMPLATES_DIR = Path(__file__).parent / "templates"
OWN_ASSETS = ("dashboard.js", "dashboard.css")
PLOTLY_JS = "plotly.min.js"


def plotly_js() -> bytes:
    """Plotly's own bundle as the `plotly` package ships it: served from here, never from a CDN."""
    from plotly.offline import get_plotlyjs

    return get_plotlyjs().encode()


def asset(name: str) -> bytes:
    """One of the files the pages load: Plotly's bundle or the dashboard's own script and style."""
    if name == PLOTLY_JS:
        return plotly_js()
    if name in OWN_ASSETS:
        return (ASSETS_DIR / name).read_bytes()
    raise KeyError(name)


@dataclass(frozen=True)
class Links:
    """Where each page lives: routes of the live server, or files of a static export (relative, so the folder
    opens from file:// anywhere)."""

    static: bool = False

    def overview(self) -> str:
        return "index.html" if self.static else "/"

    def trend(self, key: str) -> str:
        return f"trend-{key}.html" if self.static else f"/trend/{quote(key, safe='')}"

    def run(self, run_id: str) -> str:
        return f"run-{run_id}.html" if self.static else f"/run/{quote(run_id, safe='')}"

    def compare(self, run_a: str, run_b: str) -> str:
        if self.static:
            return f"compare-{run_a}--{run_b}.html"
        return "/compare?" + urlencode({"a": run_a, "b": run_b})

    def asset(self, name: str) -> str:
        return f"assets/{name}" if self.static else f"/assets/{name}"


@functools.cache
def environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(TEMPLATES_DIR),
        autoescape=True,  # every page, whatever its file name: board strings are text, never markup
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.policies["json.dumps_function"] = strictjson.dumps  # page data is strict JSON: NaN would fail JSON.parse
    env.filters["ms"] = _ms
    env.filters["mb"] = _mb
    env.filters["css"] = lambda verdict: "verdict-" + "-".join(str(verdict).split())
    return env


def _ms(value: Any, digits: int = 3) -> str:
    return "–" if not isinstance(value, int | float) else f"{value:.{digits}f} ms"


def _mb(value: Any) -> str:
    return "–" if not isinstance(value, int | float) else f"{value / 1e6:.1f} MB"


def render(template: str, links: Links, title: str, data: dict[str, Any], **context: Any) -> str:
    """A page: `data` is both the template's context and, as `page-data`, what the script plots."""
    return (
        environment()
        .get_template(template)
        .render(links=links, title=title, data=data, verdicts=VERDICT_ORDER, **context)
    )


def overview_page(data: dict[str, Any], links: Links) -> str:
    return render("overview.html", links, "etlab lab overview", data)


def trend_page(data: dict[str, Any], links: Links) -> str:
    cell = data["cell"]
    title = f"{cell['board']} · {cell['model']} · {cell['backend']}: night by night"
    return render("trend.html", links, title, data)


def run_page(data: dict[str, Any], links: Links) -> str:
    return render("run.html", links, f"run {data['run']['run_id']}", data)


def problem_page(name: str, problem: str, links: Links) -> str:
    """A page that could not be made from its data (named by `problem`: the file and the field)."""
    return render("problem.html", links, f"{name}: cannot be shown", {"problem": problem})


def compare_page(data: dict[str, Any], links: Links, run_ids: list[str] | None = None) -> str:
    picked = data["a"] is not None and data["b"] is not None
    title = f"compare {data['a']['run_id']} → {data['b']['run_id']}" if picked else "compare two runs"
    return render("compare.html", links, title, data, run_ids=run_ids or [])
