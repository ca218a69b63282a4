"""Result bundles for the analysis, overlay, explore and compare tests.

`make_bundle` is the one place that produces a bundle: it lowers a tiny real model with ExecuTorch and runs it
with ExecuTorch's Python runtime (ETDump on), then writes the bundle files the board agent writes (layout in
docs/DESIGN.md). It can later be swapped for orchestrator.lowering.export.lower plus the native runner and agent.
"""

from __future__ import annotations

import json
import re
import shutil
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from orchestrator.fsutil import sha256_file
from orchestrator.lowering.sidecar import Sidecar
from orchestrator.lowering.variants import VARIANTS
from orchestrator.tensorfile import NamedTensor, read_tensors, write_tensors

SEQUENCE_LENGTH = 128


@dataclass(frozen=True)
class TinyModel:
    """A lowered tiny model: what the analysis needs besides the bundle."""

    name: str  # "distilbert" or "gpt2"
    backend: str  # "portable" or "xnnpack"
    pte: Path
    sidecar: Sidecar
    exported: Path  # the .pt2
    reference_outputs: Path
    inputs: Path  # the reference inputs (ETLT)

    @classmethod
    def from_artifact(cls, artifact: Any) -> TinyModel:
        """A model lowered by the real pipeline (orchestrator.lowering.export.lower)."""
        paths = artifact.paths
        return cls(
            artifact.model.removesuffix("-tiny"), artifact.variant.name, artifact.pte, artifact.sidecar,
            paths.exported_program, paths.reference_outputs, paths.reference_inputs,
        )  # fmt: skip


@dataclass(frozen=True)
class BundleCase:
    path: Path
    model: TinyModel


def board_info(
    governor: str | None = "performance", temperature_c: float | None = 47.2, throttled: str = "0x0"
) -> dict:
    """A board_info document in the agent's schema (board/agent/README.md) with the fields analysis reads."""
    value = int(throttled, 16)
    bits = {0: "under_voltage_now", 2: "throttled_now", 16: "under_voltage_occurred", 18: "throttling_occurred"}
    flags = {name: bool(value >> bit & 1) for bit, name in bits.items()}
    return {
        "schema": 1,
        "hostname": "pi5-test",
        "model": "Raspberry Pi 5 Model B Rev 1.0",
        "arch": "aarch64",
        "cores_online": 4,
        "governor": governor,
        "temperature_c": temperature_c,
        "throttled": {"raw": throttled, "value": value, "flags": flags, "active": [n for n, on in flags.items() if on]},
    }


def make_bundle(model: TinyModel, bundle: Path, *, warmup: int = 2, iterations: int = 6, run_id: str = "") -> Path:
    """Run `model` warmup + iterations times with ETDump on and write a complete bundle into `bundle`."""
    import torch
    from executorch.runtime import Runtime

    bundle.mkdir(parents=True, exist_ok=True)
    run_id = run_id or bundle.name
    inputs = [torch.from_numpy(tensor.array) for tensor in read_tensors(model.inputs)]
    before = board_info(temperature_c=47.2)
    started = time.perf_counter()
    program = Runtime.get().load_program(model.pte, enable_etdump=True, debug_buffer_size=0)
    loaded = time.perf_counter()
    method = program.load_method("forward")
    initialised = time.perf_counter()
    durations = []
    for _ in range(warmup + iterations):
        tick = time.perf_counter()
        outputs = method.execute(inputs)
        durations.append((time.perf_counter() - tick) * 1000.0)
    program.write_etdump_result_to_file(str(bundle / "etdump.etdp"), str(bundle / "debug.bin"))
    (bundle / "debug.bin").unlink(missing_ok=True)
    write_tensors(bundle / "outputs.etlt", [NamedTensor("output_0", outputs[0].numpy())])
    timings = {
        "runner_version": "python-runtime",
        "executorch_version": "1.5.1",
        "model": f"/home/pi/.etlab/models/{model.sidecar.sha256}.pte",
        "method": "forward",
        "threads": 1,
        "load_ms": (loaded - started) * 1000.0,
        "method_init_ms": (initialised - loaded) * 1000.0,
        "warmup_ms": durations[:warmup],
        "iterations_ms": durations[warmup:],
        "iterations_requested": iterations,
        "stopped_early": False,
        "max_seconds": None,
        "etdump": True,
        "inputs_source": "file",
    }
    run = {
        "schema": 1,
        "run_id": run_id,
        "agent_version": "test",
        "model_sha256": model.sidecar.sha256,
        "labels": {"model": model.sidecar.model, "backend": model.backend, "board": "pi5-test"},
        "parameters": {"warmup": warmup, "iterations": iterations, "method": "forward", "etdump": True},
        "runner_exit_code": 0,
    }
    documents = {
        "timings.json": timings,
        "run.json": run,
        "board_info_before.json": before,
        "board_info_after.json": board_info(temperature_c=49.8),
    }
    for name, document in documents.items():
        (bundle / name).write_text(json.dumps(document, indent=2))
    (bundle / "runner.log").write_text("python runtime run\n")
    write_manifest(bundle, run_id=run_id, model_sha256=model.sidecar.sha256)
    return bundle


