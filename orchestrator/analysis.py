"""Bundle analysis: ETDump -> per-instruction and per-XNN-node statistics -> summary, ops tables and overlays.

Inputs are a pulled result bundle (layout in docs/DESIGN.md) and, optionally, the lowered .pte, its sidecar and
the eager reference outputs. Outputs go to `<bundle>/analysis/` and `<bundle>/model_explorer/`; the raw bundle
files are only read, never modified, also when the analysis fails.

Statistics cover the measured executions only: the runner writes one "Execute" block per execution, warmup
first, and timings.json says how many warmups there were. Each kernel instruction is timed by its
OPERATOR_CALL event (its `native_call_<op>` twin, nested inside, is not counted again); each delegate call by
its DELEGATE_CALL event. Shares (`pct`) are of the mean whole-method time ("Method::execute").
"""

from __future__ import annotations

import csv
import io
import math
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from . import console, overlays
from .bundle import verify_bundle
from .errors import AnalysisError, BundleError
from .etdump import Etdump, ProgramPlan, RunBlock, read_etdump, read_program_plan
from .fsutil import atomic_write_json, atomic_write_text, read_json, sha256_file
from .spec import is_valid_name
from .stats import Distribution, distribution
from .xnn_match import XNNPACK_BACKEND, MatchError, XnnNode, match_events, operator_type, read_xnn_nodes

SUMMARY_SCHEMA = 1
ANALYSIS_DIR = "analysis"
REQUIRED_FILES = ("result_manifest.json", "run.json")
NS_PER_TICK_CANDIDATES = (1.0, 1e3, 1e-3)  # ns, us and ps ticks; Linux runtimes tick in ns
CV_LIMIT = 0.05  # warm iterations varying more than this make a run "degraded"
HOT_CELSIUS = 80.0
TIMING_AGREEMENT = 0.25  # ETDump's Method::execute vs timings.json, relative
OUTPUT_RTOL = 1e-2  # relative to the reference output's largest magnitude
OUTPUT_ATOL = 1e-4
TOP_LAYERS = 10
OPS_CSV_COLUMNS = (
    "node_id", "chain", "instruction", "kind", "op", "samples",
    "median_ms", "p10_ms", "p90_ms", "mean_ms", "min_ms", "max_ms", "pct",
)  # fmt: skip


# --------------------------------------------------------------------------------------------------------------
# Profile: what the ETDump says, independent of the rest of the bundle


@dataclass
class InstructionProfile:
    node_id: str
    chain: int
    index: int
    kind: str  # KernelCall, DelegateCall, ...
    op: str | None  # "aten::add.out" for kernels, the backend id for delegates
    label: str  # what the PTE adapter shows: "aten::add", "XnnpackBackend"
    samples_ms: np.ndarray
    dist: Distribution | None = None
    pct: float | None = None

    def row(self) -> dict[str, Any]:
        d = self.dist
        return {
            "node_id": self.node_id,
            "chain": self.chain,
            "instruction": self.index,
            "kind": self.kind,
            "op": self.op,
            "samples": d.n if d else 0,
            "median_ms": d.median if d else None,
            "p10_ms": d.p10 if d else None,
            "p90_ms": d.p90 if d else None,
            "mean_ms": d.mean if d else None,
            "min_ms": d.min if d else None,
            "max_ms": d.max if d else None,
            "pct": self.pct,
        }


@dataclass
class XnnNodeProfile:
    node: str  # node id inside the delegate graph ("0", "1", ...)
    type: str
    events: list[str]
    samples_ms: np.ndarray
    dist: Distribution | None
    pct: float | None


@dataclass
class DelegateProfile:
    node_id: str
    backend: str
    graph_id: str  # the PTE adapter's delegate graph id: "<pte file name>::<node_id>"
    call: Distribution | None  # the DELEGATE_CALL time
    event_names: list[str]  # one execution's runtime events, in order
    event_samples_ms: np.ndarray  # executions x events
    status: str  # "placed", "left out", "no events", "not inspectable"
    reason: str | None = None
    nodes: list[XnnNodeProfile] = field(default_factory=list)
    unplaced_events: list[str] = field(default_factory=list)
    fused_nodes: list[str] = field(default_factory=list)
    node_types: dict[str, str] = field(default_factory=dict)

    def event_mean_ms(self) -> float:
        return float(self.event_samples_ms.sum(axis=1).mean()) if self.event_samples_ms.size else 0.0

    def placed_mean_ms(self) -> float:
        return float(sum(node.dist.mean for node in self.nodes if node.dist))

    def to_dict(self) -> dict[str, Any]:
        call_mean = self.call.mean if self.call else None
        events = [
            {"name": name, **_dist_ms(distribution(self.event_samples_ms[:, k]))}
            for k, name in enumerate(self.event_names)
        ]
        return {
            "node_id": self.node_id,
            "backend": self.backend,
            "graph_id": self.graph_id,
            "status": self.status,
            "reason": self.reason,
            "call_mean_ms": call_mean,
            "events_mean_ms": self.event_mean_ms(),
            "placed_mean_ms": self.placed_mean_ms(),
            "coverage": (self.placed_mean_ms() / call_mean) if call_mean else None,
            "nodes": [
                {"node": n.node, "type": n.type, "events": n.events, **_dist_ms(n.dist), "pct": n.pct}
                for n in self.nodes
            ],
            "fused_nodes": [{"node": node, "type": self.node_types.get(node)} for node in self.fused_nodes],
            "unplaced_events": self.unplaced_events,
            "events": events,
        }


