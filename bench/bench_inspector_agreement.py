"""etlab's per-operator numerics against ExecuTorch's own Inspector (`Inspector.calculate_numeric_gap`) on the same
program: does etlab's SQNR at an operator agree with what the Inspector computes there?

For each model and variant, on the local board (the workstation):

1. `fab deploy-and-profile --numerics=full`: the timed program, etlab's numerics program (the same program with taps)
   run by etlab's native runner, the run's analysis/numerics.json (SQNR per operator against fp32 eager, "etlab") and
   the tapped values themselves (numerics_tensors.etlt), compared bit for bit with the Inspector's runtime values.
2. The same timed program lowered again in this process with `generate_etrecord=True` (its sha256 must equal the
   timed .pte's: the same program), etlab's reference inputs as the ETRecord's representative inputs; run in
   ExecuTorch's Python runtime with an ETDump and a debug buffer (every instruction's output); the Inspector's
   `calculate_numeric_gap("SNR", reference_graph="exported_program")`: per row, the AOT graph's value against the
   runtime's, as 10 log10(mean a^2 / mean (a-b)^2) (the same formula as etlab's).
3. Each Inspector row is named by the AOT node whose value it compares (its `aot_ops` whose eager value is the row's
   AOT value) and joined to etlab's tap at that node: the operator itself, the int8 `quantize` after it (etlab's
   int8 taps; dequantized with the tap's scale and zero point), a `dequantize` of that value (a delegate's output in
   a statically quantized program), or the operator's float value before the quantize the program runs next (quantized
   here as that node does).

Per joined operator: etlab's SQNR, the Inspector's SNR, and the SQNR of the Inspector's *runtime* value against
etlab's fp32 reference file ("like with like": the same reference as etlab's, the Inspector's runtime value); and the
Inspector's AOT value against the same fp32 reference (how much quantization the Inspector's reference already
holds). The Inspector's reference is the program's own exported graph: fp32 for an fp32 program (the same reference
as etlab's), the quantized graph for a quantized one (so its SNR is the runtime's fidelity to the quantized graph,
not the quantization's loss).

    .venv/bin/python bench/bench_inspector_agreement.py [--case distilbert-tiny:xnnpack-int8-static ...]
        [--json out.json]

ETLAB_* variables pass through; artifacts and results go to a temporary folder unless they are set.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import tempfile
import time
import warnings
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.bench_numerics import cpu_name, fab, newest_run

TARGET_DB = 0.5
EXACT_DB = 150.0  # etlab's cap (results/numerics.py): an exact value; the Inspector says inf
# MobileNetV2's XNNPACK programs are one delegate: nothing outside it, its output the one row (int8-dynamic kept for
# what the Inspector's reference does there; xnnpack and xnnpack-int8-static on request)
CASES = (
    "distilbert-tiny:portable", "distilbert-tiny:xnnpack", "distilbert-tiny:xnnpack-int8-dynamic",
    "distilbert-tiny:xnnpack-int8-static", "mobilenet-v2-tiny:portable", "mobilenet-v2-tiny:xnnpack-int8-dynamic",
)  # fmt: skip
VARIANTS = {
    "portable": ("--backend", "portable"),
    "xnnpack": ("--backend", "xnnpack"),
    "xnnpack-int8-dynamic": ("--backend", "xnnpack", "--quantize", "int8-dynamic"),
    "xnnpack-int8-static": ("--backend", "xnnpack", "--quantize", "int8-static"),
}


@dataclass
class Row:
    """One etlab tap joined to one Inspector row."""

    index: int  # etlab's tap index
    node: str  # the .pt2 node etlab names the tap by
    op: str
    join: str  # how the Inspector's value is etlab's: operator, quantize, dequantize, pre-quantize
    inspector_node: str  # the AOT node whose value the Inspector row compares
    outside: bool  # the Inspector row is one instruction outside delegates (else a delegate's output)
    etlab_db: float  # etlab's SQNR (native runner, numerics program, against fp32 eager)
    inspector_db: float  # the Inspector's SNR (Python runtime, timed program, against the AOT graph), capped
    runtime_vs_fp32_db: float  # the Inspector's runtime value against etlab's fp32 reference: like with like
    aot_vs_fp32_db: float  # the Inspector's AOT value against etlab's fp32 reference
    identical: bool  # the Inspector's runtime value is the board's tapped value, bit for bit (int8 taps as int8)
    max_difference: float  # else the largest absolute difference between them (dequantized)

    @property
    def like_with_like(self) -> float:
        return round(self.runtime_vs_fp32_db - self.etlab_db, 2)

    @property
    def raw(self) -> float:
        return round(self.inspector_db - self.etlab_db, 2)


@dataclass
class Program:
    model: str
    variant: str
    same_pte: bool
    taps: int
    inspector_rows: int
    float_rows: int
    rows: list[Row]
    not_joined: dict[str, list[str]] = field(default_factory=dict)  # why -> etlab tap nodes
    inspector_only: list[str] = field(default_factory=list)  # float Inspector rows with no etlab tap
    etrecord_lowering_s: float = 0.0
    inspector_s: float = 0.0


def capped(value: float) -> float:
    """The Inspector's inf (no error at all) as etlab's cap; NaN (0/0: an all-zero value) as exact too."""
    if math.isnan(value) or value >= EXACT_DB:
        return EXACT_DB
    return max(-EXACT_DB, value)


def sqnr(value: Any, reference: Any) -> float:
    """etlab's SQNR (results/numerics.py's sqnr_db) of `value` against `reference`, in float64."""
    import numpy as np

    from orchestrator.results.numerics import sqnr_db

    x = np.asarray(value, dtype=np.float64).reshape(-1)
    r = np.asarray(reference, dtype=np.float64).reshape(-1)
    if x.shape != r.shape:
        raise ValueError(f"shapes differ: {x.shape} vs {r.shape}")
    finite = np.isfinite(x) & np.isfinite(r)
    return sqnr_db(float(np.sum(r[finite] ** 2)), float(np.sum((x[finite] - r[finite]) ** 2)))


def only_tensor(value: Any) -> Any:
    """An Inspector output as one tensor: a one-element list unwrapped; None for anything else."""
    import torch

    if isinstance(value, (list, tuple)):
        value = value[0] if len(value) == 1 else None
    return value if isinstance(value, torch.Tensor) else None


def eager_values(exported: Any, inputs: tuple) -> dict[str, Any]:
    """Every node's value of the exported program run in eager, by node name (the Inspector's AOT run, again)."""
    import torch

    values: dict[str, Any] = {}

    class Recorder(torch.fx.Interpreter):
        def run_node(self, node: Any) -> Any:
            result = super().run_node(node)
            if isinstance(result, torch.Tensor):
                values[node.name] = result.detach().clone()
            return result

    with torch.no_grad():
        Recorder(exported.module()).run(*inputs)
    return values


def row_node(row: Any, values: dict[str, Any], prefer: set[str]) -> str | None:
    """The AOT node whose value the Inspector row compares: among its `aot_ops`, the one whose eager value is the
    row's AOT value (an identity, a view, may share it: a tapped node first, else the last)."""
    import torch

    aot = only_tensor(row.aot_intermediate_output)
    if aot is None:
        return None
    found = [
        name
        for name in row.aot_ops
        if name in values
        and values[name].shape == aot.shape
        and values[name].dtype == aot.dtype
        and torch.equal(values[name], aot)
    ]
    if not found:
        return None
    return next((name for name in reversed(found) if name in prefer), found[-1])


