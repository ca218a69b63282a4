"""The interleaved A/B re-test: is program B really slower (or faster) than program A on this board?

A and B run alternately on the same board, in rounds (A B, B A, A B, ...: a steady drift of the board within a
round falls on each side equally often), each run a few timed iterations with the same inputs, threads and
warmup. Both programs are measured in the same minutes, so whatever the board does (a background job, thermal
drift) falls on both; the samples of A are then compared with those of B.

Each run lasts about `DEFAULT_RUN_SECONDS` of timed iterations (sized by a short probe run of A): under
contention a short run lands wholly in one scheduling regime (on this machine, under a CPU hog, a 5-iteration run
took either about 14 ms or 29 ms per iteration, at random), so a run of a second or more is needed to average the
board's states out. The run, not the iteration, is the unit of independence.

The board lock is taken per run (each run is one agent `profile`, which holds the lock while it runs); between
runs another job may take the board, which costs time but never mixes measurements. The re-test is bounded by a
time budget: it stops after the round that spends it (at least `MIN_ROUNDS` rounds, unless a run fails).

A shift is confirmed only when all of these agree:
1. the pooled samples differ (stats.compare_samples: Mann-Whitney U, bootstrap CI of the median ratio, the
   minimum effect) in the suspected direction;
2. the paired per-round ratio median(B_r) / median(A_r), whose median is beyond the minimum effect the same way;
3. at least `AGREEMENT` of the rounds point the same way, and so many that chance is ruled out: a one-sided sign
   test over the rounds at `SIGN_ALPHA` (5 of 5 rounds, 7 of 8; fewer than `MIN_ROUNDS` rounds never confirm).
"""

from __future__ import annotations

import math
import posixpath
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from orchestrator import strictjson
from orchestrator.deploy.agent_client import BoardAgent, GenerateArgs
from orchestrator.deploy.runs import RunParams
from orchestrator.errors import BoardDataError, BoardError
from orchestrator.records import Count, Duration
from orchestrator.results.stats import DEFAULT_MIN_EFFECT, compare_samples
from orchestrator.results.store import new_run_id
from orchestrator.results.validity import number_list
from orchestrator.transport import BoardConnection
from orchestrator.transport.pull import pull_bundle
from orchestrator.transport.transfer import push_file

MIN_ROUNDS = 5  # the fewest rounds whose unanimous agreement passes the sign test (1/32 < SIGN_ALPHA)
DEFAULT_ROUNDS = 8
DEFAULT_RETEST_SECONDS = 180.0
DEFAULT_RUN_SECONDS = 1.0  # timed work per run: long enough to average a busy board's scheduling states
AGREEMENT = 0.75
SIGN_ALPHA = 0.05
PROBE_ITERATIONS = 5
MIN_ITERATIONS_PER_RUN, MAX_ITERATIONS_PER_RUN = 5, 200
MAX_SAMPLES_PER_RUN = 1000  # a board's timings.json is untrusted: never take more than this


@dataclass(frozen=True)
class ABProgram:
    """One side of the A/B: a .pte on the workstation, known by its sha256."""

    label: str
    pte: Path
    sha256: str
    generate: GenerateArgs | None = None  # a text-generation program: each run is its generate loop (runs.py)
    outputs_to: Path | None = None  # pull its first run's bundle here (its outputs, for the accuracy of the side)


@dataclass
class Interleaved:
    """The samples and the decision of one interleaved A/B re-test."""

    rounds: int = 0
    iterations_per_run: int = 0
    seconds: float = 0.0
    budget_seconds: float | None = None  # None: unbounded
    a_ms: list[float] = field(default_factory=list)
    b_ms: list[float] = field(default_factory=list)
    round_ratios: list[float] = field(default_factory=list)
    change: str = "no change"  # slower | faster | no change | insufficient data
    confirmed: bool = False
    reason: str = ""
    error: str | None = None

    @property
    def median_a_ms(self) -> float | None:
        return float(np.median(self.a_ms)) if self.a_ms else None

    @property
    def median_b_ms(self) -> float | None:
        return float(np.median(self.b_ms)) if self.b_ms else None

    @property
    def timing(self) -> str:
        """ "4 rounds in 12 s (budget 180 s)": what the re-test cost, for reports."""
        budget = f" (budget {self.budget_seconds:g} s)" if self.budget_seconds is not None else ""
        return f"{self.rounds} rounds of {self.iterations_per_run} iterations in {self.seconds:.0f} s{budget}"

    @property
    def ratio(self) -> float | None:
        a, b = self.median_a_ms, self.median_b_ms
        return b / a if a and b is not None else None

    @property
    def outcome(self) -> Retest:
        """What a report keeps of the re-test (`to_data` writes it): its figures, not its samples."""
        return Retest(
            rounds=self.rounds,
            iterations_per_run=self.iterations_per_run,
            seconds=round(self.seconds, 3),
            budget_seconds=self.budget_seconds,
            median_a_ms=self.median_a_ms,
            median_b_ms=self.median_b_ms,
            ratio=self.ratio,
            round_ratios=tuple(self.round_ratios),
            change=self.change,
            confirmed=self.confirmed,
            reason=self.reason,
            error=self.error,
        )


