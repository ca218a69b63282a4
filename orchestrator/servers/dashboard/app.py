"""`fab dashboard`: the lab's results in a browser, served on 127.0.0.1 behind the same guard as Model Explorer.

A small WSGI app (werkzeug's threaded server, which Model Explorer's Flask brings): GET routes for the pages and
their assets, and two POSTs that start (or reuse) Model Explorer on a run, or on a comparison's diff overlay.
Each page reads the results folder and the history afresh, so a run pulled while the dashboard is open shows on
the next load. `SameOriginOnly` refuses a foreign Host, another site's request and a POST without this page's
Origin before the app sees them; the server stops on Ctrl+C or SIGTERM and closes its socket.
"""

from __future__ import annotations

import contextlib
import logging
import sys
import threading
import traceback
import webbrowser
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from html import escape
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote

from orchestrator import console, interrupts
from orchestrator.boards.inventory import Board
from orchestrator.errors import EtlabError
from orchestrator.lab.history import History
from orchestrator.lowering.artifacts import ArtifactPaths
from orchestrator.results.compare import compare_runs
from orchestrator.servers.dashboard import data, pages
from orchestrator.servers.dashboard.boardwatch import DEFAULT_INTERVAL, BoardWatch
from orchestrator.servers.explorer import (
    DEFAULT_PORT as EXPLORER_PORT,
)
from orchestrator.servers.explorer import (
    ExplorerHandle,
    ensure_port_free,
    launch_explorer,
    program_models,
    run_overlays,
)
from orchestrator.servers.guard import DEFAULT_HOST, SameOriginOnly, guard_answers

DEFAULT_PORT = 8080
FORBIDDEN = b"forbidden: this etlab dashboard serves only its own pages, on its loopback address\n"
Response = tuple[str, str, bytes, list[tuple[str, str]]]  # status, content type, body, more headers
StartResponse = Callable[..., Any]
HTML = "text/html; charset=utf-8"
# No script but the page's own files (the JSON blocks are data, never run); Plotly sets inline styles.
CSP = "default-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:"
TYPES = {".js": "text/javascript; charset=utf-8", ".css": "text/css; charset=utf-8"}


@dataclass
class Sources:
    """Where the dashboard reads: a results folder, a history URL (either may be missing) and artifacts."""

    results_root: Path | None
    history_url: str | None
    artifacts_root: Path | None = None
    inventory_boards: tuple[str, ...] = ()
    baseline_nights: int = data.DEFAULT_BASELINE_NIGHTS
    boards: tuple[Board, ...] = ()  # the inventory's boards, looked at for the overview (reachable, lock)
    _history: History | None = field(default=None, repr=False)

    def open_history(self) -> History | None:
        """The history when there is one: a SQLite file that does not exist is no history (never created here)."""
        if self._history is None and self.history_url:
            url = self.history_url
            if url.startswith("sqlite:///") and not Path(url.removeprefix("sqlite:///")).is_file():
                return None
            self._history = History(url)
        return self._history

    def lab(self) -> data.Lab:
        return data.Lab(self.results_root, self.open_history(), self.baseline_nights)

    def close(self) -> None:
        if self._history is not None:
            self._history.close()
            self._history = None


class ExplorerSlot:
    """The one Model Explorer the dashboard starts: reused while it shows the same files, restarted otherwise. Its
    lock makes a start (seconds) one at a time: a request arriving meanwhile waits, then reuses it."""

    def __init__(self, port: int = EXPLORER_PORT) -> None:
        self.port = port
        self.handle: ExplorerHandle | None = None
        self.shown: tuple[tuple[Path, ...], tuple[Path, ...]] | None = None
        self.lock = threading.Lock()

    def open(self, models: list[Path], overlays: list[Path]) -> str:
        with self.lock:
            wanted = (tuple(models), tuple(overlays))
            if self.handle is not None and self.handle.running and self.shown == wanted:
                return self.handle.url
            self.stop()
            ensure_port_free(DEFAULT_HOST, self.port)
            self.handle = launch_explorer(models, overlays, port=self.port, open_browser=False, block=False)
            self.shown = wanted
            return self.handle.url

    def stop(self) -> None:
        if self.handle is not None:
            self.handle.stop()
            self.handle = None


