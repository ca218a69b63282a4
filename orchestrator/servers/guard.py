"""The HTTP guard in front of the local web servers etlab starts (Model Explorer's and the dashboard's).

Binding to loopback does not stop a web page from reaching a server. So Model Explorer's child process wraps the
upstream WSGI app (the package itself is left unmodified) in `LocalOnly`, which answers 403, before upstream sees
the request, to:
- a Host that is not this server's loopback name (DNS rebinding points a page's own host name at 127.0.0.1);
- `Sec-Fetch-Site: cross-site` or `same-site` (another page's <img> or <script> GET sends no Origin, but browsers
  mark every request with where it comes from), and an API request whose Origin is another site;
- an API route the UI does not need, a command other than a POSTed JSON `convert` of a model it was started with,
  and a read of any file but its overlays (real paths compared: the allowlist is `ServedFiles`).
Each refusal is one line in the server's log. The parent checks that the guard answers before it announces the
server. `foreign_request` holds the Host, Sec-Fetch-Site and Origin rules both servers share; the dashboard's
`SameOriginOnly` applies them to every request, as it serves its own pages and nothing else.
"""

from __future__ import annotations

import hmac
import http.client
import io
import ipaddress
import json
import os
import secrets
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs, urlencode

from orchestrator import strictjson
from orchestrator.names import is_loopback

DEFAULT_HOST = "127.0.0.1"


LOOPBACK_NAMES = ("127.0.0.1", "localhost", "[::1]")
API_PREFIX = "/api"  # /api/v1/..., /apipost/v1/..., /apistream/...
FORBIDDEN = b"forbidden: this Model Explorer serves only its own page, on its loopback address, its own files\n"
GUARD_LOG = "etlab-guard: refused"  # the server log's line for each refused request
_PROBE_HOST = "etlab-guard-check.invalid"
# guard_answers' own probes carry this process's secret: refused like any foreign request, but not logged (a server
# in this process, the dashboard, would print its own start-up check as refusals). Any other value is logged.
PROBE_HEADER = "X-Etlab-Guard-Probe"
_PROBE_TOKEN = secrets.token_hex(16)

# Sec-Fetch-Site values of the page's own requests and of the user's own navigation (typed URL, bookmark).
# cross-site and same-site (another port on this host) are other pages; a value we do not know is refused too.
SEC_FETCH_SERVED = frozenset({"same-origin", "none"})

# Routes of upstream's Flask app (model_explorer/server.py) and how each is served. Every other API route is
# refused, so a route a later release adds stays closed until someone reads it. Refused on purpose: upload (writes
# files, then converts them), update_config (swaps the models served), refresh_page, load_graphs_json and
# load_node_data (for graphs and node data held in memory: we serve files), GET send_command (any <img> sends a GET).
READ_TEXT_ROUTE = "/api/v1/read_text_file"  # ?path=: only the overlays
NOTIFY_ROUTE = "/api/v1/notify_user_provided_model_path"  # ?path=: the UI names each model it loads (for --watch)
COMMAND_ROUTE = "/apipost/v1/send_command"  # POSTed JSON: only `convert` of the models
OPEN_API_ROUTES = frozenset({"/api/v1/get_extensions", "/api/v1/check_new_version", "/apistream/server_director"})
MAX_COMMAND_BYTES = 1 << 20  # the UI's commands are a few hundred bytes

StartResponse = Callable[..., Any]
WsgiApp = Callable[[dict[str, Any], StartResponse], Iterable[bytes]]


def real_path(path: str) -> str | None:
    """`path` as upstream opens it (`~` expanded, relative to the server's folder), resolved through every
    symbolic link; None when no path can be made of it (e.g. a NUL byte)."""
    try:
        return os.path.realpath(os.path.expanduser(path))
    except (ValueError, OSError):
        return None


@dataclass(frozen=True)
class ServedFiles:
    """The files a server was started with, by real path: the only ones its file and convert endpoints serve."""

    models: frozenset[str] = frozenset()
    texts: frozenset[str] = frozenset()  # the overlays (node data), which the UI reads through read_text_file

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> ServedFiles:
        def real(paths: Iterable[str]) -> frozenset[str]:
            return frozenset(filter(None, map(real_path, paths)))

        return cls(real(m["url"] for m in config["models"]), real(e["path"] for e in config["node_data"]))


def host_allowed(host: str, port: int, bind_host: str = DEFAULT_HOST) -> bool:
    """Whether a Host header names this server: a loopback name with its port. A server deliberately bound to
    another address also accepts IP literals (a rebinding attack needs a host name, never an IP literal)."""
    host = host.strip().lower()
    if host in {f"{name}:{port}" for name in LOOPBACK_NAMES}:
        return True
    if is_loopback(bind_host):
        return False
    name, sep, given_port = host.rpartition(":")
    if not sep or given_port != str(port):
        return False
    name = name[1:-1] if name.startswith("[") and name.endswith("]") else name
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


