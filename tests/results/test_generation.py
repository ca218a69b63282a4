"""timings.json's `generation` record (orchestrator/results/generation.py): checked before anything is counted from it
(it comes from a board), split into phases, summarised; and the generated ids against eager greedy generation."""

from __future__ import annotations

import copy
from typing import Any

import numpy as np
import pytest

from orchestrator.errors import AnalysisError
from orchestrator.records import from_data, to_data
from orchestrator.results.etdump import RunBlock
from orchestrator.results.generation import (
    DECODE,
    PREFILL,
    GenerationTimings,
    generation_summary,
    token_check,
)
from orchestrator.results.summary import Generation
from orchestrator.results.trace import generation_steps


def record(generations: list[tuple[bool, float, list[float], list[int]]], **changes: Any) -> dict[str, Any]:
    executions = [phase for _, _, decode, _ in generations for phase in (PREFILL, *[DECODE] * len(decode))]
    data = {
        "prompt_len": 4, "new_tokens": 3, "context": 16, "max_prompt_len": 15, "executions": executions,
        "runs": [{"warmup": w, "prefill_ms": p, "decode_ms": d, "token_ids": t} for w, p, d, t in generations],
    }  # fmt: skip
    return {"generation": {**data, **changes}, "load_ms": 5.0, "method_init_ms": 2.0}


RUNS = [(True, 9.0, [1.0, 1.0], [5, 6, 7]), (False, 8.0, [2.0, 2.0], [5, 6, 7]), (False, 6.0, [1.0, 3.0], [5, 6, 7])]


def test_a_record_splits_into_timed_phases_and_summarises() -> None:
    timings = record(RUNS)
    parsed = GenerationTimings.from_timings(timings)
    assert parsed is not None and len(parsed.timed) == 2
    assert parsed.phase_times(PREFILL) == [8.0, 6.0]
    assert parsed.phase_times(DECODE) == [2.0, 2.0, 1.0, 3.0]
    blocks = [RunBlock(name="Execute", **_empty_block()) for _ in parsed.executions]
    split = parsed.phase_blocks(blocks)
    assert [len(split[PREFILL]), len(split[DECODE])] == [2, 4]
    assert split[PREFILL][0] is blocks[3]  # the warmup generation's three executions are left out
    assert parsed.phase_blocks(blocks[:-1]) == {PREFILL: [], DECODE: []}  # not lined up: no phase is guessed
    summary = generation_summary(parsed, timings, recorded=None, tokens=None)
    assert summary.ttft_ms == 7.0  # the median of 8 and 6
    assert summary.decode_tokens_per_s == pytest.approx(500.0)  # 2 steps in 4 ms, both generations
    # llama-bench's "± sd": over the generations' own speeds (prefill 4 tokens in 8 and 6 ms; decode 500 both times)
    assert summary.prefill_tokens_per_s_sd == pytest.approx(float(np.std([500.0, 4000 / 6], ddof=1)))
    assert summary.decode_tokens_per_s_sd == 0.0
    assert summary.token_ms == {"median": 2.0, "p90": pytest.approx(2.7), "max": 3.0}
    assert summary.load_ms == 7.0
    assert from_data(to_data(summary), Generation, where="summary.json") == summary


def _empty_block() -> dict[str, Any]:
    empty = np.zeros(0, dtype=np.int64)
    return {"event_names": [], "delegate_names": [], "chain": empty, "instruction": empty, "start": empty,
            "end": empty}  # fmt: skip


BAD = [
    ({"executions": "prefill"}, "generation.executions must be a list"),
    ({"executions": ["prefill", "warp", "decode"] * 3}, "a list of prefill and decode"),
    ({"prompt_len": 0}, "generation.prompt_len must be an integer >= 1"),
    ({"prompt_len": True}, "generation.prompt_len must be an integer >= 1"),
    ({"runs": {"a": 1}}, "generation.runs must be a list"),
    ({"executions": ["prefill"]}, "does not follow its runs"),
]


@pytest.mark.parametrize(("change", "words"), BAD)
def test_a_malformed_record_is_an_analysis_error_naming_the_field(change: dict[str, Any], words: str) -> None:
    with pytest.raises(AnalysisError, match=words):
        GenerationTimings.from_timings(record(RUNS, **change))