class DashboardApp:
    """The WSGI app behind the guard."""

    def __init__(self, sources: Sources, explorer: ExplorerSlot | None = None, watch: BoardWatch | None = None) -> None:
        self.sources = sources
        self.explorer = explorer or ExplorerSlot()
        self.watch = watch
        self.links = pages.Links(static=False)
        # One page assembled at a time (the history's engine and 2 cores are shared). Assets need no lock, and Model
        # Explorer starts (seconds) outside it, under its slot's own lock: pages answer meanwhile, and two
        # concurrent POSTs still start one Model Explorer.
        self.lock = threading.Lock()

    def __call__(self, environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        method = environ.get("REQUEST_METHOD", "GET")
        path = "/" + "/".join(p for p in str(environ.get("PATH_INFO", "")).split("/") if p)
        query = {k: v[0] for k, v in parse_qs(str(environ.get("QUERY_STRING", ""))).items()}
        try:
            status, kind, body, headers = self.route(method, path, query)
        except data.NotFound as exc:
            status, kind, body, headers = "404 Not Found", HTML, _message_page("not found", str(exc)), []
        except EtlabError as exc:
            status, kind, body, headers = "409 Conflict", HTML, _message_page("cannot do that", str(exc)), []
        except Exception:  # a bug: the page says so, the log has the traceback
            traceback.print_exc(file=sys.stderr)
            status, kind, body = "500 Internal Server Error", HTML, _message_page("internal error", "see the log")
            headers = []
        start_response(
            status,
            [
                ("Content-Type", kind),
                ("Content-Length", str(len(body))),
                ("Cache-Control", "no-store"),
                ("X-Content-Type-Options", "nosniff"),
                ("Content-Security-Policy", CSP),
                *headers,
            ],
        )
        return [b"" if method == "HEAD" else body]

    def route(self, method: str, path: str, query: dict[str, str]) -> Response:
        parts = [unquote(p) for p in path.strip("/").split("/")] if path != "/" else []
        if method == "POST" and len(parts) == 2 and parts[0] == "explore":
            return self._redirect(self._explore_run(parts[1]))
        if method == "POST" and parts == ["explore-diff"]:
            return self._redirect(self._explore_diff(query.get("a", ""), query.get("b", "")))
        if method not in ("GET", "HEAD"):
            return "405 Method Not Allowed", "text/plain", b"method not allowed\n", []
        if parts and parts[0] == "assets" and len(parts) == 2:
            try:
                body = pages.asset(parts[1])
            except KeyError:
                raise data.NotFound(f"no asset {parts[1]!r}") from None
            return "200 OK", TYPES.get(Path(parts[1]).suffix, "application/octet-stream"), body, []
        with self.lock:
            return self._page(parts, path, query)

    def _page(self, parts: list[str], path: str, query: dict[str, str]) -> Response:
        """The page of PAGES the path names: its route, then its params (in the path, or a form's query)."""
        route, given = (parts[0], parts[1:]) if parts else ("", [])
        page = next((page for page in pages.PAGES.values() if page.route == route), None)
        if page is None or len(given) != (0 if page.query else len(page.params)):
            raise data.NotFound(f"no page {path!r}")
        if page.query:  # all of them, or none: the page is its form alone
            given = [query[name] for name in page.params] if all(name in query for name in page.params) else []
        live = self.watch.snapshot() if self.watch is not None else None
        site = pages.Site(self.sources.lab(), self.sources.inventory_boards, live)
        return "200 OK", HTML, page.render(site, given, self.links).encode(), []

    @staticmethod
    def _redirect(url: str) -> Response:
        return "303 See Other", "text/plain", b"", [("Location", url)]

    def _models(self, model: str) -> list[Path]:
        present, _missing = program_models(ArtifactPaths.for_model(model, self.sources.artifacts_root))
        if not present:
            raise EtlabError(f"no lowered programs of {model!r} to show", hint="lower the model first")
        return present

    def _explore_run(self, run_id: str) -> str:
        with self.lock:  # what to show, read as a page is
            run = self.sources.lab().find(run_id)
            models, overlays = self._models(run.model), run_overlays(run.path, required=False)
        return self.explorer.open(models, overlays)

    def _explore_diff(self, run_a: str, run_b: str) -> str:
        with self.lock:
            lab = self.sources.lab()
            a, b = lab.find(run_a), lab.find(run_b)
            comparison = compare_runs(a.path, b.path, allow_rebuilt=True)  # writes B's diff overlay
            overlays = [o for o in run_overlays(b.path, required=False) if o != comparison.overlay]
            models = self._models(b.model)
        return self.explorer.open(models, [*overlays, *filter(None, [comparison.overlay])])


def _message_page(title: str, text: str) -> bytes:
    return f"<!doctype html><meta charset='utf-8'><title>{escape(title)}</title><p>{escape(text)}</p>".encode()


@dataclass
class DashboardServer:
    """A running dashboard (its server thread); `stop` closes the port."""

    url: str
    port: int
    server: Any
    thread: threading.Thread
    app: DashboardApp

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(10)
        self.app.explorer.stop()
        if self.app.watch is not None:
            self.app.watch.stop()
        self.app.sources.close()


def start_dashboard(
    sources: Sources,
    *,
    port: int = DEFAULT_PORT,
    explorer_port: int = EXPLORER_PORT,
    board_interval: float = DEFAULT_INTERVAL,
) -> DashboardServer:
    """Serve the dashboard on 127.0.0.1:`port` in a thread; returns once its guard answers."""
    import werkzeug.serving

    ensure_port_free(DEFAULT_HOST, port)
    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # a line per request would bury the terminal's own
    watch = BoardWatch(sources.boards, board_interval).start() if sources.boards else None
    app = DashboardApp(sources, ExplorerSlot(explorer_port), watch)
    guarded = SameOriginOnly(app, port, DEFAULT_HOST, FORBIDDEN)
    server = werkzeug.serving.make_server(DEFAULT_HOST, port, guarded, threaded=True)
    thread = threading.Thread(target=server.serve_forever, name="etlab-dashboard", daemon=True)
    thread.start()
    handle = DashboardServer(f"http://{DEFAULT_HOST}:{port}/", port, server, thread, app)
    if not guard_answers(DEFAULT_HOST, port):  # fail closed, as Model Explorer does
        handle.stop()
        raise EtlabError("the dashboard answered a foreign Host header; refusing to serve it")
    return handle


def serve_dashboard(sources: Sources, *, port: int = DEFAULT_PORT, open_browser: bool = True) -> int:
    """Serve until Ctrl+C or SIGTERM, then stop and free the port. Returns 0."""
    with interrupts.sigterm_interrupts():
        handle = start_dashboard(sources, port=port)
        try:
            console.info("the etlab dashboard is ready (Ctrl+C stops it):")
            console.plain(handle.url)
            if open_browser:
                webbrowser.open_new_tab(handle.url)
            with contextlib.suppress(KeyboardInterrupt):
                while handle.thread.is_alive():
                    handle.thread.join(0.5)
        finally:
            handle.stop()
            console.info("stopped the dashboard")
    return 0
