"""etlab against ONNX Runtime and LiteRT on the built-in families: same module, same inputs, 2 threads, interleaved.

For each family (a built-in name, full size, random weights; `--tiny` takes the tiny variants for a quick check):

- etlab: `fab lower` of fp32 XNNPACK and one int8 scheme (`int8-static` for convolution models, `int8-dynamic` for
  the rest, as bench_families.py), and the same with `--rewrites auto` where rewrites apply to the model (what
  `fab advise --try` adopts; the int8 program also with the trade-offs auto leaves out, `conv1d-as-2d`); each
  program run by the local board's native runner (`setup-board`'s build), a process per round: `--warmup` untimed
  runs, then `--iterations` timed ones (its timings.json).
- ONNX Runtime (the `bench` extra: onnxruntime, onnx, onnxscript): `torch.onnx.export(dynamo=True, optimize=True)`
  of the same eager module (the spec's seeded random weights, checked against the lowering's reference outputs),
  CPU execution provider, graph optimizations ORT_ENABLE_ALL, `intra_op_num_threads`, its threads spinning between
  operators (its default) and not (`ORT no-spin`: on cores shared with other work spinning costs it up to 2x); int8:
  `onnxruntime.quantization` of the optimized fp32 graph, `quantize_dynamic` for the transformers (per-channel
  int8 weights, dynamic activations, as etlab's int8-dynamic), `quantize_static` (QDQ, calibrated on the reference
  input) for the convolution models (as etlab's int8-static, given the same input as its `--calibration`). Timed
  by bench/peers_ort.py, a process per round, with `perf_counter` around `session.run`.
- LiteRT, where its PyTorch converter installs (`--litert-python`: a venv of its own, bench/peers_litert.py runs
  there: it converts the lowering's `.pt2` and times LiteRT's interpreter, a process per round).
- The same two peers without AMX (`ORT no-AMX`, `LiteRT no-AMX`): each round's process under bench/deny_amx.c, a
  seccomp filter that refuses Linux's AMX permission request, so their XNNPACK and MLAS take the AVX-512 VNNI
  kernels that etlab's XNNPACK build (ExecuTorch's wheel: GCC, which XNNPACK builds without AMX kernels) runs. A
  Raspberry Pi has no AMX: this column is the like-for-like one. Its ratio is the second column.

Rounds interleave the engines (A, B, C, A, B, C, ...); each figure is the median of every timed iteration. SQNR
(dB) of each engine's outputs against eager PyTorch fp32 (the rewritten programs' against the eager outputs at the
position they keep). The ratio is the fastest peer's median over etlab's best program's: 1.0 or more, etlab is
at least as fast.

    .venv/bin/python bench/bench_peers.py [--families distilbert,mobilenet-v2,...] [--tiny] [--rounds 5]
        [--iterations 10] [--warmup 2] [--threads 2] [--work /work/peers/bench-peers]
        [--litert-python /work/peers/litert-venv/bin/python]
        [--engines etlab,advised,ort,ort-nospin,litert,ort-noamx,litert-noamx]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import numpy as np

PROJECT_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(PROJECT_ROOT))

from bench.bench_quantize import cpu_description, load_average, local_board_runner  # noqa: E402
from orchestrator import console  # noqa: E402
from orchestrator.lowering.builtins import BUILTIN_SPECS  # noqa: E402
from orchestrator.lowering.program import program_name  # noqa: E402
from orchestrator.lowering.rewrites.registry import REWRITES, RewriteRequest, parse_rewrites  # noqa: E402
from orchestrator.lowering.variants import Variant  # noqa: E402
from orchestrator.tensorfile import NamedTensor, read_tensors, write_tensors  # noqa: E402

FAMILIES = ("distilbert", "bert-base", "gpt2", "vit", "whisper-tiny-encoder", "wav2vec2", "mobilenet-v2", "resnet-18",
            "efficientnet-b0")  # fmt: skip
TINY = {"distilbert": "distilbert-tiny", "bert-base": "bert-base-tiny", "gpt2": "gpt2-tiny", "vit": "vit-tiny",
        "whisper-tiny-encoder": "whisper-tiny-encoder-tiny", "wav2vec2": "wav2vec2-tiny",
        "mobilenet-v2": "mobilenet-v2-tiny", "resnet-18": "resnet-18-tiny",
        "efficientnet-b0": "efficientnet-b0-tiny"}  # fmt: skip
CONV_SOURCES = ("torchvision", "timm")
ENGINES = ("etlab", "advised", "ort", "ort-nospin", "litert", "ort-noamx", "litert-noamx")
PEERS = ("ort", "ort-nospin", "litert")
# The same peers denied AMX (bench/deny_amx.c): the instruction set etlab's XNNPACK build uses, and a Pi has no AMX.
PEERS_WITHOUT_AMX = ("ort-noamx", "litert-noamx")
LITERT_PYTHON = Path("/work/peers/litert-venv/bin/python")
BENCH = Path(__file__).resolve().parent
LITERT_SCRIPT = BENCH / "peers_litert.py"
ORT_SCRIPT = BENCH / "peers_ort.py"
# Published Raspberry Pi 5 figures for the same architectures (bench/README.md gives the sources).
PI5_PUBLISHED = {"mobilenet-v2": "Arm course, ExecuTorch XNNPACK: 10.89 ms fp32, 4.01 ms int8"}


@dataclass
class Program:
    """One engine's program of one precision: how to time it, its samples, its outputs' SQNR."""

    engine: str  # etlab, advised, ort, litert
    precision: str  # fp32, int8
    run: Any  # (first: bool) -> list of ms
    samples: list[float] = field(default_factory=list)
    sqnr: float | None = None
    note: str = ""

    def median(self) -> float | None:
        return statistics.median(self.samples) if self.samples else None


def sqnr_db(got: np.ndarray, reference: np.ndarray) -> float:
    got, reference = got.astype(np.float64).reshape(reference.shape), reference.astype(np.float64)
    noise = float(np.sum((got - reference) ** 2))
    return 999.0 if noise == 0.0 else 10.0 * math.log10(float(np.sum(reference * reference)) / noise)


def worst_sqnr(outputs: list[np.ndarray], references: list[np.ndarray]) -> float:
    return min(sqnr_db(got, reference) for got, reference in zip(outputs, references, strict=True))


def at_kept_position(reference: np.ndarray, inputs: dict[str, np.ndarray], spec: Any) -> np.ndarray:
    """The eager `[B, S, vocab]` logits at the one position head-at-position keeps: each row's `[MASK]` (fill-mask)
    or last real token (causal-lm)."""
    from orchestrator.lowering.sources.huggingface import HuggingFaceOptions

    ids = inputs["input_ids"]
    if spec.task == "fill-mask":
        positions = (ids == spec.options_of(HuggingFaceOptions).mask_token_id).argmax(axis=1)
    else:
        positions = inputs["attention_mask"].sum(axis=1) - 1
    return reference[np.arange(len(ids)), positions]


def last_line(text: str) -> str:
    lines = text.strip().splitlines()
    return lines[-1][:300] if lines else "(no message)"


# --- etlab ------------------------------------------------------------------------------------------------------


def fab_lower(
    model: str, quantize: str, artifacts: Path, rewrites: str = "none", calibration: Path | None = None
) -> None:
    env = {**os.environ, "ETLAB_ARTIFACTS": str(artifacts)}
    command = [sys.executable, "-m", "fabric", "lower", "--model", model, "--backend", "xnnpack", "--quantize",
               quantize, "--weights", "random", "--rewrites", rewrites]  # fmt: skip
    if calibration is not None:
        command += ["--calibration", str(calibration)]
    completed = subprocess.run(command, cwd=PROJECT_ROOT, env=env, capture_output=True, text=True, check=False)
    if completed.returncode != 0:
        raise RuntimeError(f"fab lower {model} --rewrites {rewrites} failed: {completed.stderr[-1500:]}")


def etlab_run(runner: Path, pte: Path, inputs: Path, args: argparse.Namespace, out: Path) -> Any:
    def run(first: bool) -> tuple[list[float], list[np.ndarray] | None]:
        timings = out.with_suffix(".timings.json")
        command = [str(runner), "--model", str(pte), "--inputs", str(inputs), "--threads", str(args.threads),
                   "--warmup", str(args.warmup), "--iterations", str(args.iterations),
                   "--timings", str(timings)]  # fmt: skip
        if first:
            command += ["--outputs", str(out)]
        completed = subprocess.run(command, capture_output=True, text=True, check=False)
        if completed.returncode != 0:
            raise RuntimeError(f"runner failed ({completed.returncode}): {last_line(completed.stderr)}")
        outputs = [tensor.array for tensor in read_tensors(out)] if first else None
        return json.loads(timings.read_text())["iterations_ms"], outputs

    return run


# --- ONNX Runtime -----------------------------------------------------------------------------------------------


def onnx_files(module: Any, inputs: dict[str, np.ndarray], name: str, conv: bool, work: Path) -> dict[str, Path]:
    """fp32 (dynamo export, optimized) and int8 ONNX files of the eager module, made once per work folder."""
    import torch

    folder = work / "onnx" / name
    folder.mkdir(parents=True, exist_ok=True)
    fp32, int8 = folder / f"{name}.onnx", folder / f"{name}.int8.onnx"
    if not fp32.is_file():
        args = tuple(torch.from_numpy(array) for array in inputs.values())
        with torch.no_grad():
            program = torch.onnx.export(module, args, dynamo=True, optimize=True, input_names=list(inputs))
        program.save(str(fp32))  # type: ignore[union-attr]
    if not int8.is_file():
        from onnxruntime.quantization import QuantType, quantize_dynamic, quantize_static
        from onnxruntime.quantization.shape_inference import quant_pre_process

        prepared = folder / f"{name}.prep.onnx"
        try:
            quant_pre_process(str(fp32), str(prepared), skip_symbolic_shape=True)
        except Exception as exc:  # the pre-processing is an optimization only
            console.warn(f"{name}: ORT quant_pre_process failed ({exc}); quantizing the export as it is")
            prepared = fp32
        if conv:
            quantize_static(str(prepared), str(int8), OneSample(inputs), per_channel=True,
                            activation_type=QuantType.QInt8, weight_type=QuantType.QInt8)  # fmt: skip
        else:
            quantize_dynamic(str(prepared), str(int8), per_channel=True, weight_type=QuantType.QInt8)
    return {"fp32": fp32, "int8": int8}


class OneSample:
    """ORT's CalibrationDataReader over the reference input (etlab's int8-static calibrates on generated samples)."""

    def __init__(self, inputs: dict[str, np.ndarray]) -> None:
        self.items = iter([inputs])

    def get_next(self) -> dict[str, np.ndarray] | None:
        return next(self.items, None)


def ort_run(
    path: Path, inputs: dict[str, np.ndarray], args: argparse.Namespace, spinning: bool, prefix: list[str]
) -> Any:
    """peers_ort.py, one process per round (under `prefix`: the AMX denier or nothing)."""
    feed = path.parent / "inputs.npz"
    np.savez(feed, **cast("dict[str, Any]", inputs))  # the cast: mypy would match the arrays against allow_pickle
    tag = ("spin" if spinning else "nospin") + ("-noamx" if prefix else "")
    command = [*prefix, sys.executable, str(ORT_SCRIPT), str(path), str(feed), str(path.with_suffix(f".{tag}.npz")),
               str(args.threads), str(args.warmup), str(args.iterations), "1" if spinning else "0"]  # fmt: skip
    return timed_process(command, path.with_suffix(f".{tag}.npz"), "ONNX Runtime")


def timed_process(command: list[str], outputs: Path, engine: str) -> Any:
    """A peer's script that prints its times (a JSON list) last and writes its outputs (.npz)."""

    def run(first: bool) -> tuple[list[float], list[np.ndarray] | None]:
        completed = subprocess.run(command, capture_output=True, text=True, check=False)
        if completed.returncode != 0:
            raise RuntimeError(f"{engine} run failed: {last_line(completed.stderr)}")
        times = json.loads(completed.stdout.strip().splitlines()[-1])
        return times, list(np.load(outputs).values()) if first else None

    return run


