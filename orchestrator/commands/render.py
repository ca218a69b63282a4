"""Terminal rendering of a run's results (top operators, outputs, memory, counters, cells, context scaling,
generation); every table etlab prints is drawn in commands/render*.py: render_boards.py (boards, gc),
render_lowering.py (lowering), render_models.py (models), render_compare.py (comparisons), render_night.py (the
nightly), render_advice.py (findings), render_generation.py (a language model's figures, and their markdown)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from orchestrator import console, paths
from orchestrator.commands.render_deploy import energy_lines, energy_text, numerics_lines, print_degraded
from orchestrator.commands.render_generation import decode_text, prefill_text, print_generation
from orchestrator.deploy.cells import CellOutcome
from orchestrator.errors import AnalysisError
from orchestrator.fsutil import read_json
from orchestrator.lowering.program import ProgramName
from orchestrator.lowering.variants import Variant
from orchestrator.results.context_scaling import context_rows, write_plot
from orchestrator.results.documents import ANALYSIS_DIR, Summary, load_summary
from orchestrator.results.modules import counts_total, rolled_up, shown_delegated_ms, shown_ms
from orchestrator.results.ops_record import OPS_FILE, load_ops
from orchestrator.results.summary import Counters, RunSummary
from orchestrator.servers.dashboard.records import OperatorRow
from orchestrator.servers.dashboard.where import operator_rows

MODULE_WIDTH = 30  # the Top operators table keeps within 140 columns (ETLAB_WIDTH) beside its node and source


def _short_source(source: str | None) -> str:
    """ "modeling_distilbert.py:216 in forward" -> "modeling_distilbert.py:216": a module's forward is the rule."""
    if not source:
        return "–"
    return source.removesuffix(" in forward")


def _dotted_lines(module: str | None, width: int = MODULE_WIDTH) -> str:
    """A module's path in lines of at most `width`, broken after a dot: "distilbert.transformer." / "layer.0.ffn"."""
    if not module:
        return "–"
    lines = [""]
    for part in module.split("."):
        piece = f".{part}" if lines[-1] else part
        if lines[-1] and len(lines[-1]) + len(piece) > width:
            lines[-1] += "."
            piece = part
            lines.append("")
        lines[-1] += piece
    return "\n".join(lines)


def render_top_ops(summary: Summary | Path, limit: int = 15) -> None:
    """Print the top operators of an analysed bundle (a Summary, or the bundle's folder) and its validity: the rows
    the dashboard's run page shows (servers/dashboard/where.py), the XNNPACK nodes inside a delegate call in its
    stead, each with its module, source line and output shape."""
    if isinstance(summary, Summary):
        run, bundle = summary.run, summary.bundle_dir
    else:
        run, bundle = load_summary(Path(summary)), Path(summary)
    operators: list[OperatorRow] = []
    if (bundle / ANALYSIS_DIR / OPS_FILE).is_file():
        try:
            operators, _, _ = operator_rows(load_ops(bundle), limit)
        except AnalysisError as exc:  # an edited ops.json costs the table, never the rest
            console.warn(console.escape(f"no top operators: {exc}"))
    rows = [
        [row.node_id, f"{row.op}\n{row.shape}" if row.shape else row.op, _dotted_lines(row.module),
         _short_source(row.source), row.median_ms, row.mean_ms, row.share]
        for row in operators
    ]  # fmt: skip
    warm = run.latency.warm
    measured = (
        f"median {warm.median_ms:.2f} ms over {run.latency.iterations} iterations, CV {warm.cv * 100:.1f}%"
        if warm
        else "no measured iterations"
    )
    caption = f"run {run.run_id}: {measured} — {run.validity.status}; node: an XNNPACK node as <delegate call>/<node>"
    columns = ["node", "op, output shape", "module", "source", "median ms", "mean ms", "% of run"]
    if run.generation is not None:  # ops.json is a decode step's; ops_prefill.json the prompt's
        caption = f"run {run.run_id}: one decode step (ops_prefill.json: the prefill) — {run.validity.status}"
        columns[-1] = "% of step"
    console.table("Top operators", columns, rows, caption=caption, fold=("module",), whole=[columns[0], *columns[3:]])
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
    render_numerics(run)
    if run.energy is not None:
        console.plain(f"energy: {energy_text(run.energy)}")
    roofline = run.operator_roofline.line if run.operator_roofline is not None else None
    if roofline is not None:  # the costliest memory-bound FC/conv/bmm node (results/op_roofline.py)
        console.plain(f"roofline: {roofline}")
    if run.generation is not None and run.generation.roofline is not None:
        decode_line = decode_text(run.generation.roofline, run.generation.decode_tokens_per_s)
        console.plain(f"decode roofline: {decode_line}")
    if run.generation is not None and run.generation.prefill_roofline is not None:
        console.plain(f"prefill roofline: {prefill_text(run.generation.prefill_roofline, run.generation.ttft_ms)}")
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