# how directly an Inspector row holds a tap's value, most direct first
JOINS = ("operator", "dequantize", "quantize", "pre-quantize")


@dataclass(frozen=True)
class Carrier:
    """An AOT node whose value is (or, quantized, becomes) a tap's value."""

    tap: Any
    join: str
    quantize: Any = None  # the quantize node to apply (pre-quantize) or to undo (quantize)


def carriers(exported: Any, record: Any) -> dict[str, Carrier]:
    """The AOT nodes whose values are etlab's taps, by name: the operator (a float tap), the quantize after it (an
    int8 tap), the dequantize of that (the same value in float), or the operator before that quantize."""
    from orchestrator.lowering.export.numerics_taps import tap_points

    points = {point.label: point for point in tap_points(exported)[0]}
    found: dict[str, Carrier] = {}
    for tap in record.taps:
        point = points.get(tap.node)
        if point is None:
            continue
        if tap.qparams is None:
            found[tap.node] = Carrier(tap, "operator")
            continue
        quantize = point.value
        found[quantize.name] = Carrier(tap, "quantize", quantize)
        for user in quantize.users:
            if "dequantize_per_tensor" in str(user.target):
                found[user.name] = Carrier(tap, "dequantize")
        found[tap.node] = Carrier(tap, "pre-quantize", quantize)
    return found


