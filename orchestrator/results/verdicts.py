"""The one list of verdicts that nightly, compare, the reports and JUnit share, and what each one means.

A lab board is noisy: iterations of one run share that run's conditions (a busy minute, a hot SoC), so the
samples of one run can never show that the *program* changed. Hence:

- the same program (sha256) and versions as the baseline: any shift is board **drift**, never a regression;
- a changed program that looks slower or faster is re-tested interleaved (A B, B A, ... on the same board), and
  only a shift that survives that is a **regression** / **improvement**; otherwise it is **unconfirmed**;
- a run that stays degraded after one re-measurement is **inconclusive**.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable


class Kind(str, enum.Enum):
    REGRESSION = "regression"  # a changed program, confirmed slower by the interleaved re-test
    IMPROVEMENT = "improvement"  # a changed program, confirmed faster
    UNCONFIRMED = "unconfirmed"  # looked shifted against the baseline, the interleaved re-test did not confirm it
    DRIFT = "drift"  # the program is unchanged and the timings moved: the board changed
    INCONCLUSIVE = "inconclusive"  # degraded even after a re-measurement (or the re-test could not run)
    NEW = "new"  # not enough baseline nights yet
    OK = "ok"  # within noise of the baseline
    NOT_COMPARED = "not compared"  # an invalid run
    FAILED = "failed"  # the model failed on a healthy board
    INFRA = "infra"  # the board or the link failed

    def __str__(self) -> str:
        return self.value

    @property
    def is_warning(self) -> bool:
        """Worth a line in the report, not a red build."""
        return self in (Kind.UNCONFIRMED, Kind.DRIFT, Kind.INCONCLUSIVE, Kind.NOT_COMPARED)

    @property
    def is_failure(self) -> bool:
        """A JUnit failure and exit code 1."""
        return self in (Kind.REGRESSION, Kind.FAILED)


def exit_code(kinds: Iterable[Kind | str], *, infrastructure_ok: bool = True) -> int:
    """2 when the night is incomplete (infrastructure), else 1 for a confirmed regression or a failed model, else 0."""
    found = {Kind(k) for k in kinds}
    if Kind.INFRA in found or not infrastructure_ok:
        return 2
    if any(kind.is_failure for kind in found):
        return 1
    return 0
