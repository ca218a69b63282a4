"""The x86 workstation against an emulated Raspberry Pi 5 on the same program: where their values diverge, if they
do (issue 53).

One emulated Pi 5 (orchestrator/testing/pi.py: qemu-user with `QEMU_CPU=cortex-a76`, so XNNPACK picks the Arm
kernels a Pi 5 runs) and the local board in one inventory; for each model, `fab deploy-and-profile --numerics` on
both boards (the same .pte files, the same inputs), then per program:

- `fab compare X86_RUN PI_RUN --numerics`: the first operator where the two runs part ways (3 dB of SQNR where one
  of them is below fp32's rounding, 100 dB), if any;
- from the two runs' analysis/numerics.json: the taps in both, how many differ by >= 3 dB (and how many of those are
  divergences by compare's rule, not two rounding-level figures), the taps whose SQNR is the same to 0.01 dB, the
  largest |difference| with its operator and module (overall, and among taps below rounding), each board's lowest
  SQNR and its outputs' SQNR against fp32 eager.

Only the numbers matter: the Pi is emulated (qemu-user translates its instructions on this machine), its timings are
not a Pi's and are not reported. The runner is cross-built on the workstation (`build: workstation`) when
aarch64-linux-gnu-g++ is here, else built on the emulated board (minutes). Needs root and what
`./bootstrap.sh --test` installs (qemu-user-static, binfmt, the arm64 rootfs).

    sudo .venv/bin/python bench/bench_numerics_pi.py [--model distilbert-tiny --model mobilenet-v2-tiny]
        [--quantize none,int8-dynamic] [--static mobilenet-v2-tiny] [--iterations 3] [--json out.json] [--keep]

ETLAB_* variables pass through; artifacts and results go to temporary folders unless they are set.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.bench_numerics import cpu_name  # noqa: E402
from orchestrator.boards.inventory import Board  # noqa: E402
from orchestrator.deploy import crossbuild  # noqa: E402
from orchestrator.results.numerics import (  # noqa: E402
    DIVERGENCE_DB,
    ROUNDING_DB,
    NumericsPair,
    OperatorRecord,
    compare_numerics,
    read_numerics_document,
)
from orchestrator.tensorfile import read_tensors  # noqa: E402
from orchestrator.testing.pi import start_pi_board  # noqa: E402
from orchestrator.testing.sshd import SshdLab  # noqa: E402

MODELS = ("distilbert-tiny", "mobilenet-v2-tiny")
NETWORK = 53  # the lab's loopback range, 127.53.x.y: away from the suite's labs running at the same time


def fab(*args: str, env: dict[str, str], timeout: float = 1800) -> tuple[int, float, str]:
    """A real `fab` task in its own process: its exit code, wall seconds, and what it printed."""
    started = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "fabric", *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout
    )
    return proc.returncode, time.perf_counter() - started, proc.stdout + proc.stderr


def board_entry(board: Board) -> dict[str, Any]:
    """An inventory entry (as tests/plugins/boards.py writes them)."""
    entry: dict[str, Any] = {"transport": board.transport, "workdir": board.workdir, "build": board.build}
    if board.transport == "ssh":
        ssh = board.ssh
        entry.update(host=ssh.host, port=ssh.port, user=ssh.user, key=str(ssh.key))
        entry.update(connect_timeout=ssh.connect_timeout, keepalive=ssh.keepalive)
        entry["tcp_user_timeout"] = ssh.tcp_user_timeout
    if board.tags:
        entry["tags"] = list(board.tags)
    return entry


def write_inventory(path: Path, boards: list[Board]) -> Path:
    import yaml

    known_hosts = next(board.known_hosts for board in boards if board.transport == "ssh")
    document = {
        "defaults": {"known_hosts": str(known_hosts)},
        "boards": {board.name: board_entry(board) for board in boards},
        "groups": {"default": [board.name for board in boards]},
    }
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    return path


def newest_run(results: Path, board: str, model: str, variant: str) -> Path | None:
    runs = sorted((results / board / model / variant).glob("*/analysis/numerics.json"))
    return runs[-1].parent.parent if runs else None


def outputs_apart(x86_run: Path, pi_run: Path) -> list[dict[str, Any]]:
    """The timing passes' own outputs (outputs.etlt), x86 against the Pi, element by element."""
    found = []
    for a, b in zip(read_tensors(x86_run / "outputs.etlt"), read_tensors(pi_run / "outputs.etlt"), strict=True):
        x, y = a.array.astype(np.float64), b.array.astype(np.float64)
        largest = float(np.abs(x).max()) if x.size else 0.0
        apart = float(np.abs(x - y).max()) if x.size else 0.0
        found.append(
            {
                "name": a.name,
                "identical": bool(np.array_equal(a.array, b.array)),
                "share_differing": round(float(np.mean(a.array != b.array)), 3),
                "max_abs_difference": apart,
                "relative": apart / largest if largest else None,  # of the x86 output's largest magnitude
                "largest_magnitude": largest,
            }
        )
    return found