@dataclass
class Profile:
    method: str
    pte_name: str | None
    executions: int
    ns_per_tick: float
    total: Distribution | None  # whole-method time per execution
    instructions: list[InstructionProfile]
    delegates: list[DelegateProfile]
    operator_types: list[dict[str, Any]]
    timing_agreement: float | None = None  # ETDump method time / timings.json time, after unit inference

    def coverage(self) -> dict[str, Any]:
        """How much delegate time the XNN-node overlays account for."""
        call = sum(d.call.mean for d in self.delegates if d.call)
        placed = sum(d.placed_mean_ms() for d in self.delegates)
        events = sum(d.event_mean_ms() for d in self.delegates)
        return {
            "delegate_call_mean_ms": call,
            "delegate_events_mean_ms": events,
            "placed_mean_ms": placed,
            "placed_share": placed / call if call else None,
            "placed_share_of_events": placed / events if events else None,
            "delegates": len(self.delegates),
            "delegates_placed": sum(1 for d in self.delegates if d.status == "placed"),
            "left_out": [{"node_id": d.node_id, "reason": d.reason} for d in self.delegates if d.status != "placed"],
        }


def _dist_ms(dist: Distribution | None) -> dict[str, Any]:
    if dist is None:
        return {"samples": 0, "median_ms": None, "p10_ms": None, "p90_ms": None, "mean_ms": None}
    return {"samples": dist.n, "median_ms": dist.median, "p10_ms": dist.p10, "p90_ms": dist.p90, "mean_ms": dist.mean}


def _instruction_key(chain: np.ndarray | int, index: np.ndarray | int) -> np.ndarray | int:
    return chain * 1_000_000 + index


def _method_totals(blocks: list[RunBlock]) -> np.ndarray:
    """Method::execute duration per block (ticks), NaN where a block lacks it."""
    totals = np.full(len(blocks), np.nan)
    for b, block in enumerate(blocks):
        for k, name in enumerate(block.event_names):
            if name == "Method::execute" and block.chain[k] == -1:
                totals[b] = float(block.end[k] - block.start[k])
                break
    return totals


def profile_etdump(
    etdump: Etdump,
    plan: ProgramPlan | None,
    *,
    method: str = "forward",
    skip_executions: int = 0,
    ns_per_tick: float = 1.0,
) -> Profile:
    """Per-instruction (and, for XNNPACK delegates, per-node) statistics over the Execute blocks after the first
    `skip_executions`. Instructions the plan lists but that never fired are kept, with no samples."""
    blocks = etdump.execute_blocks[skip_executions:]
    if not blocks:
        held = len(etdump.execute_blocks)
        raise AnalysisError(f"the ETDump holds {held} Execute block(s); none left after skipping {skip_executions}")
    ticks_per_ms = 1e6 / ns_per_tick  # dividing keeps round figures round (7000 ns -> 0.007 ms)
    instructions = _instruction_table(blocks, plan, method)
    columns = {_instruction_key(i.chain, i.index): c for c, i in enumerate(instructions)}
    times = np.zeros((len(blocks), len(instructions)))
    fired = np.zeros((len(blocks), len(instructions)), dtype=np.int64)
    sorted_keys = np.array(sorted(columns), dtype=np.int64)
    column_of_sorted = np.array([columns[k] for k in sorted_keys], dtype=np.int64)
    for b, block in enumerate(blocks):
        names = np.asarray(block.event_names, dtype=object)
        timed = ((names == "OPERATOR_CALL") | (names == "DELEGATE_CALL")) & (block.chain >= 0)
        keys = _instruction_key(block.chain[timed], block.instruction[timed])
        slots = np.searchsorted(sorted_keys, keys)
        slots = np.clip(slots, 0, len(sorted_keys) - 1)
        known = sorted_keys[slots] == keys
        cols = column_of_sorted[slots[known]]
        np.add.at(times[b], cols, block.durations[timed][known] / ticks_per_ms)
        np.add.at(fired[b], cols, 1)

    totals_ticks = _method_totals(blocks)
    totals = totals_ticks / ticks_per_ms
    if np.isnan(totals).any():  # no Method::execute event: fall back to the instructions' sum
        totals = np.where(np.isnan(totals), times.sum(axis=1), totals)
    total = distribution(totals)
    total_mean = total.mean if total else 0.0
    for c, instruction in enumerate(instructions):
        instruction.samples_ms = times[fired[:, c] > 0, c]
        instruction.dist = distribution(instruction.samples_ms)
        if instruction.dist and total_mean:
            instruction.pct = instruction.dist.mean / total_mean * 100.0

    pte_name = plan.pte.name if plan else None
    delegates = _delegate_profiles(blocks, plan, instructions, fired, method, ticks_per_ms, total_mean, pte_name)
    return Profile(
        method=method,
        pte_name=pte_name,
        executions=len(blocks),
        ns_per_tick=ns_per_tick,
        total=total,
        instructions=instructions,
        delegates=delegates,
        operator_types=_operator_types(delegates, total_mean, len(blocks)),
    )