def render_modules(run: RunSummary, depth: int | None, limit: int = 15) -> None:
    """The time by module of the model (`--by module[:DEPTH]`) in the run's median execution: the slowest modules,
    each its time counted `total` (with its submodules) or `self` (its own rows), delegated or not, then the rest of
    the modules, the time on no module and the runtime around the instructions: together, the run's median."""
    tree = run.modules
    if tree is None:
        console.warn("--by module: no time by module to show")
        return
    rows = rolled_up(tree, depth)
    whole = tree.median_ms if tree.median_ms is not None else tree.measured_ms

    def line(name: str, kind: str | None, counts: str | None, ms: float, delegated: float | None) -> list[Any]:
        return [name, kind, counts, ms, ms / whole * 100 if whole else None, delegated,
                ms - delegated if delegated is not None else None]  # fmt: skip

    table = [
        line(row.module, (row.module_type or "").rsplit(".", 1)[-1] or None,
             "total" if counts_total(row, depth) else "self", shown_ms(row, depth), shown_delegated_ms(row, depth))
        for row in rows[:limit]
    ]  # fmt: skip
    rest = rows[limit:]
    if rest:
        delegated = [shown_delegated_ms(row, depth) for row in rest]
        table.append(line(f"({len(rest)} more modules)", None, None, sum(shown_ms(row, depth) for row in rest),
                          None if None in delegated else sum(d for d in delegated if d is not None)))  # fmt: skip
    if tree.median_ms is not None:  # a summary.json from before these figures has only the modules
        table.append(line("(no module: the model itself, or no source)", None, None, tree.unattributed_ms or 0.0,
                          tree.unattributed_delegated_ms or 0.0))  # fmt: skip
        table.append(line("(the runtime around the instructions)", None, None, tree.outside_ms or 0.0, 0.0))
    level = (
        "each module by its own rows (`self`: its submodules are rows of their own)"
        if depth is None
        else f"modules at depth {depth} with their submodules (`total`), shallower ones by their own rows (`self`)"
    )
    share = f"{tree.attributed_share * 100:.1f}%" if tree.attributed_share is not None else "none"
    adds_up = (
        f"ms in the run's median execution ({tree.executions}): the rows add up to the run's median, "
        f"{tree.median_ms:.3f} ms"
        if tree.median_ms is not None
        else f"% of the measured time, {tree.measured_ms:.3f} ms"
    )
    console.table(
        "Time by module",
        ["module", "type", "counts", "ms", "% of median", "delegated ms", "not delegated ms"],
        table,
        caption=f"{level}; {adds_up}; {share} of the measured time traced to a module",
        fold=("module",),
    )


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
    figures: list[str] = [accuracy.verdict]
    if accuracy.sqnr_db is not None:
        figures.append(f"{accuracy.sqnr_db:.1f}dB")
    if accuracy.top1_agreement is not None:
        tie = accuracy.top1_within_noise is not None and accuracy.top1_within_noise > accuracy.top1_agreement
        figures.append(f"t1 {accuracy.top1_agreement:.0%}{'~' if tie else ''}")
    if accuracy.top5_overlap is not None:
        figures.append(f"t5 {accuracy.top5_overlap:.0%}")
    return " ".join(figures) + ("" if accuracy.meaningful else " †")


