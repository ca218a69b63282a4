"""`fab nightly`: the lab's matrix every night, recorded, compared with its baseline, reported.

Cells (board × model × backend) are recorded as soon as they finish, one transaction each, so a killed
nightly re-run the same night skips what is already recorded and loses nothing.

Exit codes: 0 all good, 1 a regression (or a model that fails on a healthy board), 2 an infrastructure
failure (a board unreachable or lost; takes precedence, since the night is incomplete).
"""

from __future__ import annotations

import datetime as dt
import secrets
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from orchestrator import console, paths
from orchestrator.boards.fanout import fan_out
from orchestrator.boards.inventory import Board, Inventory
from orchestrator.deploy.pipeline import CellJob, CellOutcome, run_cells_on_board
from orchestrator.deploy.runs import RunParams
from orchestrator.errors import EtlabError, ExitCode, InventoryError
from orchestrator.lab.history import History, RunRecord
from orchestrator.lab.report import CellVerdict, NightReport, write_reports
from orchestrator.lowering.spec import ModelSpec, resolve_spec
from orchestrator.results.stats import DEFAULT_MIN_EFFECT, compare_samples

DEFAULT_BASELINE_NIGHTS = 7
MIN_BASELINE_NIGHTS = 2
OP_MIN_SHARE = 0.005  # an operator must move at least 0.5% of the total to be named


@dataclass(frozen=True)
class MatrixEntry:
    models: tuple[ModelSpec, ...]
    backends: tuple[str, ...]
    boards: tuple[str, ...]
    params: RunParams


@dataclass(frozen=True)
class NightlyConfig:
    entries: tuple[MatrixEntry, ...]
    history_url: str | None = None
    reports_dir: Path = field(default_factory=lambda: paths.results_dir() / "nightly")
    baseline_nights: int = DEFAULT_BASELINE_NIGHTS
    min_baseline_nights: int = MIN_BASELINE_NIGHTS
    min_effect: float = DEFAULT_MIN_EFFECT
    weights: str = "auto"


# ---------------------------------------------------------------- configuration


_TOP_KEYS = {
    "history", "reports", "baseline_nights", "min_baseline_nights", "min_effect", "weights",
    "iterations", "warmup", "threads", "max_seconds", "timeout", "matrix",
}  # fmt: skip
_ENTRY_KEYS = {
    "models",
    "backends",
    "boards",
    "groups",
    "tags",
    "iterations",
    "warmup",
    "threads",
    "max_seconds",
    "timeout",
}
_RUN_KEYS = ("iterations", "warmup", "threads", "max_seconds", "timeout")


def _nightly_node(path: Path) -> yaml.Node | None:
    root = yaml.compose(path.read_text())
    if isinstance(root, yaml.MappingNode):
        for key, value in root.value:
            if key.value == "nightly":
                return value
    return None


