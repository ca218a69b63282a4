"""deploy-and-profile's lines under its Results table: why runs are degraded and what to change, once; the advice
once per model (its findings across the model's runs, each with the range of its measured saving)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from orchestrator import console
from orchestrator.deploy.cells import CellOutcome
from orchestrator.results.summary import EnergySummary
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


def _ms_span(values: Sequence[float]) -> str:
    """ "1.2 ms", or "1.2–1,180 ms": the range of a saving over runs, never an exponent."""
    low, high = (console.format_ms(value) for value in (min(values), max(values)))
    if low == high:
        return low
    same_unit = low.rsplit(" ", 1)[1] == high.rsplit(" ", 1)[1]
    return f"{low.rsplit(' ', 1)[0]}–{high}" if same_unit else f"{low}–{high}"


def _share_span(values: Sequence[float]) -> str:
    low, high = (console.format_share(value) for value in (min(values), max(values)))
    if low == high:
        return low
    return f"{low}–{high}" if low.startswith(("<", ">")) else f"{low.rstrip('%')}–{high}"


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
    from orchestrator.advice.findings import SHOWN_SHARE
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

    # as the advisor numbers them: a failed accuracy gate's fix first, then by what each is worth (its largest
    # predicted saving, else the time it covers), then the findings about no time
    def rank(entry: _Seen) -> tuple[bool, bool, float]:
        worth = max(entry.savings) if entry.savings else entry.finding.worth_ms
        return (not entry.finding.gate_failed, worth is None, -(worth or 0.0))

    ranked = sorted(seen.values(), key=rank)
    variants = list(dict.fromkeys(cell.variant.name for cell, _ in advices))
    lines = []

    # the top few, then every finding worth a few percent of the run, predicted or not (fp32 matmuls on a board
    # never measured in int8 may hold most of it), and every accuracy finding (another axis): never "more"
    def worth_share(entry: _Seen) -> float:
        if entry.shares:
            return max(entry.shares)
        return entry.finding.share if entry.finding.worth_ms is not None else 0.0

    shown = [
        entry
        for k, entry in enumerate(ranked)
        if k < MODEL_FINDINGS or entry.finding.keep_float or worth_share(entry) >= SHOWN_SHARE
    ]
    for entry in shown:
        finding = entry.finding
        saving = (
            f"not predicted ({console.format_share(finding.share)} of the run)" if finding.share else "not predicted"
        )
        if finding.keep_float:  # accuracy, not time: what the advisor predicts is an SQNR
            saving = _saving(finding, 0.0)
        elif entry.savings:
            bound = "≤ " if finding.saving_is_bound else ""
            share = f" ({_share_span(entry.shares)})" if entry.shares else ""
            saving = f"{bound}{_ms_span(entry.savings)}{share}"
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


def numerics_lines(cells: Sequence[CellOutcome]) -> list[str]:
    """One line per run with a numerics pass: its outputs against fp32 eager and the operator that added the most
    error, with the command that shows the rest."""
    lines = []
    for cell in cells:
        numerics = cell.summary.numerics if cell.summary is not None else None
        if numerics is None or numerics.status != "ok":
            continue  # a failed pass is warned about by the analysis, with its reason
        outputs = ", ".join(f"{value:.1f}" for value in numerics.output_sqnr_db) or "—"
        line = f"accuracy of {cell.model}/{cell.variant} on {cell.board}: outputs {outputs} dB against fp32 eager"
        worst = numerics.losing_most[0] if numerics.losing_most else None
        if worst is not None and worst.introduced_share > 0:
            where = worst.module or worst.node
            source = f" at {worst.source}" if worst.source else ""
            line += f"; the most error added: {worst.op} in {where}{source} ({worst.introduced_db:.1f} dB)"
        lines.append(f"{line}; all {numerics.taps} operators: fab analyze --run {cell.run_id}")
    return lines


def energy_text(energy: EnergySummary) -> str:
    """ "4.51 W, 0.48 J per inference (12 samples, vcgencmd pmic_read_adc)", or why it is not measured."""
    if energy.status != "measured" or energy.mean_watts is None:
        return f"not measured ({energy.why or 'no sensor'})"
    parts = [f"{energy.mean_watts:.2f} W"]
    if energy.joules_per_token is not None:
        parts.append(f"{energy.joules_per_token * 1000:.3g} mJ per token")
    if energy.joules_per_inference is not None:
        what = "generation" if energy.joules_per_token is not None else "inference"
        parts.append(f"{energy.joules_per_inference:.3g} J per {what}")
    return f"{', '.join(parts)} ({energy.samples} samples, {energy.source})"


def energy_lines(cells: Sequence[CellOutcome]) -> list[str]:
    """One line per run whose board measured its power (boards without a sensor stay quiet here)."""
    return [
        f"energy of {cell.model}/{cell.variant} on {cell.board}: {energy_text(cell.summary.energy)}"
        for cell in cells
        if cell.summary is not None and cell.summary.energy is not None and cell.summary.energy.status == "measured"
    ]