def place(row: OperatorRecord) -> str:
    return f"{row.op} in {row.module or row.node}"


def described(pair: NumericsPair | None) -> dict[str, Any] | None:
    if pair is None:
        return None
    return {"where": place(pair.a), "x86_db": pair.a.sqnr_db, "pi_db": pair.b.sqnr_db, "delta_db": pair.delta_db}


def compare(model: str, variant: str, pi_name: str, results: Path, env: dict[str, str]) -> dict[str, Any]:
    x86_run, pi_run = newest_run(results, "local", model, variant), newest_run(results, pi_name, model, variant)
    if x86_run is None or pi_run is None:
        missing = [name for name, run in (("local", x86_run), (pi_name, pi_run)) if run is None]
        return {"model": model, "variant": variant, "error": f"no numerics run on {', '.join(missing)}"}
    code, _, said = fab("compare", x86_run.name, pi_run.name, "--numerics", env=env)
    if code != 0:
        return {"model": model, "variant": variant, "error": f"fab compare --numerics exit {code}: {said[-600:]}"}
    # fab compare's own comparison (orchestrator/results/numerics.py), read here for the figures its table leaves out.
    on_x86, on_pi = read_numerics_document(x86_run), read_numerics_document(pi_run)
    joined = compare_numerics(on_x86, on_pi)
    pairs = joined.pairs
    apart = [pair for pair in pairs if abs(pair.delta_db) >= DIVERGENCE_DB]
    below = [pair for pair in pairs if min(pair.a.sqnr_db, pair.b.sqnr_db) < ROUNDING_DB]
    diverged = joined.first_divergence
    first = None
    if diverged is not None:
        named = diverged.b if diverged.b.fused else diverged.a  # as fab compare names it
        first = (
            f"{place(named)} ({named.source or 'no source line'}): {diverged.a.sqnr_db:.1f} dB on x86, "
            f"{diverged.b.sqnr_db:.1f} dB on the Pi; it adds {diverged.a.introduced_db:.1f} / "
            f"{diverged.b.introduced_db:.1f} dB itself"
        )
    said_agree = "the runs agree" in said
    if said_agree != (diverged is None):
        first = f"{first}; fab compare said otherwise: {said[-300:]}"
    return {
        "model": model,
        "variant": variant,
        "runs": [x86_run.name, pi_run.name],
        "taps": len(pairs),
        "only_one_board": joined.only_a + joined.only_b,
        "same_to_0.01_db": sum(1 for pair in pairs if pair.delta_db == 0),
        "below_rounding": len(below),
        "apart_3db": len(apart),
        "diverging": sum(1 for pair in pairs if pair.diverges),
        "largest": described(max(pairs, key=lambda pair: abs(pair.delta_db), default=None)),
        "largest_below_rounding": described(max(below, key=lambda pair: abs(pair.delta_db), default=None)),
        "lowest_db": [min(row.sqnr_db for row in document.operators) for document in (on_x86, on_pi)],
        "outputs_db": [list(joined.outputs_a), list(joined.outputs_b)],
        "first_divergence": first,
        "outputs_apart": outputs_apart(x86_run, pi_run),
        "compare_said": said,
    }


def deploy(
    model: str, quantize: str, pi_name: str, inventory: Path, iterations: int, env: dict[str, str]
) -> dict[str, Any]:
    code, wall, said = fab("deploy-and-profile", "--model", model, "--backend", "xnnpack", "--quantize", quantize,
                           "--numerics", "--board", f"local,{pi_name}", "--no-explore", "--iterations",
                           str(iterations), "--warmup", "1", "--inventory", str(inventory), env=env)  # fmt: skip
    print(f"  deploy-and-profile {model} --quantize {quantize}: exit {code} in {wall:.0f} s", flush=True)
    if code not in (0, 1):  # 1: an accuracy gate (a random-weight int8 run may fail it); the bundles are there
        print("    " + "\n    ".join(said.strip().splitlines()[-15:]), flush=True)
    return {"model": model, "quantize": quantize, "exit": code, "wall_s": round(wall, 1), "tail": said[-2000:]}


