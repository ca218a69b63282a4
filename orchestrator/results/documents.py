"""What an analysis writes: summary.json, ops.json, ops.csv (and reads back: load_summary)."""

from __future__ import annotations

import csv
import io
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from orchestrator.errors import AnalysisError, BundleError
from orchestrator.fsutil import atomic_write_json, atomic_write_text, read_json, unreadable
from orchestrator.lowering.sidecar import Sidecar
from orchestrator.programs.memory import ProgramMemory
from orchestrator.records import to_data
from orchestrator.results import overlays
from orchestrator.results.bundle import board_supplied
from orchestrator.results.bundle_reader import BundleFiles, bundle_model_sha
from orchestrator.results.summary import (
    SUMMARY_SCHEMA,
    Latency,
    NumericsRow,
    ProgramInfo,
    RunSummary,
    Validity,
    read_summary,
    summary_data,
)
from orchestrator.results.summary_outputs import Correctness
from orchestrator.results.trace import TRACE_FILE

if TYPE_CHECKING:  # the types only: reading and writing documents needs no numpy
    from orchestrator.results.counters_profile import CounterProfile
    from orchestrator.results.op_roofline import OperatorRooflines
    from orchestrator.results.profile import Profile

NUMERICS_DOCUMENT = "numerics.json"  # analysis/numerics.json: every operator of the numerics pass


ANALYSIS_DIR = "analysis"
TOP_LAYERS = 10
OPS_CSV_COLUMNS = (
    "node_id", "chain", "instruction", "kind", "op", "samples",
    "median_ms", "p10_ms", "p90_ms", "mean_ms", "min_ms", "max_ms", "pct", "module", "module_type", "source",
)  # fmt: skip


@dataclass
class Summary:
    """An analysis's result: the summary, the profile it came from, and the files written."""

    bundle_dir: Path
    run: RunSummary
    profile: Profile | None
    written: list[Path] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # what the analysis could not do, for the command to say once
    timeline: list[str] = field(default_factory=list)  # the executions trace.json draws, as its steps are titled

    @property
    def data(self) -> dict[str, Any]:
        """What summary.json holds."""
        return summary_data(self.run)

    @property
    def validity(self) -> str:
        return self.run.validity.status

    @property
    def reasons(self) -> list[str]:
        return [r.reason for r in self.run.validity.reasons]


def write_outputs(
    bundle_dir: Path,
    run: RunSummary,
    profile: Profile | None,
    *,
    program: ProgramMemory | None = None,
    counters: CounterProfile | None = None,
    phases: Mapping[str, Profile] | None = None,
    trace: dict[str, Any] | None = None,
    numerics: dict[str, Any] | None = None,
    numerics_rows: Sequence[NumericsRow] = (),
    exported_program: str | None = None,
    rooflines: OperatorRooflines | None = None,
) -> list[Path]:
    """Everything goes to analysis/ and model_explorer/; summary.json last, as the commit point, the one file
    fsynced: the others are derived again from the raw bundle by `fab analyze` (fsutil.atomic_write_bytes).

    `phases` (a text-generation run: prefill, decode) get their own ops_<phase>.json and overlays; `trace` (results/
    trace.py) is analysis/trace.json, the timeline; `rooflines` (results/op_roofline.py) ops.json's `roofline` and
    the `roofline_pct` overlay.
    """
    out = bundle_dir / ANALYSIS_DIR
    written = []
    # Outputs of an earlier analysis (and comparisons made from it) must not outlive it.
    stale = [
        out / "ops.json",
        out / "ops.csv",
        out / TRACE_FILE,
        out / NUMERICS_DOCUMENT,
        *out.glob("ops_*.json"),
        *out.glob("compare_vs_*.json"),
    ]
    stale += (bundle_dir / overlays.OVERLAY_DIR).glob("me_overlay_*.json")
    for path in stale:
        path.unlink(missing_ok=True)
    if numerics is not None:
        out.mkdir(parents=True, exist_ok=True)
        atomic_write_json(out / NUMERICS_DOCUMENT, numerics, durable=False)
        written.append(out / NUMERICS_DOCUMENT)
    if profile is not None:
        document = ops_document(profile, run.run_id, counters, rooflines)
        atomic_write_json(out / "ops.json", document, durable=False, indent=None)
        atomic_write_text(out / "ops.csv", ops_csv(profile, counters), durable=False)
        written += [out / "ops.json", out / "ops.csv"]
        written += overlays.write_overlays(
            bundle_dir,
            profile,
            run_id=run.run_id,
            pte_sha256=run.model.sha256,
            program=program,
            counters=counters,
            counters_summary=run.counters,
            phases=phases,
            numerics=numerics_rows,
            exported_program=exported_program,
            rooflines=rooflines,
        )
    for phase, phase_profile in (phases or {}).items():
        atomic_write_json(
            out / f"ops_{phase}.json", ops_document(phase_profile, run.run_id, None), durable=False, indent=None
        )
        written.append(out / f"ops_{phase}.json")
    if trace is not None:
        atomic_write_json(out / TRACE_FILE, trace, durable=False, indent=None)
        written.append(out / TRACE_FILE)
    atomic_write_json(out / "summary.json", summary_data(run))
    written.append(out / "summary.json")
    return written


