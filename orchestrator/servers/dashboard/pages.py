"""The dashboard's pages: Jinja2 templates (autoescaped) over the typed records data.py assembles.

Data for the plots travels in `<script type="application/json">` blocks written with Jinja2's `tojson`, which
escapes `<`, `>`, `&` and `'`, so no board-controlled string can close the block or become markup, and writes NaN
and Infinity as null (strictjson.dumps), so the block always parses; the page's one script (assets/dashboard.js)
parses the block and hands the values to Plotly. No value is ever concatenated into JavaScript. Links come from a
`Links` object, so the same templates serve the live server and the static export.

A page is one row of `PAGES` (its route, data, template and static export): the live server (app.py), the static
export (static.py) and the links read it, so adding a page is adding a row (and its template, when no existing one
fits).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode

import jinja2

from orchestrator import strictjson
from orchestrator.console import format_bytes
from orchestrator.deploy.board_status import BoardStatus
from orchestrator.names import is_valid_name
from orchestrator.servers.dashboard import data
from orchestrator.servers.dashboard.data import VERDICT_ORDER
from orchestrator.servers.dashboard.records import ComparePage, ProblemPage, TrendPage, plain

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
    opens from file:// anywhere). `links.<page>(*params)` is the link to a page of PAGES (`links.run(run_id)`)."""

    static: bool = False

    def to(self, name: str, *params: str) -> str:
        """The link to page `name` of PAGES named by `params` (none: a page that takes none, or a form's page)."""
        page = PAGES[name]
        if self.static:
            return page.file_name(params)
        if not page.route:
            return "/"
        if page.query:
            return f"/{page.route}" + ("?" + urlencode(dict(zip(page.params, params, strict=True))) if params else "")
        return "/" + "/".join([page.route, *(quote(value, safe="") for value in params)])

    def __getattr__(self, name: str) -> Callable[..., str]:
        if name.startswith("_") or name not in PAGES:
            raise AttributeError(name)
        return functools.partial(self.to, name)

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
    env.filters["bytes"] = _bytes  # a tiny model's KV cache of 32 kB is no "0.0 MB"
    env.filters["css"] = lambda verdict: "verdict-" + "-".join(str(verdict).split())
    return env


def _ms(value: Any, digits: int = 3) -> str:
    return "–" if not isinstance(value, int | float) else f"{value:.{digits}f} ms"


def _mb(value: Any) -> str:
    return "–" if not isinstance(value, int | float) else f"{value / 1e6:.1f} MB"


def _bytes(value: Any) -> str:
    return "–" if not isinstance(value, int) else format_bytes(value)


def render(template: str, links: Links, title: str, data: Any, **context: Any) -> str:
    """A page: `data`, its typed record, is the template's context and, as plain JSON in `page-data`, what the
    script plots."""
    return (
        environment()
        .get_template(template)
        .render(links=links, title=title, data=data, page_data=plain(data), verdicts=VERDICT_ORDER, **context)
    )


@dataclass
class Site:
    """What a page is made from: the lab (read once per page load, or once per static export), the inventory's board
    names and a look at the boards (the overview's)."""

    lab: data.Lab
    inventory_boards: tuple[str, ...] = ()
    live: Mapping[str, BoardStatus] | None = None

    @functools.cached_property
    def cells(self) -> dict[str, data.Cell]:
        """The history's cells by key (read once: a static export makes a trend page per cell)."""
        return {data.cell_key(cell): cell for cell in data.cells(self.lab)}

    @functools.cached_property
    def picker(self) -> dict[str, Any]:
        """The compare form's runs and default pair (made once: a static export renders many comparisons)."""
        return _picker(self)