def as_tap(value: Any, carrier: Carrier) -> Any:
    """A value at the carrier node as etlab's tap holds it: float32, or the int8 values of the quantize after it."""
    import torch

    value = value.detach()
    if carrier.join == "quantize":
        return value
    if carrier.join == "dequantize":  # (q - zero point) * scale in float: q again, exactly
        scale, zero_point = carrier.tap.qparams
        return torch.clamp(torch.round(value.double() / scale) + zero_point, -128, 127).to(torch.int8)
    if carrier.join == "pre-quantize":  # the quantize the program runs next, as the graph's node does it
        node = carrier.quantize
        return node.target(value.float(), *node.args[1:])
    return value.float()


def dequantized(value: Any, tap: Any) -> Any:
    """A tap's value in float64 (an int8 tap dequantized with its scale and zero point), as numpy."""
    import numpy as np

    array = np.asarray(value, dtype=np.float64)
    if tap.qparams is None:
        return array
    scale, zero_point = tap.qparams
    return (array - zero_point) * scale


def inspector_gap(model: str, variant: str, artifacts: Path, work: Path, buffer_mb: int) -> tuple[Any, ...]:
    """The timed program again with an ETRecord, run with intermediate outputs, and the Inspector's numeric gap."""
    import torch
    from executorch.devtools import Inspector
    from executorch.runtime import Runtime

    from orchestrator.fsutil import sha256_file
    from orchestrator.lowering.artifacts import load_artifact
    from orchestrator.lowering.export.numerics import _quantized, cached_numerics
    from orchestrator.lowering.export.program import lower_exported
    from orchestrator.lowering.lowered import spec_from_record
    from orchestrator.lowering.variants import Variant
    from orchestrator.tensorfile import read_tensors

    artifact = load_artifact(model, Variant.parse(variant), artifacts)
    numerics = cached_numerics(artifact)
    if numerics is None:
        raise SystemExit(f"{model} {variant}: no numerics program (did the deploy-and-profile --numerics run?)")
    inputs = tuple(torch.from_numpy(t.array) for t in read_tensors(artifact.paths.reference_inputs))
    if artifact.variant.quantized:  # made again as its lowering made it (calibration is deterministic), as numerics.py
        spec = spec_from_record(artifact.sidecar.spec, str(artifact.paths.sidecar(artifact.variant)))
        exported = _quantized(spec, artifact, None)
    else:
        exported = torch.export.load(str(artifact.paths.exported_program))
    values = eager_values(exported, inputs)
    found = carriers(exported, numerics.record)
    started = time.perf_counter()
    manager = lower_exported(exported, artifact.variant, model=model, etrecord=True, quiet=True)
    lowering_s = time.perf_counter() - started
    pte = work / f"{model}_{variant}.pte"
    pte.write_bytes(manager.buffer)
    same = sha256_file(pte) == artifact.sha256
    etrecord = manager.get_etrecord()
    etrecord.update_representative_inputs([list(inputs)])
    # saved and passed by path: get_etrecord()'s instruction -> debug handle map has int keys, the Inspector looks
    # instructions up by str (as a parsed ETRecord has them); unsaved, no event gets a handle and the gap is empty
    etrecord.save(str(work / f"{model}_{variant}.etrecord"))

    program = Runtime.get().load_program(pte, enable_etdump=True, debug_buffer_size=buffer_mb << 20)
    method = program.load_method("forward")
    assert method is not None
    method.execute(list(inputs))
    etdump, debug = work / f"{model}_{variant}.etdp", work / f"{model}_{variant}.debug.bin"
    program.write_etdump_result_to_file(str(etdump), str(debug))
    started = time.perf_counter()
    inspector = Inspector(
        etdump_path=str(etdump), etrecord=str(work / f"{model}_{variant}.etrecord"), debug_buffer_path=str(debug)
    )
    frame = inspector.calculate_numeric_gap("SNR", reference_graph="exported_program")
    inspector_s = time.perf_counter() - started
    reference = {t.name: t.array for t in read_tensors(numerics.reference)}
    return frame, values, found, reference, numerics.record, same, lowering_s, inspector_s