def load_config(inventory: Inventory) -> NightlyConfig:
    """Validate the inventory's `nightly:` section; errors name the file, line and field."""
    path = inventory.path
    node = _nightly_node(path)
    if node is None or (isinstance(node, yaml.ScalarNode) and node.value in ("", "null", "~")):
        raise InventoryError(
            f"{path}: no `nightly:` section", hint="see README.md (Nightly runs) for the matrix format"
        )

    def fail(at: yaml.Node, field_name: str, message: str) -> InventoryError:
        return InventoryError(f"{path}:{at.start_mark.line + 1}: {field_name}: {message}")

    def mapping(at: yaml.Node, field_name: str, allowed: set[str]) -> dict[str, yaml.Node]:
        if not isinstance(at, yaml.MappingNode):
            raise fail(at, field_name, "expected a mapping")
        found = {}
        for key, value in at.value:
            if key.value not in allowed:
                import difflib

                close = difflib.get_close_matches(key.value, allowed, n=1)
                hint = f" (did you mean {close[0]!r}?)" if close else ""
                raise fail(key, f"{field_name}.{key.value}", f"unknown key{hint}")
            found[key.value] = value
        return found

    def scalar(at: yaml.Node, field_name: str, kind: type, low: float | None = None) -> Any:
        value = yaml.safe_load(yaml.serialize(at))
        if kind is float and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        if not isinstance(value, kind) or (isinstance(value, bool) and kind is not bool):
            raise fail(at, field_name, f"expected {kind.__name__}, got {value!r}")
        if low is not None and value < low:
            raise fail(at, field_name, f"must be >= {low}, got {value!r}")
        return value

    def names(at: yaml.Node, field_name: str) -> tuple[str, ...]:
        if isinstance(at, yaml.ScalarNode):
            return (str(at.value),)
        if not isinstance(at, yaml.SequenceNode) or not all(isinstance(v, yaml.ScalarNode) for v in at.value):
            raise fail(at, field_name, "expected a name or a list of names")
        return tuple(str(v.value) for v in at.value)

    def run_params(found: dict[str, yaml.Node], field_name: str, base: dict[str, Any]) -> dict[str, Any]:
        values = dict(base)
        for key in _RUN_KEYS:
            if key in found:
                kind = float if key in ("max_seconds", "timeout") else int
                values[key] = scalar(found[key], f"{field_name}.{key}", kind, 0 if key == "warmup" else 1)
        return values

    top = mapping(node, "nightly", _TOP_KEYS)
    defaults = run_params(top, "nightly", {"iterations": 30, "warmup": 3})
    if "matrix" not in top:
        raise fail(node, "nightly.matrix", "is required: a list of {models, backends, boards/groups/tags}")
    matrix = top["matrix"]
    if not isinstance(matrix, yaml.SequenceNode) or not matrix.value:
        raise fail(matrix, "nightly.matrix", "expected a non-empty list")

    entries = []
    seen: dict[tuple[str, str, str], int] = {}
    for index, entry_node in enumerate(matrix.value):
        where = f"nightly.matrix[{index}]"
        found = mapping(entry_node, where, _ENTRY_KEYS)
        for required in ("models", "backends"):
            if required not in found:
                raise fail(entry_node, f"{where}.{required}", "is required")
        models = []
        for model in names(found["models"], f"{where}.models"):
            # A spec file path is relative to the inventory; anything else is a built-in name.
            is_file = model.endswith(".json")
            try:
                models.append(resolve_spec(None, path.parent / model) if is_file else resolve_spec(model))
            except EtlabError as exc:
                raise fail(found["models"], f"{where}.models", str(exc).splitlines()[0]) from None
        backends = names(found["backends"], f"{where}.backends")
        for backend in backends:
            if backend not in ("portable", "xnnpack"):
                raise fail(found["backends"], f"{where}.backends", f"unknown backend {backend!r}")
        # The cell's boards: the union of the boards, groups and tags it names (the inventory default if none).
        picked: dict[str, Board] = {}
        for key, pick in (
            ("boards", lambda value: inventory.select(boards=[value])),
            ("groups", lambda value: inventory.select(group=value)),
            ("tags", lambda value: inventory.select(tag=value)),
        ):
            for value in names(found[key], f"{where}.{key}") if key in found else ():
                try:
                    picked.update((board.name, board) for board in pick(value))
                except EtlabError as exc:
                    raise fail(found[key], f"{where}.{key}", str(exc).splitlines()[0]) from None
        selected = list(picked.values()) or inventory.default_selection()
        params = run_params(found, where, defaults)
        for board in selected:
            for spec in models:
                for backend in backends:
                    cell = (board.name, spec.name, backend)
                    if cell in seen:
                        raise fail(entry_node, where, f"cell {' / '.join(cell)} is already in matrix[{seen[cell]}]")
                    seen[cell] = index
        entries.append(MatrixEntry(tuple(models), backends, tuple(b.name for b in selected), RunParams(**params)))

    reports = top.get("reports")
    return NightlyConfig(
        entries=tuple(entries),
        history_url=scalar(top["history"], "nightly.history", str) if "history" in top else None,
        reports_dir=Path(scalar(reports, "nightly.reports", str))
        if reports is not None
        else paths.results_dir() / "nightly",
        baseline_nights=scalar(top["baseline_nights"], "nightly.baseline_nights", int, 1)
        if "baseline_nights" in top
        else DEFAULT_BASELINE_NIGHTS,
        min_effect=scalar(top["min_effect"], "nightly.min_effect", float, 0)
        if "min_effect" in top
        else DEFAULT_MIN_EFFECT,
        weights=scalar(top["weights"], "nightly.weights", str) if "weights" in top else "auto",
    )


# ---------------------------------------------------------------- recording


