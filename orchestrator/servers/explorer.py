"""`explore`: Model Explorer with the PTE adapter, preloaded with a model's programs and a run's overlays.

Model Explorer's `visualize_from_config` blocks and serves until killed, so it runs in a child process (its own
process group, stopped with SIGTERM, then SIGKILL). Upstream's server reads any file it is asked for
(`/api/v1/read_text_file`) and converts any model path (`send_command`; a .pt2 is unpickled by torch.export.load,
so converting a file a web page made the browser download runs that page's code). It binds to 127.0.0.1 unless
the caller explicitly asks for another address.

The child serves behind the HTTP guard of servers/guard.py, which the parent checks before it announces the
server.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
import webbrowser
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

from orchestrator import console, interrupts
from orchestrator.errors import UsageError
from orchestrator.fsutil import read_json
from orchestrator.lowering.artifacts import VARIANTS, ArtifactPaths
from orchestrator.paths import PROJECT_ROOT
from orchestrator.results.documents import refuse_board_supplied
from orchestrator.results.exported_overlays import EXPORTED_GRAPH, EXPORTED_PREFIX
from orchestrator.results.overlays import INDEX_NAME, OVERLAY_DIR
from orchestrator.servers.errors import ExplorerError, PortBusy
from orchestrator.servers.guard import DEFAULT_HOST, ServedFiles, guard_answers, guard_server, is_loopback

DEFAULT_PORT = 8081
PTE_ADAPTER = "pte_adapter_model_explorer"
MODEL_SUFFIXES = (".pt2", ".pte")
HEALTH_TIMEOUT_S = 120.0
STOP_TIMEOUT_S = 10.0


@dataclass
class ExplorerHandle:
    """A running Model Explorer server (a child process group)."""

    url: str
    host: str
    port: int
    process: subprocess.Popen[bytes]
    log_path: Path
    config: dict[str, Any] = field(default_factory=dict, repr=False)
    focus: str | None = None  # the .pte whose graphs the overlays paint
    short_url: str | None = None  # http://127.0.0.1:8081/run/<run-id>: redirects to `url` (printed instead of it)
    delegates: list[ShortLink] = field(default_factory=list)  # the run's delegate graphs, the costliest first
    _workdir: tempfile.TemporaryDirectory[str] | None = field(default=None, repr=False)

    def url_for(self, graph: str, model: str | None = None) -> str:
        """A URL opening another graph of the focus program, e.g. a delegate ("<pte>::forward_0_28"), or a graph of
        another loaded `model` (file name; the .pt2's one graph is "graph")."""
        return explorer_url(self.host, self.port, self.config, model or self.focus, graph=graph)

    @property
    def exported_model(self) -> str | None:
        """The exported .pt2 (file name) the overlays also paint, when it is loaded."""
        loaded = {Path(str(model["url"])).name for model in self.config.get("models", ())}
        painted = {entry["model_name"] for entry in self.config.get("node_data", ())}
        return next((name for name in sorted(loaded) if name.endswith(".pt2") and name in painted), None)

    @property
    def exported_url(self) -> str | None:
        """The URL opening that .pt2's graph."""
        exported = self.exported_model
        return self.url_for(EXPORTED_GRAPH, exported) if exported else None

    @property
    def running(self) -> bool:
        return self.process.poll() is None

    def stop(self, timeout: float = STOP_TIMEOUT_S) -> None:
        """Stop the server and everything it started (its whole process group)."""
        if self.process.poll() is None:
            _signal_group(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                _signal_group(self.process.pid, signal.SIGKILL)
                self.process.wait(timeout)
        if self._workdir is not None:
            self._workdir.cleanup()
            self._workdir = None


@dataclass(frozen=True)
class ShortLink:
    """A delegate graph of the run, its cost, and the short URL that opens it."""

    graph: str
    median_ms: float | None
    nodes: int
    url: str

    @property
    def line(self) -> str:
        cost = "–" if self.median_ms is None else f"{self.median_ms:.4g} ms"
        return f"{self.graph.rpartition('::')[2]}  {cost}  ({self.nodes} node{'s' * (self.nodes != 1)})  {self.url}"


def _signal_group(pid: int, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signum)


def check_host(host: str) -> None:
    """Any non-loopback address was asked for explicitly: allow it, but say loudly what it exposes."""
    if not is_loopback(host):
        console.loud_warning(
            f"Model Explorer will listen on {host}: anyone who can reach this address can read the models and "
            "overlays it serves, with no login. Prefer 127.0.0.1 with an SSH tunnel."
        )


def ensure_port_free(host: str, port: int) -> None:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        # As the server does: connections left in TIME_WAIT by a previous server do not block the port.
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as exc:
            raise PortBusy(
                f"cannot listen on {host}:{port}: {exc.strerror or exc} (is another Model Explorer running?)"
            ) from None


def run_overlays(run_dir: Path, *, required: bool = True) -> list[Path]:
    """An analysed run's overlays (median_ms, mean_ms, pct, and any compare diffs); [] if none and not required.
    AnalysisError when the run's manifest lists analysis or overlay files: a board wrote those, never shown as
    etlab's (fab explore, the dashboard's Model Explorer button and its compare diffs alike)."""
    refuse_board_supplied(Path(run_dir))
    found = sorted((Path(run_dir) / OVERLAY_DIR).glob("me_overlay_*.json"))
    if not found and required:
        raise ExplorerError(f"{run_dir} has no Model Explorer overlays", hint="analyse the run first")
    return found


def program_models(paths: ArtifactPaths) -> tuple[list[Path], list[Path]]:
    """A model's programs to show: those present, and those missing.

    The exported .pt2 and both fp32 .pte files are expected; the quantized variants (xnnpack-<scheme>) that were
    lowered are shown next to them.
    """
    expected = [paths.exported_program, *(paths.pte(variant) for variant in VARIANTS.values() if not variant.quantized)]
    quantized = [paths.pte(variant) for variant in VARIANTS.values() if variant.quantized]
    variants = [pte for pte in quantized if pte.is_file()]
    return [m for m in expected if m.is_file()] + variants, [m for m in expected if not m.is_file()]


def artifact_models(artifact_dir: Path) -> list[Path]:
    """A model's lowered artifacts to show: its exported .pt2 and every .pte beside it (not the numerics programs:
    the same programs with their operators' values made outputs, which the numerics overlays paint on these)."""
    folder = Path(artifact_dir)
    programs = [path for path in sorted(folder.glob("*.pte")) if not path.name.endswith(".numerics.pte")]
    found = sorted(folder.glob("*.pt2")) + programs
    if not found:
        raise ExplorerError(f"no .pt2 or .pte in {folder}", hint="lower the model first")
    return found


def _model_file(name: object, suffix: str) -> str | None:
    # A file name, nothing else: it only selects which loaded model an overlay paints.
    return name if isinstance(name, str) and name.endswith(suffix) and Path(name).name == name else None


def overlay_target(overlay: Path) -> str | None:
    """The model file name an overlay was made for, from the overlays.json index next to it (None if unknown): the
    run's .pte, or for `me_overlay_exported_*` the .pt2 it was lowered from."""
    index = Path(overlay).parent / INDEX_NAME
    if not index.is_file():
        return None
    with contextlib.suppress(OSError, ValueError, RecursionError):
        document = read_json(index)
        if not isinstance(document, dict):
            return None
        if Path(overlay).name.startswith(f"me_overlay_{EXPORTED_PREFIX}"):
            exported = document.get("exported_program")
            return _model_file(exported.get("file"), ".pt2") if isinstance(exported, dict) else None
        return _model_file(document.get("pte"), ".pte")
    return None


def overlay_index(overlays: list[Path], pte: str | None) -> dict[str, Any]:
    """The overlays.json index of the run whose overlays paint `pte` ({} when none is readable)."""
    for folder in dict.fromkeys(Path(overlay).parent for overlay in overlays):
        with contextlib.suppress(OSError, ValueError, RecursionError):
            document = read_json(folder / INDEX_NAME)
            if isinstance(document, dict) and pte is not None and document.get("pte") == pte:
                return document
    return {}


SHORT_ROUTE = "run"  # http://127.0.0.1:<port>/run/<run-id>[/delegate/<node id>]


def short_routes(
    host: str, port: int, config: dict[str, Any], focus: str | None, index: dict[str, Any], url: str
) -> tuple[dict[str, str], str | None, list[ShortLink]]:
    """The short local URLs of a run's Model Explorer (route -> the page's own path and query, which the guard
    redirects to): the run's, and one per delegate graph by cost; the run's short URL and the delegates' links."""
    run_id = index.get("run_id")
    if not isinstance(run_id, str) or not run_id or "/" in run_id:
        return {}, None, []
    shown_host = f"[{host}]" if ":" in host else host
    base = f"/{SHORT_ROUTE}/{quote(run_id, safe='')}"
    routes = {base: url.partition(f":{port}")[2]}
    links = []
    for entry in index.get("delegates") or []:
        if not isinstance(entry, dict) or not entry.get("placed") or not isinstance(entry.get("graph"), str):
            continue
        route = f"{base}/delegate/{quote(str(entry.get('node_id')), safe='')}"
        routes[route] = explorer_url(host, port, config, focus, graph=entry["graph"]).partition(f":{port}")[2]
        cost, nodes = entry.get("median_ms"), entry.get("nodes")
        links.append(
            ShortLink(
                entry["graph"],
                cost if isinstance(cost, int | float) else None,
                nodes if isinstance(nodes, int) else 0,
                f"http://{shown_host}:{port}{route}",
            )
        )
    return routes, f"http://{shown_host}:{port}{base}", links


def _collection_labels(model_file: str) -> list[str]:
    """The UI's labels for the collections the adapters make from one file: a .pte's program and its delegates (the
    PTE adapter), a .pt2's one graph (the PyTorch adapter)."""
    if model_file.endswith(".pt2"):
        return [model_file]
    return [f"{model_file} ({model_file})", f"{model_file} (delegates)"]


def build_config(models: list[Path], overlays: list[Path]) -> dict[str, Any]:
    """What the child loads: models with their adapters, and node data with the collections they target."""
    model_entries = [
        {"url": str(path.resolve()), **({"adapterId": PTE_ADAPTER} if path.suffix == ".pte" else {})} for path in models
    ]
    loaded = {path.name for path in models}
    node_data: list[dict[str, str]] = []
    for overlay in overlays:
        target = overlay_target(overlay)
        if target is not None and target in loaded:
            node_data += [{"path": str(overlay.resolve()), "model_name": label} for label in _collection_labels(target)]
        else:
            node_data.append({"path": str(overlay.resolve()), "model_name": ""})
    return {"models": model_entries, "node_data": node_data}


def explorer_url(
    host: str, port: int, config: dict[str, Any], focus: str | None, graph: str = "forward", method: str = "forward"
) -> str:
    """The page URL. Its `?data=` state opens `graph` of the focus program (its `forward` graph by default, or one
    of its delegate graphs by id) with the method's layer expanded."""
    data: dict[str, Any] = {
        "models": config["models"],
        "nodeData": [entry["path"] for entry in config["node_data"]],
        "nodeDataTargets": [entry["model_name"] for entry in config["node_data"]],
    }
    if focus is not None:
        labels = _collection_labels(focus)
        data["uiState"] = {
            "paneStates": [
                {
                    # The PTE adapter puts XNN nodes in a "forward" layer too, so expanding it suits every graph.
                    "deepestExpandedGroupNodeIds": [f"{method}___group___"] if len(labels) > 1 else [],
                    "selectedNodeId": "",
                    "selectedGraphId": graph,
                    "selectedCollectionLabel": labels[0 if graph == method or len(labels) == 1 else 1],
                    "widthFraction": 1,
                }
            ]
        }
    shown_host = f"[{host}]" if ":" in host else host
    return f"http://{shown_host}:{port}/?data={quote(json.dumps(data, separators=(',', ':')))}"


def _wait_healthy(handle: ExplorerHandle, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    shown_host = f"[{handle.host}]" if ":" in handle.host else handle.host
    health = f"http://{shown_host}:{handle.port}/check_health"
    while time.monotonic() < deadline:
        if not handle.running:
            log = handle.log_path.read_text(errors="replace")[-2000:] if handle.log_path.is_file() else ""
            raise ExplorerError(f"Model Explorer exited with code {handle.process.returncode} while starting:\n{log}")
        with contextlib.suppress(urllib.error.URLError, OSError), urllib.request.urlopen(health, timeout=2) as answer:
            if answer.status == 200:
                if not guard_answers(handle.host, handle.port):  # fail closed: never announce an unguarded file server
                    handle.stop()
                    raise ExplorerError("Model Explorer answered a foreign Host header; refusing to serve it")
                return
        time.sleep(0.2)
    handle.stop()
    raise ExplorerError(f"Model Explorer did not answer {health} within {timeout:.0f} s")


def launch_explorer(
    models: list[Path],
    overlays: list[Path],
    *,
    host: str = DEFAULT_HOST,
    port: int = DEFAULT_PORT,
    open_browser: bool = True,
    block: bool = True,
    health_timeout: float = HEALTH_TIMEOUT_S,
) -> ExplorerHandle:
    """Serve `models` (.pt2 / .pte) with `overlays` in Model Explorer; return once it answers its health check.

    With block=True, also wait until Ctrl+C / SIGTERM and stop the server before returning."""
    models = [Path(m) for m in models]
    overlays = [Path(o) for o in overlays]
    if not models:
        raise UsageError("nothing to explore: no model files given")
    missing = [str(p) for p in [*models, *overlays] if not p.is_file()]
    if missing:
        raise ExplorerError(f"missing file(s): {', '.join(missing)}", hint="lower the model and analyse the run first")
    unknown = [p.name for p in models if p.suffix not in MODEL_SUFFIXES]
    if unknown:
        raise UsageError(f"not a .pt2 or .pte model: {', '.join(unknown)}")
    check_host(host)
    ensure_port_free(host, port)

    targets = [overlay_target(o) for o in overlays]
    focus = next((t for t in targets if t and t.endswith(".pte") and t in {m.name for m in models}), None)
    if focus is None:
        focus = next((m.name for m in models if m.suffix == ".pte"), None)
    # The UI renames a repeated graph id ("forward" -> "forward (2)") in load order, so the program the overlays
    # paint is loaded first and keeps the ids they are keyed by.
    models = sorted(models, key=lambda m: (m.name != focus, m.suffix != ".pte"))
    config = build_config(models, overlays)
    url = explorer_url(host, port, config, focus)
    redirects, short_url, delegates = short_routes(host, port, config, focus, overlay_index(overlays, focus), url)

    guard = interrupts.sigterm_interrupts() if block else contextlib.nullcontext()
    with guard:
        handle = _spawn(host, port, {**config, "redirects": redirects}, url, focus)
        handle.short_url, handle.delegates = short_url, delegates
        try:
            _wait_healthy(handle, health_timeout)
            _announce(short_url or url, host, port, delegates)
            exported = handle.exported_model
            if exported is not None:
                console.info(f"the run is painted on {exported} too, layers as the model's modules: pick it at the top")
            if open_browser:
                webbrowser.open_new_tab(url)
            if block:
                handle.process.wait()
        except KeyboardInterrupt:
            handle.stop()
            if not block:
                raise
            console.info("stopped Model Explorer")
        except BaseException:
            handle.stop()
            raise
        if block:
            handle.stop()
    return handle


def _spawn(host: str, port: int, config: dict[str, Any], url: str, focus: str | None) -> ExplorerHandle:
    workdir = tempfile.TemporaryDirectory(prefix="etlab-explorer-")
    config_path = Path(workdir.name) / "config.json"
    config_path.write_text(json.dumps({**config, "host": host, "port": port}))
    log_path = Path(workdir.name) / "model_explorer.log"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(PROJECT_ROOT), os.environ.get("PYTHONPATH")])))
    with open(log_path, "wb") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "orchestrator.servers.explorer", str(config_path), str(os.getpid())],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,  # its own process group, so stop() reaches everything it starts
        )
    return ExplorerHandle(url, host, port, process, log_path, config, focus, _workdir=workdir)


