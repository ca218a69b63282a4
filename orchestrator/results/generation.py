"""A text-generation run as it is used: time to first token, decode speed, per-token latency, and the phases.

The runner's `--generate` mode (board/runner/README.md, "Generate mode") records, in timings.json's `generation`,
one entry per `execute()` (`executions`: "prefill" or "decode", warmup included) and per generation its prefill
time (with each chunk's, `prefill_chunk_ms`, when a prompt longer than one call takes is prefilled in chunks: one
"prefill" execution each), its decode steps' times and the ids it produced. ETDump opens one "Execute" block per
`execute()`, so those entries split the blocks into the prefill's and the decode steps' (timed generations only),
each profiled on its own. Everything in timings.json came from a board: it is checked here before anything is
counted from it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from orchestrator.errors import AnalysisError
from orchestrator.lowering.sidecar import Generation as SidecarGeneration
from orchestrator.results.etdump import Etdump, RunBlock
from orchestrator.results.stats import distribution
from orchestrator.results.summary import Generation, Memory, TokenCheck
from orchestrator.results.summary_checks import as_float, as_int  # the same value checks
from orchestrator.results.summary_outputs import Accuracy
from orchestrator.results.validity import weights_meaning

PREFILL = "prefill"
DECODE = "decode"
PHASES = (PREFILL, DECODE)
_MAX_EXECUTIONS = 1_000_000  # far beyond any run's budget: a larger list is not a runner's
_MAX_TOKEN_ID = 2**31


@dataclass(frozen=True)
class GenerationRun:
    """One generation: a prefill (one execute per chunk of the prompt), then N-1 decode steps, N ids."""

    warmup: bool
    prefill_ms: float
    decode_ms: tuple[float, ...]
    token_ids: tuple[int, ...]
    prefill_chunk_ms: tuple[float, ...] = ()  # one per prefill execute; () from a runner before chunks: one

    @property
    def prefill_chunks(self) -> tuple[float, ...]:
        return self.prefill_chunk_ms or (self.prefill_ms,)

    @property
    def executions(self) -> list[str]:
        return [PREFILL] * len(self.prefill_chunks) + [DECODE] * len(self.decode_ms)


def judge_tokens(tokens: TokenCheck | None, scheme: str, thresholds: dict[str, float], weights: str | None) -> Accuracy:
    """A quantized language model's gate: the share of generated ids equal to fp32 eager greedy generation's, against
    `min_top1_agreement`, with where the text first parts (after it, every id continues another text)."""
    meaningful, weights_note = weights_meaning(weights)
    gate = {"min_top1_agreement": thresholds["min_top1_agreement"]}
    if tokens is None or tokens.agreement is None:
        return Accuracy(scheme, "unchecked", meaningful, thresholds=gate, note="no generated ids or reference")
    parted = "never parts" if tokens.first_divergence is None else f"first parts at token {tokens.first_divergence}"
    note = f"{tokens.matching}/{tokens.compared} generated ids equal eager greedy generation's; {parted}"
    if weights_note:
        note += f"; {weights_note}"
    below = tokens.agreement < gate["min_top1_agreement"]
    reasons = (f"token agreement {tokens.agreement:.2f} < {gate['min_top1_agreement']:.2f}",) if below else ()
    return Accuracy(
        scheme, "fail" if below else "pass", meaningful, top1_agreement=tokens.agreement, thresholds=gate,
        reasons=reasons, note=note,
    )  # fmt: skip


@dataclass(frozen=True)
class GenerationTimings:
    """timings.json's `generation`, checked."""

    prompt_len: int
    new_tokens: int
    context: int | None
    max_prompt_len: int | None
    executions: tuple[str, ...]
    runs: tuple[GenerationRun, ...]

    @classmethod
    def from_timings(cls, timings: dict[str, Any]) -> GenerationTimings | None:
        """None for a run that did not generate; AnalysisError naming the field when the record is malformed."""
        data = timings.get("generation") if isinstance(timings, dict) else None
        if data is None:
            return None
        if not isinstance(data, dict):
            raise _bad("generation", "a mapping")
        prompt_len, new_tokens = _count(data, "prompt_len", 1), _count(data, "new_tokens", 1)
        context = None if data.get("context") is None else _count(data, "context", 2)
        max_prompt = None if data.get("max_prompt_len") is None else _count(data, "max_prompt_len", 1)
        executions = data.get("executions")
        if not isinstance(executions, list) or len(executions) > _MAX_EXECUTIONS:
            raise _bad("generation.executions", "a list")
        if any(item not in PHASES for item in executions):
            raise _bad("generation.executions", f"a list of {' and '.join(PHASES)}")
        runs = data.get("runs")
        if not isinstance(runs, list) or len(runs) > _MAX_EXECUTIONS:
            raise _bad("generation.runs", "a list")
        parsed = tuple(_run(item, f"generation.runs[{index}]", new_tokens) for index, item in enumerate(runs))
        expected = [phase for run in parsed for phase in run.executions]
        if executions != expected:
            raise AnalysisError(
                f"timings.json: generation.executions ({len(executions)}) does not follow its runs "
                f"({len(parsed)} generations, {len(expected)} executions)"
            )
        return cls(prompt_len, new_tokens, context, max_prompt, tuple(executions), parsed)

    @property
    def timed(self) -> list[GenerationRun]:
        return [run for run in self.runs if not run.warmup]

    def phase_blocks(self, execute_blocks: list[RunBlock]) -> dict[str, list[RunBlock]]:
        """The timed generations' Execute blocks by phase, in order; empty when the ETDump does not line up."""
        if len(execute_blocks) != len(self.executions):
            return {phase: [] for phase in PHASES}
        return {phase: [execute_blocks[i] for i in self.execution_indices(phase)] for phase in PHASES}

    def execution_indices(self, phase: str) -> list[int]:
        """The timed generations' executions of `phase`, by their index among every execute() call."""
        warmup = [run.warmup for run in self.runs for _ in run.executions]
        return [i for i, (which, early) in enumerate(zip(self.executions, warmup, strict=True))
                if which == phase and not early]  # fmt: skip

    def phase_times(self, phase: str) -> list[float]:
        """The timed executions' times of `phase`, in the order of its blocks."""
        if phase == PREFILL:
            return [ms for run in self.timed for ms in run.prefill_chunks]
        return [ms for run in self.timed for ms in run.decode_ms]

    def last_tokens(self) -> tuple[int, ...]:
        timed = self.timed or list(self.runs)
        return timed[-1].token_ids if timed else ()