@dataclass(frozen=True)
class Retest:
    """An interleaved re-test's outcome as reports and the history keep it (a verdict's `retest`, trial.json)."""

    rounds: Count
    iterations_per_run: Count
    seconds: Duration
    budget_seconds: Duration | None
    median_a_ms: Duration | None
    median_b_ms: Duration | None
    ratio: Duration | None
    round_ratios: tuple[Duration, ...]
    change: str  # slower | faster | no change | insufficient data
    confirmed: bool
    reason: str
    error: str | None


def decide(
    a_ms: list[float], b_ms: list[float], round_ratios: list[float], *, min_effect: float, expect: str | None = None
) -> tuple[str, bool, str]:
    """(change, confirmed, reason) from interleaved samples. `expect` ("slower"/"faster") is the suspected way."""
    pooled = compare_samples(a_ms, b_ms, min_effect=min_effect)
    if len(round_ratios) < MIN_ROUNDS:
        return pooled.change, False, f"only {len(round_ratios)} round(s), {MIN_ROUNDS} needed"
    paired = float(np.median(round_ratios))
    # The way the rounds must agree on: the pooled change's, else the suspected one, else the paired ratio's.
    direction = pooled.change if pooled.is_change else expect or ("slower" if paired > 1.0 else "faster")
    way = 1.0 if direction == "slower" else -1.0
    agree = sum((ratio - 1.0) * way > 0 for ratio in round_ratios)
    agreeing = agree / len(round_ratios)
    chance = sign_test(agree, len(round_ratios))
    figures = (
        f"paired ratio {paired:.3f} over {len(round_ratios)} rounds, {agreeing:.0%} of rounds {direction} "
        f"(sign test p={chance:.2g})"
    )
    if not pooled.is_change:
        return pooled.change, False, f"interleaved: {pooled.reason}; {figures}"
    if expect and pooled.change != expect:
        return pooled.change, False, f"interleaved: {pooled.reason}, not {expect}; {figures}"
    if (paired - 1.0) * way < min_effect:
        return pooled.change, False, f"interleaved: {pooled.reason}, but the {figures}"
    if agreeing < AGREEMENT or chance > SIGN_ALPHA:
        return pooled.change, False, f"interleaved: {pooled.reason}, but only {figures}"
    return pooled.change, True, f"interleaved: {pooled.reason}; {figures}"


def sign_test(agree: int, rounds: int) -> float:
    """One-sided sign test: the chance that `agree` or more of `rounds` fair coin flips land the same way."""
    return sum(math.comb(rounds, k) for k in range(agree, rounds + 1)) / 2**rounds if rounds else 1.0


def iterations_for(probe_ms: float, run_seconds: float) -> int:
    """Timed iterations that fill `run_seconds` at the probe's pace, within the per-run bounds."""
    wanted = math.ceil(run_seconds * 1000.0 / probe_ms) if probe_ms > 0 else MAX_ITERATIONS_PER_RUN
    return max(MIN_ITERATIONS_PER_RUN, min(MAX_ITERATIONS_PER_RUN, wanted))


def _timings(conn: BoardConnection, bundle: str) -> list[float]:
    """The timed iterations of one bundle, read on the board (no pull: only the numbers are needed)."""
    result = conn.run(["cat", posixpath.join(bundle, "timings.json")], timeout=60)
    try:
        document = strictjson.loads(result.stdout, where=f"timings.json in {bundle}")
    except ValueError as exc:
        raise BoardDataError(f"{conn.board.name}: {exc}") from None
    values = document.get("iterations_ms") if isinstance(document, dict) else None
    if not isinstance(values, list):
        raise BoardDataError(f"{conn.board.name}: timings.json in {bundle} has no iterations_ms list")
    return [v for v in number_list(values[:MAX_SAMPLES_PER_RUN]) if v > 0]