def summary_document(
    bundle: BundleFiles,
    sidecar: Sidecar | None,
    pte: Path | None,
    latency: Latency,
    board: dict[str, Any],
    correctness: Correctness,
    profile: Profile | None,
    validity: Validity,
) -> RunSummary:
    manifest, run, timings = bundle.manifest, bundle.run, bundle.timings
    given_labels = run.get("labels")
    labels = given_labels if isinstance(given_labels, dict) else {}
    pte_record = sidecar.files.get("pte") if sidecar is not None else None
    return RunSummary(
        run_id=manifest.get("run_id") or run.get("run_id") or bundle.path.name,
        status=manifest.get("status"),
        error=manifest.get("error"),
        labels=labels,
        model=ProgramInfo(
            name=labels.get("model") or (sidecar.model if sidecar is not None else None),
            backend=labels.get("backend") or (sidecar.variant.name if sidecar is not None else None),
            pte=pte.name if pte else None,
            sha256=bundle_model_sha(run, manifest),
            weights=sidecar.weights if sidecar is not None else None,
            size_bytes=pte_record.size if pte_record is not None else None,
            parameters=sidecar.parameters if sidecar is not None else None,
        ),
        board=labels.get("board") or board.get("hostname"),
        versions={
            "runner": timings.get("runner_version"),
            "executorch_board": timings.get("executorch_version"),
            "agent": run.get("agent_version") or manifest.get("agent_version"),
            "lowered_with": dict(sidecar.versions) if sidecar is not None else None,
        },
        latency=latency,
        board_conditions=board,
        correctness=correctness,
        profile=profile_summary(profile) if profile is not None else None,
        validity=validity,
    )


def profile_summary(profile: Profile) -> dict[str, Any]:
    """summary.json's `profile`: the top instructions and the delegated split, by median (the shares' baseline,
    etdump_profile.share_base_ms)."""
    timed = sorted(((i, i.dist) for i in profile.instructions if i.dist), key=lambda timing: -timing[1].median)
    delegated = sum(dist.median for i, dist in timed if i.kind == "DelegateCall")
    kernels = sum(dist.median for i, dist in timed if i.kind != "DelegateCall")
    total = max(profile.total.median if profile.total else 0.0, delegated + kernels)
    return {
        "method": profile.method,
        "executions": profile.executions,
        "ns_per_tick": profile.ns_per_tick,
        "etdump_vs_timings": profile.timing_agreement,
        "method_ms": to_data(profile.total),
        "instructions": len(profile.instructions),
        "instructions_timed": len(timed),
        "top_layers": [
            {"node_id": i.node_id, "op": i.op or i.label, "ms": dist.median, "mean_ms": dist.mean, "pct": i.pct}
            for i, dist in timed[:TOP_LAYERS]
        ],
        "split": {
            "delegated_ms": delegated,
            "non_delegated_ms": kernels,
            "other_ms": max(0.0, total - delegated - kernels),
            "delegated_pct": delegated / total * 100 if total else None,
            "non_delegated_pct": kernels / total * 100 if total else None,
        },
        "top_operator_types": profile.operator_types[:TOP_LAYERS],
        "overlay_coverage": profile.coverage(),
    }