def phase_etdump(etdump: Etdump, blocks: list[RunBlock]) -> Etdump:
    """An ETDump of `blocks` only: what profile_etdump reads for one phase."""
    return Etdump(etdump.version, list(blocks))


def token_check(generated: np.ndarray, reference: np.ndarray) -> TokenCheck:
    """Position by position; the first divergence makes every later id a different continuation, so `agreement`
    counts positions, and `first_divergence` says where the text parts."""
    ran, expected = np.asarray(generated).reshape(-1), np.asarray(reference).reshape(-1)
    compared = min(ran.size, expected.size)
    equal = ran[:compared] == expected[:compared]
    first = None if bool(equal.all()) else int(np.argmin(equal))
    matching = int(equal.sum())
    return TokenCheck(compared, matching, matching / compared if compared else None, first, int(expected.size))


def generation_summary(
    record: GenerationTimings,
    timings: dict[str, Any],
    *,
    recorded: SidecarGeneration | None,
    tokens: TokenCheck | None,
    memory: Memory | None = None,
) -> Generation:
    """The figures of the timed generations. `recorded` (the sidecar's, when it is this build's) gives the KV cache's
    bytes, the prompt's source and, with ids equal to eager's, the texts; `memory` (memory.py) each phase's peak."""
    text = None
    if recorded is not None and recorded.reference_text is not None and tokens and tokens.first_divergence is None:
        text = {"prompt": recorded.prompt_text or "", "generated": recorded.reference_text}
    timed = record.timed
    prefill = distribution([run.prefill_ms for run in timed])
    prefill_rates = distribution([record.prompt_len / run.prefill_ms * 1000.0 for run in timed if run.prefill_ms])
    rates = [len(run.decode_ms) / sum(run.decode_ms) * 1000.0 for run in timed if run.decode_ms and sum(run.decode_ms)]
    decode_rates = distribution(rates)
    steps = distribution(record.phase_times(DECODE))
    loads = [timings.get(key) for key in ("load_ms", "method_init_ms")]
    phases = memory.phases if memory is not None else {}
    return Generation(
        prompt_len=record.prompt_len,
        new_tokens=record.new_tokens,
        context=record.context,
        generations=len(timed),
        ttft_ms=prefill.median if prefill else None,
        prefill_tokens_per_s=record.prompt_len / prefill.median * 1000.0 if prefill and prefill.median else None,
        decode_tokens_per_s=float(np.median(rates)) if rates else None,
        token_ms={"median": steps.median, "p90": steps.p90, "max": steps.max} if steps else {},
        load_ms=sum(known) if (known := [v for v in map(as_float, loads) if v is not None]) else None,
        kv_cache_bytes=recorded.kv_cache_bytes if recorded is not None else None,
        memory={
            PREFILL: _peak(phases.get("first_execution")),
            DECODE: _peak(phases.get("decode")),
        },
        tokens=tokens,
        prefill_tokens_per_s_sd=prefill_rates.stdev if prefill_rates else None,
        decode_tokens_per_s_sd=decode_rates.stdev if decode_rates else None,
        prompt_source=recorded.prompt_source if recorded is not None else None,
        text=text,
    )