def record_from_cell(cell: CellOutcome, night: str, versions: dict[str, str], threads: int | None) -> RunRecord:
    summary = cell.summary or {}
    warm = (summary.get("latency") or {}).get("warm") or {}
    validity = summary.get("validity") or {}
    status = "ok" if cell.ok else ("infra" if cell.infrastructure else "failed")
    latencies: list[float] = []
    ops: dict[str, tuple[str, float]] = {}
    if cell.bundle:
        from orchestrator.fsutil import read_json

        try:
            latencies = [float(v) for v in read_json(cell.bundle / "timings.json").get("iterations_ms", [])]
        except (OSError, ValueError):
            latencies = []
        try:
            for row in read_json(cell.bundle / "analysis" / "ops.json").get("instructions", []):
                if row.get("median_ms") is not None:
                    ops[f"{row['chain']}:{row['instruction']}"] = (
                        str(row.get("op") or row.get("kind")),
                        row["median_ms"],
                    )
        except (OSError, ValueError, KeyError):
            ops = {}
    return RunRecord(
        run_id=cell.run_id or f"{night}-unrun-{secrets.token_hex(4)}",
        night=night,
        board=cell.board,
        model=cell.model,
        backend=cell.backend,
        status=status,
        validity=validity.get("status") or "invalid",
        reasons=[r.get("reason", "") for r in validity.get("reasons", [])] or ([cell.error] if cell.error else []),
        error=cell.error,
        stage=cell.stage if not cell.ok else None,
        versions=versions,
        pte_sha256=(summary.get("model") or {}).get("sha256"),
        threads=(summary.get("latency") or {}).get("threads") or threads,
        median_ms=warm.get("median_ms"),
        p90_ms=warm.get("p90_ms"),
        mean_ms=warm.get("mean_ms"),
        cv=warm.get("cv"),
        conditions=summary.get("board_conditions") or {},
        bundle_path=str(cell.bundle) if cell.bundle else None,
        latencies_ms=latencies,
        ops=ops,
    )


# ---------------------------------------------------------------- regression detection


def judge(
    record: RunRecord, baseline: Sequence[RunRecord], min_effect: float, *, min_nights: int = MIN_BASELINE_NIGHTS
) -> CellVerdict:
    """Compare one cell with its baseline nights (valid runs on the same board, model, backend and versions).

    A regression needs all of: a statistically real shift of the per-iteration samples (stats.compare_samples),
    an effect of at least `min_effect` and at least the night-to-night spread of the baseline, and a median
    outside the range of every baseline night. Nights differ more than iterations within a night, so one
    baseline night is not enough to call anything.
    """
    if record.status == "infra":
        return CellVerdict(record, "infra", record.error or "")
    if record.status != "ok":
        return CellVerdict(record, "failed", record.error or "")
    if record.validity == "invalid":
        return CellVerdict(record, "not compared", "this run is invalid: " + "; ".join(record.reasons))
    usable = [b for b in baseline if b.latencies_ms]
    pooled = [v for b in usable for v in b.latencies_ms]
    current = float(np.median(record.latencies_ms))
    baseline_median = float(np.median(pooled)) if pooled else None
    ratio = current / baseline_median if baseline_median else None
    if len(usable) < min_nights:
        detail = f"building a baseline: {len(usable)} valid night(s) so far, {min_nights} needed"
        return CellVerdict(record, "new", detail, baseline_median, ratio)
    night_medians = [float(np.median(b.latencies_ms)) for b in usable]
    spread = (max(night_medians) - min(night_medians)) / float(np.median(night_medians))
    threshold = max(min_effect, spread)
    verdict = compare_samples(pooled, record.latencies_ms, min_effect=threshold)
    beyond_nights = current > max(night_medians) if verdict.change == "slower" else current < min(night_medians)
    if verdict.is_change and beyond_nights:
        kind = "regression" if verdict.change == "slower" else "improvement"
        detail = f"{verdict.reason}; baseline: {len(usable)} nights, {len(pooled)} samples, threshold {threshold:.1%}"
        slower = _slower_ops(record, usable, min_effect) if kind == "regression" else []
        if slower:
            detail += "; slower operators: " + ", ".join(op["op"] for op in slower[:5])
        return CellVerdict(record, kind, detail, baseline_median, ratio, slower)
    reason = verdict.reason if not verdict.is_change else f"{verdict.reason}, but within the baseline nights' range"
    return CellVerdict(record, "no change", reason, baseline_median, ratio)


def _slower_ops(record: RunRecord, baseline: Sequence[RunRecord], min_effect: float) -> list[dict[str, Any]]:
    total = record.median_ms or 0.0
    rows = []
    for key, (name, current) in record.ops.items():
        before = [b.ops[key][1] for b in baseline if key in b.ops]
        if not before:
            continue
        reference = float(np.median(before))
        delta = current - reference
        if reference > 0 and current / reference - 1 >= min_effect and delta >= OP_MIN_SHARE * total:
            rows.append({"op": f"{name} [{key}]", "baseline_ms": reference, "current_ms": current, "delta_ms": delta})
    return sorted(rows, key=lambda row: -row["delta_ms"])


# ---------------------------------------------------------------- the night


