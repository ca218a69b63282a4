"""The facts the advisor reads from a results folder: which run of the same model on the same board measures an
fp32 run's quantization saving. A run of any quantized scheme of the registry does (quantize.Scheme.peers)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from orchestrator.advice.facts import run_facts
from orchestrator.lowering.artifacts import Artifact, ArtifactPaths
from orchestrator.lowering.quantize.schemes import FP32, QUANTIZED, SCHEMES
from orchestrator.lowering.sidecar import sidecar_from_data
from orchestrator.lowering.variants import QUANTIZED_ON, Variant
from orchestrator.results.store import find_run
from tests.advice.advice_helpers import DATA, recorded

MODEL = "distilbert-tiny"


def _recorded_run(results: Path, backend: str, run_id: str) -> None:
    run = results / "local" / MODEL / backend / run_id
    (run / "analysis").mkdir(parents=True)
    (run / "result_manifest.json").write_text(json.dumps({"run_id": run_id}))
    for name in ("ops", "summary"):
        shutil.copy(DATA / MODEL / f"{name}.json", run / "analysis" / f"{name}.json")


def _facts_of_the_fp32_run(tmp_path: Path, *peers: Variant) -> tuple[Variant | None, bool]:
    results = tmp_path / "results"
    _recorded_run(results, "xnnpack", "20261201T000000Z-000abc")
    for number, peer in enumerate(peers, 1):
        _recorded_run(results, peer.name, f"20261201T00000{number}Z-000abc")
    fp32 = Variant(QUANTIZED_ON)
    artifact = Artifact(ArtifactPaths.for_model(MODEL, tmp_path / "artifacts"), fp32,
                        sidecar_from_data(recorded(MODEL)["sidecar"]))  # fmt: skip
    facts, _ = run_facts(find_run("20261201T000000Z", root=results), artifact, results_root=results)
    assert facts.sidecar is not None  # the artifact is the program the run ran: its peers are looked for
    return facts.quantized_peer_variant, facts.quantized_peer is not None


@pytest.mark.parametrize("scheme", [scheme.name for scheme in QUANTIZED])
def test_a_run_of_every_quantized_scheme_measures_the_saving(tmp_path: Path, scheme: str) -> None:
    peer = Variant(QUANTIZED_ON, SCHEMES[scheme])
    assert _facts_of_the_fp32_run(tmp_path, peer) == (peer, True)


def test_the_peers_are_taken_in_the_order_fp32_names_them(tmp_path: Path) -> None:
    peers = [Variant(QUANTIZED_ON, SCHEMES[name]) for name in FP32.peers]
    assert {variant.scheme for variant in peers} == set(QUANTIZED)
    assert _facts_of_the_fp32_run(tmp_path, *reversed(peers)) == (peers[0], True)