SPEEDUP_KEY = "speedup: XNNPACK fp32 over portable, a quantized program over XNNPACK fp32 (medians, one board)"
ACCURACY_KEY = (
    "accuracy vs fp32 eager: SQNR, top-1 agreement (t1; ~ a flip within the noise), top-5 overlap (t5); "
    "† random weights: the figures say little"
)


def megabytes(value: int | None) -> float | None:
    return round(value / 1e6, 2) if value is not None else None


def render_memory(run: RunSummary) -> None:
    """Peak and current RSS per phase, and how much of the peak the program accounts for."""
    memory = run.memory
    if memory is None:
        return
    rows = [
        [phase, megabytes(v.get("peak_rss_bytes")), megabytes(v.get("rss_bytes"))] for phase, v in memory.phases.items()
    ]
    peak_kind = "each phase's own peak" if memory.peak_reset else "running peak (the kernel refused a reset)"
    console.table(
        "Memory",
        ["phase", "peak RSS MB", "RSS MB"],
        rows,
        caption=f"peak {megabytes(memory.peak_rss_bytes)} MB ({peak_kind}); "
        f"planned arenas {megabytes(memory.planned_bytes)} MB, constants {megabytes(memory.constants_bytes)} MB, "
        f"peak live activations {megabytes(memory.peak_live_bytes)} MB, "
        f"delegates and everything else {megabytes(memory.other_bytes)} MB",
    )


