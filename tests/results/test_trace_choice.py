"""Which execution analysis/trace.json draws (results/trace.py): a typical one, the measured iteration nearest the
median, not the first (an LLM's first decode step took 4.6 ms against a 0.165 ms median); its name says which and
why; `first` and N draw others, and an N past the last is a usage error. Built on timings alone: no board."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from orchestrator.errors import UsageError
from orchestrator.results.etdump import RunBlock
from orchestrator.results.generation import DECODE, PREFILL, GenerationTimings
from orchestrator.results.trace import generation_steps, iteration_steps
from tests.results.test_generation import record


def blocks(count: int) -> list[RunBlock]:
    empty = np.zeros(0, dtype=np.int64)
    return [RunBlock(name="Execute", event_names=[], delegate_names=[], chain=empty, instruction=empty, start=empty,
                     end=empty) for _ in range(count)]  # fmt: skip


def test_an_ordinary_run_draws_the_iteration_nearest_the_median_unless_told() -> None:
    execute = blocks(7)  # two warm-up executions, then five measured
    profile: Any = SimpleNamespace(executions=5, ns_per_tick=1.0)
    times = [4.6, 3.41, 3.38, 3.40, 3.52]
    (step,) = iteration_steps(execute, profile, times)
    assert step.block is execute[3] and step.sample == 1
    assert step.title == "iteration 2 of 5 (nearest the median, 3.410 ms; median 3.410 ms)"
    (first,) = iteration_steps(execute, profile, times, "first")
    assert first.block is execute[2] and first.title == "iteration 1 of 5 (the first, 4.600 ms; median 3.410 ms)"
    (asked,) = iteration_steps(execute, profile, times, 4)
    assert asked.block is execute[5] and asked.sample == 3 and asked.name == "iteration 4 of 5"
    with pytest.raises(UsageError, match="no iteration 6: the run timed 5"):
        iteration_steps(execute, profile, times, 6)


def test_a_generation_draws_the_prefill_and_the_decode_step_nearest_their_medians() -> None:
    ids = [5, 6, 7, 8]  # four new tokens: a prefill and three decode steps per generation, one warm-up then three
    runs = [(True, 50.0, [9.0, 9.0, 9.0], ids), (False, 30.0, [4.6, 0.17, 0.19], ids),
            (False, 10.0, [0.16, 0.18, 0.175], ids), (False, 12.0, [0.2, 0.165, 0.3], ids)]  # fmt: skip
    parsed = GenerationTimings.from_timings(record(runs, new_tokens=4))
    assert parsed is not None
    split = parsed.phase_blocks(blocks(len(parsed.executions)))
    phases: Any = {PREFILL: object(), DECODE: object()}  # a step only carries its phase's profile
    prefill, step = generation_steps(split, phases, parsed.timed)
    assert prefill.block is split[PREFILL][2] and prefill.name == "prefill of generation 3 of 3"
    assert prefill.why == "nearest the median, 12.00 ms; median 12.00 ms"
    assert step.block is split[DECODE][4] and step.sample == 4  # 0.18 ms: the median of the nine steps
    assert step.title == "decode step 5 of 9 (generation 2's step 2; nearest the median, 0.180 ms; median 0.180 ms)"
    prefill, step = generation_steps(split, phases, parsed.timed, "first")
    assert prefill.block is split[PREFILL][0] and step.block is split[DECODE][0]
    assert step.why == "generation 1's step 1; the first, 4.600 ms; median 0.180 ms"
    prefill, step = generation_steps(split, phases, parsed.timed, 7)  # generation 3's first step, and its prompt
    assert step.block is split[DECODE][6] and prefill.block is split[PREFILL][2]
    assert prefill.why == "the prompt of decode step 7 of 9"
    with pytest.raises(UsageError, match="no decode step 10: the run timed 9"):
        generation_steps(split, phases, parsed.timed, 10)
