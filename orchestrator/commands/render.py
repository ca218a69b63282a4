"""Terminal rendering of what the domain layers return: every table etlab prints is drawn here."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from orchestrator import console
from orchestrator.deploy.cells import CellOutcome
from orchestrator.fsutil import read_json
from orchestrator.results.documents import ANALYSIS_DIR, Summary, load_summary


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


def print_cells(cells: Sequence[CellOutcome]) -> None:
    """board × backend: median, speedup of XNNPACK over portable, validity, bundle; then the failures."""
    medians = {(c.board, c.model, c.backend): c.median_ms for c in cells}
    rows = []
    for cell in cells:
        portable = medians.get((cell.board, cell.model, "portable"))
        speedup = None
        if cell.backend == "xnnpack" and portable and cell.median_ms:
            speedup = f"{portable / cell.median_ms:.1f}×"
        status = "ok" if cell.ok else f"FAILED at {cell.stage}"
        rows.append(
            [
                cell.board,
                cell.model,
                cell.backend,
                status,
                cell.median_ms,
                speedup,
                cell.validity,
                _short_path(cell.bundle) if cell.bundle else None,
            ]
        )
    console.table(
        "Results",
        ["board", "model", "backend", "status", "median ms", "speedup vs portable", "validity", "bundle"],
        rows,
    )
    for cell in cells:
        if cell.error:
            reason = cell.detail or cell.error  # every line: a host key's fingerprints, a bundle's bad files
            console.error(f"{cell.board}: {cell.model}/{cell.backend} failed at {cell.stage}: {reason}")
        for reason in ((cell.summary or {}).get("validity") or {}).get("reasons", []):
            console.warn(f"{cell.board}: {cell.model}/{cell.backend}: {reason.get('reason')}")


def _short_path(path: Path) -> str:
    """Relative to the working folder when inside it: tables stay readable."""
    try:
        return str(path.relative_to(Path.cwd()))
    except ValueError:
        return str(path)