def render_numerics(run: RunSummary) -> None:
    """Where accuracy goes: the operators that lose the most against fp32 eager, then what stands out."""
    numerics = run.numerics
    if numerics is None:
        return
    if numerics.status != "ok":
        console.warn(f"numerics pass failed: {numerics.error}")
        return

    def figure(value: float | None, digits: int = 3) -> str:
        return "—" if value is None else f"{value:.{digits}g}"

    rows = [
        [row.op, row.module or "—", row.source or "—", f"{row.sqnr_db:.1f}", f"{row.introduced_db:.1f}",
         f"{row.introduced_share:.0%}", figure(row.max_abs_error), figure(row.cosine, 5), row.nan + row.inf]
        for row in numerics.losing_most
    ]  # fmt: skip
    outputs = ", ".join(f"{value:.1f}" for value in numerics.output_sqnr_db) or "—"
    console.table(
        "Where accuracy goes (against fp32 eager)",
        ["op", "module", "source", "SQNR dB", "added dB", "own share", "max abs err", "cosine", "NaN/Inf"],
        rows,
        caption=f"{numerics.taps} operators measured on the board, delegates included; added dB: the SQNR of the "
        f"error the operator added itself (lower: worse); outputs' SQNR {outputs} dB; analysis/numerics.json: all",
    )
    if numerics.collapse is not None:
        where = numerics.collapse.module or numerics.collapse.node
        console.warn(
            f"{numerics.collapse.op} in {where} ({numerics.collapse.source or 'no source line'}) outputs only zeros "
            "where fp32 does not: the first layer that collapses (a calibration whose scales floored?)"
        )
    if numerics.nonfinite is not None:
        row = numerics.nonfinite
        console.warn(f"{row.op} in {row.module or row.node} ({row.source or '?'}): {row.nan} NaN, {row.inf} Inf")


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
    """board × backend: median, speedup (XNNPACK over portable, quantized over fp32 XNNPACK), validity, the run id
    (what compare, advise and explore take; the model and backend are never cut), then the next commands.

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
            speedup = f"{reference / cell.median_ms:.2f}×"
        status = "ok" if cell.ok else f"FAILED at {cell.stage}"
        row = [cell.board, cell.model, variant.name, status, cell.median_ms, speedup]
        row.append(megabytes(cell.summary.memory.peak_rss_bytes) if cell.summary and cell.summary.memory else None)
        if quantized:
            size = cell.summary.model.size_bytes if cell.summary else None
            row += [round(size / 1e6, 3) if size else None, _accuracy_cell(cell)]
        rows.append([*row, cell.validity, _run_id(cell)])
    extra = ["size MB", "accuracy"] if quantized else []
    console.table(
        "Results",
        ["board", "model", "backend", "status", "median ms", "speedup", "peak MB", *extra, "validity", "run id"],
        rows,
        caption=f"{SPEEDUP_KEY}; {ACCURACY_KEY}" if quantized else SPEEDUP_KEY,
        whole=["model", "backend", "run id", "accuracy"],  # never cut: the other columns narrow for them
    )
    _next_commands(cells)
    unchecked: dict[tuple[str, str], list[str]] = {}  # (board, why) -> runs: one line per board and cause
    for cell in cells:
        if cell.error:
            failure = cell.detail or cell.error  # every line: a host key's fingerprints, a bundle's bad files
            console.error(f"{cell.board}: {cell.model}/{cell.variant} failed at {cell.stage}: {failure}")
        for reason in cell.summary.validity.reasons if cell.summary else ():
            if reason.level != "degraded":  # the degraded ones are said once for all runs, with what to change
                console.warn(f"{cell.board}: {cell.model}/{cell.variant}: {reason.reason}")
        if cell.summary is not None and not cell.summary.correctness.checked:
            unchecked.setdefault((cell.board, cell.summary.correctness.reason or "no reference outputs"), []).append(
                f"{cell.model}/{cell.variant}"
            )
        counters = cell.summary.counters if cell.summary else None
        if counters is not None:
            _counters_lines(counters, f"{cell.board}: {cell.model}/{cell.variant}: ", per_run=False)
    print_degraded(cells)
    for line in [*numerics_lines(cells), *energy_lines(cells)]:
        console.plain(line)
    for (board, why), runs in unchecked.items():
        console.warn(f"{board}: {', '.join(runs)}: correctness not checked ({why})")
    _counters_by_cause(cells)
    print_generation([(cell.board, cell.model, cell.variant.name, cell.summary) for cell in cells if cell.summary])


def _run_id(cell: CellOutcome) -> str | None:
    """The run's id: its bundle's folder name (results/<board>/<model>/<backend>/<run id>)."""
    return cell.run_id or (cell.bundle.name if cell.bundle is not None else None)


def _next_commands(cells: Sequence[CellOutcome]) -> None:
    """Where the bundles are, and the commands that take these runs: explore and advise the first run, and compare
    it with a run of the same program on another board (compare refuses two different programs)."""
    runs = [cell for cell in cells if cell.ok and _run_id(cell)]
    if not runs:
        return
    # the run worth exploring: an XNNPACK one where the deploy also ran portable (`--backend portable,xnnpack`)
    first = next((cell for cell in runs if cell.variant.backend != "portable"), runs[0])
    if first.bundle is not None and len(first.bundle.parents) > 3:
        console.info(f"bundles: {short_path(first.bundle.parents[3])}/<board>/<model>/<backend>/<run id>")
    commands = [f"fab explore --run {_run_id(first)}", f"fab advise --run {_run_id(first)}"]
    twin = next(
        (cell for cell in runs if cell is not first and (cell.model, cell.variant) == (first.model, first.variant)),
        None,
    )
    if twin is not None:
        commands.append(f"fab compare {_run_id(first)} {_run_id(twin)}")
    console.info("next: " + " · ".join(commands))


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
            "KV cache",
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
                megabytes(row.decode_peak_bytes),
                None if row.kv_cache_bytes is None else console.format_bytes(row.kv_cache_bytes),
            ]
            for row in rows
        ],
        caption="each context is its own program (its KV cache is planned memory); same prompt and new tokens",
    )
    base = str(dataclasses.replace(ProgramName.parse(rows[0].model), context=None))
    plot = write_plot(rows, results_root or paths.results_dir(), base)
    if plot is not None:
        console.info(f"plot: {short_path(plot)}")


def short_path(path: Path) -> str:
    """Relative to the working folder when inside it: tables stay readable."""
    try:
        return str(path.relative_to(Path.cwd()))
    except ValueError:
        return str(path)