def measure(model: str, variant: str, env: dict[str, str], work: Path, buffer_mb: int) -> Program:
    import numpy as np

    from orchestrator.tensorfile import read_tensors

    results, artifacts = Path(env["ETLAB_RESULTS"]), Path(env["ETLAB_ARTIFACTS"])
    fab("deploy-and-profile", "--model", model, *VARIANTS[variant], "--numerics=full", "--board", "local",
        "--no-explore", "--iterations", "3", env=env)  # fmt: skip
    run = newest_run(results, "local", model, variant)
    board = {t.name: t.array for t in read_tensors(run / "numerics_tensors.etlt")}  # the taps' values on the board
    etlab = {row["node"]: row for row in json.loads((run / "analysis" / "numerics.json").read_text())["operators"]}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        frame, values, found, reference, record, same, lowering_s, inspector_s = inspector_gap(
            model, variant, artifacts, work, buffer_mb
        )
    best: dict[str, tuple[int, Row]] = {}  # tap node -> (join priority, row)
    inside: set[str] = set()  # nodes an Inspector row spans without comparing their own value
    inspector_only: list[str] = []
    float_rows = 0
    for _, row in frame.iterrows():
        runtime = only_tensor(row.runtime_intermediate_output)
        aot = only_tensor(row.aot_intermediate_output)
        if runtime is None or aot is None:
            continue
        name = row_node(row, values, set(found))
        inside.update(op for op in row.aot_ops if op != name)
        carrier = found.get(name) if name is not None else None
        float_rows += bool(aot.dtype.is_floating_point)
        if carrier is None or carrier.tap.node not in etlab:
            if aot.dtype.is_floating_point and name is not None and "quantize" not in name:
                inspector_only.append(name)
            continue
        tap = carrier.tap
        expected = reference[f"output_{tap.index}"]
        # as flat values: a linear's runtime value may be its addmm's 2-D one, the tap's the model's 3-D
        inspector_value = as_tap(runtime, carrier).numpy().reshape(-1)
        board_value = board[f"output_{tap.index}"].reshape(-1)
        joined = Row(
            index=tap.index,
            node=tap.node,
            op=tap.op,
            join=carrier.join,
            inspector_node=name or "",
            outside="DELEGATE_CALL" not in row.runtime_ops,
            etlab_db=float(etlab[tap.node]["sqnr_db"]),
            inspector_db=round(capped(float(row.gap[0])), 2),
            runtime_vs_fp32_db=round(sqnr(dequantized(inspector_value, tap), expected), 2),
            aot_vs_fp32_db=round(sqnr(dequantized(as_tap(aot, carrier).numpy(), tap), expected), 2),
            identical=bool(np.array_equal(inspector_value, board_value)),
            max_difference=float(np.max(np.abs(dequantized(inspector_value, tap) - dequantized(board_value, tap)))),
        )
        priority = JOINS.index(carrier.join)
        if tap.node not in best or priority < best[tap.node][0]:
            best[tap.node] = (priority, joined)
    rows = sorted((row for _, row in best.values()), key=lambda r: r.index)
    joined_nodes = set(best)
    not_joined: dict[str, list[str]] = {}
    for tap in record.taps:
        if tap.node in joined_nodes:
            continue
        names = [name for name, carrier in found.items() if carrier.tap is tap]
        why = (
            "inside a delegate (the Inspector compares the delegate's outputs)"
            if any(name in inside for name in names)
            else "no Inspector row holds its value"
        )
        not_joined.setdefault(why, []).append(tap.node)
    return Program(
        model=model,
        variant=variant,
        same_pte=same,
        taps=len(record.taps),
        inspector_rows=len(frame),
        float_rows=float_rows,
        rows=rows,
        not_joined=not_joined,
        inspector_only=inspector_only,
        etrecord_lowering_s=round(lowering_s, 1),
        inspector_s=round(inspector_s, 2),
    )


def figures(rows: list[Row], attribute: str) -> dict[str, float | None]:
    gaps = [abs(getattr(row, attribute)) for row in rows]
    if not gaps:
        return {"max": None, "median": None}
    return {"max": round(max(gaps), 2), "median": round(statistics.median(gaps), 2)}


def summary(program: Program) -> dict[str, Any]:
    """The target's figures: outside delegates; fp32, the Inspector's own SNR (its reference is etlab's: the fp32
    graph); quantized, the like-with-like figure (the Inspector's own SNR has the quantized graph as reference)."""
    outside = [row for row in program.rows if row.outside]
    delegate = [row for row in program.rows if not row.outside]
    fp32 = "int8" not in program.variant
    target = [abs(row.raw if fp32 else row.like_with_like) for row in outside]
    verdict = "n/a (nothing outside delegates)" if not target else "met" if max(target) <= TARGET_DB else "NOT met"
    return {
        "outside": len(outside),
        "delegate_outputs": len(delegate),
        "identical": sum(row.identical for row in program.rows),
        "like_with_like_outside": figures(outside, "like_with_like"),
        "inspector_snr_outside": figures(outside, "raw"),
        "like_with_like_delegate_outputs": figures(delegate, "like_with_like"),
        "inspector_snr_delegate_outputs": figures(delegate, "raw"),
        "target": "Inspector SNR" if fp32 else "like with like",
        "verdict": verdict,
    }


def spread(values: dict[str, float | None]) -> str:
    return "—" if values["max"] is None else f"max {values['max']:.2f} / median {values['median']:.2f} dB"


