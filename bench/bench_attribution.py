"""Issue 37's "Done when": the share of each model's measured time attributed to a module path of the model.

For each model (a built-in name, full size, random weights), one `fab deploy-and-profile --board local --backend
xnnpack --weights random --no-explore` (fp32 XNNPACK, ETDump on), then from the run's `analysis/summary.json`
`modules` (orchestrator/results/modules.py): the measured time (the timed instructions' time per execution), the
part of it traced to a module path (delegate internals included: a delegate call's time goes to its XNNPACK nodes'
modules), the share, and the three modules that took the most time themselves (`fab analyze --by module`'s first
rows). A text-generation model's profile, and so its `modules`, is the decode step's (results/analysis.py); its
prefill is computed here the same way from `ops_prefill.json`, and the decode step's from `ops_decode.json` as a
cross-check. Time without a module is listed by operator and instruction (the rows to look at when a model is below
the 95% target).

    .venv/bin/python bench/bench_attribution.py [--models distilbert,gpt2,...] [--iterations 20] [--json out.json]

The ETLAB_* variables (ETLAB_ARTIFACTS, ETLAB_RESULTS, ...) pass through: a lowering already in the artifacts
folder is reused. Each model is lowered first, portable and XNNPACK in one `fab lower` (see `lower`).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
from pathlib import Path
from typing import Any

PROJECT_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(PROJECT_ROOT))

from orchestrator import console  # noqa: E402
from orchestrator.lowering.builtins import BUILTIN_SPECS  # noqa: E402
from orchestrator.paths import results_dir  # noqa: E402
from orchestrator.results.ops_record import OpsRecord, read_ops  # noqa: E402

DEFAULT_MODELS = "distilbert,gpt2,whisper-tiny-encoder,mobilenet-v2,smollm2-135m-gen"
TARGET = 0.95


def load_average() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def runs(model: str) -> set[Path]:
    folder = results_dir() / "local" / model / "xnnpack"
    return {path for path in folder.iterdir() if path.is_dir()} if folder.is_dir() else set()


def lower(model: str) -> bool:
    """Both fp32 programs lowered in one `fab lower` (a cache hit when they are): `deploy-and-profile` lowers the
    portable one too, and lowering one variant alone re-exports the model and rewrites the `.pt2` the other one's
    sidecar vouches for, which then no longer counts as lowered (exit 65)."""
    command = [sys.executable, "-m", "fabric", "lower", "--model", model, "--backend", "portable,xnnpack",
               "--weights", "random"]  # fmt: skip
    completed = subprocess.run(command, cwd=PROJECT_ROOT, capture_output=True, text=True, check=False)
    if completed.returncode != 0:
        console.warn(f"{model}: lowering failed ({completed.returncode}): {completed.stderr[-800:]}")
    return completed.returncode == 0


def deploy(model: str, iterations: int) -> Path | None:
    """One profiled run of the model's fp32 XNNPACK program on the local board: its bundle folder."""
    if not lower(model):
        return None
    before = runs(model)
    command = [sys.executable, "-m", "fabric", "deploy-and-profile", "--model", model, "--board", "local",
               "--backend", "xnnpack", "--weights", "random", "--no-explore",
               "--iterations", str(iterations)]  # fmt: skip
    completed = subprocess.run(command, cwd=PROJECT_ROOT, capture_output=True, text=True, check=False)
    if completed.returncode != 0:
        console.warn(f"{model}: deploy-and-profile failed ({completed.returncode}): {completed.stderr[-800:]}")
        return None
    new = sorted(path for path in runs(model) - before if (path / "analysis" / "summary.json").is_file())
    return new[-1] if new else None


def phase_share(ops: OpsRecord) -> tuple[float, float, dict[str, float]]:
    """(measured ms, attributed ms, unattributed ms by operator) from an ops document, as modules.py counts them:
    a delegate call's time on its XNNPACK nodes' modules, the rest of the call on the call's own module."""
    measured = attributed = 0.0
    missing: dict[str, float] = {}
    delegates = {d.node_id: d for d in ops.delegates}

    def count(module: str | None, what: str, ms: float) -> None:
        nonlocal measured, attributed
        measured += ms
        if module:
            attributed += ms
        elif ms > 0:
            missing[what] = missing.get(what, 0.0) + ms

    for row in ops.instructions:
        if not row.samples:
            continue
        delegate = delegates.get(row.node_id) if row.kind == "DelegateCall" else None
        placed = 0.0
        for node in delegate.nodes if delegate is not None else ():
            if node.median_ms is not None:
                placed += node.mean_ms
                count(node.module, f"{node.type} in {row.node_id}", node.mean_ms)
        count(row.module, f"{row.op or row.kind} ({row.node_id})", max(0.0, row.mean_ms - placed))
    return measured, attributed, missing