def amx_denier(work: Path) -> list[str]:
    """bench/deny_amx.c built once into the work folder: the prefix that runs a command without AMX."""
    binary = work / "deny_amx"
    source = BENCH / "deny_amx.c"
    if not binary.is_file() or binary.stat().st_mtime < source.stat().st_mtime:
        completed = subprocess.run([os.environ.get("CC", "cc"), "-O2", "-o", str(binary), str(source)],
                                   capture_output=True, text=True, check=False)  # fmt: skip
        if completed.returncode != 0:
            raise RuntimeError(f"cannot build deny_amx: {last_line(completed.stderr)}")
    return [str(binary)]


# --- LiteRT (its own venv) --------------------------------------------------------------------------------------


def litert_run(
    python: Path, pt2: Path, arrays: dict[str, np.ndarray], precision: str, static: bool, args: argparse.Namespace,
    work: Path, prefix: list[str],
) -> Any:  # fmt: skip
    """Convert once (peers_litert.py convert), then one process per round (peers_litert.py time)."""
    folder = work / "litert" / pt2.stem.removesuffix("_exported")
    folder.mkdir(parents=True, exist_ok=True)
    inputs = folder / "inputs.npz"
    # in the module's order: LiteRT's signature names them args_0, args_1, ... (the cast: as in ort_run)
    np.savez(inputs, **cast("dict[str, Any]", arrays))
    model = folder / f"model.{precision}.tflite"
    how = "int8-static" if precision == "int8" and static else precision
    if not model.is_file():
        command = [str(python), str(LITERT_SCRIPT), "convert", str(pt2), str(inputs), str(model), how]
        completed = subprocess.run(command, capture_output=True, text=True, check=False)
        if completed.returncode != 0:
            raise RuntimeError(f"LiteRT conversion failed: {last_line(completed.stderr)}")

    out = folder / f"outputs.{precision}{'-noamx' if prefix else ''}.npz"
    command = [*prefix, str(python), str(LITERT_SCRIPT), "time", str(model), str(inputs), str(out), str(args.threads),
               str(args.warmup), str(args.iterations)]  # fmt: skip
    return timed_process(command, out, "LiteRT")