def _instruction_table(blocks: list[RunBlock], plan: ProgramPlan | None, method: str) -> list[InstructionProfile]:
    empty = np.zeros(0)
    if plan is not None:
        return [
            InstructionProfile(i.node_id(method), i.chain, i.index, i.kind, i.op or i.backend, i.label, empty)
            for i in plan.instructions
        ]
    # No .pte: learn the instructions from the events themselves.
    found: dict[tuple[int, int], InstructionProfile] = {}
    for block in blocks:
        for k, name in enumerate(block.event_names):
            chain, index = int(block.chain[k]), int(block.instruction[k])
            if chain < 0:
                continue
            node_id = f"{method}_{chain}_{index}"
            if name == "DELEGATE_CALL" and (chain, index) not in found:
                found[(chain, index)] = InstructionProfile(
                    node_id, chain, index, "DelegateCall", None, "delegate", empty
                )
            elif name.startswith("native_call_"):
                op = name[len("native_call_") :]  # the kernel's name, without the namespace only the program knows
                found[(chain, index)] = InstructionProfile(
                    node_id, chain, index, "KernelCall", op, op.split(".", 1)[0], empty
                )
            elif name == "OPERATOR_CALL" and (chain, index) not in found:
                found[(chain, index)] = InstructionProfile(node_id, chain, index, "KernelCall", None, "kernel", empty)
    return [found[key] for key in sorted(found)]


def _delegate_profiles(
    blocks: list[RunBlock],
    plan: ProgramPlan | None,
    instructions: list[InstructionProfile],
    fired: np.ndarray,
    method: str,
    ticks_per_ms: float,
    total_mean: float,
    pte_name: str | None,
) -> list[DelegateProfile]:
    by_key = plan.by_key() if plan else {}
    # Per block, the delegate-internal events of each instruction, in order.
    sequences: list[dict[tuple[int, int], list[int]]] = []
    for block in blocks:
        groups: dict[tuple[int, int], list[int]] = defaultdict(list)
        for k, delegate_name in enumerate(block.delegate_names):
            if delegate_name is not None and block.chain[k] >= 0:
                groups[(int(block.chain[k]), int(block.instruction[k]))].append(k)
        sequences.append(groups)

    profiles = []
    for c, instruction in enumerate(instructions):
        if instruction.kind != "DelegateCall":
            continue
        key = (instruction.chain, instruction.index)
        backend = instruction.op or "delegate"
        profile = DelegateProfile(
            node_id=instruction.node_id,
            backend=backend,
            graph_id=f"{pte_name}::{instruction.node_id}" if pte_name else instruction.node_id,
            call=instruction.dist,
            event_names=[],
            event_samples_ms=np.zeros((0, 0)),
            status="no events",
        )
        profiles.append(profile)
        ran = [b for b in range(len(blocks)) if fired[b, c] > 0]
        if not ran:
            profile.reason = "the delegate never ran in the measured executions"
            continue
        if any(fired[b, c] > 1 for b in ran):
            profile.status, profile.reason = "left out", "the delegate ran more than once per execution"
            continue
        name_lists = [[blocks[b].delegate_names[k] for k in sequences[b].get(key, [])] for b in ran]
        if not name_lists[0]:
            profile.reason = "the backend reported no per-operator events"
            continue
        if any(names != name_lists[0] for names in name_lists[1:]):
            profile.status, profile.reason = "left out", "its operator events differ between executions"
            continue
        profile.event_names = [str(name) for name in name_lists[0]]
        profile.event_samples_ms = np.array(
            [blocks[b].durations[sequences[b][key]] / ticks_per_ms for b in ran], dtype=np.float64
        )
        plan_instruction = by_key.get(key)
        if backend != XNNPACK_BACKEND or plan_instruction is None or plan_instruction.delegate is None:
            profile.status = "not inspectable"
            profile.reason = "no .pte given" if plan is None else f"no node matcher for backend {backend}"
            continue
        try:
            nodes = read_xnn_nodes(plan_instruction.delegate, plan.pte)
        except AnalysisError as exc:  # one unreadable payload costs that delegate's overlay, not the analysis
            profile.status, profile.reason = "left out", str(exc)
            continue
        _place_on_nodes(profile, nodes, total_mean)
    return profiles


def _place_on_nodes(profile: DelegateProfile, nodes: list[XnnNode], total_mean: float) -> None:
    profile.node_types = {str(node.index): node.type for node in nodes}
    try:
        placement = match_events(nodes, profile.event_names)
    except MatchError as exc:
        profile.status, profile.reason = "left out", str(exc)
        return
    profile.status = "placed"
    types = {node.index: node.type for node in nodes}
    for index in sorted(placement.node_events):
        positions = placement.node_events[index]
        samples = profile.event_samples_ms[:, positions].sum(axis=1)
        dist = distribution(samples)
        pct = dist.mean / total_mean * 100.0 if dist and total_mean else None
        events = [profile.event_names[p] for p in positions]
        profile.nodes.append(XnnNodeProfile(str(index), types[index], events, samples, dist, pct))
    profile.unplaced_events = [profile.event_names[p] for p in placement.unplaced_events]
    profile.fused_nodes = [str(index) for index in placement.fused_nodes]


