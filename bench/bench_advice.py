"""The advisor's predictions against the board's answer: per model and rewrite, the saving `fab advise` predicted
from the profile of the model as exported, and the saving the interleaved A/B of `fab advise --try --each`
measured (target: within 25% of the measured gain).

For each model (a built-in name, full size, random weights unless pretrained ones are cached):

1. `fab deploy-and-profile --backend xnnpack` of the model as exported on the local board (ETDump on);
2. `fab advise --run <that run> --try --each`: every proposed rewrite lowered together and one by one, each
   checked against the model as exported, then A/B against it (`--rounds`, `--retest-seconds` per variant).

    .venv/bin/python bench/bench_advice.py [--models distilbert,gpt2] [--rounds 8] [--retest-seconds 120]
                                           [--work DIR]

`--work` keeps the artifacts (and results) between runs: a second run lowers nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

PROJECT_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(PROJECT_ROOT))

from bench.bench_quantize import cpu_description, load_average  # noqa: E402
from orchestrator import console  # noqa: E402

DEFAULT_MODELS = "distilbert,gpt2"


def fab(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "fabric", *args], cwd=PROJECT_ROOT, env={**os.environ, **env},
                          capture_output=True, text=True)  # fmt: skip
    if done.returncode != 0:
        raise SystemExit(f"fab {' '.join(args)} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    print(f"  fab {args[0]} {' '.join(args[1:3])}: {time.monotonic() - started:.0f} s", file=sys.stderr)
    return done


def one_model(model: str, env: dict[str, str], results: Path, rounds: int, budget: float) -> dict[str, Any]:
    fab("deploy-and-profile", "--model", model, "--backend", "xnnpack", "--board", "local", "--iterations", "20",
        "--no-explore", env=env)  # fmt: skip
    run = sorted((results / "local" / model / "xnnpack").iterdir())[-1]
    fab("advise", "--run", run.name, "--try", "--each", "--board", "local", "--rounds", str(rounds),
        "--retest-seconds", str(budget), env=env)  # fmt: skip
    advice = json.loads((run / "analysis" / "advice.json").read_text())
    trial = json.loads((run / "analysis" / "advice_trial.json").read_text())
    return {"model": model, "run": run.name, "advice": advice, "trial": trial}


def rows_of(result: dict[str, Any]) -> list[list[Any]]:
    rows = []
    for variant in result["trial"]["variants"]:
        error = variant["prediction_error"]
        rows.append([
            result["model"], " + ".join(variant["rewrites"]), result["trial"]["original_ms"], variant["predicted_ms"],
            variant["measured_ms"], f"{error:+.0%}" if error is not None else "—",
            "yes" if error is not None and abs(error) <= 0.25 else "no", "yes" if variant["confirmed"] else "no",
        ])  # fmt: skip
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default=DEFAULT_MODELS)
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--retest-seconds", type=float, default=120.0)
    parser.add_argument("--work", type=Path, default=PROJECT_ROOT / ".etlab" / "bench-advice")
    args = parser.parse_args()
    artifacts, results = args.work / "artifacts", args.work / "results"
    env = {"ETLAB_ARTIFACTS": str(artifacts), "ETLAB_RESULTS": str(results)}
    print(f"machine: {cpu_description()}, load average {load_average()}", file=sys.stderr)
    table = []
    for model in args.models.split(","):
        result = one_model(model, env, results, args.rounds, args.retest_seconds)
        (args.work / f"{model}.json").write_text(json.dumps(result, indent=1))
        table += rows_of(result)
        for finding in result["advice"]["findings"][:6]:
            print(f"  {model} {finding['id']} {finding['kind']}: {finding['title']}, {finding['measured_ms']:.2f} ms"
                  f" measured, saving {finding['saving_ms']} ms", file=sys.stderr)  # fmt: skip
    console.table(
        "Advisor: predicted vs measured saving per rewrite (fp32 XNNPACK, local board)",
        ["model", "rewrites", "as exported ms", "predicted ms", "measured ms", "error", "within 25%", "confirmed"],
        table,
        caption=f"{cpu_description()}; load average after: {load_average()}",
    )


if __name__ == "__main__":
    main()