@pytest.mark.parametrize(
    ("field", "value", "words"),
    [
        ("token_ids", [5, -1, 7], "token_ids must be a list of token ids"),
        ("decode_ms", [1.0, float("nan")], "decode_ms must be a list of numbers"),
        ("prefill_ms", "fast", "prefill_ms must be a number"),
        ("token_ids", [5, 6], "2 token ids for 2 decode steps"),
    ],
)
def test_a_malformed_run_is_refused(field: str, value: Any, words: str) -> None:
    timings = record(RUNS)
    broken = copy.deepcopy(timings)
    broken["generation"]["runs"][1][field] = value
    with pytest.raises(AnalysisError, match=words):
        GenerationTimings.from_timings(broken)


def test_a_prompt_prefilled_in_chunks_is_one_prefill_of_several_executions() -> None:
    """A prompt longer than one call takes: each chunk an execution (and an ETDump block) of the prefill phase, the
    time to first token their sum."""
    timings = record(RUNS)
    for run, chunks in zip(timings["generation"]["runs"], ([4.0, 5.0], [3.0, 5.0], [6.0]), strict=True):
        run["prefill_chunk_ms"] = chunks
    timings["generation"]["executions"] = [
        phase for run in timings["generation"]["runs"]
        for phase in [PREFILL] * len(run["prefill_chunk_ms"]) + [DECODE] * len(run["decode_ms"])
    ]  # fmt: skip
    parsed = GenerationTimings.from_timings(timings)
    assert parsed is not None and parsed.phase_times(PREFILL) == [3.0, 5.0, 6.0]  # the timed chunks, in order
    blocks = [RunBlock(name="Execute", **_empty_block()) for _ in parsed.executions]
    split = parsed.phase_blocks(blocks)
    assert split[PREFILL] == [blocks[4], blocks[5], blocks[8]] and len(split[DECODE]) == 4
    assert generation_summary(parsed, timings, recorded=None, tokens=None).ttft_ms == 7.0  # 8 and 6: the sums
    # the timeline draws every chunk of the prefill nearest the median (8 and 6: the first), then a decode step
    profile: Any = object()  # a step only carries its phase's profile
    steps = generation_steps(split, {PREFILL: profile, DECODE: profile}, parsed.timed)
    assert [step.name for step in steps] == [
        "prefill chunk 1/2 of generation 1 of 2", "prefill chunk 2/2 of generation 1 of 2", "decode step 1 of 4"
    ]  # fmt: skip
    assert [steps[0].block, steps[1].block, steps[2].block] == [blocks[4], blocks[5], blocks[6]]
    for chunks, words in (([3.0, 4.0], "not the sum of its prefill_chunk_ms"), ([8.0, -1.0], "numbers >= 0")):
        broken = copy.deepcopy(timings)
        broken["generation"]["runs"][1]["prefill_chunk_ms"] = chunks
        with pytest.raises(AnalysisError, match=words):
            GenerationTimings.from_timings(broken)
    unlisted = copy.deepcopy(timings)
    unlisted["generation"]["executions"] = record(RUNS)["generation"]["executions"]  # one prefill each
    with pytest.raises(AnalysisError, match="does not follow its runs"):
        GenerationTimings.from_timings(unlisted)


def test_a_run_without_generation_has_no_record() -> None:
    assert GenerationTimings.from_timings({"iterations_ms": [1.0]}) is None


def test_token_check_finds_the_first_divergence() -> None:
    same = token_check(np.array([[1, 2, 3, 4]]), np.array([[1, 2, 3, 4]]))
    assert (same.agreement, same.first_divergence) == (1.0, None)
    parted = token_check(np.array([[1, 2, 9, 4]]), np.array([[1, 2, 3, 4]]))
    assert (parted.matching, parted.first_divergence) == (3, 2)
    shorter = token_check(np.array([[1, 2]]), np.array([[1, 2, 3, 4]]))
    assert (shorter.compared, shorter.reference_tokens, shorter.first_divergence) == (2, 4, None)


def test_the_ids_in_a_few_words_for_reports_and_pages() -> None:
    timings = record(RUNS)
    parsed = GenerationTimings.from_timings(timings)
    assert parsed is not None

    def said(check: Any) -> tuple[float | None, str]:
        generation = from_data(
            to_data(generation_summary(parsed, timings, recorded=None, tokens=check)), Generation, where="summary.json"
        )
        assert generation is not None
        return generation.token_agreement, generation.ids_text

    assert said(token_check(np.array([1, 2, 3, 4]), np.array([1, 2, 3, 4]))) == (1.0, "= eager (4)")
    assert said(token_check(np.array([1, 2, 9, 4]), np.array([1, 2, 3, 4]))) == (0.75, "75%, parts at 2")
    assert said(None) == (None, "not checked")