def _operator_types(delegates: list[DelegateProfile], total_mean: float, executions: int) -> list[dict[str, Any]]:
    """Delegate-internal time per XNNPACK operator type, summed per execution over every delegate call site."""
    per_type: dict[str, np.ndarray] = {}
    counts: dict[str, int] = defaultdict(int)
    for delegate in delegates:
        if delegate.event_samples_ms.shape[0] != executions:
            continue  # a delegate that skipped some executions cannot be summed per execution
        for k, name in enumerate(delegate.event_names):
            kind = operator_type(name)
            per_type[kind] = per_type.get(kind, np.zeros(executions)) + delegate.event_samples_ms[:, k]
            counts[kind] += 1
    rows = []
    for kind, samples in per_type.items():
        dist = distribution(samples)
        pct = dist.mean / total_mean * 100.0 if dist and total_mean else None
        rows.append({"type": kind, "count": counts[kind], **_dist_ms(dist), "pct": pct})
    rows.sort(key=lambda row: -(row["mean_ms"] or 0.0))
    return rows


def inferred_ns_per_tick(etdump_ticks: np.ndarray, timings_ms: list[float]) -> tuple[float, float | None]:
    """The tick length (ns) that makes ETDump's Method::execute agree with timings.json, and the remaining ratio."""
    ticks = etdump_ticks[np.isfinite(etdump_ticks)]
    if ticks.size == 0 or not timings_ms or float(np.median(timings_ms)) <= 0:
        return 1.0, None
    measured_ns = float(np.median(timings_ms)) * 1e6
    best = min(NS_PER_TICK_CANDIDATES, key=lambda ns: abs(math.log(float(np.median(ticks)) * ns / measured_ns)))
    return best, float(np.median(ticks)) * best / measured_ns


# --------------------------------------------------------------------------------------------------------------
# The bundle around the profile: latency, board conditions, correctness, validity


@dataclass
class Summary:
    bundle_dir: Path
    data: dict[str, Any]  # what summary.json holds
    profile: Profile | None
    written: list[Path] = field(default_factory=list)

    @property
    def validity(self) -> str:
        return str(self.data["validity"]["status"])

    @property
    def reasons(self) -> list[str]:
        return [str(r["reason"]) for r in self.data["validity"]["reasons"]]


def _read_optional_json(path: Path) -> tuple[Any, str | None]:
    if not path.is_file():
        return None, f"{path.name} is missing"
    try:
        return read_json(path), None
    except (OSError, ValueError) as exc:
        return None, f"{path.name} is unreadable ({exc})"


def _read_required_json(path: Path) -> Any:
    if not path.is_file():
        raise AnalysisError(f"bundle {path.parent} is missing {path.name}")
    try:
        return read_json(path)
    except (OSError, ValueError) as exc:
        raise AnalysisError(f"bundle file {path} is unreadable: {exc}") from None


def _number_list(value: Any) -> list[float]:
    if not isinstance(value, list):
        return []
    return [float(x) for x in value if isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x)]


def _number(value: Any) -> float | None:
    if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    return None


def latency_summary(timings: dict[str, Any] | None) -> dict[str, Any]:
    timings = timings or {}
    warmup = _number_list(timings.get("warmup_ms"))
    iterations = _number_list(timings.get("iterations_ms"))
    first = warmup[0] if warmup else (iterations[0] if iterations else None)
    warm = distribution(iterations)
    return {
        "load_ms": _number(timings.get("load_ms")),
        "method_init_ms": _number(timings.get("method_init_ms")),
        "first_run_ms": first,
        "warmup_runs": len(warmup),
        "iterations": len(iterations),
        "iterations_requested": timings.get("iterations_requested"),
        "stopped_early": timings.get("stopped_early"),
        "threads": timings.get("threads"),
        "warm": {
            "min_ms": warm.min,
            "median_ms": warm.median,
            "mean_ms": warm.mean,
            "p90_ms": warm.p90,
            "max_ms": warm.max,
            "cv": warm.cv,
        }
        if warm
        else None,
    }


def _throttle(info: dict[str, Any] | None) -> dict[str, Any] | None:
    throttled = info.get("throttled") if isinstance(info, dict) else None
    if not isinstance(throttled, dict):
        return None
    active = throttled.get("active")
    if not isinstance(active, list):
        flags = throttled.get("flags")
        active = [name for name, on in flags.items() if on] if isinstance(flags, dict) else []
    return {"raw": throttled.get("raw"), "active": [str(flag) for flag in active]}


def board_conditions(before: dict[str, Any] | None, after: dict[str, Any] | None) -> dict[str, Any]:
    """Governor, temperature and throttling around the run, read defensively (any field may be missing)."""

    def get(info: dict[str, Any] | None, key: str) -> Any:
        return info.get(key) if isinstance(info, dict) else None

    throttled_before, throttled_after = _throttle(before), _throttle(after)
    seen_before = set(throttled_before["active"]) if throttled_before else set()
    during = []
    if throttled_after:
        during = [f for f in throttled_after["active"] if f.endswith("_now") or f not in seen_before]
    if throttled_before:
        during += [f for f in throttled_before["active"] if f.endswith("_now") and f not in during]
    return {
        "hostname": get(after, "hostname") or get(before, "hostname"),
        "board_model": get(after, "model") or get(before, "model"),
        "arch": get(after, "arch") or get(before, "arch"),
        "cores_online": get(after, "cores_online") or get(before, "cores_online"),
        "governor_before": get(before, "governor"),
        "governor_after": get(after, "governor"),
        "temperature_c_before": _number(get(before, "temperature_c")),
        "temperature_c_after": _number(get(after, "temperature_c")),
        "throttled_before": throttled_before,
        "throttled_after": throttled_after,
        "throttling_during_run": sorted(set(during)),
    }