def interleave(
    conn: BoardConnection,
    a: ABProgram,
    b: ABProgram,
    inputs: tuple[Path, str],
    params: RunParams,
    *,
    min_effect: float = DEFAULT_MIN_EFFECT,
    expect: str | None = None,
    rounds: int = DEFAULT_ROUNDS,
    budget_seconds: float = DEFAULT_RETEST_SECONDS,
    iterations_per_run: int | None = None,
    run_seconds: float = DEFAULT_RUN_SECONDS,
) -> Interleaved:
    """Run A and B alternately on the board and decide. Board trouble ends the re-test with `error` set.

    Without `iterations_per_run`, each run gets as many iterations as fill `run_seconds` (a probe run of A sizes it).
    """
    started = time.monotonic()
    result = Interleaved(budget_seconds=budget_seconds if np.isfinite(budget_seconds) else None)
    agent = BoardAgent(conn, conn.workdir)
    try:
        remote = {
            side.label: push_file(conn, side.pte, kind="models", suffix=".pte", sha256=side.sha256).remote_path
            for side in (a, b)
        }
        remote_inputs = push_file(conn, inputs[0], kind="inputs", suffix=".etlt", sha256=inputs[1]).remote_path
        per_run = iterations_per_run
        if not per_run:
            probe = _one_run(conn, agent, remote[a.label], remote_inputs, a, params, PROBE_ITERATIONS)
            per_run = iterations_for(float(np.median(probe)), run_seconds)
        result.iterations_per_run = per_run
        for round_index in range(max(rounds, MIN_ROUNDS)):
            medians = {}
            order = ((a, result.a_ms), (b, result.b_ms))
            # A B, then B A: a board that warms up or gets busier during a round would otherwise always slow B.
            for side, into in order if round_index % 2 == 0 else order[::-1]:
                samples = _one_run(conn, agent, remote[side.label], remote_inputs, side, params, per_run)
                into.extend(samples)
                medians[side.label] = float(np.median(samples))
            result.rounds += 1
            result.round_ratios.append(medians[b.label] / medians[a.label])
            if result.rounds >= MIN_ROUNDS and time.monotonic() - started >= budget_seconds:
                break
    except BoardError as exc:
        result.error = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    result.seconds = time.monotonic() - started
    if result.error:
        result.reason = f"the interleaved re-test stopped: {result.error}"
        return result
    result.change, result.confirmed, result.reason = decide(
        result.a_ms, result.b_ms, result.round_ratios, min_effect=min_effect, expect=expect
    )
    return result


def _one_run(
    conn: BoardConnection,
    agent: BoardAgent,
    model: str,
    inputs: str,
    side: ABProgram,
    params: RunParams,
    iterations: int,
) -> list[float]:
    run_id = f"{new_run_id()}-ab"
    bundle = posixpath.join(conn.workdir, "bundles", run_id)  # ours, not the board's word
    try:
        document, _ = agent.profile(
            model=model,
            run_id=run_id,
            inputs=inputs,
            labels={"purpose": "interleaved-retest", "side": side.label, "pte_sha256": side.sha256},
            warmup=params.warmup,
            iterations=iterations,
            threads=params.threads or conn.board.threads,
            max_seconds=params.max_seconds,
            timeout=params.runner_timeout(),
            lock_timeout=params.lock_timeout,
            etdump=False,
            generate=side.generate,
        )
        if document.get("status") != "ok":
            status, error = document.get("status"), document.get("error")
            raise BoardError(f"{conn.board.name}: program {side.label} {status}: {error}")
        samples = _timings(conn, bundle)
        if side.outputs_to is not None and not side.outputs_to.exists():  # the first run's: verified, capped
            pull_bundle(conn, bundle, side.outputs_to)
    finally:
        # Re-test bundles are scratch: they must not push the nightly's own bundles out of `gc --keep`.
        conn.run(["rm", "-rf", "--", bundle], timeout=60, check=False)
    if len(samples) < 2:
        raise BoardError(f"{conn.board.name}: program {side.label} produced {len(samples)} timed iteration(s)")
    return samples
