"""The mixed-precision proposal against the board (issue 53): for each model and scheme, on one board,

1. `fab deploy-and-profile --quantize none,<scheme> --numerics` (the fp32 run gives the cost of the layers kept);
2. `fab advise` on the quantized run: the `keep-float` finding's layers, its predicted SQNR and predicted cost;
3. `fab advise --try`: the mixed-precision program, the quantized one and fp32 A/B'd on the board (interleaved), each
   program's outputs on the board against fp32 eager: the measured SQNR and the measured cost, and the speed/accuracy
   front.

Prints, per model: SQNR now, the layers kept, predicted against measured SQNR, predicted against measured cost (ms),
and the front. A model whose loss no few layers hold gets no proposal: said so, with its worst layers' shares, and
(`--force K`) its top K layers kept in float anyway, to check the prediction itself (one run each, not an A/B).

    .venv/bin/python bench/bench_mixed_precision.py [--case distilbert:int8-dynamic ...] [--board local]
        [--rounds 5] [--retest-seconds 60] [--json out.json]

ETLAB_* variables pass through; results go to a temporary ETLAB_RESULTS unless it is set.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.bench_numerics import cpu_name, fab, newest_run
from orchestrator.advice.sensitivity import KeptLayer, predicted_sqnr_db, ranked_layers
from orchestrator.results.numerics import read_numerics_document

CASES = ("distilbert:int8-dynamic", "whisper-tiny-encoder:int8-dynamic", "wav2vec2:int8-dynamic",
         "mobilenet-v2:int8-static")  # fmt: skip


def measure(
    model: str, scheme: str, board: str, rounds: int, seconds: float, force: int, env: dict[str, str]
) -> dict[str, Any]:
    results = Path(env["ETLAB_RESULTS"])
    deploy = ["deploy-and-profile", "--model", model, "--backend", "xnnpack", "--quantize", f"none,{scheme}",
              "--numerics", "--board", board, "--no-explore", "--iterations", "10"]  # fmt: skip
    fab(*deploy, env=env)
    run = newest_run(results, board, model, f"xnnpack-{scheme}")
    summary = json.loads((run / "analysis" / "summary.json").read_text())
    numerics = summary.get("numerics") or {}
    found: dict[str, Any] = {"model": model, "scheme": scheme, "run": run.name,
                             "output_sqnr_db": numerics.get("output_sqnr_db")}  # fmt: skip
    fab("advise", "--run", run.name, env=env)
    advice = json.loads((run / "analysis" / "advice.json").read_text())
    finding = next((f for f in advice["findings"] if f["kind"] == "keep-float"), None)
    if finding is None:
        found["proposal"] = None
        ranked = ranked_layers(read_numerics_document(run).operators)
        found["worst"] = [(layer.module, layer.share) for layer in ranked[:5]]
        if force:  # no few layers hold the loss: keep the top ones anyway, to test the model's prediction
            found["forced"] = forced(model, scheme, board, ranked[:force], numerics["output_sqnr_db"], summary, env)
        return found
    found["proposal"] = {key: finding[key] for key in ("keep_float", "sqnr_db", "predicted_sqnr_db", "cost_ms")}
    fab("advise", "--run", run.name, "--try", "--board", board, "--rounds", str(rounds), "--retest-seconds",
        str(seconds), env=env)  # fmt: skip
    trial = json.loads((run / "analysis" / "advice_trial.json").read_text())
    kept = next(v for v in trial["variants"] if v["keep_float"])
    fp32 = next((v for v in trial["variants"] if v["backend"] == "xnnpack"), None)
    retest = kept["retest"]
    found["measured"] = {
        "original_sqnr_db": trial["original_sqnr_db"],
        "kept_sqnr_db": kept["sqnr_db"],
        "cost_ms": (retest["median_b_ms"] - retest["median_a_ms"])
        if retest["median_a_ms"] is not None and retest["median_b_ms"] is not None else None,
        "quantized_ms": retest["median_a_ms"],
        "kept_ms": retest["median_b_ms"],
        "fp32_ms": fp32["retest"]["median_b_ms"] if fp32 else None,
        "fp32_sqnr_db": fp32["sqnr_db"] if fp32 else None,
        "front": [(p["name"], p["backend"]) for p in trial["pareto_front"]],
    }  # fmt: skip
    return found


def forced(
    model: str, scheme: str, board: str, kept: list[KeptLayer], outputs: list[float], summary: dict[str, Any],
    env: dict[str, str],
) -> dict[str, Any]:  # fmt: skip
    """The top layers kept in float although the advisor proposed nothing: predicted against measured SQNR."""
    share = sum(layer.share for layer in kept)
    predicted = predicted_sqnr_db(min(outputs), share)
    names = ",".join(layer.module for layer in kept)
    fab("deploy-and-profile", "--model", model, "--backend", "xnnpack", "--quantize", scheme, "--keep-float", names,
        "--numerics", "--board", board, "--no-explore", "--iterations", "10", env=env)  # fmt: skip
    results = Path(env["ETLAB_RESULTS"])
    (folder,) = [path for path in (results / board).glob(f"{model}.kf-*") if path.is_dir()][-1:]
    run = newest_run(results, board, folder.name, f"xnnpack-{scheme}")
    mixed = json.loads((run / "analysis" / "summary.json").read_text())
    return {
        "kept": [layer.module for layer in kept],
        "share": round(share, 4),
        "predicted_sqnr_db": predicted,
        "measured_sqnr_db": (mixed.get("numerics") or {}).get("output_sqnr_db"),
        "accuracy_sqnr_db": (mixed.get("accuracy") or {}).get("sqnr_db"),
        "quantized_ms": (summary["latency"].get("warm") or {}).get("median_ms"),
        "kept_ms": (mixed["latency"].get("warm") or {}).get("median_ms"),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--case", action="append", help=f"model:scheme (default: {', '.join(CASES)})")
    parser.add_argument("--board", default="local")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--retest-seconds", type=float, default=60.0)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--force", type=int, default=6, help="no proposal: keep this many top layers anyway (0: no)")
    args = parser.parse_args()
    env = dict(os.environ)
    scratch = None
    if "ETLAB_RESULTS" not in env:
        scratch = tempfile.TemporaryDirectory(prefix="bench-mixed-")
        env["ETLAB_RESULTS"] = scratch.name
    print(f"CPU: {cpu_name()}")
    rows = []
    for case in args.case or CASES:
        model, _, scheme = case.partition(":")
        found = measure(model, scheme, args.board, args.rounds, args.retest_seconds, args.force, env)
        rows.append(found)
        proposal, measured = found.get("proposal"), found.get("measured")
        if proposal is None:
            print(f"{model} {scheme}: output SQNR {found['output_sqnr_db']}: no proposal; worst {found['worst']}")
            if found.get("forced"):
                print(f"  kept anyway: {json.dumps(found['forced'])}")
            continue
        assert measured is not None
        cost = measured["cost_ms"]
        predicted_cost = proposal["cost_ms"]
        print(
            f"{model} {scheme}: SQNR {proposal['sqnr_db']:.1f} dB (board {measured['original_sqnr_db']}) keeping "
            f"{', '.join(proposal['keep_float'])}: predicted {proposal['predicted_sqnr_db']:.1f} dB, measured "
            f"{measured['kept_sqnr_db']} dB; cost predicted "
            f"{'—' if predicted_cost is None else f'{predicted_cost:+.2f} ms'}, measured "
            f"{'—' if cost is None else f'{cost:+.2f} ms'} (int8 {measured['quantized_ms']:.2f} ms, kept "
            f"{measured['kept_ms']:.2f} ms, fp32 {measured['fp32_ms']:.2f} ms at {measured['fp32_sqnr_db']} dB); "
            f"front: {measured['front']}"
        )
    if args.json:
        args.json.write_text(json.dumps({"cpu": cpu_name(), "cases": rows}, indent=2))
    if scratch is not None:
        scratch.cleanup()


if __name__ == "__main__":
    main()
