"""Recorded profiles for the advisor's tests (tests/data/advice/<model>/: ops.json, summary.json and the sidecar of
a run on the local board), read back as the advisor's RunFacts."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from orchestrator.advice.findings import RunFacts
from orchestrator.lowering.lowered import spec_from_record
from orchestrator.lowering.sidecar import sidecar_from_data
from orchestrator.results.ops_record import read_ops
from orchestrator.results.summary import read_summary

DATA = Path(__file__).parents[1] / "data" / "advice"


def recorded(model: str) -> dict[str, Any]:
    return {name: json.loads((DATA / model / f"{name}.json").read_text()) for name in ("ops", "summary", "sidecar")}


def facts_of(raw: dict[str, Any], **changes: Any) -> RunFacts:
    sidecar = sidecar_from_data(raw["sidecar"])
    facts = RunFacts(
        read_ops(raw["ops"]),
        read_summary(raw["summary"]),
        sidecar,
        spec_from_record(sidecar.spec, "recorded sidecar"),
    )
    return dataclasses.replace(facts, **changes)