def _counter_columns(counters: CounterProfile | None) -> list[str]:
    """Only what was captured (and what derives from it) gets a column: a missing counter is no column of zeros."""
    return counters.metrics if counters is not None else []


def _counter_cells(counters: CounterProfile | None, node_id: str) -> dict[str, float | None]:
    return {metric: counters.values[metric].get(node_id) for metric in _counter_columns(counters)} if counters else {}


def ops_document(
    profile: Profile, run_id: str, counters: CounterProfile | None = None, rooflines: OperatorRooflines | None = None
) -> dict[str, Any]:
    return {
        "schema": SUMMARY_SCHEMA,
        "run_id": run_id,
        "method": profile.method,
        "pte": profile.pte_name,
        "executions": profile.executions,
        "ns_per_tick": profile.ns_per_tick,
        "method_ms": to_data(profile.total),
        "counters": _counter_columns(counters),
        "instructions": [
            {**i.row(), **_counter_cells(counters, i.node_id), "samples_ms": [round(float(v), 6) for v in i.samples_ms]}
            for i in profile.instructions
        ],
        "delegates": to_data([d.report() for d in profile.delegates]),
        "operator_types": profile.operator_types,
        "coverage": profile.coverage(),
        "roofline": to_data(rooflines) if rooflines is not None else None,
    }


def ops_csv(profile: Profile, counters: CounterProfile | None = None) -> str:
    buffer = io.StringIO()
    columns = [*OPS_CSV_COLUMNS, *_counter_columns(counters)]
    writer = csv.DictWriter(buffer, fieldnames=columns, lineterminator="\n")
    writer.writeheader()
    for instruction in profile.instructions:
        writer.writerow({**instruction.row(), **_counter_cells(counters, instruction.node_id)})
    return buffer.getvalue()


def refuse_board_supplied(bundle_dir: Path) -> None:
    """AnalysisError when the bundle's manifest lists analysis/ or model_explorer/ files: a board supplied them
    (pulled before pulls refused that), so nothing there is etlab's own, overlays included."""
    try:
        supplied = board_supplied(bundle_dir)
    except BundleError as exc:
        raise AnalysisError(str(exc)) from None
    if supplied:
        raise AnalysisError(
            f"run {bundle_dir.name}: its board listed {', '.join(supplied[:3])} in result_manifest.json; an analysis "
            "a board supplies is never read",
            hint=f"delete {bundle_dir}: `fab pull` refuses such a bundle now",
        )


def read_analysis_file(bundle_dir: Path, name: str) -> Any:
    """One file an analysis wrote (analysis/<name>), read strictly. AnalysisError when it is unreadable, or when the
    bundle's manifest lists analysis files: then a board supplied them (pulled before pulls refused that), and
    nothing in analysis/ is etlab's own."""
    bundle_dir = Path(bundle_dir)
    refuse_board_supplied(bundle_dir)
    path = bundle_dir / ANALYSIS_DIR / name
    try:
        return read_json(path)
    except (OSError, ValueError) as exc:
        raise AnalysisError(unreadable(path, exc)) from None


class NotAnalysed(AnalysisError):
    """A pulled run the analysis has not been run on (no analysis/summary.json)."""


def load_summary(bundle_dir: Path) -> RunSummary:
    """A bundle's analysis/summary.json: NotAnalysed when there is none, an AnalysisError naming the file and the
    field when it is unreadable or not etlab's."""
    path = Path(bundle_dir) / ANALYSIS_DIR / "summary.json"
    if not path.is_file():
        raise NotAnalysed(f"{bundle_dir} has not been analysed (no {ANALYSIS_DIR}/summary.json)")
    return read_summary(read_analysis_file(bundle_dir, "summary.json"), str(path))