# --- one family -------------------------------------------------------------------------------------------------


def programs_of(name: str, args: argparse.Namespace, runner: Path) -> tuple[list[Program], Any]:
    """Lower, export and convert what the family needs; each engine's failure is a note, not the end of the run."""
    import torch

    from orchestrator.lowering.sources.builders.models import load_model
    from orchestrator.lowering.sources.builders.torchvision import declare_torchvision_ops

    declare_torchvision_ops()
    spec = BUILTIN_SPECS[name]
    conv = spec.model_source in CONV_SOURCES
    scheme = "int8-static" if conv else "int8-dynamic"
    int8 = Variant.parse(f"xnnpack-{scheme}").name
    artifacts = args.work / "artifacts"
    folder = artifacts / name
    inputs_file = folder / f"{name}_inputs.etlt"
    calibration = None
    if conv:  # int8-static on every engine calibrated on the same data: the reference input (twice: etlab takes >= 2)
        fab_lower(name, "none", artifacts)
        calibration = args.work / "calibration" / f"{name}.etlt"
        calibration.parent.mkdir(parents=True, exist_ok=True)
        write_tensors(
            calibration, [NamedTensor(t.name, np.stack([t.array, t.array])) for t in read_tensors(inputs_file)]
        )
    fab_lower(name, f"none,{scheme}", artifacts, calibration=calibration)
    inputs = {tensor.name: tensor.array for tensor in read_tensors(inputs_file)}
    module = load_model(spec, "random").module.eval()
    with torch.no_grad():
        eager = module(*(torch.from_numpy(array) for array in inputs.values()))
    eager_list = [t.numpy() for t in (eager if isinstance(eager, tuple | list) else (eager,))]
    stored = [tensor.array for tensor in read_tensors(folder / f"{name}_reference_outputs.etlt")]
    agreement = worst_sqnr(eager_list, stored)
    if agreement < 100:
        console.warn(f"{name}: the eager module here is not the lowered one's ({agreement:.0f} dB against its outputs)")
    references = {"plain": eager_list}
    programs: list[Program] = []

    def add(engine: str, precision: str, make: Any) -> None:
        if engine.split(":")[0] not in args.engines:
            return
        try:
            programs.append(Program(engine, precision, make()))
        except Exception as exc:  # one engine's failure is recorded; the rest run
            console.warn(f"{name} {engine} {precision}: {exc}")
            programs.append(Program(engine, precision, None, note=str(exc).splitlines()[0][:160] if str(exc) else ""))

    for precision, backend in (("fp32", "xnnpack"), ("int8", int8)):
        pte = folder / f"{name}_{backend}.pte"
        out = args.work / "out" / f"{name}.{precision}.etlt"
        add("etlab", precision, lambda pte=pte, out=out: etlab_run(runner, pte, inputs_file, args, out))
    # fp32: `--rewrites auto`; int8 also the trade-offs auto leaves out that the advisor proposes for an int8 program
    # and `fab advise --try` adopts there (conv1d-as-2d: faster int8, slower fp32)
    requests = {"fp32": parse_rewrites("auto")}
    auto_names = requests["fp32"].resolve(spec)
    int8_only = tuple(n for n, rewrite in REWRITES.items() if not rewrite.in_auto and rewrite.applies(spec))
    requests["int8"] = RewriteRequest(names=(*auto_names, *int8_only)) if int8_only else requests["fp32"]
    if "advised" in args.engines:
        for precision, backend in (("fp32", "xnnpack"), ("int8", int8)):
            request = requests[precision]
            advised = program_name(spec, request)
            if advised == name:
                continue
            try:
                fab_lower(name, f"none,{scheme}", artifacts, rewrites=str(request), calibration=calibration)
            except RuntimeError as exc:
                console.warn(f"{name}: --rewrites {request}: {exc}")
                continue
            if "head-at-position" in request.resolve(spec):
                references["advised"] = [at_kept_position(eager_list[0], inputs, spec)]
            pte = artifacts / advised / f"{advised}_{backend}.pte"
            add("advised", precision, lambda pte=pte, p=precision, a=advised: etlab_run(
                runner, pte, inputs_file, args, args.work / "out" / f"{a}.{p}.etlt"))  # fmt: skip
    if "ort" in args.engines:
        try:
            files = onnx_files(module, inputs, name, conv, args.work)
            for precision in ("fp32", "int8"):
                add("ort", precision, lambda p=precision: ort_run(files[p], inputs, args, True, []))
                add("ort-nospin", precision, lambda p=precision: ort_run(files[p], inputs, args, False, []))
                add("ort-noamx", precision, lambda p=precision: ort_run(files[p], inputs, args, False,
                                                                          amx_denier(args.work)))  # fmt: skip
        except Exception as exc:  # an export that fails is a finding, not the end of the run
            console.warn(f"{name}: ONNX export failed: {exc}")
            programs += [Program("ort", p, None, note=f"export failed: {str(exc).splitlines()[0][:120]}")
                         for p in ("fp32", "int8")]  # fmt: skip
    if "litert" in args.engines and args.litert_python and args.litert_python.is_file():
        pt2 = folder / f"{name}_exported.pt2"
        for precision in ("fp32", "int8"):
            add("litert", precision, lambda p=precision: litert_run(args.litert_python, pt2, inputs, p, conv, args,
                                                                      args.work, []))  # fmt: skip
            add("litert-noamx", precision, lambda p=precision: litert_run(
                args.litert_python, pt2, inputs, p, conv, args, args.work, amx_denier(args.work)))  # fmt: skip
    elif "litert" in args.engines:
        programs += [Program(engine, p, None, note="no LiteRT venv (--litert-python)")
                     for engine in ("litert", "litert-noamx") for p in ("fp32", "int8")]  # fmt: skip
    return programs, references


