"""Terminal rendering of what the domain layers return: every table etlab prints is drawn here."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from orchestrator import console, paths
from orchestrator.deploy.agent_client import GC_CATEGORIES, GcResult
from orchestrator.deploy.cells import CellOutcome
from orchestrator.fsutil import read_json
from orchestrator.lowering.export.delegation import BOOKKEEPING, bookkeeping_counts
from orchestrator.lowering.variants import Variant
from orchestrator.results.context_scaling import context_rows, write_plot
from orchestrator.results.documents import ANALYSIS_DIR, Summary, load_summary
from orchestrator.results.summary import Counters, RunSummary
from orchestrator.results.verdicts import Kind

if TYPE_CHECKING:  # the types only: rendering a table must not import what produced it
    from orchestrator.boards.fanout import BoardOutcome
    from orchestrator.lab.report import NightReport
    from orchestrator.lowering.export.lower import LoweringResult
    from orchestrator.lowering.lowered import LoweredModel
    from orchestrator.lowering.sidecar import Sidecar
    from orchestrator.lowering.spec import ModelSpec
    from orchestrator.results.compare import Comparison


def render_top_ops(summary: Summary | Path, limit: int = 15) -> None:
    """Print the top operators of an analysed bundle (a Summary, or the bundle's folder) and its validity."""
    if isinstance(summary, Summary):
        run = summary.run
        timed = [i.row() for i in summary.profile.instructions if i.dist] if summary.profile else []
    else:
        run = load_summary(Path(summary))
        ops_path = Path(summary) / ANALYSIS_DIR / "ops.json"
        timed = [r for r in read_json(ops_path)["instructions"] if r["samples"]] if ops_path.is_file() else []
    timed.sort(key=lambda r: -r["mean_ms"])
    rows = [[r["node_id"], r["op"] or r["kind"], r["median_ms"], r["p90_ms"], r["mean_ms"], r["pct"]] for r in timed]
    warm = run.latency.warm
    measured = (
        f"median {warm.median_ms:.2f} ms over {run.latency.iterations} iterations, CV {warm.cv * 100:.1f}%"
        if warm
        else "no measured iterations"
    )
    caption = f"run {run.run_id}: {measured} — {run.validity.status}"
    columns = ["node", "op", "median ms", "p90 ms", "mean ms", "% of run"]
    if run.generation is not None:  # ops.json is a decode step's; ops_prefill.json the prompt's
        caption = f"run {run.run_id}: one decode step (ops_prefill.json: the prefill) — {run.validity.status}"
        columns[-1] = "% of step"
    console.table("Top operators", columns, rows[:limit], caption=caption)
    profile = run.profile or {}
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
    render_memory(run)
    render_counters(run, summary)
    render_outputs(run)
    print_generation([(run.board or "?", run.model.name or "?", run.model.backend or "?", run)])
    for reason in run.validity.reasons:
        (console.error if reason.level == "invalid" else console.warn)(reason.reason)
    accuracy = run.accuracy
    if accuracy is not None:
        figures = ", ".join(
            f"{label} {value:.3g}"
            for label, value in (
                ("SQNR dB", accuracy.sqnr_db),
                ("top-1", accuracy.top1_agreement),
                ("top-5 overlap", accuracy.top5_overlap),
                ("max abs error", accuracy.max_abs_error),
            )
            if value is not None
        )
        line = f"accuracy of {accuracy.scheme} vs fp32 eager: {accuracy.verdict} ({figures})"
        if accuracy.note:
            line += f"; {accuracy.note}"
        (console.warn if accuracy.verdict == "fail" else console.info)(console.escape(line))
        for said in accuracy.reasons:
            console.warn(f"accuracy: {said}")


def _figure(value: float | None, style: str) -> str | None:
    return None if value is None else format(value, style)


def render_outputs(run: RunSummary) -> None:
    """Each output against eager, one row per output: SQNR, errors, and top-1/top-5 where it is logits."""
    accuracy = run.accuracy
    checks = accuracy.outputs if accuracy is not None and accuracy.outputs else run.correctness.outputs
    if not checks:
        return
    rows = [
        [
            check.name,
            check.kind,
            "×".join(map(str, check.shape or ())) or "scalar",
            _figure(check.sqnr_db, ".1f"),
            _figure(check.max_rel_error, ".1e"),
            _figure(check.max_abs_error, ".1e"),
            _figure(check.top1_agreement, ".0%"),
            _figure(check.top5_overlap, ".0%"),
            "ok" if check.ok else "FAIL",
        ]
        for check in checks
    ]
    against = f"{accuracy.scheme} vs fp32 eager" if accuracy is not None and accuracy.outputs else "vs eager"
    caption = run.correctness.kind_note
    console.table(
        f"Outputs {against}",
        ["output", "kind", "shape", "SQNR dB", "max rel err", "max abs err", "top-1", "top-5", "check"],
        rows,
        caption=caption,
    )


def _accuracy_cell(cell: CellOutcome) -> str | None:
    accuracy = cell.summary.accuracy if cell.summary else None
    if accuracy is None:
        return None
    # Compact, so the cell stays on one line: the markers are explained once, in the table's caption (ACCURACY_KEY).
    figures = [accuracy.verdict]
    if accuracy.sqnr_db is not None:
        figures.append(f"{accuracy.sqnr_db:.1f}dB")
    if accuracy.top1_agreement is not None:
        tie = accuracy.top1_within_noise is not None and accuracy.top1_within_noise > accuracy.top1_agreement
        figures.append(f"t1 {accuracy.top1_agreement:.0%}{'~' if tie else ''}")
    if accuracy.top5_overlap is not None:
        figures.append(f"t5 {accuracy.top5_overlap:.0%}")
    return " ".join(figures) + ("" if accuracy.meaningful else " †")


ACCURACY_KEY = (
    "accuracy vs fp32 eager: SQNR, top-1 agreement (t1; ~ a flip within the noise), top-5 overlap (t5); "
    "† random weights: the figures say little"
)


def _mb(value: int | None) -> float | None:
    return round(value / 1e6, 2) if value is not None else None


def render_memory(run: RunSummary) -> None:
    """Peak and current RSS per phase, and how much of the peak the program accounts for."""
    memory = run.memory
    if memory is None:
        return
    rows = [[phase, _mb(v.get("peak_rss_bytes")), _mb(v.get("rss_bytes"))] for phase, v in memory.phases.items()]
    peak_kind = "each phase's own peak" if memory.peak_reset else "running peak (the kernel refused a reset)"
    console.table(
        "Memory",
        ["phase", "peak RSS MB", "RSS MB"],
        rows,
        caption=f"peak {_mb(memory.peak_rss_bytes)} MB ({peak_kind}); planned arenas {_mb(memory.planned_bytes)} MB, "
        f"constants {_mb(memory.constants_bytes)} MB, peak live activations {_mb(memory.peak_live_bytes)} MB, "
        f"delegates and everything else {_mb(memory.other_bytes)} MB",
    )


def render_counters(run: RunSummary, summary: Summary | Path) -> None:
    """The counters pass: the hottest instructions with every captured counter, then what could not be captured."""
    counters = run.counters
    if counters is None:
        return
    bundle = summary.bundle_dir if isinstance(summary, Summary) else Path(summary)
    ops_path = bundle / ANALYSIS_DIR / "ops.json"
    metrics = [*counters.captured, *counters.derived]
    if metrics and ops_path.is_file():
        rows = [r for r in read_json(ops_path)["instructions"] if any(r.get(m) is not None for m in metrics)]
        key = "cycles" if "cycles" in counters.captured else metrics[0]
        rows.sort(key=lambda r: -(r.get(key) or 0))
        console.table(
            "Counters",
            ["node", "op", *metrics],
            [[r["node_id"], r["op"] or r["kind"], *(r.get(m) for m in metrics)] for r in rows[:10]],
            caption=f"per execution, median of {counters.executions}; {counters.threads} thread(s): counters are "
            "read by the thread that runs the operators, user space only"
            + ("; multiplexed, counts scaled by time enabled / running" if counters.multiplexed else ""),
        )
    _counters_lines(counters)


def _counters_lines(counters: Counters, where: str = "", *, per_run: bool = True) -> None:
    """What the counters pass captured, on which thread, what it could not and why (`per_run`: the captured and
    missing lines too; print_cells says those once per board and cause, `_counters_by_cause`)."""
    if counters.status != "ok":
        console.warn(f"{where}counters pass failed: {counters.error}")
        return
    if per_run:
        _captured_line(where, counters.captured, counters.threads)
        for (error, reason), names in _missing_by_cause([counters]).items():
            _missing_line(where, names, error, reason)
    check = counters.consistency
    if check.get("checked") and not check.get("agrees"):
        console.warn(f"{where}counters vs timing: the hottest on {check.get('metric')} is {check.get('hottest')}: "
                     f"{check.get('reason')}")  # fmt: skip


def _captured_line(where: str, captured: Sequence[str], threads: int | None, runs: int = 1) -> None:
    console.info(console.escape(
        f"{where}counters pass: {', '.join(captured) or 'nothing'} captured on {threads} thread(s)"
        f"{f' in each of {runs} runs' if runs > 1 else ''}, read by the thread that runs the operators (user space "
        "only)"
    ))  # fmt: skip


def _missing_by_cause(passes: Sequence[Counters]) -> dict[tuple[str, str], list[str]]:
    """The counters the passes could not capture, by cause (error and reason), each name once."""
    causes: dict[tuple[str, str], list[str]] = {}
    for counters in passes:
        for missing in counters.missing:
            names = causes.setdefault((str(missing.get("error")), str(missing.get("reason"))), [])
            if str(missing.get("name")) not in names:
                names.append(str(missing.get("name")))
    return causes


def _missing_line(where: str, names: Sequence[str], error: str, reason: str, runs: int = 1) -> None:
    which = f"counter {names[0]}" if len(names) == 1 else f"counters {', '.join(names)}"
    console.warn(f"{where}{which} not captured{f' (all {runs} runs)' if runs > 1 else ''}: {error}: {reason}")


def _counters_by_cause(cells: Sequence[CellOutcome]) -> None:
    """One line per board and cause, not per variant and counter: three variants on a board without a PMU say once
    which counters it cannot give and why."""
    boards: dict[str, list[Counters]] = {}
    for cell in cells:
        counters = cell.summary.counters if cell.summary else None
        if counters is not None and counters.status == "ok":
            boards.setdefault(cell.board, []).append(counters)
    for board, passes in boards.items():
        captured = {(c.captured, c.threads) for c in passes}
        for captured_names, threads in sorted(captured, key=str):
            runs = sum((c.captured, c.threads) == (captured_names, threads) for c in passes)
            _captured_line(f"{board}: ", captured_names, threads, runs)
        for (error, reason), names in _missing_by_cause(passes).items():
            runs = sum(any(str(m.get("error")) == error and str(m.get("reason")) == reason for m in c.missing)
                       for c in passes)  # fmt: skip
            _missing_line(f"{board}: ", names, error, reason, runs)


def print_cells(cells: Sequence[CellOutcome]) -> None:
    """board × backend: median, speedup (XNNPACK over portable, quantized over fp32 XNNPACK), validity, bundle.

    With quantized variants in the table, the size of each program and the accuracy gate's verdict are shown too.
    """
    medians = {(c.board, c.model, c.variant): c.median_ms for c in cells}
    quantized = any(cell.variant.quantized for cell in cells)
    rows = []
    for cell in cells:
        variant = cell.variant
        # The speedup's reference: the same backend in fp32 for a quantized program, portable for fp32 XNNPACK.
        base = Variant(variant.backend) if variant.quantized else None
        if variant == Variant("xnnpack"):
            base = Variant("portable")
        reference = medians.get((cell.board, cell.model, base)) if base else None
        speedup = None
        if reference and cell.median_ms and base is not None:
            speedup = f"{reference / cell.median_ms:.2f}× vs {'fp32' if variant.quantized else 'portable'}"
        status = "ok" if cell.ok else f"FAILED at {cell.stage}"
        row = [cell.board, cell.model, variant.name, status, cell.median_ms, speedup]
        row.append(_mb(cell.summary.memory.peak_rss_bytes) if cell.summary and cell.summary.memory else None)
        if quantized:
            size = cell.summary.model.size_bytes if cell.summary else None
            row += [round(size / 1e6, 3) if size else None, _accuracy_cell(cell)]
        rows.append([*row, cell.validity, _short_path(cell.bundle) if cell.bundle else None])
    extra = ["size MB", "accuracy"] if quantized else []
    console.table(
        "Results",
        ["board", "model", "backend", "status", "median ms", "speedup", "peak MB", *extra, "validity", "bundle"],
        rows,
        caption=ACCURACY_KEY if quantized else None,
        whole=["accuracy"],
    )
    unchecked: dict[tuple[str, str], list[str]] = {}  # (board, why) -> runs: one line per board and cause
    for cell in cells:
        if cell.error:
            failure = cell.detail or cell.error  # every line: a host key's fingerprints, a bundle's bad files
            console.error(f"{cell.board}: {cell.model}/{cell.variant} failed at {cell.stage}: {failure}")
        for reason in cell.summary.validity.reasons if cell.summary else ():
            console.warn(f"{cell.board}: {cell.model}/{cell.variant}: {reason.reason}")
        if cell.summary is not None and not cell.summary.correctness.checked:
            unchecked.setdefault((cell.board, cell.summary.correctness.reason or "no reference outputs"), []).append(
                f"{cell.model}/{cell.variant}"
            )
        counters = cell.summary.counters if cell.summary else None
        if counters is not None:
            _counters_lines(counters, f"{cell.board}: {cell.model}/{cell.variant}: ", per_run=False)
    for (board, why), runs in unchecked.items():
        console.warn(f"{board}: {', '.join(runs)}: correctness not checked ({why})")
    _counters_by_cause(cells)
    print_generation([(cell.board, cell.model, cell.variant.name, cell.summary) for cell in cells if cell.summary])


def print_context_scaling(cells: Sequence[CellOutcome], results_root: Path | None = None) -> None:
    """One model at several KV cache sizes: a row per board, backend and context, and the plot's path."""
    runs = [(cell.board, cell.model, cell.variant.name, cell.summary) for cell in cells if cell.summary]
    rows = context_rows(runs)
    if not rows:
        return
    console.table(
        "Against the context",
        [
            "board",
            "backend",
            "context",
            "TTFT ms",
            "prefill tok/s",
            "decode tok/s",
            "token ms p50",
            "decode MB",
            "KV cache MB",
        ],
        [
            [
                row.board,
                row.backend,
                row.context,
                row.ttft_ms,
                row.prefill_tokens_per_s,
                row.decode_tokens_per_s,
                row.token_median_ms,
                _mb(row.decode_peak_bytes),
                _mb(row.kv_cache_bytes),
            ]
            for row in rows
        ],
        caption="each context is its own program (its KV cache is planned memory); same prompt and new tokens",
    )
    base = rows[0].model.split(".ctx")[0]
    plot = write_plot(rows, results_root or paths.results_dir(), base)
    if plot is not None:
        console.info(f"plot: {_short_path(plot)}")


def print_generation(runs: Sequence[tuple[str, str, str, RunSummary]]) -> None:
    """A language model as it is used: time to first token, decode speed, per-token latency, memory per phase."""
    rows = []
    for board, model, backend, summary in runs:
        generation = summary.generation
        if generation is None:
            continue
        steps = generation.token_ms
        rows.append([
            board, model, backend, f"{generation.prompt_len}+{generation.new_tokens}/{generation.context or '?'}",
            generation.ttft_ms, generation.decode_tokens_per_s,
            " / ".join("-" if steps.get(k) is None else f"{steps[k]:.2f}" for k in ("median", "p90", "max")),
            _mb(generation.memory.get("prefill")), _mb(generation.memory.get("decode")),
            _mb(generation.kv_cache_bytes), generation.ids_text,
        ])  # fmt: skip
    if rows:
        console.table(
            "Generation",
            [
                "board",
                "model",
                "backend",
                "prompt+new/ctx",
                "TTFT ms",
                "decode tok/s",
                "token ms p50/p90/max",
                "prefill MB",
                "decode MB",
                "KV cache MB",
                "ids vs eager greedy",
            ],
            rows,
            caption="TTFT: the prompt's prefill (median); decode tok/s: the steps after the first token; MB: peak "
            "RSS per phase",
        )
        for board, model, backend, summary in runs:
            text = summary.generation.text if summary.generation else None
            if text:  # the ids equal eager's: this is what the board generated
                console.info(console.escape(f"{board}: {model}/{backend}: {text['prompt']!r} → {text['generated']!r}"))


def _short_path(path: Path) -> str:
    """Relative to the working folder when inside it: tables stay readable."""
    try:
        return str(path.relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def summarize(outcomes: Sequence[BoardOutcome[Any]], *, title: str = "Boards") -> None:
    """Print the per-board summary table (board, status, stage, time, reason)."""
    rows = [
        (
            outcome.board.name,
            "ok" if outcome.ok else "FAILED",
            outcome.stage,
            round(outcome.duration, 2),
            outcome.error,
        )
        for outcome in outcomes
    ]
    failed = sum(not outcome.ok for outcome in outcomes)
    caption = f"{len(outcomes) - failed} ok, {failed} failed" if outcomes else "no boards"
    console.table(title, ["board", "status", "stage", "seconds", "reason"], rows, caption=caption)
    print_details(outcomes)


def print_gc(outcomes: Sequence[BoardOutcome[GcResult]]) -> None:
    """The `fab gc` table: what each board that answered removed, per category and in all, and the space freed."""
    rows = []
    for outcome in outcomes:
        result = outcome.value
        if not outcome.ok or result is None:
            continue
        removed = result.removed
        counts = [len(removed[category]) for category in GC_CATEGORIES]
        rows.append([outcome.board.name, result.removed_count, *counts, f"{result.bytes_freed:,}"])
    if rows:
        console.table("gc", ["board", "removed", *GC_CATEGORIES, "bytes freed"], rows)


def print_details(outcomes: Sequence[BoardOutcome[Any]]) -> None:
    """Under a table that shows one line per board: the whole reason of every failure that has more to say."""
    entries = [
        (outcome.board.name, outcome.stage, outcome.detail)
        for outcome in outcomes
        if not outcome.ok and outcome.detail and outcome.detail != outcome.error
    ]
    if entries:
        console.details("Details", entries)


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
    floating = [*quantization.float_linears, *quantization.float_convolutions]
    if floating:
        text += f"; FLOAT: {', '.join(floating[:4])}{' …' if len(floating) > 4 else ''}"
    return text


def _rewrites_note(result: LoweringResult) -> str:
    applied = next(iter(result.variants.values())).sidecar.applied_rewrites
    return f"rewrites applied: {', '.join(applied)}" if applied else "the model as exported (no rewrites)"


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
        "fallback ops: the graph's nodes outside the delegates (the course's count): kernels, which run, and "
        "bookkeeping nodes (memory planning, tuple access, views), which run none; stored twice: constants held "
        "both outside and inside an XNNPACK delegate (a tied embedding)",
    )
    for variant, item in result.variants.items():
        outside = item.sidecar.outside_delegates
        if outside is not None and outside.stored_twice_bytes >= _STORED_TWICE_WARNING:
            shapes = ", ".join("×".join(map(str, t["shape"])) for t in outside.stored_twice[:3])
            console.warn(
                f"{variant}: {outside.stored_twice_bytes / 1e6:.1f} MB of constants stored twice, outside and inside "
                f"the XNNPACK delegates ({shapes}): a tied embedding costs its size again in the .pte and in memory"
            )
        quantization = item.sidecar.quantization
        if quantization is None:
            continue
        for note in quantization.float_notes():
            console.warn(f"{variant}: {note}")
        if (quantization.calibration_source or "").startswith("generated"):
            console.warn(
                f"{variant}: calibrated on {quantization.calibration_samples} generated samples, not real inputs"
            )


def _inputs_cell(inputs: Sequence[tuple[Any, Any, Any]]) -> str:
    """(name, dtype, shape) → `input_ids, attention_mask int64 1×128`: inputs of one dtype and shape share it."""
    groups: dict[tuple[str, str], list[str]] = {}
    for name, dtype, shape in inputs:
        groups.setdefault((str(dtype), "×".join(map(str, shape or ()))), []).append(str(name))
    return "; ".join(f"{', '.join(names)} {dtype} {shape}" for (dtype, shape), names in groups.items())


def print_models(builtins: Sequence[ModelSpec], lowered: Sequence[LoweredModel]) -> None:
    """`fab models`: every name `--model` takes, and what each built-in program returns."""
    from orchestrator.lowering.spec import OUTPUT_WORDS, WRAPPED_TASKS  # `fab models` only

    rows = [
        [spec.name, spec.model_source, spec.task, _inputs_cell([(i.name, i.dtype, i.shape) for i in spec.inputs]),
         f"{spec.output}: {OUTPUT_WORDS[spec.output]}" if spec.task in WRAPPED_TASKS else None, spec.description]
        for spec in builtins
    ]  # fmt: skip
    columns = ["name", "source", "task", "inputs", "output", "description"]
    console.table("Built-in models (--model NAME)", columns, rows)
    if not lowered:
        console.info("no models lowered from a spec file or your own program yet (fab lower --spec FILE)")
        return
    rows = []
    for model in lowered:
        sidecar = model.sidecar
        origin = _short_path(Path(model.spec_file)) if model.spec_file else f"your {sidecar.spec.get('model_source')}"
        inputs = _inputs_cell([(i.get("name"), i.get("dtype"), i.get("shape")) for i in sidecar.inputs])
        rows.append([model.name, origin, inputs, sidecar.created.replace("T", " ")[:16]])
    columns = ["name", "from", "inputs", "lowered"]
    console.table("Lowered from a spec or your own file (--model NAME)", columns, rows, fold=["from"])


def render_comparison(comparison: Comparison, limit: int = 15) -> None:
    """The biggest per-operator changes and the overall verdict, through the console."""
    changed = [op for op in comparison.ops if op.delta_ms is not None]
    changed.sort(key=lambda op: -abs(op.delta_ms or 0.0))
    rows = [
        [
            op.node_id,
            op.op,
            op.median_a_ms,
            op.median_b_ms,
            op.delta_ms,
            f"{((op.median_b_ms or 0) / op.median_a_ms - 1) * 100:+.1f}%" if op.median_a_ms else None,
            op.verdict.change if op.verdict else None,
        ]
        for op in changed[:limit]
    ]
    console.table(
        f"{comparison.run_id_b} vs {comparison.run_id_a}",
        ["node", "op", "A median ms", "B median ms", "Δ ms", "Δ %", "change"],
        rows,
        caption=f"per operator, over {comparison.per_operator_scope}: the measured change of each instruction; "
        "the overall verdict follows",
    )
    if comparison.generation:
        console.table(
            "Generation",
            ["figure", "A", "B", "B / A"],
            [
                [row["label"], row["a"], row["b"], f"{row['ratio']:.3f}×" if row["ratio"] is not None else None]
                for row in comparison.generation
            ],
            caption="tokens/s: above 1× is faster; milliseconds: above 1× is slower",
        )
    if comparison.memory:
        console.table(
            "Memory",
            ["figure", "A MB", "B MB", "Δ MB", "Δ %"],
            [
                [
                    row["figure"],
                    _mb(row["a"]),
                    _mb(row["b"]),
                    _mb(row["delta"]),
                    f"{row['ratio'] * 100:+.1f}%" if row["ratio"] is not None else None,
                ]
                for row in comparison.memory
            ],
        )
    for note in comparison.notes:
        console.warn(note)
    # One verdict, said once: the measured figure is its detail, never a claim of its own.
    line = f"overall: {comparison.verdict.value}: {comparison.verdict_detail}"
    if comparison.verdict == Kind.REGRESSION:
        console.error(line)
    elif comparison.verdict.is_warning:
        console.warn(line)
    else:
        console.info(console.escape(line))


def print_night(report: NightReport) -> None:
    rows = [
        [*item.cell, item.record.median_ms, item.baseline_median_ms, item.change,
         _mb(item.record.peak_rss_bytes), item.verdict.value, item.record.validity]
        for item in report.verdicts
    ]  # fmt: skip
    console.table(
        f"Nightly {report.night}",
        ["board", "model", "backend", "median ms", "baseline ms", "change", "peak MB", "verdict", "validity"],
        rows,
        caption=f"exit code {report.exit_code}",
    )
    if any(item.record.generation for item in report.verdicts):
        # here, not at the top: it imports SQLAlchemy, which only the nightly's tables need
        from orchestrator.lab.report import GENERATION_HEADERS, GENERATION_KEYS, generation_rows

        console.table(
            "Generation",
            list(GENERATION_HEADERS),
            [[row[key] for key in GENERATION_KEYS] for row in generation_rows(report)],
            caption="language models: the median above is one whole generation",
            whole=["model", "prompt+new/ctx", "ids vs eager"],
        )
    if report.places:
        # here, not at the top: it imports SQLAlchemy, which only the nightly's tables need
        from orchestrator.lab.report import place_rows

        console.table(
            "labgrid places",
            ["board", "model", "backend", "place", "coordinator", "waited for the place"],
            [[*cell, place.place, place.coordinator, place.waited_text] for cell, place in place_rows(report)],
        )
    for item in report.regressions:
        console.error(f"REGRESSION {' / '.join(item.cell)}: {item.detail}")
    for item in report.warnings:
        console.warn(f"{item.verdict.value.upper()} {' / '.join(item.cell)}: {item.detail}")
    for item in report.failures:
        where = f"{' / '.join(item.cell)} at {item.record.stage}"
        console.error(f"{item.verdict.value.upper()} {where}: {item.record.error}")
    for kind, path in report.outputs.items():
        console.info(console.escape(f"{kind}: {path}"))