def _announce(url: str, host: str, port: int, delegates: Sequence[ShortLink] = ()) -> None:
    console.info("Model Explorer is ready:")
    console.plain(url)  # one unbroken line, for copy and paste
    if delegates:
        console.info("the run's delegates, the costliest first (median per call):")
        for link in delegates[:8]:
            console.plain(f"  {link.line}")
    ssh = os.environ.get("SSH_CONNECTION", "").split()
    if ssh and is_loopback(host):
        user = os.environ.get("USER") or "user"
        server = ssh[2] if len(ssh) > 2 else "host"
        console.info(f"over SSH? forward the port first:  ssh -L {port}:127.0.0.1:{port} {user}@{server}")


def _serve(config_path: Path, parent: int | None = None) -> None:
    """Child process: load the config and serve until killed, or until `parent` (the etlab process) is gone."""
    if parent is not None:
        threading.Thread(target=_exit_with_parent, args=(parent,), daemon=True).start()
    import model_explorer

    config = json.loads(Path(config_path).read_text())
    guard_server(config["port"], config["host"], ServedFiles.from_config(config), config.get("redirects") or {})
    if any(str(model["url"]).endswith(".pt2") for model in config["models"]):
        # a text-generation .pt2 calls etlab's operators: torch.export.load knows them only once imported
        import orchestrator.lowering.attention.ops  # noqa: F401
    explorer_config = model_explorer.config()
    for model in config["models"]:
        explorer_config.add_model_from_path(model["url"], adapterId=model.get("adapterId", ""))
    for entry in config["node_data"]:
        explorer_config.add_node_data_from_path(entry["path"], entry["model_name"] or None)
    model_explorer.visualize_from_config(
        config=explorer_config,
        host=config["host"],
        port=config["port"],
        extensions=[PTE_ADAPTER],
        no_open_in_browser=True,
    )


def _exit_with_parent(parent: int) -> None:
    """Child process: a parent that dies without stopping us (SIGKILL, a crash) must not leave the port taken."""
    while os.getppid() == parent:
        time.sleep(0.5)
    if os.getpgrp() == os.getpid():  # our own group (as _spawn starts us): take everything we started along
        os.killpg(os.getpid(), signal.SIGKILL)
    os._exit(0)


if __name__ == "__main__":
    _serve(Path(sys.argv[1]), int(sys.argv[2]) if len(sys.argv) > 2 else None)