def check_outputs(outputs: Path, reference: Path) -> dict[str, Any]:
    """Board outputs vs eager reference outputs: max abs error and top-1 agreement per output."""
    from .tensorfile import TensorFileError, read_tensors

    try:
        got, want = read_tensors(outputs), read_tensors(reference)
    except TensorFileError as exc:
        return {"checked": False, "ok": False, "reason": str(exc), "outputs": []}
    if len(got) != len(want):
        return {"checked": True, "ok": False, "reason": f"{len(got)} outputs, reference has {len(want)}", "outputs": []}
    rows, problems = [], []
    for position, (board, eager) in enumerate(zip(got, want, strict=True)):
        name = eager.name or board.name or f"output {position}"
        if board.shape != eager.shape:
            problems.append(f"{name}: shape {board.shape}, reference {eager.shape}")
            rows.append({"name": name, "shape": board.shape, "reference_shape": eager.shape})
            continue
        a, b = board.array.astype(np.float64), eager.array.astype(np.float64)
        # Every comparison with NaN is false: non-finite board values must be caught before any threshold.
        finite = np.isfinite(b)
        bad = int(np.count_nonzero(finite & ~np.isfinite(a)))
        both = finite & np.isfinite(a)
        error = float(np.max(np.abs(a - b)[both])) if both.any() else 0.0
        scale = float(np.max(np.abs(b[finite]))) if finite.any() else 0.0
        row: dict[str, Any] = {"name": name, "shape": board.shape, "max_abs_error": error, "reference_max_abs": scale}
        if bad:
            row["max_abs_error"] = None  # NaN/Inf have no error figure (and are not valid JSON)
            row["non_finite"] = bad
            problems.append(f"{name}: {bad} non-finite value(s) (NaN or Inf) where the reference is finite")
            rows.append(row)
            continue
        if np.issubdtype(eager.array.dtype, np.floating) and b.ndim >= 1 and b.shape[-1] > 1:
            flat_a, flat_b = a.reshape(-1, a.shape[-1]), b.reshape(-1, b.shape[-1])
            top_a, top_b = flat_a.argmax(axis=1), flat_b.argmax(axis=1)
            rows_ref = np.arange(len(flat_b))
            # A flip between near-equal reference logits is a tie, not a disagreement.
            margin = flat_b[rows_ref, top_b] - flat_b[rows_ref, top_a]
            genuine = (top_a != top_b) & (margin > 2 * error)
            row["top1_agreement"] = float(np.mean(top_a == top_b))
            if genuine.any():
                problems.append(f"{name}: top-1 differs from the reference in {int(genuine.sum())} row(s)")
        if error > OUTPUT_ATOL + OUTPUT_RTOL * scale:
            problems.append(f"{name}: max abs error {error:.3g} exceeds {OUTPUT_ATOL + OUTPUT_RTOL * scale:.3g}")
        rows.append(row)
    errors = [r["max_abs_error"] for r in rows if r.get("max_abs_error") is not None]
    agreements = [r["top1_agreement"] for r in rows if "top1_agreement" in r]
    non_finite = sum(r.get("non_finite", 0) for r in rows)
    return {
        "checked": True,
        "ok": not problems,
        "reason": "; ".join(problems) or None,
        "max_abs_error": None if non_finite else max(errors) if errors else None,
        "non_finite": non_finite,
        "top1_agreement": min(agreements) if agreements else None,
        "outputs": rows,
    }


def judge_validity(
    manifest: dict[str, Any],
    latency: dict[str, Any],
    board: dict[str, Any],
    correctness: dict[str, Any],
    notes: list[tuple[str, str]],
) -> dict[str, Any]:
    """valid / degraded / invalid, with every reason. `notes` are (level, reason) pairs found along the way."""
    reasons = list(notes)
    status = manifest.get("status")
    if status != "ok":
        error = manifest.get("error") or f"exit code {manifest.get('runner_exit_code')}"
        reasons.append(("invalid", f"runner status {status!r}: {error}"))
    if not latency["iterations"]:
        reasons.append(("invalid", "no measured iterations"))
    if correctness.get("checked") and not correctness.get("ok"):
        reasons.append(("invalid", f"output mismatch: {correctness.get('reason')}"))
    if board["throttling_during_run"]:
        reasons.append(("degraded", f"throttling: {', '.join(board['throttling_during_run'])}"))
    for moment in ("before", "after"):
        governor = board[f"governor_{moment}"]
        if governor is not None and governor != "performance":
            reasons.append(("degraded", f"cpufreq governor {governor!r} {moment} the run (want 'performance')"))
            break
    hottest = max(
        (t for t in (board["temperature_c_before"], board["temperature_c_after"]) if t is not None), default=None
    )
    if hottest is not None and hottest >= HOT_CELSIUS:
        reasons.append(("degraded", f"SoC temperature reached {hottest:.1f} °C"))
    warm = latency.get("warm")
    if warm and warm["cv"] > CV_LIMIT:
        reasons.append(("degraded", f"unstable timings: CV {warm['cv'] * 100:.1f}% > {CV_LIMIT * 100:.0f}%"))
    levels = {level for level, _ in reasons}
    verdict = "invalid" if "invalid" in levels else "degraded" if "degraded" in levels else "valid"
    return {"status": verdict, "reasons": [{"level": level, "reason": reason} for level, reason in reasons]}