def show(program: Program) -> None:
    print(
        f"\n{program.model} {program.variant}: same .pte as etlab's timed program: {program.same_pte}; "
        f"{program.taps} etlab taps, {program.inspector_rows} Inspector rows ({program.float_rows} float); "
        f"{len(program.rows)} joined; ETRecord lowering {program.etrecord_lowering_s} s, "
        f"calculate_numeric_gap {program.inspector_s} s"
    )
    print(
        f"  {'node':<30} {'op':<22} {'where':<8} {'join':<12} {'etlab':>7} {'insp.':>7} {'rt/fp32':>8} "
        f"{'aot/fp32':>8} {'d(like)':>8} {'d(insp)':>8}  same values"
    )
    for row in program.rows:
        same = "identical" if row.identical else f"max |diff| {row.max_difference:.3g}"
        print(
            f"  {row.node:<30} {row.op.removeprefix('aten.'):<22} {'outside' if row.outside else 'delegate':<8} "
            f"{row.join:<12} {row.etlab_db:>7.2f} {row.inspector_db:>7.2f} {row.runtime_vs_fp32_db:>8.2f} "
            f"{row.aot_vs_fp32_db:>8.2f} {row.like_with_like:>+8.2f} {row.raw:>+8.2f}  {same}"
        )
    for why, nodes in program.not_joined.items():
        print(f"  not joined, {why}: {len(nodes)}: {', '.join(nodes[:8])}{' …' if len(nodes) > 8 else ''}")
    if program.inspector_only:
        print(f"  float Inspector rows with no etlab tap: {len(program.inspector_only)}: "
              f"{', '.join(program.inspector_only[:8])}{' …' if len(program.inspector_only) > 8 else ''}")  # fmt: skip
    found = summary(program)
    print(
        f"  outside delegates: {found['outside']} operators; |like with like| {spread(found['like_with_like_outside'])}"
        f"; |Inspector SNR - etlab| {spread(found['inspector_snr_outside'])}; target ({found['target']}, "
        f"≤ {TARGET_DB} dB): {found['verdict']}"
    )
    if found["delegate_outputs"]:
        print(
            f"  delegate outputs: {found['delegate_outputs']}; |like with like| "
            f"{spread(found['like_with_like_delegate_outputs'])}; |Inspector SNR - etlab| "
            f"{spread(found['inspector_snr_delegate_outputs'])}"
        )
    print(f"  the Inspector's runtime value is the board's, bit for bit: {found['identical']} of {len(program.rows)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--case", action="append", help=f"MODEL:VARIANT (variants: {', '.join(VARIANTS)}); default: {', '.join(CASES)}"
    )
    parser.add_argument("--debug-buffer-mb", type=int, default=64, help="the runtime's buffer of intermediate outputs")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    env = dict(os.environ)
    scratch = Path(tempfile.mkdtemp(prefix="bench-inspector-"))
    env.setdefault("ETLAB_RESULTS", str(scratch / "results"))
    env.setdefault("ETLAB_ARTIFACTS", str(scratch / "artifacts"))
    print(f"machine: {cpu_name()}, {os.cpu_count()} cores; board local; scratch {scratch}", flush=True)
    programs = []
    work = scratch / "inspector"
    work.mkdir(exist_ok=True)
    for case in args.case or CASES:
        model, _, variant = case.partition(":")
        if variant not in VARIANTS:
            raise SystemExit(f"{case}: expected MODEL:VARIANT, a variant among {', '.join(VARIANTS)}")
        program = measure(model, variant, env, work, args.debug_buffer_mb)
        programs.append(program)
        show(program)
    print(f"\nsummary (target: per-operator SQNR within {TARGET_DB} dB outside delegates)")
    for program in programs:
        found = summary(program)
        print(
            f"  {program.model:<18} {program.variant:<21} outside {found['outside']:>3}, delegate outputs "
            f"{found['delegate_outputs']:>2}, identical {found['identical']:>3}/{len(program.rows):<3}  like with like "
            f"{spread(found['like_with_like_outside'])}  Inspector SNR - etlab {spread(found['inspector_snr_outside'])}"
            f"  {found['verdict']}"
        )
    if args.json:
        data = [
            {**asdict(program), "summary": summary(program),
             "rows": [{**asdict(row), "like_with_like": row.like_with_like, "raw": row.raw} for row in program.rows]}
            for program in programs
        ]  # fmt: skip
        args.json.write_text(json.dumps({"machine": cpu_name(), "programs": data}, indent=1))


if __name__ == "__main__":
    main()
