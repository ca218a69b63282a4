"""The advisor: every detector on a run's facts, in DETECTORS order, each seeing which instructions an earlier one
already explained (so no time is counted twice); the findings numbered by what they are worth."""

from __future__ import annotations

from dataclasses import replace

from orchestrator.advice.detectors import DETECTORS
from orchestrator.advice.findings import Advice, Finding, RunFacts


def advise(facts: RunFacts) -> Advice:
    """Every detector on the run, in DETECTORS order; the findings numbered by what they are worth (`_rank`)."""
    explained: set[str] = set()  # instruction node ids an earlier finding accounted for
    drafts: list[Finding] = []
    for detector in DETECTORS.values():
        for finding in detector.find(facts, frozenset(explained)):
            explained.update(node for nodes in finding.nodes.values() for node in nodes)
            drafts.append(finding)
    ordered = sorted(drafts, key=_rank)
    numbered = tuple(
        replace(finding, id=f"F{k}", where=facts.ops.where(finding.nodes)) for k, finding in enumerate(ordered, 1)
    )
    model = facts.summary.model
    board, median = facts.summary.board, facts.ops.method_median_ms
    return Advice(facts.ops.run_id, model.name, model.backend, board, median, numbered)


def _rank(finding: Finding) -> tuple[int, float]:
    """A program failing its accuracy gate first (not shippable as it is), then the time findings by what they are
    worth (`Finding.worth_ms`), then the rest (accuracy, board conditions, sizes)."""
    if finding.gate_failed:
        return (-1, 0.0)
    worth = finding.worth_ms
    if worth is not None:
        return (0, -worth)
    return (1, -(finding.saving_mb or 0.0))
