"""The advisor in the terminal: the findings table of `fab advise`, and the one line per finding every analysis
prints."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from orchestrator import console
from orchestrator.advice.findings import ONE_LINE_FINDINGS, Advice, Finding, shown_findings
from orchestrator.lowering.program import ProgramName
from orchestrator.results.numerics import EXACT_DB

if TYPE_CHECKING:  # the trial module brings the lowering: a warm deploy prints advice lines without it
    from orchestrator.advice.trial import ParetoPoint, TrialReport


def _saving(finding: Finding, method_ms: float) -> str:
    if finding.predicted_sqnr_db is not None and finding.sqnr_db is not None:  # accuracy won back, at a cost
        cost = f", {finding.cost_ms:+.3g} ms" if finding.cost_ms is not None else ", time cost not predicted"
        return f"SQNR {finding.sqnr_db:.1f} → {finding.predicted_sqnr_db:.1f} dB{cost}"
    if finding.saving_mb is not None:
        return f"{finding.saving_mb:.1f} MB"
    if finding.saving_ms is None:
        return "not predicted"
    share = f" ({console.format_share(finding.saving_ms / method_ms)})" if method_ms else ""
    return f"{'≤ ' if finding.saving_is_bound else ''}{console.format_ms(finding.saving_ms)}{share}"


def _total(advice: Advice) -> str:
    """The predicted total as a share of the run's median: the baseline of every share the advice gives."""
    share = (
        f" ({console.format_share(advice.predicted_ms / advice.method_ms)} of the run's median "
        f"{console.format_ms(advice.method_ms)})"
        if advice.method_ms
        else ""
    )
    return f"predicted total {console.format_ms(advice.predicted_ms)}{share}"


def render_advice(advice: Advice, notes: list[str]) -> None:
    """`fab advise`: every finding, with its operators, measured share, cause, predicted saving and fix."""
    for note in notes:
        console.warn(note)
    if not advice.findings:
        console.info(console.escape(f"run {advice.run_id}: no findings: the time is where it should be"))
        return
    rows = [
        [f.id, f.title, f"{f.calls} × {', '.join(f.operators)}" if f.operators else "—", f.measured_ms or None,
         f"{f.share:.0%}" if f.share else "—", _saving(f, advice.method_ms), f.fix_kind, f.fix + _at_line(f)]
        for f in advice.findings
    ]  # fmt: skip
    console.table(
        f"Advice for run {advice.run_id} ({advice.model}, {advice.backend}, {advice.board})",
        ["id", "finding", "operators", "measured ms", "share", "predicted saving", "fix kind", "fix"],
        rows,
        caption=f"{_total(advice)} from the predicted findings (≤: at most, not counted); causes below",
    )
    console.details(
        "Causes", [(f.id, f.kind, f"{f.cause}\nsaving: {f.saving_note}{_where(f)}") for f in advice.findings]
    )


def _where(finding: Finding) -> str:
    return "".join(f"\nwhere: {line}" for line in finding.where)


def advice_lines(advice: Advice, limit: int = ONE_LINE_FINDINGS) -> list[str]:
    """One line per top finding and the predicted total, as every analysis prints them."""
    shown = shown_findings(advice, limit)  # as the dashboard's night cells and the nightly report list them
    lines = [f"{f.id} {_saving(f, advice.method_ms)}{_share_of(f)}: {f.title} → {f.fix}{_at_line(f)}" for f in shown]
    more = len(advice.findings) - len(shown)
    tail = f"; {more} more: fab advise --run {advice.run_id}" if more > 0 else ""
    return [*lines, f"{_total(advice)}{tail}"] if lines else []


def _unpredicted(finding: Finding) -> bool:
    return finding.saving_ms is None and finding.saving_mb is None and finding.predicted_sqnr_db is None


def _share_of(finding: Finding) -> str:
    return f" ({console.format_share(finding.share)} of the run)" if _unpredicted(finding) and finding.share else ""


def _at_line(finding: Finding) -> str:
    """A fix in the user's code points at its line: the source of the finding's costliest operator."""
    if finding.fix_kind != "code" or not finding.where:
        return ""
    at = finding.where[0].split(" at ", 1)[1].split(" (", 1)[0]
    return f" at {at}" if at != "?" else ""


def print_advice_lines(advice: Advice, who: str = "") -> None:
    """One unbroken line each (the terminal wraps them, not rich): a line to grep, a run id to copy."""
    for line in advice_lines(advice):
        console.plain(f"{who}advice: {line}")


