"""One table per model family: lowering cost, delegated share, XNNPACK and int8 speedups, `.pte` sizes.

For each model (a built-in name, full size, random weights unless pretrained ones are cached):

1. Lowering: one cold `fab lower` of portable, fp32 XNNPACK and one int8 scheme (`int8-static` for convolution
   models, `int8-dynamic` for the rest; `model:scheme` picks another) into a fresh artifacts folder; each
   variant's seconds and peak RSS as its sidecar records them, and its `.pte` size.
2. Latency on the local board's native runner (as `setup-board` built it), same inputs and threads: fp32 XNNPACK
   and int8 interleaved round by round; portable once (`--portable-iterations`, no warm-up: its kernels take
   seconds to a minute per inference on a transformer, and XNNPACK's lead over it is far beyond the noise).
3. Delegated share: one `fab deploy-and-profile` of the XNNPACK program (ETDump on), the share of the measured
   time spent inside XNNPACK delegates (summary.json's profile split).

    .venv/bin/python bench/bench_families.py [--models mobilenet-v2,resnet-18,vit,bert-base,...]
                                             [--rounds 5] [--iterations 10] [--threads 2]

The Arm course's Raspberry Pi figures for MobileNetV2 (XNNPACK, 10.9 ms fp32, 4.0 ms int8; a Pi 5's Cortex-A76)
are printed next to ours, with this machine's CPU: the ratio says how far this workstation is from a Pi, not
whether etlab is right.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

PROJECT_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(PROJECT_ROOT))

from bench.bench_quantize import cpu_description, fab_lower, load_average, local_board_runner, run_native  # noqa: E402
from orchestrator import console  # noqa: E402
from orchestrator.lowering.builtins import BUILTIN_SPECS  # noqa: E402
from orchestrator.lowering.sidecar import read_sidecar  # noqa: E402
from orchestrator.lowering.variants import Variant, parse_schemes  # noqa: E402

DEFAULT_MODELS = "mobilenet-v2,resnet-18,vit,bert-base,whisper-tiny-encoder,smollm2-135m"
CONV_SOURCES = ("torchvision", "timm")  # convolution models: int8-static quantizes their convolutions
ARM_COURSE_MOBILENET_V2_MS = {"xnnpack": 10.9, "int8": 4.0}  # Raspberry Pi 5, the course's own table


def scheme_for(model: str) -> tuple[str, str]:
    """`model` or `model:scheme` -> (model, scheme)."""
    name, _, scheme = model.partition(":")
    if name not in BUILTIN_SPECS:
        raise SystemExit(f"unknown model {name!r}; built-ins: {', '.join(BUILTIN_SPECS)}")
    default = "int8-static" if BUILTIN_SPECS[name].model_source in CONV_SOURCES else "int8-dynamic"
    return name, scheme or default


def delegated_share(model: str, artifacts: Path, results: Path) -> float | None:
    """The XNNPACK program profiled once on the local board: the delegated share of its measured time (%)."""
    env = {**os.environ, "ETLAB_ARTIFACTS": str(artifacts), "ETLAB_RESULTS": str(results)}
    command = [sys.executable, "-m", "fabric", "deploy-and-profile", "--model", model, "--board", "local",
               "--backend", "xnnpack", "--weights", "random", "--no-explore"]  # fmt: skip
    completed = subprocess.run(command, cwd=PROJECT_ROOT, env=env, capture_output=True, text=True, check=False)
    if completed.returncode != 0:
        console.warn(f"{model}: deploy-and-profile failed ({completed.returncode}): {completed.stderr[-500:]}")
        return None
    summaries = sorted(results.glob(f"local/{model}/xnnpack/*/analysis/summary.json"))
    if not summaries:
        return None
    split = (json.loads(summaries[-1].read_text()).get("profile") or {}).get("split") or {}
    share = split.get("delegated_pct")
    return float(share) if isinstance(share, int | float) else None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=DEFAULT_MODELS, help="built-in names, each optionally `name:scheme`")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--iterations", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--portable-iterations", type=int, default=2)
    args = parser.parse_args(argv)
    portable_args = argparse.Namespace(**{**vars(args), "warmup": 0, "iterations": args.portable_iterations})
    console.info(f"machine: {cpu_description()}")
    console.info(f"load average before: {load_average()}")
    runner = local_board_runner()
    with tempfile.TemporaryDirectory(prefix="bench-families-") as tmp:
        work = Path(tmp)
        for entry in args.models.split(","):
            model, scheme = scheme_for(entry)
            parse_schemes([scheme])  # an unknown scheme fails here, before any lowering
            artifacts = work / f"artifacts-{model}"
            wall = fab_lower(model, f"none,{scheme}", 1, artifacts, backends="portable,xnnpack")
            folder = artifacts / model
            variants = {"portable": "portable", "xnnpack": "xnnpack", "int8": Variant.parse(f"xnnpack-{scheme}").name}
            sidecars = {label: read_sidecar(folder / f"{model}_{backend}.json") for label, backend in variants.items()}
            inputs = folder / f"{model}_inputs.etlt"
            samples = {"portable": run_native(runner, folder / f"{model}_portable.pte", inputs, portable_args, work)}
            samples |= {label: [] for label in ("xnnpack", "int8")}
            for _ in range(args.rounds):
                for label in ("xnnpack", "int8"):
                    samples[label] += run_native(runner, folder / f"{model}_{variants[label]}.pte", inputs, args, work)
            medians = {label: statistics.median(values) for label, values in samples.items()}
            share = delegated_share(model, artifacts, work / f"results-{model}")
            print_rows(model, scheme, wall, sidecars, medians, share)  # as each model ends: a long run keeps them
            console.info(f"{model}: done, load {load_average()}")
    console.info(f"load average after: {load_average()}")
    return 0


def print_rows(
    model: str, scheme: str, wall: float, sidecars: dict[str, Any], medians: dict[str, float], share: float | None
) -> None:
    """One model's table, printed as soon as it is measured."""
    print("| model | variant | lowering s | peak RSS GB | .pte MB | median ms | speedup |")
    print("|---|---|---:|---:|---:|---:|---|")
    for label, sidecar in sidecars.items():
        speedup = {
            "portable": "",
            "xnnpack": f"{medians['portable'] / medians['xnnpack']:.1f}x over portable",
            "int8": f"{medians['xnnpack'] / medians['int8']:.2f}x over fp32 XNNPACK ({scheme})",
        }[label]
        print(
            f"| {model} | {label} | {sidecar.lowering.seconds:.1f} | {sidecar.lowering.peak_rss_bytes / 1e9:.2f} "
            f"| {sidecar.files['pte'].size / 1e6:.1f} | {medians[label]:.1f} | {speedup} |"
        )
    delegated = f"{share:.1f}%" if share is not None else "not measured"
    print(f"| {model} | delegated share of the XNNPACK run: {delegated}; cold lowering {wall:.1f} s | | | | | |")
    if model == "mobilenet-v2":
        course = ARM_COURSE_MOBILENET_V2_MS
        print(
            f"MobileNetV2 here: {medians['xnnpack']:.1f} ms fp32, {medians['int8']:.1f} ms int8; the Arm course on "
            f"a Raspberry Pi 5: {course['xnnpack']} / {course['int8']} ms "
            f"({medians['xnnpack'] / course['xnnpack']:.2f}x / {medians['int8'] / course['int8']:.2f}x of the Pi's)"
        )


if __name__ == "__main__":
    raise SystemExit(main())
