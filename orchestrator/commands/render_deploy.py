"""deploy-and-profile's lines under its Results table: why runs are degraded and what to change, once; the advice
once per model (its findings across the model's runs, each with the range of its measured saving)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from orchestrator import console
from orchestrator.deploy.cells import CellOutcome
from orchestrator.results.validity import CV_LIMIT

if TYPE_CHECKING:  # the advisor's records (ops_record: 0.14 s) are imported by the advice, after the boards' work
    from orchestrator.advice.findings import Advice, Finding

MODEL_FINDINGS = 3  # findings shown per model; `fab advise --run ID` shows a run's all
GOVERNOR_FIX = "echo performance | sudo tee /sys/devices/system/cpu/cpufreq/policy*/scaling_governor"
BUSY_LOAD = 0.5  # a load average of at least this per core before a run is a busy board


def _span(values: Sequence[float], unit: str, digits: str = ".3g") -> str:
    low, high = min(values), max(values)
    if f"{low:{digits}}" == f"{high:{digits}}":
        return f"{low:{digits}}{unit}"
    return f"{low:{digits}}–{high:{digits}}{unit}"


def _boards(cells: Sequence[CellOutcome]) -> str:
    return ", ".join(dict.fromkeys(cell.board for cell in cells))


def degraded_lines(cells: Sequence[CellOutcome], iterations: int | None = None) -> list[str]:
    """Once, after the table: which runs are degraded, the figures that made them so, and what to change (more
    iterations, fewer threads, a quieter board, the governor, cooling). [] when none is."""
    degraded = [c for c in cells if c.summary is not None and c.summary.validity.status == "degraded"]
    if not degraded:
        return []
    causes, fixes = [], []
    unsteady = [c for c in degraded if c.summary and c.summary.latency.warm and c.summary.latency.warm.cv > CV_LIMIT]
    if unsteady:
        cvs = [c.summary.latency.warm.cv * 100 for c in unsteady if c.summary and c.summary.latency.warm]
        counts = sorted({c.summary.latency.iterations for c in unsteady if c.summary})
        ran = "/".join(map(str, counts))
        limit = f"{CV_LIMIT * 100:.0f}%"
        causes.append(f"timings varied: CV {_span(cvs, '%', '.0f')} (limit {limit}) over {ran} iterations")
        more = max(50, 2 * max([*counts, iterations or 0]))
        fixes.append(f"more iterations (--iterations {more}; these ran {ran})")
        threads = {c.board: c.summary.latency.threads for c in unsteady if c.summary and c.summary.latency.threads}
        cores = {c.board: c.summary.board_conditions.get("cores_online") for c in unsteady if c.summary}
        shown = [f"{board}: {count} on {cores.get(board) or '?'} cores" for board, count in threads.items()]
        fewer = max(1, min(threads.values()) // 2) if threads else 1
        fixes.append(f"fewer threads (--threads {fewer}, or `threads:` in the inventory"
                     + (f"; ran {', '.join(shown)})" if shown else ")"))  # fmt: skip
        busy = []
        for cell in unsteady:
            assert cell.summary is not None
            load = cell.summary.board_conditions.get("load_1m_before")
            count = cell.summary.board_conditions.get("cores_online") or 1
            if isinstance(load, int | float) and load >= BUSY_LOAD * count:
                busy.append((cell.board, load, count))
        if busy:
            worst = {board: (load, count) for board, load, count in sorted(busy, key=lambda b: b[1])}
            seen = ", ".join(f"{board}: load {load:.1f} on {count} cores" for board, (load, count) in worst.items())
            fixes.append(f"a quieter board (before the runs, {seen}: stop what else runs there)")
        else:
            fixes.append("a quieter board (nothing else running on it)")
    governors: dict[str, str] = {}
    for cell in degraded:
        assert cell.summary is not None
        conditions = cell.summary.board_conditions
        for governor in (conditions.get("governor_before"), conditions.get("governor_after")):
            if isinstance(governor, str) and governor != "performance":
                governors.setdefault(cell.board, governor)
    if governors:
        said = ", ".join(f"'{governor}' on {board}" for board, governor in governors.items())
        causes.append(f"CPU governor {said}")
        fixes.append(f"the CPU governor 'performance' ({GOVERNOR_FIX})")
    hot = [c for c in degraded if c.summary and any(r.reason.startswith(("throttling", "SoC temperature"))
                                                     for r in c.summary.validity.reasons)]  # fmt: skip
    if hot:
        causes.append(f"heat or throttling on {_boards(hot)}")
        fixes.append("cooling (a heatsink or fan) and a pause between runs")
    head = f"degraded: {len(degraded)} of {len(cells)} runs ({_boards(degraded)})"
    lines = [f"{head}: {'; '.join(causes)}" if causes else head]
    if fixes:
        lines.append(f"  to steady them: {'; '.join(fixes)}")
    return lines


@dataclass
class _Seen:
    """One finding across a model's runs: its savings and shares, where it was found."""

    finding: Finding
    savings: list[float]
    shares: list[float]
    variants: list[str]