def measure(name: str, args: argparse.Namespace, runner: Path) -> list[Program]:
    programs, references = programs_of(name, args, runner)
    live = [program for program in programs if program.run is not None]
    for round_index in range(args.rounds):
        for program in live:
            if program.note.startswith("failed"):
                continue
            try:
                times, outputs = program.run(round_index == 0)
            except RuntimeError as exc:
                console.warn(f"{name} {program.engine} {program.precision}: {exc}")
                program.note = f"failed: {str(exc).splitlines()[0][:120]}"
                continue
            program.samples += times
            if outputs is not None:
                reference = references.get(program.engine, references["plain"])
                program.sqnr = worst_sqnr(outputs[: len(reference)], reference)
    return programs


def median_cell(program: Program | None) -> str:
    if program is None:
        return "—"
    median = program.median()
    return f"{median:.3g}" if median is not None else f"— ({program.note or 'not run'})"


def sqnr_cell(program: Program | None) -> str:
    return f"{program.sqnr:.0f}" if program is not None and program.sqnr is not None else "—"


def ratio(found: dict[str, Program], peers: tuple[str, ...]) -> str:
    """The fastest of `peers` over etlab's best program: 1.0 or more, etlab is at least as fast."""
    ours = [m for e in ("etlab", "advised") if e in found and (m := found[e].median()) is not None]
    theirs = [m for e in peers if e in found and (m := found[e].median()) is not None]
    return f"{min(theirs) / min(ours):.2f}" if ours and theirs else "—"