def origin_allowed(origin: str, port: int, bind_host: str = DEFAULT_HOST) -> bool:
    """Whether an Origin header is this server's own page (http://<an allowed Host>)."""
    scheme, sep, rest = origin.strip().lower().partition("://")
    return scheme == "http" and bool(sep) and "/" not in rest and host_allowed(rest, port, bind_host)


def foreign_request(
    environ: dict[str, Any], port: int, bind_host: str = DEFAULT_HOST, *, check_origin: bool = True
) -> str | None:
    """Why a request does not come from this server's own page (a foreign Host, another site's Sec-Fetch-Site, with
    `check_origin` another site's Origin), or None."""
    host = environ.get("HTTP_HOST")
    if host is None or not host_allowed(host, port, bind_host):
        return f"Host {host!a}"
    site = environ.get("HTTP_SEC_FETCH_SITE")
    if site is not None and site.strip().lower() not in SEC_FETCH_SERVED:
        return f"Sec-Fetch-Site {site!a}"
    origin = environ.get("HTTP_ORIGIN")
    if check_origin and origin is not None and not origin_allowed(origin, port, bind_host):
        return f"Origin {origin!a}"
    return None


def refuse(environ: dict[str, Any], start_response: StartResponse, reason: str, message: bytes) -> Iterable[bytes]:
    """Answer 403 with `message`, and say why in one line of the server's log (not for guard_answers' own probes)."""
    probe = str(environ.get("HTTP_" + PROBE_HEADER.upper().replace("-", "_"), ""))
    if not hmac.compare_digest(probe.encode(), _PROBE_TOKEN.encode()):
        # Only the method and path: a query can hold anything, and the log is read in a terminal.
        print(
            f"{GUARD_LOG} {environ.get('REQUEST_METHOD')} {str(environ.get('PATH_INFO'))!a}: {reason}",
            file=sys.stderr,
            flush=True,
        )
    start_response(
        "403 Forbidden",
        [
            ("Content-Type", "text/plain; charset=utf-8"),
            ("Content-Length", str(len(message))),
            ("Connection", "close"),  # a refused POST's body is left unread: never parse it as a request
        ],
    )
    return [message]