def _bundle_model_sha(run: dict[str, Any], manifest: dict[str, Any]) -> str | None:
    for source in (run, manifest):
        value = source.get("model_sha256") if isinstance(source, dict) else None
        if isinstance(value, str) and len(value) == 64:
            return value.lower()
    return None


def _pte_sha(pte: Path, sidecar: dict[str, Any] | None) -> str:
    """The sidecar's hash when its record of the .pte still matches the file (size and mtime), else hashed."""
    record = ((sidecar or {}).get("files") or {}).get("pte") if isinstance(sidecar, dict) else None
    sha = (sidecar or {}).get("sha256") if isinstance(sidecar, dict) else None
    if isinstance(record, dict) and isinstance(sha, str):
        stat = pte.stat()
        if record.get("size") == stat.st_size and record.get("mtime_ns") == stat.st_mtime_ns:
            return sha.lower()
    return sha256_file(pte)


@dataclass
class _Bundle:
    """The raw bundle files analysis reads, and problems found reading them."""

    path: Path
    manifest: dict[str, Any]
    run: dict[str, Any]
    timings: dict[str, Any]
    board_before: dict[str, Any] | None
    board_after: dict[str, Any] | None
    notes: list[tuple[str, str]]

    @property
    def ran_ok(self) -> bool:
        return self.manifest.get("status") == "ok"

    @property
    def method(self) -> str:
        return str(self.timings.get("method") or (self.run.get("parameters") or {}).get("method") or "forward")

    @property
    def etdump_requested(self) -> bool:
        parameters = self.run.get("parameters") or {}
        return self.timings.get("etdump") is not False and parameters.get("etdump") is not False


def _read_bundle(bundle_dir: Path) -> _Bundle:
    if not bundle_dir.is_dir():
        raise AnalysisError(f"bundle folder {bundle_dir} does not exist")
    manifest = _read_required_json(bundle_dir / "result_manifest.json")
    run = _read_required_json(bundle_dir / "run.json")
    if not isinstance(manifest, dict) or not isinstance(run, dict):
        raise AnalysisError(f"bundle {bundle_dir}: result_manifest.json or run.json is not a JSON object")
    listed = manifest.get("files") if isinstance(manifest.get("files"), dict) else {}
    missing = sorted(name for name in listed if not (bundle_dir / name).is_file())
    if missing:
        raise AnalysisError(f"bundle {bundle_dir} is missing {', '.join(missing)} (listed in result_manifest.json)")
    try:
        verify_bundle(bundle_dir)  # what the board wrote, byte for byte: a torn or edited file is refused
    except BundleError as exc:
        raise AnalysisError(str(exc)) from None
    _check_names(bundle_dir, manifest, run)
    notes: list[tuple[str, str]] = []
    timings, problem = _read_optional_json(bundle_dir / "timings.json")
    if problem and manifest.get("status") == "ok":
        raise AnalysisError(f"bundle {bundle_dir}: {problem}")
    before, problem_before = _read_optional_json(bundle_dir / "board_info_before.json")
    after, problem_after = _read_optional_json(bundle_dir / "board_info_after.json")
    for problem in (problem_before, problem_after):
        if problem:
            notes.append(("degraded", f"board conditions unknown: {problem}"))
    return _Bundle(
        bundle_dir,
        manifest,
        run,
        timings if isinstance(timings, dict) else {},
        before if isinstance(before, dict) else None,
        after if isinstance(after, dict) else None,
        notes,
    )


def _check_names(bundle_dir: Path, manifest: dict[str, Any], run: dict[str, Any]) -> None:
    """Names the board wrote end up in file names and reports: they must pass the spec name rule, every time."""
    labels = run.get("labels")
    if labels is not None and not isinstance(labels, dict):
        raise AnalysisError(f"bundle {bundle_dir}: run.json 'labels' is not a mapping")
    fields = {"result_manifest.json run_id": manifest.get("run_id"), "run.json run_id": run.get("run_id")}
    fields |= {f"run.json labels.{key}": (labels or {}).get(key) for key in ("model", "backend")}
    for field_name, value in fields.items():
        if value is not None and not is_valid_name(value):
            raise AnalysisError(
                f"bundle {bundle_dir}: {field_name} {str(value)[:80]!r} is not a valid name "
                "(letters, digits, '.', '_', '-'); the bundle is refused"
            )


def _hashing_ms(run: dict[str, Any]) -> dict[str, float | None] | None:
    """How long the agent spent hashing the model and inputs before the run (run.json `hashing_ms`)."""
    hashing = run.get("hashing_ms")
    if not isinstance(hashing, dict):
        return None
    return {key: _number(hashing.get(key)) for key in ("model", "inputs")}


def _verify_program(bundle: _Bundle, pte: Path, sidecar: dict[str, Any] | None) -> None:
    if not pte.is_file():
        raise AnalysisError(f"program {pte} does not exist")
    expected = _bundle_model_sha(bundle.run, bundle.manifest)
    if expected is None:
        bundle.notes.append(("degraded", "the bundle does not name its model's sha256; the .pte is unverified"))
    elif _pte_sha(pte, sidecar) != expected:
        raise AnalysisError(
            f"{pte.name} is not the model this bundle ran (bundle model sha256 {expected[:12]}…)",
            hint="pass the .pte that was profiled, or re-lower and re-run",
        )