def model_advice_lines(model: str, advices: Sequence[tuple[CellOutcome, Advice]]) -> list[str]:
    """The advice once for a model: its runs' findings joined by what they say (title and fix), the largest saving
    first, each with the range of its predicted saving and share over the runs that found it."""
    # here, not at the top: print_cells (render.py) imports this module, and a deploy starts before the advisor loads
    from orchestrator.commands.render_advice import _at_line, _saving

    seen: dict[tuple[str, str], _Seen] = {}
    for cell, advice in advices:
        for finding in advice.findings:
            key = (finding.title, finding.fix + _at_line(finding))
            entry = seen.setdefault(key, _Seen(finding, [], [], []))
            if finding.saving_ms is not None:
                entry.savings.append(finding.saving_ms)
                if advice.method_ms:
                    entry.shares.append(finding.saving_ms / advice.method_ms)
            if cell.variant.name not in entry.variants:
                entry.variants.append(cell.variant.name)
    if not seen:
        return []
    # as the advisor numbers them: a failed accuracy gate's fix first; predicted savings, largest first; then the
    # bounds (what the operators take); then the findings without a predicted saving
    ranked = sorted(seen.values(), key=lambda e: (not e.finding.gate_failed, not e.savings, e.finding.saving_is_bound,
                                                  -max(e.savings, default=0)))  # fmt: skip
    variants = list(dict.fromkeys(cell.variant.name for cell, _ in advices))
    lines = []
    # an unpredicted finding may hold most of the run (fp32 matmuls on a board never measured in int8), and an
    # accuracy finding is about another axis: neither is folded into "more"
    shown = [
        *ranked[:MODEL_FINDINGS],
        *(
            entry
            for entry in ranked[MODEL_FINDINGS:]
            if entry.finding.keep_float or (not entry.savings and entry.finding.share)
        ),
    ]
    for entry in shown:
        finding = entry.finding
        saving = f"not predicted ({finding.share:.0%} of the run)" if finding.share else "not predicted"
        if finding.keep_float:  # accuracy, not time: what the advisor predicts is an SQNR
            saving = _saving(finding, 0.0)
        elif entry.savings:
            bound = "≤ " if finding.saving_is_bound else ""
            share = f" ({_span([s * 100 for s in entry.shares], '%', '.0f')})" if entry.shares else ""
            saving = f"{bound}{_span(entry.savings, ' ms')}{share}"
        where = f" [{', '.join(entry.variants)}]" if len(variants) > 1 and len(entry.variants) < len(variants) else ""
        lines.append(f"  {saving}: {finding.title}{where} → {finding.fix}{_at_line(finding)}")
    runs = len(advices)
    more = len(ranked) - len(shown)
    first = advices[0][1].run_id
    tail = f"; {more} more" if more > 0 else ""
    plural = "s" if runs != 1 else ""
    head = f"advice for {model} ({runs} run{plural}{tail}; one run's findings: fab advise --run {first}):"
    return [head, *lines]


def print_model_advice(advices: Sequence[tuple[CellOutcome, Advice]]) -> None:
    """Each model's advice once, in the order the models ran."""
    by_model: dict[str, list[tuple[CellOutcome, Advice]]] = {}
    for cell, advice in advices:
        by_model.setdefault(cell.model, []).append((cell, advice))
    for model, runs in by_model.items():
        for line in model_advice_lines(model, runs):
            console.plain(line)


def print_degraded(cells: Sequence[CellOutcome], iterations: int | None = None) -> None:
    for line in degraded_lines(cells, iterations):
        console.plain(line)