def write_manifest(
    bundle: Path, *, run_id: str, model_sha256: str, status: str = "ok", error: str | None = None
) -> None:
    files = {
        path.name: {"sha256": sha256_file(path), "size": path.stat().st_size}
        for path in sorted(bundle.iterdir())
        if path.is_file() and path.name != "result_manifest.json"
    }
    manifest = {
        "schema": 1,
        "run_id": run_id,
        "status": status,
        "error": error,
        "runner_exit_code": 0 if status == "ok" else 7,
        "model_sha256": model_sha256,
        "files": files,
    }
    (bundle / "result_manifest.json").write_text(json.dumps(manifest, indent=2))


def remanifest(bundle: Path) -> None:
    """Re-hash the files a test changed, as if the board had written them (entries of deleted files stay)."""
    path = bundle / "result_manifest.json"
    manifest = json.loads(path.read_text())
    for name in list(manifest["files"]):
        if (bundle / name).is_file():
            manifest["files"][name] = {"sha256": sha256_file(bundle / name), "size": (bundle / name).stat().st_size}
    path.write_text(json.dumps(manifest, indent=2))


def copy_bundle(bundle: BundleCase, destination: Path) -> BundleCase:
    """A private copy a test may modify or analyse."""
    shutil.copytree(bundle.path, destination, ignore=shutil.ignore_patterns("analysis", "model_explorer"))
    return BundleCase(destination, bundle.model)


def analyze(case: BundleCase):
    from orchestrator.results.analysis import analyze_bundle

    model = case.model
    return analyze_bundle(case.path, pte=model.pte, sidecar=model.sidecar, reference_outputs=model.reference_outputs)


def raw_hashes(bundle: Path) -> dict[str, str]:
    """sha256 of every raw bundle file (analysis outputs live in sub-folders)."""
    return {p.name: sha256_file(p) for p in bundle.iterdir() if p.is_file()}


def rewrite_etdump(bundle: Path, edit: Callable[[Any], None]) -> None:
    """Apply edit(etdump dataclass) to a bundle's ETDump and write it back size-prefixed, as the runtime does."""
    from executorch.devtools.etdump.serialize import deserialize_from_etdump_flatcc, serialize_to_etdump_flatcc

    path = bundle / "etdump.etdp"
    etdump = deserialize_from_etdump_flatcc(path.read_bytes())
    edit(etdump)
    data = serialize_to_etdump_flatcc(etdump)
    path.write_bytes(struct.pack("<I", len(data)) + data)
    remanifest(bundle)


def adapter_graphs(pte: Path) -> dict[str, set[str]]:
    """graph id -> node ids, as the PTE adapter (run in-process) builds them for Model Explorer."""
    from pte_adapter_model_explorer.main import PTEAdapter

    converted = PTEAdapter().convert(str(pte), {})
    return {graph.id: {node.id for node in graph.nodes} for c in converted["graphCollections"] for graph in c.graphs}


def edit_json(path: Path, **changes: object) -> None:
    """Change a bundle's JSON file as if the board had written it so (its manifest entry follows)."""
    document = json.loads(path.read_text())
    document.update(changes)
    path.write_text(json.dumps(document))
    if path.name != "result_manifest.json" and (path.parent / "result_manifest.json").is_file():
        remanifest(path.parent)


# Values a board or an edited file can send that Python's json takes and etlab must refuse (issue 34.4): raw JSON text.
NESTING_BOMB = "[" * 100_000 + "]" * 100_000
HUGE_INTEGER = "9" * 400
_PLANTED = "@@planted@@"


def plant_json(path: Path, field: str, raw: str) -> None:
    """Set `field` ("latency.warm.median_ms", "warmup_ms[0]") of a JSON file to the raw JSON text `raw` (NaN, a
    400-digit integer, a nesting bomb: what json.dumps will not write); missing or null mappings on the way are
    made. A board's file is re-hashed in its manifest, as if the board had written it so."""
    document = json.loads(path.read_text())
    parts = [int(part[1:-1]) if part.startswith("[") else part for part in re.findall(r"\[\d+\]|[^.\[\]]+", field)]
    container = document
    for part in parts[:-1]:
        if isinstance(part, str) and not isinstance(container.get(part), dict | list):
            container[part] = {}
        container = container[part]
    container[parts[-1]] = _PLANTED
    path.write_text(json.dumps(document).replace(json.dumps(_PLANTED), raw))
    manifest = path.parent / "result_manifest.json"
    if path.parent.name not in ("analysis", "model_explorer") and path != manifest and manifest.is_file():
        remanifest(path.parent)


