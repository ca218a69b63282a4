"""A dashboard page is one row of `pages.PAGES`: a page registered here, and nowhere else, is served by the live
server, linked by `Links` and written by the static export; and the four pages etlab ships are rows of it."""

from __future__ import annotations

import dataclasses
import http.client
import typing
from pathlib import Path
from typing import Any

import pytest

from orchestrator.servers.dashboard import data, pages, records
from orchestrator.servers.dashboard.app import Sources, start_dashboard
from orchestrator.servers.dashboard.records import ProblemPage
from orchestrator.servers.dashboard.static import write_static
from tests.plugins.explorer import free_port

GREETED = ("world", "lab")


def _hello(site: pages.Site, who: str) -> ProblemPage:
    if who == "nobody":
        raise data.NotFound("no such greeting")
    return ProblemPage(problem=f"hello {who}, from a lab of {len(site.lab.runs())} runs")


@pytest.fixture
def hello_page(monkeypatch: pytest.MonkeyPatch) -> pages.Page:
    """A page made of a row only: its template is one etlab already has (problem.html shows `data.problem`)."""
    page = pages.Page("hello", ("who",), _hello, "problem.html", lambda found: "a greeting",
                      exported=lambda _site: [(who,) for who in (*GREETED, "../escape")])  # fmt: skip
    monkeypatch.setitem(pages.PAGES, "hello", page)
    return page


def _get(port: int, path: str) -> tuple[int, str]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        connection.request("GET", path, headers={"Host": f"127.0.0.1:{port}"})
        response = connection.getresponse()
        return response.status, response.read().decode()
    finally:
        connection.close()


def test_a_page_added_to_pages_is_served_and_linked(hello_page: pages.Page, tmp_path: Path) -> None:
    assert pages.Links().hello("a b/c") == "/hello/a%20b%2Fc"
    assert pages.Links(static=True).hello("world") == "hello-world.html"
    server = start_dashboard(Sources(tmp_path / "results", None), port=free_port())
    try:
        status, body = _get(server.port, pages.Links().hello("world"))
        assert status == 200 and "hello world, from a lab of 0 runs" in body and "<title>a greeting" in body
        assert _get(server.port, "/hello/nobody")[0] == 404  # its data function's NotFound
        assert _get(server.port, "/hello")[0] == 404  # a page of it is named by its one param
        assert _get(server.port, "/hello/a/b")[0] == 404
    finally:
        server.stop()


def test_a_page_added_to_pages_is_exported(hello_page: pages.Page, tmp_path: Path) -> None:
    written = write_static(data.Lab(tmp_path / "results"), tmp_path / "site")
    names = [path.name for path in written]
    assert names[0] == "index.html"
    for who in GREETED:
        assert f"hello-{who}.html" in names
        assert f"hello {who}, from a lab" in (tmp_path / "site" / f"hello-{who}.html").read_text()
    assert not any("escape" in name for name in names)  # a param that is no file name gets no file
    assert sorted(path.name for path in (tmp_path / "site").iterdir()) == sorted(
        [*(name for name in names if name.endswith(".html")), "assets"]
    )


def test_the_shipped_pages_are_rows_of_pages() -> None:
    assert list(pages.PAGES) == ["overview", "trend", "run", "compare"]
    assert len({page.route for page in pages.PAGES.values()} | {"assets", "explore"}) == len(pages.PAGES) + 2
    links, files = pages.Links(), pages.Links(static=True)
    assert (links.overview(), files.overview()) == ("/", "index.html")
    assert (links.run("r1"), files.run("r1")) == ("/run/r1", "run-r1.html")
    assert (links.compare("a", "b"), files.compare("a", "b")) == ("/compare?a=a&b=b", "compare-a--b.html")
    assert links.compare() == "/compare"  # the form alone
    with pytest.raises(AttributeError):
        links.nosuchpage("x")


def test_each_shipped_page_is_a_typed_record_of_typed_rows() -> None:
    """The data functions return records.py's dataclasses, whose fields are typed rows, not bare mappings."""
    assemblers = {"overview": data.overview, "trend": data.trend, "run": data.run_page, "compare": data.compare_page}
    assert set(assemblers) == set(pages.PAGES)
    for name, assemble in assemblers.items():
        record = typing.get_type_hints(assemble)["return"]
        assert dataclasses.is_dataclass(record) and record.__module__ == records.__name__, name
    row_fields = {
        records.OverviewPage: ("boards", "grid", "runs"),
        records.TrendPage: ("cell", "points", "baseline", "latest"),
        records.RunPage: ("run", "advice", "phases", "validity", "generation", "memory", "operators", "split"),
        records.ComparePage: ("a", "b"),
    }
    for record, names in row_fields.items():
        hints = typing.get_type_hints(record)
        for field_name in names:
            rows = [t for t in _leaf_types(hints[field_name]) if dataclasses.is_dataclass(t)]
            assert rows, f"{record.__name__}.{field_name} is {hints[field_name]}, not a typed row"


def _leaf_types(hint: Any) -> list[Any]:
    arguments = typing.get_args(hint)
    return [leaf for argument in arguments for leaf in _leaf_types(argument)] if arguments else [hint]
