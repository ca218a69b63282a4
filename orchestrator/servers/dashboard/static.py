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

from collections.abc import Mapping
from pathlib import Path

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
    site = pages.Site(lab, inventory_boards, live)
    for page in pages.PAGES.values():
        for params in page.exported(site) if page.exported is not None else ():
            name = page.file_name(params)
            if not all(is_valid_name(param) for param in params):  # a file named from data stays in the folder
                console.warn(f"{name[:80]!r}: not a file name, not exported")
                continue
            try:
                text = page.render(site, params, links)
            except EtlabError as exc:  # bad data behind it: a page saying why instead
                console.warn(f"{name}: {exc}")
                text = pages.problem_page(name, str(exc), links)
            atomic_write_text(folder / name, text)
            written.append(folder / name)
    for name in (pages.PLOTLY_JS, *pages.OWN_ASSETS):
        (folder / "assets" / name).write_bytes(pages.asset(name))
        written.append(folder / "assets" / name)
    return written