@pytest.fixture(scope="session")
def analysis_models(tiny_artifacts: dict[str, Any]) -> dict[str, TinyModel]:
    """Tiny models keyed "distilbert_xnnpack", "distilbert_portable", "gpt2_xnnpack", lowered by the real pipeline."""
    from orchestrator.lowering.artifacts import load_artifact
    from tests.plugins.artifacts import ARTIFACT_CACHE

    keys = (("distilbert", "xnnpack"), ("distilbert", "portable"), ("gpt2", "xnnpack"))
    return {
        f"{name}_{backend}": TinyModel.from_artifact(load_artifact(f"{name}-tiny", VARIANTS[backend], ARTIFACT_CACHE))
        for name, backend in keys
    }


@pytest.fixture(scope="session")
def analysis_bundles(
    analysis_models: dict[str, TinyModel], tmp_path_factory: pytest.TempPathFactory
) -> dict[str, BundleCase]:
    """One pristine bundle per model (2 warmups, 6 iterations). Copy one with `copy_bundle` before changing it."""
    root = tmp_path_factory.mktemp("analysis-bundles")
    return {key: BundleCase(make_bundle(model, root / f"run-{key}"), model) for key, model in analysis_models.items()}


BundleCopy = Callable[..., BundleCase]


@pytest.fixture
def bundle_copy(tmp_path: Path, analysis_bundles: dict[str, BundleCase]) -> BundleCopy:
    """bundle_copy("distilbert_xnnpack") -> a private BundleCase under this test's tmp_path."""

    def make(key: str, name: str | None = None) -> BundleCase:
        return copy_bundle(analysis_bundles[key], tmp_path / (name or f"run-{key}"))

    return make


RUNNER_KEYS = ("runner_distilbert_xnnpack", "runner_distilbert_portable")


@pytest.fixture(scope="session")
def runner_bundles(
    local_board: Any, tiny_artifacts: dict[str, Any], tmp_path_factory: pytest.TempPathFactory
) -> dict[str, BundleCase]:
    """Bundles from the real path: the native runner, through the agent, on the local board, pulled back."""
    from orchestrator.deploy.runs import RunParams, profile, pull, push_artifact
    from orchestrator.lowering.artifacts import load_artifact
    from orchestrator.results.store import new_run_id
    from orchestrator.transport import connect
    from tests.plugins.artifacts import ARTIFACT_CACHE

    root = tmp_path_factory.mktemp("runner-bundles")
    cases = {}
    with connect(local_board) as conn:
        for backend in ("xnnpack", "portable"):
            artifact = load_artifact("distilbert-tiny", VARIANTS[backend], ARTIFACT_CACHE)
            remote = profile(
                conn, artifact, push_artifact(conn, artifact), RunParams(warmup=2, iterations=6), new_run_id()
            )
            assert remote.status == "ok", remote.error
            cases[f"runner_distilbert_{backend}"] = BundleCase(
                pull(conn, remote, artifact, root), TinyModel.from_artifact(artifact)
            )
    return cases


@pytest.fixture(scope="session")
def all_bundles(
    analysis_bundles: dict[str, BundleCase], runner_bundles: dict[str, BundleCase]
) -> dict[str, BundleCase]:
    """Python-runtime bundles (synthetic board info) and real native-runner bundles."""
    return {**analysis_bundles, **runner_bundles}


def steady_copy(bundle: BundleCase, destination: Path, *, spread: float = 0.05) -> BundleCase:
    """A copy whose every timing is held within ±`spread` of its own median: a run on a quiet board.

    The runs behind these bundles happen on a shared, loaded machine, where one iteration of a tiny model takes
    2 ms or 50 ms (a 25x range within one run). Tests of what compare *does* with a known shift (a 3x slower run,
    a 4x slower operator) need a baseline whose noise is bounded, or the shift drowns in it; clipping keeps the
    real program's samples, their order and their medians. Iterations (timings.json) and every ETDump event
    (Method::execute, operator calls, delegate events), each event kind by its own median, are clipped.
    """
    import numpy as np

    case = copy_bundle(bundle, destination)

    def clip(values: list[float]) -> list[float]:
        median = float(np.median(values))
        return [min(max(v, median * (1 - spread)), median * (1 + spread)) for v in values]

    def steady(etdump: Any) -> None:
        groups: dict[tuple[Any, ...], list[Any]] = {}
        for run in (r for r in etdump.run_data if r.name == "Execute"):
            for event in run.events:
                profile = event.profile_event
                if profile is not None:
                    key = (profile.name, profile.chain_index, profile.instruction_id,
                           profile.delegate_debug_id_int, profile.delegate_debug_id_str)  # fmt: skip
                    groups.setdefault(key, []).append(profile)
        for events in groups.values():
            durations = clip([float(p.end_time - p.start_time) for p in events])
            for profile, duration in zip(events, durations, strict=True):
                profile.end_time = profile.start_time + round(duration)

    rewrite_etdump(case.path, steady)
    timings = json.loads((case.path / "timings.json").read_text())
    edit_json(case.path / "timings.json", iterations_ms=clip(timings["iterations_ms"]))
    return case