def table(rows: dict[str, list[Program]]) -> list[str]:
    lines = ["| family | precision | etlab ms | etlab advised ms | ORT ms | ORT no-spin ms | LiteRT ms "
             "| ORT no-AMX ms | LiteRT no-AMX ms | fastest peer / etlab best | without AMX "
             "| SQNR dB (etlab / advised / ORT / ORT no-spin / LiteRT / ORT no-AMX / LiteRT no-AMX) |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]  # fmt: skip
    for name, programs in rows.items():
        for precision in ("fp32", "int8"):
            found = {p.engine: p for p in programs if p.precision == precision}
            cells = " | ".join(median_cell(found.get(engine)) for engine in ENGINES)
            sqnrs = " / ".join(sqnr_cell(found.get(engine)) for engine in ENGINES)
            lines.append(f"| {name} | {precision} | {cells} | {ratio(found, PEERS)} "
                         f"| {ratio(found, PEERS_WITHOUT_AMX)} | {sqnrs} |")  # fmt: skip
    return lines


def versions() -> str:
    from importlib.metadata import PackageNotFoundError, version

    found = []
    for package in ("executorch", "torch", "onnxruntime", "onnx", "onnxscript", "transformers", "timm"):
        try:
            found.append(f"{package} {version(package)}")
        except PackageNotFoundError:
            found.append(f"{package} absent")
    return ", ".join(found)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--families", default=",".join(FAMILIES))
    parser.add_argument("--tiny", action="store_true", help="the tiny variants: a quick check of the harness")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--iterations", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--work", type=Path, default=Path("/work/peers/bench-peers"))
    parser.add_argument("--litert-python", type=Path, default=LITERT_PYTHON if LITERT_PYTHON.is_file() else None)
    parser.add_argument("--engines", default=",".join(ENGINES))
    args = parser.parse_args(argv)
    args.engines = set(args.engines.split(","))
    families = args.families.split(",")
    unknown = [f for f in families if f not in FAMILIES]
    if unknown:
        raise SystemExit(f"unknown families {unknown}; choose from {', '.join(FAMILIES)}")
    (args.work / "out").mkdir(parents=True, exist_ok=True)
    console.info(f"machine: {cpu_description()}; {versions()}")
    console.info(f"load average before: {load_average()}")
    runner = local_board_runner()
    rows: dict[str, list[Program]] = {}
    for family in families:
        name = TINY[family] if args.tiny else family
        started = time.perf_counter()
        rows[name] = measure(name, args, runner)
        console.info(f"{name}: done in {time.perf_counter() - started:.0f} s, load {load_average()}")
        print("\n".join(table({name: rows[name]})), flush=True)  # as each family ends: a long run keeps them
    print("\n".join(table(rows)))
    for name in rows:
        if name in PI5_PUBLISHED:
            print(f"{name} on a Raspberry Pi 5, published: {PI5_PUBLISHED[name]}")
    console.info(f"load average after: {load_average()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
