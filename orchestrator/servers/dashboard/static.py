"""`fab dashboard --static DIR`: the dashboard's pages as files that open from file:// with no server and no network.

The same templates as the live server, with relative links: index.html (the overview), trend-<cell>.html per
history cell, run-<id>.html per pulled run, compare-<a>--<b>.html for each run against the previous run of its cell,
and assets/ with Plotly's bundle (once, not per page) and the dashboard's script and style. A run id that is not a
valid name gets no file (its folder was made by hand; no file name is built from it).

One run's data never costs the export: a run that was not analysed, or whose files cannot be read, gets a page
saying so (data.run_page), and a page that cannot be made at all (bad data: an EtlabError) is written as a page
saying why, with a warning; the export goes on and completes.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from orchestrator import console
from orchestrator.deploy.board_status import BoardStatus
from orchestrator.errors import EtlabError
from orchestrator.fsutil import atomic_write_text
from orchestrator.names import is_valid_name
from orchestrator.servers.dashboard import data, pages


def write_static(
    lab: data.Lab,
    folder: Path,
    inventory_boards: tuple[str, ...] = (),
    live: Mapping[str, BoardStatus] | None = None,
) -> list[Path]:
    """Write every page into `folder` (`live`: a look at the boards, for the overview); returns the files written,
    the overview first."""
    links = pages.Links(static=True)
    folder = Path(folder)
    (folder / "assets").mkdir(parents=True, exist_ok=True)
    written = []

    def write(name: str, render: Callable[..., str], assemble: Callable[..., dict[str, Any]], *args: Any) -> None:
        """The page `render(assemble(*args))`; bad data behind it (an EtlabError) makes a page saying why instead."""
        try:
            text = render(assemble(*args), links)
        except EtlabError as exc:
            console.warn(console.escape(f"{name}: {exc}"))
            text = pages.problem_page(name, str(exc), links)
        atomic_write_text(folder / name, text)
        written.append(folder / name)

    write("index.html", pages.overview_page, data.overview, lab, inventory_boards, live)
    for cell in data.cells(lab):
        write(links.trend(data.cell_key(cell)), pages.trend_page, data.trend, lab, cell)
    exported = [run for run in lab.runs() if is_valid_name(run.run_id)]
    for run in exported:
        write(links.run(run.run_id), pages.run_page, data.run_page, lab, run.run_id)
    names = {run.run_id for run in exported}
    for run_a, run_b in data.default_pairs(lab):
        if run_a in names and run_b in names:
            write(links.compare(run_a, run_b), pages.compare_page, data.compare_page, lab, run_a, run_b)
    for name in (pages.PLOTLY_JS, *pages.OWN_ASSETS):
        (folder / "assets" / name).write_bytes(pages.asset(name))
        written.append(folder / "assets" / name)
    return written