@dataclass(frozen=True)
class Page:
    """One dashboard page: a row of PAGES is all the live server, the static export and the links know of it.

    `route` is its URL's first segment (the overview's: ""); `params` name one page: path segments after the route,
    or with `query` the query string's fields (as a form sends them; without them the page is the form alone).
    `assemble(site, *params)` is its data (data.NotFound: a 404), rendered by `template` under `title(data)`, with
    `context(site)` as more template values. `exported(site)` lists the params of every page of it a static export
    writes, as `<route>-<params joined by -->.html` (the overview: index.html); None: none is exported."""

    route: str
    params: tuple[str, ...]
    assemble: Callable[..., Any]  # a record of records.py
    template: str
    title: Callable[[Any], str]
    exported: Callable[[Site], Iterable[tuple[str, ...]]] | None = None
    query: bool = False
    context: Callable[[Site], dict[str, Any]] | None = None

    def file_name(self, params: Sequence[str]) -> str:
        return f"{self.route}-{'--'.join(params)}.html" if self.route else "index.html"

    def render(self, site: Site, params: Sequence[str], links: Links) -> str:
        """The page named by `params` (their number checked by the caller)."""
        found = self.assemble(site, *params)
        more = self.context(site) if self.context is not None else {}
        return render(self.template, links, self.title(found), found, **more)


def _trend(site: Site, key: str) -> TrendPage:
    cell = site.cells.get(key)
    if cell is None:
        raise data.NotFound("no such cell in the history")
    return data.trend(site.lab, cell)


def _trend_title(found: TrendPage) -> str:
    cell = found.cell
    return f"{cell.board} · {cell.model} · {cell.backend}: night by night"


def _exported_runs(site: Site) -> list[tuple[str]]:
    """Every pulled run whose id is a valid name (a folder made by hand gets no file: none is named from it)."""
    return [(run.run_id,) for run in site.lab.runs() if is_valid_name(run.run_id)]


def _compare(site: Site, run_a: str | None = None, run_b: str | None = None) -> ComparePage:
    if run_a is None or run_b is None:
        return ComparePage(a=None, b=None)  # the form alone
    return data.compare_page(site.lab, run_a, run_b)


PICKER_RUNS = 500  # the newest pulled runs the compare picker offers


def _picker(site: Site) -> dict[str, Any]:
    """The compare form's runs (newest first, each with what its filters select by) and the pair it shows when none
    is asked for: the newest run, and the run before it of its own cell (else the next newest): never one run twice."""
    runs = data.pulled_runs(site.lab, PICKER_RUNS)
    newest = runs[0] if runs else None
    same = [
        r for r in runs[1:] if newest and (r.board, r.model, r.backend) == (newest.board, newest.model, newest.backend)
    ]
    before = same[0] if same else (runs[1] if len(runs) > 1 else None)
    facets = {field: sorted({getattr(r, field) for r in runs}) for field in ("board", "model", "backend")}
    return {
        "runs": runs,
        "facets": facets,
        "default_a": before.run_id if before else None,
        "default_b": newest.run_id if newest else None,
    }


def _compare_title(found: ComparePage) -> str:
    if found.a is None or found.b is None:
        return "compare two runs"
    return f"compare {found.a.run_id} → {found.b.run_id}"


def _exported_pairs(site: Site) -> list[tuple[str, str]]:
    """Each run against the previous run of its cell, both exported."""
    return [(a, b) for a, b in data.default_pairs(site.lab) if is_valid_name(a) and is_valid_name(b)]


# Every page, the overview first (a static export writes them in this order).
PAGES: dict[str, Page] = {
    "overview": Page(
        "", (), lambda site: data.overview(site.lab, site.inventory_boards, site.live), "overview.html",
        lambda _: "etlab lab overview", exported=lambda _: [()],
    ),
    "trend": Page(
        "trend", ("key",), _trend, "trend.html", _trend_title,
        exported=lambda site: [(key,) for key in site.cells],
    ),
    "run": Page(
        "run", ("run_id",), lambda site, run_id: data.run_page(site.lab, run_id), "run.html",
        lambda found: f"run {found.run.run_id}", exported=_exported_runs,
    ),
    "compare": Page(
        "compare", ("a", "b"), _compare, "compare.html", _compare_title, exported=_exported_pairs, query=True,
        context=lambda site: site.picker,
    ),
}  # fmt: skip


def render_page(name: str, found: Any, links: Links, **context: Any) -> str:
    """Page `name` of PAGES rendered from data already assembled (`found`)."""
    page = PAGES[name]
    return render(page.template, links, page.title(found), found, **context)


def problem_page(name: str, problem: str, links: Links) -> str:
    """A page that could not be made from its data (named by `problem`: the file and the field)."""
    return render("problem.html", links, f"{name}: cannot be shown", ProblemPage(problem=problem))