def render_trial(report: TrialReport) -> None:
    """`fab advise --try`: predicted and measured saving side by side, per variant."""
    rows = []
    for trial in report.variants:
        measured = trial.measured_ms
        share = f" ({trial.measured_percent:.0f}%)" if trial.measured_percent is not None else ""
        error = f"{trial.prediction_error:+.0%}" if trial.prediction_error is not None else "—"
        rows.append([
            trial.name, trial.change, trial.predicted_at_retest_ms,
            f"{console.format_ms(measured)}{share}" if measured is not None else "—", error,
            f"{trial.ratio:.3f}" if trial.ratio is not None else "—",
            "yes" if trial.confirmed else "no", _db(trial.outputs.sqnr_db), _db(trial.sqnr_db),
        ])  # fmt: skip
    console.table(
        f"Advice tried on {report.board}: {report.model} ({report.variant.name}) as exported{_baselines(report)}",
        ["variant", "change", "predicted ms", "measured saving", "prediction error", "ratio", "confirmed",
         "eager outputs", "board SQNR"],
        rows,
        caption="predicted: the advisor's share of the profiled run's median, at the A/B's pace; measured: "
        "interleaved A/B, median of the model as exported minus the variant's; confirmed: the interleaved "
        "re-test's rules (as the nightly's); eager outputs: the variant's eager outputs against the model's; "
        f"board SQNR: its outputs on the board against fp32 eager (the original's: {_db(report.original_sqnr_db)})",
    )  # fmt: skip
    console.details("Re-tests", [(trial.name, None, trial.why) for trial in report.variants])
    render_pareto(report)
    for line in adopt_lines(report):
        console.plain(line, stderr=False)


def _db(value: float | None) -> str:
    if value is None:
        return "—"
    return "exact" if value >= EXACT_DB else f"{value:.1f} dB"


def _adopt(point: ParetoPoint) -> str:
    """The command that profiles a point's program: a mixed-precision one by its layers, not its digest."""
    from orchestrator.commands.common import lower_options  # here: it brings the transports, advice lines need none

    variant = point.variant
    if point.trial is not None and point.trial.keep_float:
        base = str(replace(ProgramName.parse(point.name), keep_float_digest=None))
        return (f"fab deploy-and-profile --model {base} --quantize {variant.scheme.name} "
                f"--keep-float {','.join(point.trial.keep_float)}")  # fmt: skip
    return f"fab deploy-and-profile {lower_options(point.name, variant)}"


def render_pareto(report: TrialReport) -> None:
    """Speed against accuracy: every program the trial measured, the ones on the front marked, each with the command
    that adopts it."""
    # here, not at the top: the trial module brings the lowering
    from orchestrator.advice.trial import pareto_front

    points = report.points()
    if len(points) < 2:
        return
    front = {id(point) for point in pareto_front(points)}
    rows = [
        [point.name, point.variant.name, point.median_ms, _db(point.sqnr_db), "yes" if id(point) in front else "no",
         _adopt(point)]
        for point in sorted(points, key=lambda point: (point.median_ms, -point.sqnr_db))
    ]  # fmt: skip
    console.table(
        f"Speed against accuracy on {report.board}",
        ["program", "backend", "median ms", "board SQNR", "on the front", "adopt it"],
        rows,
        caption="median: the interleaved A/B's; board SQNR: its outputs on the board against fp32 eager; on the "
        "front: no other program is both faster and more accurate",
    )  # fmt: skip


def _baselines(report: TrialReport) -> str:
    """Both medians the table's figures come from, each named: the A/B's (what `measured` is of) and the profiled
    run's (what the advice's shares are of); the board's pace drifts between them."""
    a_b = f"{console.format_ms(report.original_ms)} median in this A/B" if report.original_ms is not None else None
    profiled = next((trial.profiled_ms for trial in report.variants if trial.profiled_ms), None)
    run = f"{console.format_ms(profiled)} median in the profiled run" if profiled else None
    said = "; ".join(part for part in (a_b, run) if part)
    return f": {said}" if said else ""


def adopt_lines(report: TrialReport) -> list[str]:
    """How to adopt what the trial confirmed (the confirmed variant with the largest measured saving): the command
    that lowers and runs it, and the nightly matrix's keys that track it beside the model as exported."""
    speedups = [trial for trial in report.variants if not trial.keep_float and trial.variant is None]
    if not speedups:  # accuracy against time: the table of speed against accuracy says how to adopt each point
        return []
    confirmed = [trial for trial in speedups if trial.confirmed]
    if not confirmed:
        return ["nothing confirmed: no change to adopt (the re-tests above say why)"]
    best = max(confirmed, key=lambda trial: trial.measured_ms or 0.0)
    variant = report.variant
    backend = f"--backend {variant.backend}" + (f" --quantize {variant.scheme.name}" if variant.quantized else "")
    # the attention alone: the program it made, by its name (lowered by the trial); else the model and the options
    model = best.name if best.attention is not None and not best.rewrites else report.model
    options = [f"--attention {best.attention}"] if best.attention is not None and best.rewrites else []
    options += [f"--rewrites {','.join(best.rewrites)}"] if best.rewrites else []
    keys = [f"`attention: {best.attention}`"] if best.attention is not None else []
    keys += [f"`advised: true` and `rewrites: [{', '.join(best.rewrites)}]`"] if best.rewrites else []
    beside = " (the model as exported and its rewritten program, side by side)" if best.rewrites else ""
    return [
        f"adopt it: fab deploy-and-profile --model {' '.join([model, backend, *options])} "
        "(fab lower takes the same options)",
        f"track it nightly: {' and '.join(keys)} in the matrix entry of {report.model}{beside}",
    ]