def fmt_db(values: list[float]) -> str:
    return ", ".join(f"{value:.2f}" for value in values) or "—"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", action="append", help=f"default: {', '.join(MODELS)}")
    parser.add_argument("--quantize", default="none,int8-dynamic", help="the variants of every model")
    parser.add_argument("--static", action="append", help="models also tried int8-static (default: mobilenet-v2-tiny)")
    parser.add_argument("--iterations", type=int, default=3)
    parser.add_argument("--flavour", default="pi5")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--keep", action="store_true", help="keep the scratch folder (results, inventory, lab)")
    args = parser.parse_args()
    models = args.model or list(MODELS)
    static = [model for model in (args.static if args.static is not None else ["mobilenet-v2-tiny"]) if model in models]

    scratch = Path(tempfile.mkdtemp(prefix="etlab-bench-numerics-pi-"))
    env = dict(os.environ)
    env.setdefault("ETLAB_RESULTS", str(scratch / "results"))
    env.setdefault("ETLAB_ARTIFACTS", str(scratch / "artifacts"))
    env.setdefault("COLUMNS", "200")
    results = Path(env["ETLAB_RESULTS"])
    cross = crossbuild.find_cross_compiler("aarch64") is not None
    native = crossbuild.find_cross_compiler(platform.machine()) is not None
    built = "cross-built on the workstation" if cross else "built on the board"
    print(f"machine: {cpu_name()}, {os.cpu_count()} cores; emulated {args.flavour} (qemu-user); runner for the Pi "
          f"{built}; scratch {scratch}", flush=True)  # fmt: skip

    pi_name = f"{args.flavour}-emu"  # pi5-emu
    started = time.perf_counter()
    deploys: list[dict[str, Any]] = []
    rows: list[dict[str, Any]] = []
    lab = SshdLab(scratch / "lab", network=NETWORK)
    try:
        pi = start_pi_board(lab, pi_name, flavour=args.flavour, build="workstation" if cross else "board")
        local = Board(name="local", transport="local", workdir=str(scratch / "local-board"),
                      build="workstation" if native else "auto", tags=("x86_64", "workstation"))  # fmt: skip
        inventory = write_inventory(scratch / "inventory.yaml", [local, pi.board])
        print(f"  Pi started in {time.perf_counter() - started:.1f} s", flush=True)
        for model in models:
            deploys.append(deploy(model, args.quantize, pi_name, inventory, args.iterations, env))
            if model in static:
                deploys.append(deploy(model, "int8-static", pi_name, inventory, args.iterations, env))
        for model in models:
            schemes = [scheme for scheme in args.quantize.split(",") if scheme]
            if model in static:
                schemes.append("int8-static")
            for scheme in schemes:
                variant = "xnnpack" if scheme == "none" else f"xnnpack-{scheme}"
                rows.append(compare(model, variant, pi_name, results, env))
    finally:
        lab.close()
        if not args.keep:
            shutil.rmtree(scratch, ignore_errors=True)
    total = time.perf_counter() - started

    print(f"\nx86 workstation against the emulated {args.flavour}, the same programs ({total:.0f} s in all; deploys: "
          + ", ".join(f"{d['model']} {d['quantize']} {d['wall_s']:.0f} s" for d in deploys) + ")")  # fmt: skip
    for row in rows:
        print(f"{row['model']} {row['variant']}:")
        if "error" in row:
            print(f"  {row['error']}")
            continue
        largest, below = row["largest"], row["largest_below_rounding"]
        print(f"  taps in both {row['taps']} (in one only: {row['only_one_board']}); the same SQNR to 0.01 dB: "
              f"{row['same_to_0.01_db']}; below {ROUNDING_DB:g} dB (not rounding) on a board: "
              f"{row['below_rounding']}")  # fmt: skip
        print(f"  |Δ| >= {DIVERGENCE_DB:g} dB: {row['apart_3db']}, of them diverging (one below {ROUNDING_DB:g} dB): "
              f"{row['diverging']}")  # fmt: skip
        for label, pair in (("largest Δ (Pi − x86)", largest), (f"largest Δ below {ROUNDING_DB:g} dB", below)):
            if pair:
                print(f"  {label}: {pair['delta_db']:+.2f} dB ({pair['x86_db']:.2f} → {pair['pi_db']:.2f}) at "
                      f"{pair['where']}")  # fmt: skip
        lowest = " / ".join(f"{value:.2f}" for value in row["lowest_db"])
        outputs = " / ".join(fmt_db(values) for values in row["outputs_db"])
        print(f"  lowest tap x86 / Pi: {lowest} dB; outputs' SQNR x86 / Pi: {outputs} dB")
        for output in row["outputs_apart"]:
            apart = "identical" if output["identical"] else (
                f"{output['share_differing']:.0%} of elements differ, max |x86 − Pi| {output['max_abs_difference']:.3g}"
                f" = {output['relative']:.2g} of the largest magnitude ({output['largest_magnitude']:.3g})"
            )  # fmt: skip
            print(f"  timing pass's {output['name']}, x86 against Pi: {apart}")
        print(f"  first divergence (fab compare): {row['first_divergence'] or 'none, the runs agree'}", flush=True)
    if args.json:
        args.json.write_text(json.dumps({"machine": cpu_name(), "total_s": round(total, 1), "deploys": deploys,
                                         "rows": rows}, indent=1))  # fmt: skip
    return 0 if all("error" not in row for row in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
