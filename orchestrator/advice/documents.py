"""What the advisor writes into a run: `analysis/advice.json` and two Model Explorer overlays that paint each
finding's nodes, at the top level and inside the delegates:

- `me_overlay_advice.json`: the value is the finding's number (F3 → 3), each finding in a colour of its own, and
  the overlay's name is the legend ("F1 tanh-gelu -0.66 ms; ...");
- `me_overlay_advice_saving_ms.json`: the value is the finding's predicted saving shared out evenly over its
  nodes (the saving is the finding's, not any one node's).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from orchestrator import console
from orchestrator.advice.findings import ADVICE_FILE, Advice, Finding, shown_findings
from orchestrator.errors import AnalysisError
from orchestrator.fsutil import atomic_write_json
from orchestrator.records import RecordError, from_data, to_data
from orchestrator.results.documents import ANALYSIS_DIR, read_analysis_file
from orchestrator.results.overlays import GREEN_YELLOW_RED, graph_node_data, overlay_path

ADVICE_OVERLAY, SAVING_OVERLAY = "advice", "advice_saving_ms"
# Distinct colours for the findings, in order (colour-blind safe: Okabe-Ito), repeated past eight.
FINDING_COLOURS = ("#e69f00", "#56b4e9", "#009e73", "#f0e442", "#0072b2", "#d55e00", "#cc79a7", "#999999")


def finding_label(finding: Finding) -> str:
    if finding.saving_ms is None:
        return f"{finding.id} {finding.kind}"
    sign = "≤" if finding.saving_is_bound else "-"
    return f"{finding.id} {finding.kind} {sign}{console.format_ms(finding.saving_ms)}"


def load_advice(bundle_dir: Path) -> Advice | None:
    """A run's advice.json (None when the advisor has not been run on it), or an AnalysisError when it is damaged:
    a results folder can be edited, so every field is checked."""
    path = Path(bundle_dir) / ANALYSIS_DIR / ADVICE_FILE
    if not path.is_file():
        return None
    document = read_analysis_file(bundle_dir, ADVICE_FILE)  # strict JSON; never a board's (its manifest is checked)
    try:
        return from_data(document, Advice, where=str(path))
    except RecordError as exc:
        raise AnalysisError(str(exc), hint="`fab advise` on the run writes it again") from None


def write_advice(bundle_dir: Path, advice: Advice) -> list[Path]:
    """advice.json and, when a finding has nodes, the two overlays; stale overlays of an earlier advice go."""
    bundle_dir = Path(bundle_dir)
    written = [bundle_dir / ANALYSIS_DIR / ADVICE_FILE]
    atomic_write_json(written[0], to_data(advice))
    painted = [finding for finding in advice.findings if finding.nodes]
    paths = [overlay_path(bundle_dir, ADVICE_OVERLAY), overlay_path(bundle_dir, SAVING_OVERLAY)]
    if not painted:
        for path in paths:
            path.unlink(missing_ok=True)
        return written
    legend = "; ".join(finding_label(finding) for finding in painted)
    numbers: dict[str, dict[str, float]] = {}
    colours: dict[str, dict[str, str]] = {}
    savings: dict[str, dict[str, float]] = {}
    for finding in painted:
        number = int(finding.id.removeprefix("F"))
        colour = FINDING_COLOURS[(number - 1) % len(FINDING_COLOURS)]
        count = sum(len(nodes) for nodes in finding.nodes.values())
        for graph, nodes in finding.nodes.items():
            for node in nodes:
                numbers.setdefault(graph, {}).setdefault(node, number)  # a node in two findings: the larger saving
                colours.setdefault(graph, {}).setdefault(node, colour)
                if finding.saving_ms is not None:
                    share = finding.saving_ms / count
                    savings.setdefault(graph, {})[node] = savings.get(graph, {}).get(node, 0.0) + share
    document = {}
    for graph, values in numbers.items():
        data = graph_node_data(f"advice ({advice.run_id}): {legend}", values, GREEN_YELLOW_RED)
        for node, colour in colours[graph].items():
            data["results"][node]["bgColor"] = colour
        document[graph] = data
    atomic_write_json(paths[0], document)
    atomic_write_json(
        paths[1],
        {graph: graph_node_data(f"predicted saving ms ({advice.run_id})", values, GREEN_YELLOW_RED)
         for graph, values in savings.items()},
    )  # fmt: skip
    return [*written, *paths]


@dataclass(frozen=True)
class FindingLines:
    """A run's findings as a page or a report lists them: the ones an analysis prints (shown_findings), one line
    each, and how many advice.json holds; `said` counts the lines, so the count and the list agree."""

    lines: tuple[str, ...] = ()
    total: int = 0
    run_id: str = ""

    @property
    def said(self) -> str:
        shown = len(self.lines)
        return f"{shown}{f' of {self.total}' if self.total > shown else ''} finding{'s' * (self.total != 1)}"

    @property
    def more(self) -> str | None:
        """Where the rest are, when some are not listed."""
        rest = self.total - len(self.lines)
        return f"{rest} more: fab advise --run {self.run_id}" if rest > 0 else None


def finding_lines(bundle: str | Path | None) -> FindingLines:
    """A recorded run's findings (its bundle's advice.json), the ones an analysis prints, one line each, the most
    worth first: none when it has none, or its bundle is gone or damaged."""
    if not bundle:
        return FindingLines()
    try:
        advice = load_advice(Path(bundle))
    except (AnalysisError, OSError):
        return FindingLines()
    if advice is None:
        return FindingLines()
    lines = []
    for finding in shown_findings(advice):
        saving = (
            ""
            if finding.saving_ms is None
            else f" ({'≤' if finding.saving_is_bound else '~'}{console.format_ms(finding.saving_ms)})"
        )
        lines.append(f"{finding.id} {finding.title}{saving}")
    return FindingLines(tuple(lines), len(advice.findings), advice.run_id)