def run_nightly(
    inventory: Inventory,
    *,
    night: str | None = None,
    history_url: str | None = None,
    reports_dir: Path | None = None,
    artifacts_root: Path | None = None,
    results_root: Path | None = None,
) -> NightReport:
    from orchestrator.lowering import lower as lowering
    from orchestrator.lowering.artifacts import load_artifact

    config = load_config(inventory)
    night = night or dt.date.today().isoformat()
    history = History(history_url or config.history_url)
    try:
        recorded = history.recorded_cells(night)
        specs: dict[str, ModelSpec] = {}
        plan: dict[str, list[tuple[str, str, RunParams]]] = {}
        skipped = []
        for entry in config.entries:
            for board in entry.boards:
                for spec in entry.models:
                    specs[spec.name] = spec
                    for backend in entry.backends:
                        if (board, spec.name, backend) in recorded:
                            skipped.append((board, spec.name, backend))
                        else:
                            plan.setdefault(board, []).append((spec.name, backend, entry.params))
        if skipped:
            console.info(f"{len(skipped)} cell(s) already recorded for {night}: skipped")

        # Lower on the workstation first, once per model (cached across nights when nothing changed).
        wanted: dict[str, set[str]] = {}
        for cells in plan.values():
            for model, backend, _ in cells:
                wanted.setdefault(model, set()).add(backend)
        lowering_errors: dict[str, str] = {}
        versions: dict[str, dict[str, str]] = {}
        for model, backends in wanted.items():
            try:
                result = lowering.lower(
                    specs[model], backends=sorted(backends), weights=config.weights, root=artifacts_root
                )
                versions[model] = next(iter(result.backends.values())).sidecar["versions"]
            except EtlabError as exc:
                lowering_errors[model] = str(exc).splitlines()[0]

        def on_board(board: Board) -> list[CellOutcome]:
            jobs, failed, threads = [], [], {}
            for model, backend, params in plan[board.name]:
                threads[(model, backend)] = params.threads or board.threads
                if model in lowering_errors:
                    failed.append(CellOutcome(board.name, model, backend, stage="lower", error=lowering_errors[model]))
                else:
                    jobs.append(CellJob(load_artifact(model, backend, artifacts_root), params))

            def record(cell: CellOutcome) -> None:
                history.record(
                    record_from_cell(cell, night, versions.get(cell.model, {}), threads[(cell.model, cell.backend)])
                )

            for cell in failed:
                record(cell)
            return failed + run_cells_on_board(board, jobs, on_cell=record, results_root=results_root)

        outcomes = fan_out([inventory.boards[name] for name in plan], on_board)
        for outcome in outcomes:
            if not outcome.ok:  # a bug, not a board failure: still visible, and a reason to alarm
                console.error(f"{outcome.board.name}: {outcome.error}")

        # Tonight's verdicts cover every cell recorded tonight, including those from an earlier, killed run.
        tonight = history.runs(night=night)
        verdicts = []
        trends: dict[tuple[str, str, str], list[RunRecord]] = {}
        for record in tonight:
            baseline = history.runs(
                cell=record.cell,
                before_night=night,
                versions=record.versions,
                valid_only=True,
                limit=config.baseline_nights,
            )
            verdicts.append(judge(record, baseline, config.min_effect, min_nights=config.min_baseline_nights))
            trends[record.cell] = list(reversed(history.runs(cell=record.cell, limit=60)))
        verdicts.sort(key=lambda v: v.cell)
        exit_code = _exit_code(verdicts, outcomes_ok=all(o.ok for o in outcomes))
        report = NightReport(night, verdicts, trends, exit_code, skipped)
        report_paths = write_reports(report, reports_dir or config.reports_dir)
        print_night(report, report_paths)
        return report
    finally:
        history.close()


def _exit_code(verdicts: Sequence[CellVerdict], *, outcomes_ok: bool) -> int:
    if any(v.verdict == "infra" for v in verdicts) or not outcomes_ok:
        return ExitCode.INFRA
    if any(v.verdict in ("regression", "failed") for v in verdicts):
        return ExitCode.FAILED
    return ExitCode.OK


def print_night(report: NightReport, outputs: dict[str, Path]) -> None:
    rows = [
        [*item.cell, item.record.median_ms, item.baseline_median_ms, item.change, item.verdict, item.record.validity]
        for item in report.verdicts
    ]
    console.table(
        f"Nightly {report.night}",
        ["board", "model", "backend", "median ms", "baseline ms", "change", "verdict", "validity"],
        rows,
        caption=f"exit code {report.exit_code}",
    )
    for item in report.regressions:
        console.error(f"REGRESSION {' / '.join(item.cell)}: {item.detail}")
    for item in report.failures:
        console.error(f"{item.verdict.upper()} {' / '.join(item.cell)} at {item.record.stage}: {item.record.error}")
    for kind, path in outputs.items():
        console.info(console.escape(f"{kind}: {path}"))
