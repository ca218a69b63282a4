"""The health job (issue 55): may a board be trusted with a night? Reachable, disk and memory free, the verification
program's outputs equal to eager PyTorch's, not throttled now, the clock governor as configured.

The agent reports facts (board/agent/etlab_agent/health.py); this module judges them, as board data: every field is
checked before it is read, and an answer of the wrong shape is a failed check, never an exception. Whether a board
goes out of service is the lab's decision (lab/service.py), from these reports.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any

from orchestrator.deploy.agent_client import BoardAgent
from orchestrator.deploy.payload import verification_files
from orchestrator.errors import AnalysisError, BoardError, EtlabError, first_line
from orchestrator.results.numerics import numerics_text, sqnr_db
from orchestrator.transport import BoardConnection
from orchestrator.transport.transfer import push_file

MIN_FREE_MB = 500  # what setup-board needs too: a night's bundles and a runtime update
MIN_MEMORY_MB = 256  # below it a model's arenas and the runner's buffers may not fit
MIN_SQNR_DB = 60.0  # fp32 on another CPU's kernels stays above 100 dB; a wrong result is far below
VERIFY_TIMEOUT_S = 120.0
LOCK_TIMEOUT_S = 600.0  # a run holding the board finishes first
THROTTLED_NOW_BITS = {0: "under-voltage", 1: "frequency capped", 2: "throttled", 3: "soft temperature limit"}
CHECKS = ("reachable", "disk", "memory", "verification", "throttling", "governor")


class BoardUnhealthy(BoardError):
    """A board failed its health job: infrastructure (exit 69), so a night skips its cells and judges none."""


@dataclass(frozen=True)
class HealthCheck:
    name: str  # one of CHECKS
    ok: bool
    detail: str


@dataclass(frozen=True)
class HealthReport:
    """One health job's outcome on one board."""

    board: str
    checks: tuple[HealthCheck, ...]
    at: dt.datetime

    @property
    def ok(self) -> bool:
        return all(check.ok for check in self.checks)

    @property
    def reason(self) -> str:
        """The failed checks in one line ('' when healthy)."""
        return "; ".join(f"{check.name}: {check.detail}" for check in self.checks if not check.ok)


def now() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc).replace(microsecond=0)


def unreachable(board: str, why: str) -> HealthReport:
    """The report of a board the job could not reach (or set up)."""
    return HealthReport(board, (HealthCheck("reachable", False, why[:300]),), now())


def check_health(conn: BoardConnection) -> HealthReport:
    """Run the health job on a connected, provisioned board: the verification program and its files are pushed
    (content-addressed: a copy the board corrupted is sent again), then the agent runs it and reports."""
    name = conn.board.name
    reachable = HealthCheck("reachable", True, conn.board.address)
    try:
        files = verification_files()
        program = push_file(conn, files.program, kind="models", suffix=".pte").remote_path
        inputs = push_file(conn, files.inputs, kind="inputs", suffix=".etlt").remote_path
        reference = push_file(conn, files.reference, kind="inputs", suffix=".etlt").remote_path
        answer = BoardAgent(conn, conn.workdir).health(program, inputs, reference, VERIFY_TIMEOUT_S, LOCK_TIMEOUT_S)
    except EtlabError as exc:  # not provisioned, the agent refused, the push failed: the board cannot verify
        return HealthReport(name, (reachable, HealthCheck("verification", False, first_line(exc)[:300])), now())
    return judge(name, answer, conn.board.governor, reachable)


def judge(name: str, answer: dict[str, Any], governor: str | None, reachable: HealthCheck) -> HealthReport:
    """The checks of the agent's answer (board data: a field of the wrong shape fails its check)."""
    checks = [
        reachable,
        _at_least("disk", answer.get("disk_free_mb"), MIN_FREE_MB, "free where bundles go"),
        _at_least("memory", answer.get("memory_available_mb"), MIN_MEMORY_MB, "available"),
        _verification(answer.get("verification")),
        _throttling(answer.get("throttled")),
        _governor(answer.get("governors"), governor),
    ]
    return HealthReport(name, tuple(checks), now())


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _at_least(check: str, value: Any, minimum: int, what: str) -> HealthCheck:
    if value is None:
        return HealthCheck(check, True, "not measured on this board")
    if not _is_int(value) or value < 0:
        return HealthCheck(check, False, f"the board answered {str(value)[:40]!r}")
    if value < minimum:
        return HealthCheck(check, False, f"{value} MB {what}, needs {minimum} MB")
    return HealthCheck(check, True, f"{value} MB {what}")


def _verification(run: Any) -> HealthCheck:
    if not isinstance(run, dict):
        return HealthCheck("verification", False, "no verification run in the answer")
    code, error, numerics = run.get("exit_code"), run.get("error"), run.get("numerics")
    if code != 0:
        why = error[:200] if isinstance(error, str) and error else f"the runner exited {str(code)[:20]}"
        return HealthCheck("verification", False, why)
    try:
        stats = numerics_text(numerics if isinstance(numerics, str) else "", "the verification run's numerics")
    except AnalysisError as exc:
        return HealthCheck("verification", False, first_line(exc)[:200])
    compared = [t.reference for t in stats.tensors if t.reference is not None and not (t.nan or t.inf)]
    if not compared or len(compared) != len(stats.tensors):
        return HealthCheck("verification", False, "an output was not compared with the reference (NaN or missing)")
    worst = min(sqnr_db(r.sum_squares, r.noise) for r in compared)
    if worst < MIN_SQNR_DB:
        return HealthCheck("verification", False, f"outputs differ from eager PyTorch's: {worst:.1f} dB SQNR")
    return HealthCheck("verification", True, f"outputs match eager PyTorch's ({worst:.0f} dB)")


def _throttling(throttled: Any) -> HealthCheck:
    if throttled is None:
        return HealthCheck("throttling", True, "not measured on this board (no vcgencmd)")
    value = throttled.get("value") if isinstance(throttled, dict) else None
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < 1 << 32:
        return HealthCheck("throttling", False, f"the board answered {str(throttled)[:60]!r}")
    now_set = [label for bit, label in THROTTLED_NOW_BITS.items() if value >> bit & 1]
    if now_set:
        return HealthCheck("throttling", False, f"{', '.join(now_set)} now (get_throttled {value:#x})")
    return HealthCheck("throttling", True, f"not throttled now (get_throttled {value:#x})")


def _governor(governors: Any, wanted: str | None) -> HealthCheck:
    if not isinstance(governors, list) or not all(isinstance(g, str | None) for g in governors):
        return HealthCheck("governor", False, f"the board answered {str(governors)[:60]!r}")
    found = sorted({g for g in governors if g})
    if wanted is None:
        return HealthCheck("governor", True, f"{', '.join(found) or 'no cpufreq'} (none configured)")
    if not found:
        return HealthCheck("governor", True, f"no cpufreq on this board ({wanted} configured)")
    wrong = [g for g in found if g != wanted]
    if wrong:
        return HealthCheck("governor", False, f"{', '.join(wrong)[:60]}, configured {wanted}")
    return HealthCheck("governor", True, wanted)
