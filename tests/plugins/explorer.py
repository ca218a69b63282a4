"""The Model Explorer server under test (tests/servers/test_explorer*.py): a real analysed bundle, the server
preloaded with its programs and overlays, and small HTTP helpers."""

from __future__ import annotations

import json
import socket
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

import pytest

from orchestrator.servers.explorer import ExplorerHandle, launch_explorer
from tests.plugins.analysis import BundleCase, analyze, copy_bundle

REFUSED = "etlab-guard: refused"  # how the server's log names a request its guard refused


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as response:
        return response.read().decode()


def post_json(url: str, body: dict) -> dict:
    request = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=120) as response:
        return json.loads(response.read())


def url_data(url: str) -> dict:
    return json.loads(parse_qs(urlparse(url).query)["data"][0])


@pytest.fixture(scope="module")
def explored(analysis_bundles: dict[str, BundleCase], tmp_path_factory: pytest.TempPathFactory) -> BundleCase:
    case = copy_bundle(analysis_bundles["distilbert_xnnpack"], tmp_path_factory.mktemp("explore") / "run-explore")
    analyze(case)
    advise_case(case)
    return case


def advise_case(case: BundleCase) -> None:
    """The advisor on an analysed case, as `fab analyze` runs it: advice.json and the advice overlays."""
    from orchestrator.advice.advisor import advise
    from orchestrator.advice.documents import write_advice
    from orchestrator.advice.findings import RunFacts
    from orchestrator.lowering.lowered import spec_from_record
    from orchestrator.results.documents import load_summary
    from orchestrator.results.ops_record import load_ops

    sidecar = case.model.sidecar
    facts = RunFacts(load_ops(case.path), load_summary(case.path), sidecar, spec_from_record(sidecar.spec, "sidecar"))
    write_advice(case.path, advise(facts))


def models_and_overlays(case: BundleCase, analysis_bundles: dict[str, BundleCase]) -> tuple[list[Path], list[Path]]:
    portable = analysis_bundles["distilbert_portable"].model.pte
    models = [case.model.exported, portable, case.model.pte]  # the run's program last: explore puts it first
    return models, sorted((case.path / "model_explorer").glob("me_overlay_*.json"))


@pytest.fixture(scope="module")
def server(explored: BundleCase, analysis_bundles: dict[str, BundleCase]) -> Iterator[ExplorerHandle]:
    models, overlays = models_and_overlays(explored, analysis_bundles)
    handle = launch_explorer(models, overlays, port=free_port(), open_browser=False, block=False)
    try:
        yield handle
    finally:
        handle.stop()


def wait_for_graph(page: Any, server: ExplorerHandle, timeout_ms: int = 90_000) -> None:
    """Wait until the page draws a graph; when it does not, fail with what the page and the server's log said."""
    try:
        page.wait_for_selector("canvas", timeout=timeout_ms)
    except Exception as error:  # playwright's TimeoutError: the page's state is the useful part
        shown = page.inner_text("body")[:3000]
        log = guard_log(server)[-3000:]
        pytest.fail(f"no graph drawn at {page.url[:200]}: {error}\n--- page ---\n{shown}\n--- server log ---\n{log}")


def guard_log(server: ExplorerHandle, since: int = 0) -> str:
    """The server's log (what it wrote from byte `since` on): its guard names every request it refuses."""
    return server.log_path.read_bytes()[since:].decode(errors="replace")