def figures(model: str, bundle: Path) -> dict[str, Any]:
    analysis = bundle / "analysis"
    summary = json.loads((analysis / "summary.json").read_text())
    tree = summary.get("modules") or {}
    own = sorted((m for m in tree.get("modules", ()) if m["self_ms"] > 0), key=lambda m: -m["self_ms"])
    measured = tree.get("measured_ms")
    result: dict[str, Any] = {
        "model": model,
        "bundle": str(bundle),
        "phase": "decode step" if summary.get("generation") else "forward",
        "measured_ms": measured,
        "attributed_ms": tree.get("attributed_ms"),
        "attributed_share": tree.get("attributed_share"),
        "top_modules": [
            {"module": m["module"], "self_ms": m["self_ms"], "share": m["self_ms"] / measured} for m in own[:3]
        ],
    }
    files = {"decode step": "ops_decode.json", "prefill": "ops_prefill.json"} if summary.get("generation") else {}
    files = files or {"forward": "ops.json"}
    for phase, name in files.items():
        path = analysis / name
        if not path.is_file():
            continue
        phase_measured, phase_attributed, missing = phase_share(read_ops(json.loads(path.read_text()), str(path)))
        result.setdefault("phases", {})[phase] = {
            "measured_ms": phase_measured,
            "attributed_ms": phase_attributed,
            "attributed_share": phase_attributed / phase_measured if phase_measured else None,
            "unattributed": dict(sorted(missing.items(), key=lambda item: -item[1])[:8]),
        }
    return result


def print_table(rows: list[dict[str, Any]]) -> None:
    print("| model | profile | measured ms | attributed ms | share | top 3 modules (own time, share of measured) |")
    print("|---|---|---:|---:|---:|---|")
    for row in rows:
        share = row["attributed_share"]
        mark = "" if share is None else (" ✓" if share >= TARGET else " ✗")
        top = "; ".join(f"`{m['module']}` {m['self_ms']:.2f} ms ({m['share'] * 100:.1f}%)" for m in row["top_modules"])
        print(
            f"| {row['model']} | {row['phase']} | {row['measured_ms']:.2f} | {row['attributed_ms']:.2f} "
            f"| {share * 100:.2f}%{mark} | {top} |"
        )
    for row in rows:
        for phase, found in row.get("phases", {}).items():
            share = found["attributed_share"]
            shown = "—" if share is None else f"{share * 100:.2f}%"
            print(f"{row['model']} {phase} (from its ops file): {found['measured_ms']:.2f} ms, attributed {shown}")
            for what, ms in found["unattributed"].items():
                print(f"    without a module: {what} {ms:.3f} ms ({ms / found['measured_ms'] * 100:.2f}%)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=DEFAULT_MODELS, help="comma-separated built-in names")
    parser.add_argument("--iterations", type=int, default=20, help="timed iterations per run")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args(argv)
    models = args.models.split(",")
    unknown = [model for model in models if model not in BUILTIN_SPECS]
    if unknown:
        raise SystemExit(f"unknown models {unknown}; built-ins: {', '.join(BUILTIN_SPECS)}")
    machine = f"{platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}, {platform.platform()}"
    print(f"machine: {machine}\nresults: {results_dir()}\nload average before: {load_average()}")
    rows = []
    for model in models:
        bundle = deploy(model, args.iterations)
        if bundle is None:
            console.warn(f"{model}: no analysed run")
            continue
        rows.append(figures(model, bundle))
        console.info(f"{model}: {bundle}, load {load_average()}")
    print(f"load average after: {load_average()}")
    print_table(rows)
    if args.json:
        args.json.write_text(json.dumps({"machine": machine, "models": rows}, indent=2))
    return 0 if len(rows) == len(models) else 1


if __name__ == "__main__":
    raise SystemExit(main())