def analyze_bundle(
    bundle_dir: Path,
    *,
    pte: Path | None = None,
    sidecar: dict[str, Any] | None = None,
    reference_outputs: Path | None = None,
) -> Summary:
    """Analyse a pulled bundle; write analysis/summary.json, ops.csv, ops.json and the Model Explorer overlays.

    Raises AnalysisError (and leaves the raw bundle untouched) when the bundle, its ETDump or the .pte is unusable.
    """
    bundle = _read_bundle(Path(bundle_dir))
    if pte is not None:
        pte = Path(pte)
        _verify_program(bundle, pte, sidecar)

    profile = None
    etdump_path = bundle.path / "etdump.etdp"
    if bundle.ran_ok and bundle.etdump_requested and not etdump_path.is_file():
        raise AnalysisError(f"bundle {bundle.path} is missing etdump.etdp")
    if etdump_path.is_file():
        plan = read_program_plan(pte, bundle.method) if pte is not None else None
        profile, profile_notes = _profile_bundle(read_etdump(etdump_path), plan, bundle.method, bundle.timings)
        bundle.notes.extend(profile_notes)
    elif bundle.ran_ok:
        bundle.notes.append(("degraded", "run without ETDump: no per-operator profile"))

    correctness: dict[str, Any] = {"checked": False, "ok": None, "reason": "no reference outputs given"}
    outputs_path = bundle.path / "outputs.etlt"
    if bundle.ran_ok and not outputs_path.is_file():
        raise AnalysisError(f"bundle {bundle.path} is missing outputs.etlt")
    if reference_outputs is not None and outputs_path.is_file():
        if not Path(reference_outputs).is_file():
            raise AnalysisError(f"reference outputs {reference_outputs} do not exist")
        correctness = check_outputs(outputs_path, Path(reference_outputs))

    latency = latency_summary(bundle.timings)
    latency["hashing_ms"] = _hashing_ms(bundle.run)
    board = board_conditions(bundle.board_before, bundle.board_after)
    data = _summary_document(bundle, sidecar, pte, latency, board, correctness, profile)
    data["validity"] = judge_validity(bundle.manifest, latency, board, correctness, bundle.notes)
    summary = Summary(bundle_dir=bundle.path, data=data, profile=profile)
    summary.written = _write_outputs(bundle.path, data, profile)
    return summary


def _write_outputs(bundle_dir: Path, data: dict[str, Any], profile: Profile | None) -> list[Path]:
    """Everything goes to analysis/ and model_explorer/; summary.json last, as the commit point."""
    out = bundle_dir / ANALYSIS_DIR
    written = []
    # Outputs of an earlier analysis (and comparisons made from it) must not outlive it.
    stale = [out / "ops.json", out / "ops.csv", *out.glob("compare_vs_*.json")]
    stale += (bundle_dir / overlays.OVERLAY_DIR).glob("me_overlay_*.json")
    for path in stale:
        path.unlink(missing_ok=True)
    if profile is not None:
        atomic_write_json(out / "ops.json", ops_document(profile, data["run_id"]))
        atomic_write_text(out / "ops.csv", _ops_csv(profile))
        written += [out / "ops.json", out / "ops.csv"]
        written += overlays.write_overlays(
            bundle_dir, profile, run_id=data["run_id"], pte_sha256=data["model"]["sha256"]
        )
    atomic_write_json(out / "summary.json", data)
    written.append(out / "summary.json")
    return written


def _profile_bundle(
    etdump: Etdump, plan: ProgramPlan | None, method: str, timings: dict[str, Any]
) -> tuple[Profile, list[tuple[str, str]]]:
    notes: list[tuple[str, str]] = []
    warmup = len(_number_list(timings.get("warmup_ms")))
    iterations = _number_list(timings.get("iterations_ms"))
    execute = etdump.execute_blocks
    if timings and len(execute) != warmup + len(iterations):
        notes.append((
            "degraded",
            f"the ETDump holds {len(execute)} Execute blocks but timings.json lists {warmup} warmup + "
            f"{len(iterations)} measured executions",
        ))  # fmt: skip
    skip = warmup if len(execute) > warmup else 0
    ns_per_tick, agreement = inferred_ns_per_tick(_method_totals(execute[skip:]), iterations)
    if agreement is not None and abs(agreement - 1.0) > TIMING_AGREEMENT:
        notes.append((
            "degraded",
            f"ETDump's method time is {agreement * 100:.0f}% of timings.json's; per-operator times may be off",
        ))  # fmt: skip
    profile = profile_etdump(etdump, plan, method=method, skip_executions=skip, ns_per_tick=ns_per_tick)
    profile.timing_agreement = agreement
    return profile, notes


