"""The lowering's tables: `fab lower`'s (delegation, what runs outside the delegates, quantization)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from orchestrator import console
from orchestrator.lowering.export.delegation import BOOKKEEPING, bookkeeping_counts

if TYPE_CHECKING:  # the types only: rendering a table must not import what produced it
    from orchestrator.lowering.export.lower import LoweringResult
    from orchestrator.lowering.sidecar import Sidecar


# Graph nodes outside the delegates that run no kernel (lowering/delegation.py BOOKKEEPING), by short name.
_BOOKKEEPING_LABELS = {"memory_planning": "alloc", "tuple_access": "getitem", "views": "view"}
_STORED_TWICE_WARNING = 1_000_000  # bytes: below it a tie costs little (the tiny test models' 0.26 MB)


def _short_op(op: str) -> str:
    """`aten::unsqueeze_copy.out` → `unsqueeze_copy`: the operator, not its namespace and out-variant (a table cell)."""
    name = op.removeprefix("aten::")
    return name.rsplit(".", 1)[0] if name.endswith((".out", ".Tensor_out", ".Scalar_out", ".int_out")) else name


def _outside_cells(sidecar: Sidecar) -> tuple[int, str, str, float | None]:
    """Kernel calls outside the delegates, their top operators, the bookkeeping nodes, and MB stored twice."""
    outside = sidecar.outside_delegates
    if outside is not None:
        kernels, calls, bookkeeping = outside.kernels, outside.kernel_calls, outside.bookkeeping
        twice: float | None = round(outside.stored_twice_bytes / 1e6, 3)
    else:  # an older sidecar: the graph's histogram without its bookkeeping nodes
        histogram = sidecar.delegation.fallback_histogram
        kernels = {op: n for op, n in histogram.items() if op not in BOOKKEEPING}
        calls, twice, bookkeeping = sum(kernels.values()), None, bookkeeping_counts(histogram)
    top = ", ".join(f"{_short_op(op)} ×{count}" for op, count in list(kernels.items())[:3])
    plumbing = ", ".join(f"{_BOOKKEEPING_LABELS.get(kind, kind)} {n}" for kind, n in bookkeeping.items() if n)
    return calls, top, plumbing or "none", twice


def _quantized_cell(sidecar: Sidecar) -> str | None:
    """`38/38 linears, 52/52 convolutions; FC qdint8 x qcint8 ×38; Conv ...`, and what stayed in float."""
    quantization = sidecar.quantization
    if quantization is None:
        return None
    kinds = ", ".join(f"{kind} ×{n}" for kind, n in quantization.fully_connected.items())
    text = f"{quantization.quantized_linears}/{quantization.linear_layers} linears"
    if quantization.convolutions:
        text += f", {quantization.quantized_convolutions}/{quantization.convolutions} convolutions"
    text += f"; FC {kinds or 'none'}"
    if quantization.convolution:
        text += "; Conv " + ", ".join(f"{kind} ×{n}" for kind, n in quantization.convolution.items())
    if quantization.padded_linears:  # the LLM recipe's 4-bit linears whose widths its group did not divide
        text += f"; {len(quantization.padded_linears)} linears padded to the group"
    if quantization.shared_heads:  # a tied head reading the embedding's quantized table: stored once
        text += "; tied head reads the embedding's table (stored once)"
    kept = quantization.kept_float
    if kept:  # mixed precision, as asked
        text += f"; kept float: {', '.join(kept[:4])}{' …' if len(kept) > 4 else ''}"
    floating = [name for name in (*quantization.float_linears, *quantization.float_convolutions) if name not in kept]
    if floating:
        text += f"; FLOAT: {', '.join(floating[:4])}{' …' if len(floating) > 4 else ''}"
    return text


def _rewrites_note(result: LoweringResult) -> str:
    applied = next(iter(result.variants.values())).sidecar.applied_rewrites
    return f"rewrites applied: {', '.join(applied)}" if applied else "the model as exported (no rewrites)"


_ATTENTION_WORDS = {"etlab": "etlab's operators, over the filled cache only", "sdpa": "transformers' static cache"}


def _attention_note(result: LoweringResult) -> str:
    """A text-generation program's attention (`--attention`; a program lowered before the choice was sdpa's)."""
    generation = next(iter(result.variants.values())).sidecar.generation
    if generation is None:
        return ""
    attention = generation.attention or "sdpa"
    return f"attention: {attention} ({_ATTENTION_WORDS.get(attention, attention)}); "


def print_lowering(result: LoweringResult) -> None:
    rows = []
    quantized = any(item.sidecar.quantization for item in result.variants.values())
    for variant, item in result.variants.items():
        delegation = item.sidecar.delegation
        calls, top, plumbing, twice = _outside_cells(item.sidecar)
        row = [
            variant.name,
            item.sidecar.pte_size_mb,
            delegation.delegate_call_sites,
            delegation.fallback_ops,
            f"{calls}" + (f": {top}" if top else ""),
            plumbing,
            twice,
        ]
        if quantized:
            row.append(_quantized_cell(item.sidecar) or "fp32")
        rows.append([*row, "cache" if item.cached else "lowered"])
    columns = ["backend", "size MB", "delegates", "fallback ops", "kernels outside", "bookkeeping", "twice MB"]
    console.table(
        f"{result.spec.name} → {result.paths.folder}",
        [*columns, *(["quantized"] if quantized else []), "source"],
        rows,
        caption=f"weights: {next(iter(result.variants.values())).sidecar.weights}; {_rewrites_note(result)}; "
        f"{_attention_note(result)}"
        "fallback ops: the graph's nodes outside the delegates (the course's count): kernels, which run, and "
        "bookkeeping nodes (memory planning, tuple access, views), which run none; stored twice: constants held "
        "both outside and inside an XNNPACK delegate (a tied embedding)",
    )
    for variant, item in result.variants.items():
        outside = item.sidecar.outside_delegates
        if outside is not None and outside.stored_twice_bytes >= _STORED_TWICE_WARNING:
            shapes = ", ".join("×".join(map(str, t.shape)) for t in outside.stored_twice.tensors[:3])
            console.warn(
                f"{variant}: {outside.stored_twice_bytes / 1e6:.1f} MB of constants stored twice, outside and inside "
                f"the XNNPACK delegates ({shapes}): a tied embedding costs its size again in the .pte and in memory"
            )
        quantization = item.sidecar.quantization
        if quantization is None or not item.cached:  # a program lowered now: its lowering said these
            continue
        for note in quantization.float_notes():
            console.warn(f"{result.spec.name}: {variant}: {note}")
        if (quantization.calibration_source or "").startswith("generated"):
            console.warn(
                f"{variant}: calibrated on {quantization.calibration_samples} generated samples, not real inputs"
            )
