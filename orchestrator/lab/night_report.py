"""A night's outcome as data: each cell's verdict against its baseline (CellVerdict), the labgrid places' waits
(PlaceWait) and the whole night (NightReport), which the reports (report.py), the terminal's table and the nightly's
exit code read."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from orchestrator.lab.run_record import RunRecord
from orchestrator.results.verdicts import Kind


@dataclass(frozen=True)
class PlaceWait:
    """A board that is a labgrid place: which place, and how long its cells waited for the place's lock (they all
    ran under one lock, so they waited together)."""

    place: str
    coordinator: str
    waited: float | None  # None when the place was never held
    error: str | None = None

    @property
    def waited_text(self) -> str:
        return f"{self.waited:.1f} s" if self.waited is not None else f"not held: {self.error or '?'}"


@dataclass
class CellVerdict:
    """The outcome of one nightly cell against its baseline."""

    record: RunRecord
    verdict: Kind
    detail: str = ""
    baseline_median_ms: float | None = None
    ratio: float | None = None
    slower_ops: list[dict] = field(default_factory=list)
    suspect: str | None = None  # "slower"/"faster": a changed program that needs the interleaved re-test
    reference: RunRecord | None = None  # the baseline night whose program is the A side of a re-test
    drift: float | None = None  # unchanged program: tonight's median / the baseline's, the board's doing
    retest: dict[str, Any] | None = None  # to_data(abtest.Interleaved.outcome)
    remeasured: dict[str, Any] | None = None  # the degraded first run that was re-measured
    memory: dict[str, Any] | None = None  # peak RSS vs the baseline nights' (judging.judge_memory)

    def __post_init__(self) -> None:
        self.verdict = Kind(self.verdict)

    @property
    def cell(self) -> tuple[str, str, str]:
        return self.record.cell

    def info(self) -> dict[str, Any]:
        """What the history keeps of a verdict (history.set_verdict)."""
        return {
            "detail": self.detail,
            "baseline_median_ms": self.baseline_median_ms,
            "ratio": self.ratio,
            "slower_ops": self.slower_ops,
            "drift": self.drift,
            "retest": self.retest,
            "remeasured": self.remeasured,
            "memory": self.memory,
        }

    @classmethod
    def stored(cls, record: RunRecord) -> CellVerdict:
        """The verdict a cell got when it was judged (a resumed night, or an earlier night in a report)."""
        info = record.verdict_info or {}
        return cls(
            record,
            Kind(record.verdict),
            str(info.get("detail") or ""),
            info.get("baseline_median_ms"),
            info.get("ratio"),
            list(info.get("slower_ops") or []),
            drift=info.get("drift"),
            retest=info.get("retest"),
            remeasured=info.get("remeasured"),
            memory=info.get("memory"),
        )

    @property
    def change(self) -> str | None:
        """Tonight's median against the baseline's, e.g. "+12.5%"."""
        return None if self.ratio is None else f"{(self.ratio - 1) * 100:+.1f}%"


@dataclass
class NightReport:
    night: str
    verdicts: list[CellVerdict]
    history: dict[tuple[str, str, str], list[RunRecord]]  # per cell, oldest first
    exit_code: int
    skipped: list[tuple[str, str, str]] = field(default_factory=list)  # recorded earlier the same night
    outputs: dict[str, Path] = field(default_factory=dict)  # the report files written (html, md, junit)
    places: dict[str, PlaceWait] = field(default_factory=dict)  # per board that is a labgrid place
    # Measured but not recorded (the history failed): kept in pending_dir until `fab nightly --record-pending`.
    pending: list[tuple[str, str, str]] = field(default_factory=list)
    pending_dir: Path | None = None
    # (as exported, advised) program names of the matrix's `advised` entries: shown side by side
    advised: list[tuple[str, str]] = field(default_factory=list)
    # Earlier nights' pending results this nightly could not record (a malformed file, kept): why, one per result
    left_behind: list[str] = field(default_factory=list)
    # A lab night whose scheduler was lost mid-way: why (its unrun cells are infrastructure failures saying so)
    lost: str | None = None

    @property
    def lost_note(self) -> str | None:
        """What a lost scheduler cost the night, and how to resume it."""
        if self.lost is None:
            return None
        unrun = [v.cell for v in self.verdicts if v.verdict == Kind.INFRA and v.record.error == self.lost]
        done = len(self.verdicts) - len(unrun)
        cells = f": {', '.join(label(cell) for cell in unrun)}" if unrun else ""
        return (
            f"{self.lost}. {done} cell(s) were recorded before it; {len(unrun)} did not run and are recorded as "
            f"infrastructure failures{cells}. To resume: start `fab lab-scheduler` again, wait until `fab lab` lists "
            f"the workers (they join again by themselves), then run `fab nightly --night {self.night}`: the cells "
            "recorded are skipped, the others run."
        )

    @property
    def pending_note(self) -> str | None:
        if not self.pending:
            return None
        return (
            f"{len(self.pending)} cell(s) measured tonight are not in the history yet: the history failed to record "
            f"them. They are kept in {self.pending_dir}; `fab nightly --record-pending` (or the next nightly) "
            f"records them: {', '.join(label(cell) for cell in self.pending)}."
        )

    @property
    def left_behind_note(self) -> str | None:
        if not self.left_behind:
            return None
        reasons = "; ".join(self.left_behind)
        return f"{len(self.left_behind)} result(s) of earlier nights are still pending, not recorded: {reasons}"

    @property
    def regressions(self) -> list[CellVerdict]:
        return [v for v in self.verdicts if v.verdict == Kind.REGRESSION]

    @property
    def failures(self) -> list[CellVerdict]:
        return [v for v in self.verdicts if v.verdict in (Kind.FAILED, Kind.INFRA)]

    @property
    def warnings(self) -> list[CellVerdict]:
        """Drift, unconfirmed and inconclusive cells: worth reading, not a red build."""
        return [v for v in self.verdicts if v.verdict.is_warning and v.verdict != Kind.NOT_COMPARED]


def label(cell: tuple[str, str, str]) -> str:
    return " / ".join(cell)