def _summary_document(
    bundle: _Bundle,
    sidecar: dict[str, Any] | None,
    pte: Path | None,
    latency: dict[str, Any],
    board: dict[str, Any],
    correctness: dict[str, Any],
    profile: Profile | None,
) -> dict[str, Any]:
    manifest, run, timings = bundle.manifest, bundle.run, bundle.timings
    labels = run.get("labels") if isinstance(run.get("labels"), dict) else {}
    side = sidecar if isinstance(sidecar, dict) else {}
    data: dict[str, Any] = {
        "schema": SUMMARY_SCHEMA,
        "run_id": manifest.get("run_id") or run.get("run_id") or bundle.path.name,
        "status": manifest.get("status"),
        "error": manifest.get("error"),
        "labels": labels,
        "model": {
            "name": labels.get("model") or side.get("model"),
            "backend": labels.get("backend") or side.get("backend"),
            "pte": pte.name if pte else None,
            "sha256": _bundle_model_sha(run, manifest),
            "weights": side.get("weights"),
        },
        "board": labels.get("board") or board.get("hostname"),
        "versions": {
            "runner": timings.get("runner_version"),
            "executorch_board": timings.get("executorch_version"),
            "agent": run.get("agent_version") or manifest.get("agent_version"),
            "lowered_with": side.get("versions"),
        },
        "latency": latency,
        "board_conditions": board,
        "correctness": correctness,
    }
    if profile is not None:
        data["profile"] = _profile_summary(profile)
    return data


def _profile_summary(profile: Profile) -> dict[str, Any]:
    timed = [i for i in profile.instructions if i.dist]
    timed.sort(key=lambda i: -i.dist.mean)  # type: ignore[union-attr]
    delegated = sum(i.dist.mean for i in timed if i.kind == "DelegateCall")  # type: ignore[union-attr]
    kernels = sum(i.dist.mean for i in timed if i.kind != "DelegateCall")  # type: ignore[union-attr]
    total = profile.total.mean if profile.total else 0.0
    return {
        "method": profile.method,
        "executions": profile.executions,
        "ns_per_tick": profile.ns_per_tick,
        "etdump_vs_timings": profile.timing_agreement,
        "method_ms": profile.total.to_dict() if profile.total else None,
        "instructions": len(profile.instructions),
        "instructions_timed": len(timed),
        "top_layers": [
            {"node_id": i.node_id, "op": i.op or i.label, "ms": i.dist.median, "mean_ms": i.dist.mean, "pct": i.pct}  # type: ignore[union-attr]
            for i in timed[:TOP_LAYERS]
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


def ops_document(profile: Profile, run_id: str) -> dict[str, Any]:
    return {
        "schema": SUMMARY_SCHEMA,
        "run_id": run_id,
        "method": profile.method,
        "pte": profile.pte_name,
        "executions": profile.executions,
        "ns_per_tick": profile.ns_per_tick,
        "method_ms": profile.total.to_dict() if profile.total else None,
        "instructions": [
            {**i.row(), "samples_ms": [round(float(v), 6) for v in i.samples_ms]} for i in profile.instructions
        ],
        "delegates": [d.to_dict() for d in profile.delegates],
        "operator_types": profile.operator_types,
        "coverage": profile.coverage(),
    }


def _ops_csv(profile: Profile) -> str:
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=OPS_CSV_COLUMNS, lineterminator="\n")
    writer.writeheader()
    for instruction in profile.instructions:
        writer.writerow(instruction.row())
    return buffer.getvalue()


def load_summary(bundle_dir: Path) -> dict[str, Any]:
    """A bundle's analysis/summary.json, or an AnalysisError saying it has not been analysed."""
    path = Path(bundle_dir) / ANALYSIS_DIR / "summary.json"
    if not path.is_file():
        raise AnalysisError(f"{bundle_dir} has not been analysed (no {ANALYSIS_DIR}/summary.json)")
    return read_json(path)


def render_top_ops(summary: Summary | Path, limit: int = 15) -> None:
    """Print the top operators of an analysed bundle (a Summary, or the bundle's folder) and its validity."""
    if isinstance(summary, Summary):
        data = summary.data
        timed = [i.row() for i in summary.profile.instructions if i.dist] if summary.profile else []
    else:
        data = load_summary(Path(summary))
        ops_path = Path(summary) / ANALYSIS_DIR / "ops.json"
        timed = [r for r in read_json(ops_path)["instructions"] if r["samples"]] if ops_path.is_file() else []
    timed.sort(key=lambda r: -r["mean_ms"])
    rows = [[r["node_id"], r["op"] or r["kind"], r["median_ms"], r["p90_ms"], r["mean_ms"], r["pct"]] for r in timed]
    warm = data["latency"]["warm"]
    measured = (
        f"median {warm['median_ms']:.2f} ms over {data['latency']['iterations']} iterations, CV {warm['cv'] * 100:.1f}%"
        if warm
        else "no measured iterations"
    )
    caption = f"run {data['run_id']}: {measured} — {data['validity']['status']}"
    columns = ["node", "op", "median ms", "p90 ms", "mean ms", "% of run"]
    console.table("Top operators", columns, rows[:limit], caption=caption)
    profile = data.get("profile") or {}
    inside = profile.get("top_operator_types") or []
    if inside:
        split, coverage = profile.get("split") or {}, profile.get("overlay_coverage") or {}
        console.table(
            "Inside the XNNPACK delegates",
            ["operator", "count", "median ms", "mean ms", "% of run"],
            [[t["type"], t["count"], t["median_ms"], t["mean_ms"], t["pct"]] for t in inside[:limit]],
            caption=f"delegated {split.get('delegated_pct') or 0:.0f}% / not delegated "
            f"{split.get('non_delegated_pct') or 0:.0f}% of the run; "
            f"{coverage.get('delegates_placed', 0)}/{coverage.get('delegates', 0)} delegates painted in Model Explorer",
        )
    for reason in data["validity"]["reasons"]:
        (console.error if reason["level"] == "invalid" else console.warn)(reason["reason"])
