"""Model Explorer overlays ("node data") that paint measured cost onto the .pte graph the PTE adapter draws.

One file per metric, `model_explorer/me_overlay_<metric>.json`, in Model Explorer's model node-data format:
`{"<graph id>": {"name": ..., "results": {"<node id>": {"value": v}}, "gradient": [...]}}`. Each file holds the
top-level graph (graph id = method name, node ids `<method>_<chain>_<instruction>`) and one graph per XNNPACK
delegate whose events could be placed on its nodes (graph id `<pte file>::<method>_<chain>_<instruction>`,
node ids = XNN node index). `model_explorer/overlays.json` says which .pte the overlays belong to, so `explore`
can target the right model when several are loaded. A program lowered from the exported `.pt2` (its source map names
the `.pt2`'s nodes) also gets `me_overlay_exported_<metric>.json` on the `.pt2`'s graph, with
`me_overlay_exported_lowering.json` saying which nodes lowering split or fused (results/exported_overlays.py); the
index names that `.pt2` (`exported_program`). Overlays are derived from the raw bundle again by
`fab analyze`, so they are written without fsyncs (fsutil.atomic_write_bytes).
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from orchestrator.fsutil import atomic_write_json
from orchestrator.programs.memory import ProgramMemory, read_program_memory
from orchestrator.results.exported_overlays import (
    EXPORTED_GRAPH,
    EXPORTED_PREFIX,
    LOWERING,
    exported_groups,
    exported_values,
    lowering_notes,
)
from orchestrator.results.summary import Counters, NumericsRow

if TYPE_CHECKING:  # the types only: reading and writing documents needs no numpy
    from orchestrator.results.counters_profile import CounterProfile
    from orchestrator.results.op_roofline import OperatorRooflines
    from orchestrator.results.profile import Attribution, DelegateProfile, Profile


OVERLAY_DIR = "model_explorer"
INDEX_NAME = "overlays.json"
METRICS = ("median_ms", "mean_ms", "pct")
LIVE_BYTES = "live_bytes"
LIVE_BYTES_MEANS = (
    "static, from the program's memory plan: for each top-level instruction, the bytes of memory-planned "
    "activations live while it runs (tensors from the first instruction that uses them to the last; inputs from "
    "the start, outputs to the end; shared bytes counted once). Delegate-internal and runtime allocations excluded."
)
GREEN_YELLOW_RED = [
    {"stop": 0.0, "bgColor": "#4caf50"},
    {"stop": 0.5, "bgColor": "#ffeb3b"},
    {"stop": 1.0, "bgColor": "#f44336"},
]
RED_YELLOW_GREEN = [  # a value where higher is better (an SQNR): the lowest red
    {"stop": 0.0, "bgColor": "#f44336"},
    {"stop": 0.5, "bgColor": "#ffeb3b"},
    {"stop": 1.0, "bgColor": "#4caf50"},
]
NUMERICS_METRICS = ("sqnr", "introduced_db")  # the numerics pass's: me_overlay_sqnr.json, me_overlay_introduced_db.json
ROOFLINE_PCT = "roofline_pct"  # FC, convolutions, batch matmuls against the board's limits (results/op_roofline.py)
BLUE_WHITE_RED = [
    {"stop": 0.0, "bgColor": "#2166ac"},
    {"stop": 0.5, "bgColor": "#ffffff"},
    {"stop": 1.0, "bgColor": "#b2182b"},
]


def overlay_path(bundle_dir: Path, metric: str) -> Path:
    return Path(bundle_dir) / OVERLAY_DIR / f"me_overlay_{metric}.json"


SIGNIFICANT_DIGITS = 4  # what Model Explorer shows of a value: 0.08934, not 0.08933781538461538


def shown(value: float) -> float:
    """A value as the node shows it: a float to SIGNIFICANT_DIGITS, a whole number (bytes, a finding) exact."""
    return value if isinstance(value, int) else float(f"{value:.{SIGNIFICANT_DIGITS}g}")


def graph_node_data(
    name: str,
    values: Mapping[str, float],
    gradient: list[dict[str, Any]],
    scale: tuple[float, float] | None = None,
) -> dict[str, Any]:
    """One graph's node data. Model Explorer colours a node by where its value sits between the graph's smallest and
    largest: a graph whose values are all one (a one-node delegate: the LM head's Fully Connected) has no range and
    stays unpainted, so its nodes get their colour here, on `scale` (the run's range over every graph)."""
    results: dict[str, dict[str, Any]] = {node: {"value": shown(value)} for node, value in values.items()}
    numbers = {value for value in values.values() if isinstance(value, int | float)}
    if len(numbers) == 1:
        low, high = scale if scale is not None else (0.0, max(numbers))
        for result in results.values():
            result["bgColor"] = gradient_color(result["value"], low, high, gradient)
    return {"name": name, "results": results, "gradient": gradient}


def gradient_color(value: float, low: float, high: float, gradient: list[dict[str, Any]]) -> str:
    """The colour Model Explorer's gradient gives `value` on the range low..high (the first stop when there is none)."""
    where = 0.0 if high <= low else max(0.0, min(1.0, (value - low) / (high - low)))
    stops = sorted(gradient, key=lambda stop: float(stop["stop"]))
    for left, right in itertools.pairwise(stops):
        if where <= float(right["stop"]):
            span = float(right["stop"]) - float(left["stop"])
            t = 0.0 if span <= 0 else (where - float(left["stop"])) / span
            ends = [str(stop["bgColor"]) for stop in (left, right)]
            a, b = ([int(end[i : i + 2], 16) for i in (1, 3, 5)] for end in ends)
            return "#{:02x}{:02x}{:02x}".format(*(round(x + (y - x) * t) for x, y in zip(a, b, strict=True)))
    return str(stops[-1]["bgColor"])


def timing_document(name: str, graphs: Mapping[str, Mapping[str, float]]) -> dict[str, Any]:
    """A timing overlay: every graph on the green-yellow-red gradient, a graph of one value on the run's range."""
    numbers = [value for values in graphs.values() for value in values.values()]
    scale = (min(numbers), max(numbers)) if numbers else None
    return {graph_id: graph_node_data(name, values, GREEN_YELLOW_RED, scale) for graph_id, values in graphs.items()}


def _metric_value(dist: Any, pct: float | None, metric: str) -> float | None:
    if dist is None:
        return None
    return {"median_ms": dist.median, "mean_ms": dist.mean, "pct": pct}[metric]


def overlay_values(profile: Profile, metric: str) -> dict[str, dict[str, float]]:
    """graph id -> node id -> value, for the top-level graph and every placed XNNPACK delegate."""
    top: dict[str, float] = {}
    for instruction in profile.instructions:
        if instruction.kind in ("KernelCall", "DelegateCall"):
            value = _metric_value(instruction.dist, instruction.pct, metric)
            if value is not None:
                top[instruction.node_id] = value
    graphs = {profile.method: top}
    for delegate in profile.delegates:
        if delegate.status != "placed":
            continue
        values = {}
        for node in delegate.nodes:
            value = _metric_value(node.dist, node.pct, metric)
            if value is not None:
                values[node.node] = value
        graphs[delegate.graph_id] = values
    return graphs


def write_live_bytes(bundle_dir: Path, program: ProgramMemory, name: str) -> Path:
    """me_overlay_live_bytes.json: the plan's live activation bytes per top-level instruction (no board needed)."""
    path = overlay_path(bundle_dir, LIVE_BYTES)
    atomic_write_json(
        path,
        {program.method: graph_node_data(name, program.node_values(), GREEN_YELLOW_RED)},
        durable=False,
        indent=None,
    )
    return path


def write_program_overlays(pte: Path, folder: Path) -> list[Path]:
    """Without a run: the live-bytes overlay of one .pte in `folder`, with its own index naming the program."""
    program = read_program_memory(pte)
    path = write_live_bytes(folder, program, f"live bytes ({pte.name})")
    index = Path(folder) / OVERLAY_DIR / INDEX_NAME
    atomic_write_json(index, {"schema": 1, "pte": pte.name, "method": program.method,
                              "metrics": {LIVE_BYTES: path.name},
                              "live_bytes": {"file": path.name, "measures": LIVE_BYTES_MEANS}})  # fmt: skip
    return [path]


def write_counter_overlays(bundle_dir: Path, counters: CounterProfile, run_id: str) -> list[Path]:
    """One overlay per captured counter and derived metric, on the top-level graph."""
    written = []
    for metric in counters.metrics:
        values = counters.values.get(metric) or {}
        path = overlay_path(bundle_dir, metric)
        document = {counters.method: graph_node_data(f"{metric} ({run_id})", values, GREEN_YELLOW_RED)}
        atomic_write_json(path, document, durable=False, indent=None)
        written.append(path)
    return written


def _numerics_value(row: NumericsRow, metric: str) -> float:
    return row.sqnr_db if metric == "sqnr" else row.introduced_db


def _matches(row: NumericsRow, source: Attribution) -> bool:
    """A tapped operator is this node's when the node came from its .pt2 node, else from its module and line."""
    if source.exported:
        return row.node in source.exported
    if row.source is None or source.source is None or row.module != source.module:
        return False
    return any(place.startswith(row.source) for place in source.source.split("; "))


def numerics_overlay_values(profile: Profile, rows: Sequence[NumericsRow], metric: str) -> dict[str, dict[str, float]]:
    """graph id -> node id -> the worst value (lowest SQNR) of the operators measured on that node: the top-level
    kernels and every placed XNNPACK node."""

    def worst(source: Attribution) -> float | None:
        found = [_numerics_value(row, metric) for row in rows if _matches(row, source)]
        return min(found) if found else None

    top = {}
    for instruction in profile.instructions:
        value = worst(instruction.source) if instruction.kind == "KernelCall" else None
        if value is not None:
            top[instruction.node_id] = value
    graphs = {profile.method: top}
    for delegate in profile.delegates:
        if delegate.status == "placed":
            values = {node.node: value for node in delegate.nodes if (value := worst(node.source)) is not None}
            graphs[delegate.graph_id] = values
    return graphs


def write_numerics_overlays(
    bundle_dir: Path, profile: Profile, rows: Sequence[NumericsRow], run_id: str, exported_program: str | None
) -> tuple[dict[str, str], dict[str, str]]:
    """me_overlay_sqnr.json and me_overlay_introduced_db.json on the .pte (its kernels and XNNPACK nodes), and
    me_overlay_exported_<metric>.json on the .pt2's own nodes (a tap is named by its .pt2 node); red is worst.
    Returns the overlay files by name: the .pte's, the .pt2's."""
    on_pte, on_pt2 = {}, {}
    for metric in NUMERICS_METRICS:
        label = f"{metric} against fp32 eager, dB ({run_id})"
        graphs = numerics_overlay_values(profile, rows, metric)
        document = {graph: graph_node_data(label, values, RED_YELLOW_GREEN) for graph, values in graphs.items()}
        path = overlay_path(bundle_dir, metric)
        atomic_write_json(path, document, durable=False, indent=None)
        on_pte[metric] = path.name
        if exported_program is not None:
            values: dict[str, float] = {}
            for row in rows:
                value = _numerics_value(row, metric)
                values[row.node] = min(value, values.get(row.node, value))
            path = overlay_path(bundle_dir, EXPORTED_PREFIX + metric)
            document = {EXPORTED_GRAPH: graph_node_data(f"{label} on {exported_program}", values, RED_YELLOW_GREEN)}
            atomic_write_json(path, document, durable=False, indent=None)
            on_pt2[metric] = path.name
    return on_pte, on_pt2


def write_roofline_overlay(bundle_dir: Path, rooflines: OperatorRooflines, run_id: str) -> Path | None:
    """me_overlay_roofline_pct.json: each FC, convolution and batch matmul node inside the delegates, its achieved
    rate as a share (%) of what the board's roofline lets it reach (red: far below); None when no node has one."""
    graphs = rooflines.overlay_values()
    if not graphs:
        return None
    label = f"{ROOFLINE_PCT}: % of the binding limit, bandwidth or peak ({run_id})"
    document = {
        graph: graph_node_data(label, values, RED_YELLOW_GREEN, (0.0, 100.0)) for graph, values in graphs.items()
    }
    path = overlay_path(bundle_dir, ROOFLINE_PCT)
    atomic_write_json(path, document, durable=False, indent=None)
    return path


def write_overlays(
    bundle_dir: Path,
    profile: Profile,
    *,
    run_id: str,
    pte_sha256: str | None,
    program: ProgramMemory | None = None,
    counters: CounterProfile | None = None,
    counters_summary: Counters | None = None,
    phases: Mapping[str, Profile] | None = None,
    numerics: Sequence[NumericsRow] | None = None,
    exported_program: str | None = None,
    rooflines: OperatorRooflines | None = None,
) -> list[Path]:
    """Write one overlay per metric (timing, live bytes, each captured counter, the numerics pass's SQNR and
    introduced error, the operators' roofline share when the board's limits are measured) plus the index; return
    the paths. `exported_program`: the .pt2 a quantized program's numerics paint when its profile names none (a tap
    is named by its .pt2 node).

    `phases` (prefill, decode of a text-generation run) add `me_overlay_<phase>_<metric>` for each timing metric.
    """
    written = []
    extra: dict[str, str] = {}
    # (overlay name, profile, timing metric, label): the run's, then each phase's under `<phase>_<metric>`.
    timed = [(metric, profile, metric, f"{metric} ({run_id})") for metric in METRICS]
    for phase, phase_profile in (phases or {}).items():
        timed += [(f"{phase}_{metric}", phase_profile, metric, f"{phase}: {metric} ({run_id})") for metric in METRICS]
    exported: dict[str, str] = {}  # overlay name -> file, on the .pt2's graph
    # Each profile's .pt2 groups, made once (they are the same for every metric, the notes and painted_pct).
    profiles = (profile, *(phases or {}).values()) if profile.exported_program is not None else ()
    groups = {id(p): exported_groups(p) for p in profiles}
    for overlay, metric_profile, metric, label in timed:
        document = timing_document(label, overlay_values(metric_profile, metric))
        path = overlay_path(bundle_dir, overlay)
        atomic_write_json(path, document, durable=False, indent=None)
        written.append(path)
        if overlay not in METRICS:
            extra[overlay] = path.name
        if profile.exported_program is not None:
            values = exported_values(groups[id(metric_profile)], metric)
            path = overlay_path(bundle_dir, EXPORTED_PREFIX + overlay)
            document = {
                EXPORTED_GRAPH: graph_node_data(f"{label} on {profile.exported_program}", values, GREEN_YELLOW_RED)
            }
            atomic_write_json(path, document, durable=False, indent=None)
            written.append(path)
            exported[overlay] = path.name
    if profile.exported_program is not None:
        path = overlay_path(bundle_dir, EXPORTED_PREFIX + LOWERING)
        notes = lowering_notes(profile, groups[id(profile)])
        name = f"lowering: split or fused nodes ({run_id})"
        document = {EXPORTED_GRAPH: {"name": name, "results": {node: {"value": note} for node, note in notes.items()}}}
        atomic_write_json(path, document, durable=False, indent=None)
        written.append(path)
        exported[LOWERING] = path.name
    if program is not None and program.live_bytes:
        written.append(write_live_bytes(bundle_dir, program, f"live bytes ({profile.pte_name or run_id})"))
        extra[LIVE_BYTES] = overlay_path(bundle_dir, LIVE_BYTES).name
    if counters is not None:
        written += write_counter_overlays(bundle_dir, counters, run_id)
        extra.update({metric: overlay_path(bundle_dir, metric).name for metric in counters.metrics})
    pt2 = profile.exported_program or exported_program
    if numerics:
        on_pte, on_pt2 = write_numerics_overlays(bundle_dir, profile, numerics, run_id, pt2)
        extra.update(on_pte)
        exported.update(on_pt2)
        written += [overlay_path(bundle_dir, metric) for metric in on_pte]
        written += [overlay_path(bundle_dir, EXPORTED_PREFIX + metric) for metric in on_pt2]
    roofline_path = write_roofline_overlay(bundle_dir, rooflines, run_id) if rooflines is not None else None
    if roofline_path is not None:
        written.append(roofline_path)
        extra[ROOFLINE_PCT] = roofline_path.name
    coverage = profile.coverage()
    index = {
        "schema": 1,
        "run_id": run_id,
        "pte": profile.pte_name,
        "pte_sha256": pte_sha256,
        "method": profile.method,
        "metrics": {metric: overlay_path(bundle_dir, metric).name for metric in METRICS} | extra,
        "live_bytes": {"file": extra[LIVE_BYTES], "measures": LIVE_BYTES_MEANS} if LIVE_BYTES in extra else None,
        "roofline_pct": (
            {"file": extra.get(ROOFLINE_PCT), "limits": rooflines.limits.text, "note": rooflines.note}
            if rooflines is not None
            else None
        ),
        "counters": _counters_index(counters, counters_summary),
        # by cost, the costliest first (Model Explorer's own list is in program order, with node counts)
        "delegate_graphs": [d.graph_id for d in by_cost(profile.delegates) if d.status == "placed"],
        "delegates": [_delegate_entry(d) for d in by_cost(profile.delegates)],
        "exported_program": (
            {
                "file": pt2,
                "graph": EXPORTED_GRAPH,
                "overlays": exported,
                # of the method's time, the share on .pt2 nodes (each group once): a delegate call's own time, beyond
                # its nodes' events, lands on none
                "painted_pct": sum(group.total("pct") or 0.0 for group in groups[id(profile)])
                if profile.exported_program is not None
                else None,
            }
            if pt2 is not None and exported
            else None
        ),
        "left_out": coverage["left_out"],
        "placed_share": coverage["placed_share"],
    }
    index_path = Path(bundle_dir) / OVERLAY_DIR / INDEX_NAME
    atomic_write_json(index_path, index, durable=False)
    written.append(index_path)
    return written


def by_cost(delegates: Sequence[DelegateProfile]) -> list[DelegateProfile]:
    """Delegate calls by their median time, the costliest first (program order among equals)."""
    return sorted(delegates, key=lambda d: -(d.call.median if d.call else 0.0))


def _delegate_entry(delegate: DelegateProfile) -> dict[str, Any]:
    call = delegate.call
    nodes = len(delegate.node_types) or len(delegate.nodes)
    return {"graph": delegate.graph_id, "node_id": delegate.node_id, "median_ms": call.median if call else None,
            "nodes": nodes, "placed": delegate.status == "placed"}  # fmt: skip


def _counters_index(counters: CounterProfile | None, summary: Counters | None) -> dict[str, Any] | None:
    if counters is None and summary is None:
        return None
    if counters is None:
        return {"status": "failed", "error": summary.error if summary else None, "captured": [], "missing": []}
    return {
        "status": "ok",
        "captured": counters.captured,
        "derived": counters.derived,
        "missing": counters.missing,  # no overlay file for these, rather than zeros
        "threads": counters.threads,
        "scope": counters.scope,
        "multiplexed": counters.multiplexed,
        "scaling": counters.scaling,
        "top_level_only": "counters are read around each top-level kernel and delegate call, not inside delegates",
    }


def diverging_color(value: float, limit: float) -> str:
    """Blue (faster, negative) -> white (0) -> red (slower, positive), saturating at +-limit."""
    if limit <= 0:
        return "#ffffff"
    t = max(-1.0, min(1.0, value / limit))
    end = str(BLUE_WHITE_RED[2 if t > 0 else 0]["bgColor"])
    r, g, b = (int(end[i : i + 2], 16) for i in (1, 3, 5))
    mix = abs(t)
    return "#{:02x}{:02x}{:02x}".format(*(round(255 + (c - 255) * mix) for c in (r, g, b)))


def write_diff_overlay(path: Path, values_by_graph: Mapping[str, Mapping[str, float]], name: str) -> Path:
    """A diverging overlay: each node gets its own colour so white means exactly no change."""
    limit = max((abs(v) for values in values_by_graph.values() for v in values.values()), default=0.0)
    document = {}
    for graph_id, values in values_by_graph.items():
        data = graph_node_data(name, values, BLUE_WHITE_RED)
        for node, value in values.items():
            data["results"][node]["bgColor"] = diverging_color(value, limit)
        document[graph_id] = data
    atomic_write_json(Path(path), document)
    return Path(path)