class SameOriginOnly:
    """WSGI middleware for a server that serves only its own pages (the dashboard): every request must come from
    its own page or the user's own navigation, and a state-changing POST must carry its own Origin (browsers send
    one with every POST; a page elsewhere cannot forge it)."""

    def __init__(self, app: WsgiApp, port: int, bind_host: str = DEFAULT_HOST, message: bytes = FORBIDDEN) -> None:
        self.app = app
        self.port = port
        self.bind_host = bind_host
        self.message = message

    def __call__(self, environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        reason = self.refusal(environ)
        if reason is None:
            return self.app(environ, start_response)
        return refuse(environ, start_response, reason, self.message)

    def refusal(self, environ: dict[str, Any]) -> str | None:
        reason = foreign_request(environ, self.port, self.bind_host)
        method = environ.get("REQUEST_METHOD")
        if reason is None and method not in ("GET", "HEAD") and environ.get("HTTP_ORIGIN") is None:
            return f"{method} without an Origin"
        return reason


class LocalOnly:
    """WSGI middleware in front of Model Explorer: refuses with 403, before the upstream app sees the request,
    anything but this server's own page asking for the files it was started with (see the module's docstring)."""

    def __init__(
        self,
        app: WsgiApp,
        port: int,
        bind_host: str = DEFAULT_HOST,
        files: ServedFiles | None = None,
        redirects: dict[str, str] | None = None,
    ) -> None:
        self.app = app
        self.port = port
        self.bind_host = bind_host
        self.files = files or ServedFiles()
        self.redirects = dict(redirects or {})  # short route -> the page's path and query (etlab's, never a request's)

    def __call__(self, environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        reason = self.refusal(environ)
        if reason is not None:
            return refuse(environ, start_response, reason, FORBIDDEN)
        target = self.redirects.get(str(environ.get("PATH_INFO", "")).rstrip("/"))
        if target is not None and environ.get("REQUEST_METHOD") in ("GET", "HEAD"):
            # A short URL (/run/<run-id>): the page's own long one, on this server (a relative Location).
            start_response("302 Found", [("Location", target), ("Content-Length", "0"), ("Cache-Control", "no-store")])
            return [b""]
        return self.app(environ, start_response)

    def refusal(self, environ: dict[str, Any]) -> str | None:
        """Why a request is refused, or None to serve it. A served API request is rewritten to carry exactly what
        was checked (the real path), so upstream never parses anything the guard did not."""
        # Repeated slashes merged, as routing merges them, so no spelling of an API route escapes its check.
        route = "/" + "/".join(part for part in str(environ.get("PATH_INFO", "")).split("/") if part)
        # The page and its static files need no Origin check (upstream refuses paths out of its folder).
        reason = foreign_request(environ, self.port, self.bind_host, check_origin=route.startswith(API_PREFIX))
        if reason is not None or not route.startswith(API_PREFIX):
            return reason
        if route in OPEN_API_ROUTES:
            return None
        if route == READ_TEXT_ROUTE:
            return _path_query(environ, self.files.texts, "read_text_file")
        if route == NOTIFY_ROUTE:
            return _path_query(environ, self.files.models, "notify_user_provided_model_path")
        if route == COMMAND_ROUTE:
            return self._command(environ)
        return "not a route etlab serves"

    def _command(self, environ: dict[str, Any]) -> str | None:
        if environ.get("REQUEST_METHOD") != "POST":
            return "send_command that is not a POST"
        # The UI's content type; a page can send it elsewhere only after a CORS preflight, which this server fails.
        if str(environ.get("CONTENT_TYPE", "")).split(";")[0].strip().lower() != "application/json":
            return "send_command that is not JSON"
        body = _request_body(environ)
        try:
            command = strictjson.loads(body, where="send_command") if body is not None else None
        except strictjson.JsonDataError:
            command = None
        if not isinstance(command, dict):
            return "send_command that is not a JSON object"
        if command.get("cmdId") != "convert":
            return "send_command other than convert"
        if command.get("deleteAfterConversion"):  # upstream would delete the model's folder when it stops
            return "convert with deleteAfterConversion"
        model = command.get("modelPath")
        path = real_path(model) if isinstance(model, str) else None
        if path is None or path not in self.files.models:
            return "convert of a model this server was not started with"
        checked = json.dumps({**command, "modelPath": path}).encode()
        environ["wsgi.input"] = io.BytesIO(checked)
        environ["CONTENT_LENGTH"] = str(len(checked))
        environ.pop("HTTP_TRANSFER_ENCODING", None)
        return None


def _path_query(environ: dict[str, Any], served: frozenset[str], route: str) -> str | None:
    """Serve a `?path=` route only for a path in `served`; the query passed on is that real path alone."""
    # WSGI hands the query over as latin-1 text of its bytes; browsers percent-encode UTF-8.
    raw = str(environ.get("QUERY_STRING", "")).encode("latin-1", "replace").decode("utf-8", "replace")
    paths = parse_qs(raw, keep_blank_values=True).get("path", [])
    path = real_path(paths[0]) if len(paths) == 1 else None
    if path is None or path not in served:
        return f"{route} of a file this server was not started with"
    environ["QUERY_STRING"] = urlencode({"path": path})
    return None


def _request_body(environ: dict[str, Any]) -> bytes | None:
    """The request's body, read whole; None when it is larger than any command (or its length is not a number)."""
    stream = environ["wsgi.input"]
    length = str(environ.get("CONTENT_LENGTH") or "").strip()
    if length:
        if not length.isdigit() or int(length) > MAX_COMMAND_BYTES:
            return None
        body = stream.read(int(length))
    elif environ.get("wsgi.input_terminated"):  # chunked: the server ends the stream
        body = stream.read(MAX_COMMAND_BYTES + 1)
    else:
        body = b""
    return body if len(body) <= MAX_COMMAND_BYTES else None


def guard_server(port: int, bind_host: str, files: ServedFiles, redirects: dict[str, str] | None = None) -> None:
    """Child process: every app werkzeug serves here (Flask's `app.run` calls `run_simple`) goes behind
    LocalOnly. Upstream builds its app inside `server.start`, so this is the one place to wrap it."""
    import werkzeug.serving

    serve = werkzeug.serving.run_simple

    def guarded(hostname: str, port_: int, application: WsgiApp, *args: Any, **kwargs: Any) -> None:
        serve(hostname, port_, LocalOnly(application, port, bind_host, files, redirects), *args, **kwargs)

    werkzeug.serving.run_simple = guarded  # type: ignore[assignment]


def guard_answers(host: str, port: int) -> bool:
    """Whether the server refuses a foreign Host (as a DNS-rebinding page would send) and a request from another
    site: the guard is in place, and it is this version of it."""
    shown_host = f"[{host}]" if ":" in host else host
    probes = (
        {"Host": f"{_PROBE_HOST}:{port}", PROBE_HEADER: _PROBE_TOKEN},
        {"Host": f"{shown_host}:{port}", "Sec-Fetch-Site": "cross-site", PROBE_HEADER: _PROBE_TOKEN},
    )
    for headers in probes:
        connection = http.client.HTTPConnection(host, port, timeout=10)
        try:
            connection.request("GET", "/check_health", headers=headers)
            if connection.getresponse().status != 403:
                return False
        finally:
            connection.close()
    return True