def _peak(phase: Any) -> int | None:
    if not isinstance(phase, dict):
        return None
    return as_int(phase.get("peak_rss_bytes"))


def _run(data: Any, where: str, new_tokens: int) -> GenerationRun:
    if not isinstance(data, dict):
        raise _bad(where, "a mapping")
    prefill = as_float(data.get("prefill_ms"))
    if prefill is None or prefill < 0:
        raise _bad(f"{where}.prefill_ms", "a number >= 0")
    decode = data.get("decode_ms")
    if not isinstance(decode, list) or any(as_float(v) is None or v < 0 for v in decode):
        raise _bad(f"{where}.decode_ms", "a list of numbers >= 0")
    ids = data.get("token_ids")
    if not isinstance(ids, list) or any(as_int(v) is None or not 0 <= v < _MAX_TOKEN_ID for v in ids):
        raise _bad(f"{where}.token_ids", "a list of token ids")
    if len(ids) != len(decode) + 1 or len(ids) > new_tokens:
        raise AnalysisError(
            f"timings.json: {where}: {len(ids)} token ids for {len(decode)} decode steps (new_tokens {new_tokens})"
        )
    chunks = data.get("prefill_chunk_ms", [])
    if not isinstance(chunks, list) or len(chunks) > _MAX_EXECUTIONS:
        raise _bad(f"{where}.prefill_chunk_ms", "a list of numbers >= 0")
    if any(as_float(v) is None or v < 0 for v in chunks):
        raise _bad(f"{where}.prefill_chunk_ms", "a list of numbers >= 0")
    if chunks and not math.isclose(sum(chunks), prefill, rel_tol=1e-6, abs_tol=1e-3):
        raise AnalysisError(f"timings.json: {where}: prefill_ms {prefill} is not the sum of its prefill_chunk_ms")
    return GenerationRun(
        data.get("warmup") is True, float(prefill), tuple(float(v) for v in decode), tuple(ids),
        tuple(float(v) for v in chunks),
    )  # fmt: skip


def _count(data: dict[str, Any], key: str, minimum: int) -> int:
    value = as_int(data.get(key))
    if value is None or value < minimum:
        raise _bad(f"generation.{key}", f"an integer >= {minimum}")
    return value


def _bad(where: str, wanted: str) -> AnalysisError:
    return AnalysisError(f"timings.json: {where} must be {wanted}")
