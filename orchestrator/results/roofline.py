"""How close a run came to its board's limits: an LLM's decode against the memory roofline, its prefill against
both.

A decode step reads every weight once and the KV cache filled so far, so tokens/s x bytes per token cannot exceed
the board's read bandwidth (setup-board's probe, boards/limits.py, as the bundle's `board_info_before.json` records
it). The share of that roofline is what the decode achieved:

- weights: the program's stored bytes (constants and delegate data), each tensor once (a tied embedding held both
  outside the delegates for the gather and inside for the head is read once a token, by the head), and of a table
  only an embedding gather reads (an untied or quantized embedding whose head holds its own copy), the one row a
  token reads. llama.cpp's model size counts its tied table once too: it is read whole by the head.
- KV cache: etlab's attention reads the filled rows only, P + i at step i (their mean over the run's steps); sdpa
  attention reads (and copies) the whole cache every step.

A step whose bytes fit the board's last-level cache is not bound by memory (a tiny model: its share can pass
100%): it is marked so.

The prefill does the prompt's work in a few calls (chunks of the program's `max_prompt_len`): every Fully Connected
and batch matmul inside the XNNPACK delegates at the rows each call takes (results/op_roofline.py's counts). The least
time the board allows is the larger of those operations at its peak rates (int8 for 8- and 4-bit weights, fp32
otherwise) and their bytes at its bandwidth; the share is that over TTFT. Work outside XNNPACK (the attention
kernel, the embedding gather) is not counted: at a prompt of 64 it is about 1% of the operations; its time is in
TTFT, and `kernels_ms` (the nodes' own time in the prefill's profile) tells the two apart.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from orchestrator.boards.limits import recorded_bandwidth
from orchestrator.errors import AnalysisError
from orchestrator.lowering.attention.choice import SDPA
from orchestrator.lowering.sidecar import Sidecar
from orchestrator.programs.outside import GatheredTable, gathered_tables
from orchestrator.programs.plan import read_program_plan
from orchestrator.programs.xnn import XNNPACK_BACKEND, read_xnn_graph
from orchestrator.records import RecordError
from orchestrator.results.op_roofline import (
    ROOFLINE_TYPES,
    BoardLimits,
    Bound,
    NodeWork,
    SequenceRows,
    bundle_limits,
    node_work,
)
from orchestrator.results.ops_record import KERNEL_CALL
from orchestrator.results.summary import DecodeRoofline, Generation, PrefillRoofline

if TYPE_CHECKING:  # the type only
    from orchestrator.results.profile import DelegateProfile, InstructionProfile, Profile, XnnNodeProfile


def weights_bytes(sidecar: Sidecar, gathered: Sequence[GatheredTable] = ()) -> int:
    """The weights a decode step reads: the program's, each stored tensor once, and of a table only a gather reads
    (`gathered`, programs/outside.py) one row."""
    outside = sidecar.outside_delegates
    twice = outside.stored_twice_bytes if outside is not None else 0
    counted_twice = {(t.shape, t.bytes) for t in outside.stored_twice.tensors} if outside is not None else set()
    rows_only = sum(t.bytes - t.row_bytes for t in gathered if (t.shape, t.bytes) not in counted_twice)
    return sidecar.memory.constants_bytes + sidecar.memory.delegate_data_bytes - twice - rows_only


def program_gathers(pte: Path | None, method: str) -> list[GatheredTable]:
    """The program's gathered tables ([] without a program, or one whose plan cannot be read: counted whole)."""
    if pte is None:
        return []
    try:
        return gathered_tables(pte, method)
    except AnalysisError:
        return []


def kv_bytes_per_step(generation: Generation, kv_cache_bytes: int, context: int, attention: str | None) -> int:
    """The KV cache a decode step reads, on average over the run's N - 1 steps."""
    if attention == SDPA or context <= 0:
        return kv_cache_bytes
    steps = max(generation.new_tokens - 1, 1)
    mean_rows = generation.prompt_len + (steps + 1) / 2  # step i attends over P + i rows, i = 1..N-1
    return round(kv_cache_bytes * min(mean_rows, context) / context)


def decode_roofline(generation: Generation, sidecar: Sidecar | None, board_before: Mapping[str, Any] | None,
                    where: str, gathered: Sequence[GatheredTable] = (),
                    profile: Profile | None = None) -> DecodeRoofline | None:  # fmt: skip
    """The decode's bytes per token and achieved bandwidth, and its share of the board's read bandwidth (None with a
    note when the board has no usable measure). None without the program's memory or a decode rate. With the decode
    step's profile, where that step's time went: its matrix products, its kernels outside the delegates."""
    recorded = sidecar.generation if sidecar is not None else None
    rate = generation.decode_tokens_per_s
    if sidecar is None or recorded is None or not rate:
        return None
    kv = kv_bytes_per_step(generation, recorded.kv_cache_bytes, recorded.context, recorded.attention)
    weights = weights_bytes(sidecar, gathered)
    per_token = weights + kv
    achieved = per_token * rate
    state = (board_before or {}).get("state")
    note = None
    try:
        bandwidth = recorded_bandwidth(state if isinstance(state, dict) else None, where)
    except RecordError as exc:  # untrusted like all the board sent: said, and the run's analysis goes on
        bandwidth, note = None, f"the board's recorded bandwidth is refused ({exc})"
    counts = _step_counts(profile)
    if bandwidth is None and note is None:
        note = "the board's read bandwidth is not measured: fab setup-board measures it"
    return DecodeRoofline(
        weights_bytes=weights,
        kv_bytes_per_token=kv,
        bytes_per_token=per_token,
        achieved_gb_per_s=achieved / 1e9,
        bandwidth_gb_per_s=bandwidth.gb_per_s if bandwidth is not None else None,
        bandwidth_threads=bandwidth.threads if bandwidth is not None else None,
        share=achieved / bandwidth.bytes_per_s if bandwidth is not None else None,
        note=note,
        fits_in_cache=bandwidth is not None and per_token <= bandwidth.llc_bytes,
        kernels_ms=_kernels_ms(profile),
        profiled_step_ms=profile.total.median if profile is not None and profile.total is not None else None,
        outside_ms=_outside_ms(profile),
        kernel_calls=counts.kernel_calls,
        delegate_calls=counts.delegate_calls,
        other_operators=counts.other_operators,
    )


def prompt_calls(prompt_len: int, max_prompt_len: int) -> list[int]:
    """The rows of each prefill call: the prompt in chunks of at most `max_prompt_len`."""
    return [min(max_prompt_len, prompt_len - start) for start in range(0, prompt_len, max(max_prompt_len, 1))]


def prefill_work(pte: Path, method: str, prompt_len: int, max_prompt_len: int) -> list[NodeWork]:
    """Every XNNPACK Fully Connected and batch matmul of `method` at each prefill call's rows."""
    graphs = []
    for instruction in read_program_plan(pte, method).delegates():
        if instruction.delegate is None or instruction.backend != XNNPACK_BACKEND:
            continue
        try:
            graphs.append(read_xnn_graph(instruction.delegate, pte))
        except AnalysisError:
            continue  # as op_roofline: a payload the profile could not place is not counted, never fatal
    works = []
    for rows in prompt_calls(prompt_len, max_prompt_len):
        sequence = SequenceRows(bound=max_prompt_len, taken=rows)
        for graph in graphs:
            found = (node_work(node, graph.values, sequence) for node in graph.nodes if node.type in ROOFLINE_TYPES)
            works += [work for work in found if work is not None]
    return works


def _timed_products(delegates: Sequence[DelegateProfile]) -> list[XnnNodeProfile]:
    """The delegates' timed FC and batch matmul nodes."""
    return [node for delegate in delegates for node in delegate.nodes
            if node.type in ROOFLINE_TYPES and node.dist is not None]  # fmt: skip


def _timed_kernel_calls(profile: Profile) -> list[InstructionProfile]:
    """The profile's timed kernel calls outside its delegates."""
    return [i for i in profile.instructions if i.kind == KERNEL_CALL and i.dist is not None]


def _kernels_ms(profile: Profile | None) -> float | None:
    """A phase profile's median time in its FC and batch matmul nodes, per execution."""
    if profile is None:
        return None
    times = [node.dist.median for node in _timed_products(profile.delegates) if node.dist is not None]
    return sum(times) if times else None


def _outside_ms(profile: Profile | None) -> float | None:
    """A phase profile's median time in the kernels outside its delegates, per execution."""
    if profile is None:
        return None
    times = [i.dist.median for i in _timed_kernel_calls(profile) if i.dist is not None]
    return sum(times) if times else None


class StepCounts(NamedTuple):
    """A phase profile's calls and operators per execution (None without a profile)."""

    kernel_calls: int | None = None  # outside the delegates
    delegate_calls: int | None = None
    other_operators: int | None = None  # the delegates' runtime events besides the matrix products


def _step_counts(profile: Profile | None) -> StepCounts:
    if profile is None:
        return StepCounts()
    calls = [d for d in profile.delegates if d.call is not None]
    events = sum(len(d.event_names) for d in calls)
    return StepCounts(len(_timed_kernel_calls(profile)), len(calls), max(events - len(_timed_products(calls)), 0))


def _least_ms(works: list[NodeWork], limits: BoardLimits) -> tuple[float | None, float | None]:
    """The works' operations at the board's peaks and their bytes at its bandwidth, in ms (None: not measured)."""
    int8_ops = sum(work.ops for work in works if work.kernel == "int8")
    fp32_ops = sum(work.ops for work in works) - int8_ops
    compute_ms = None
    if (limits.fp32_gflops or not fp32_ops) and (limits.int8_gops or not int8_ops):
        rates = ((fp32_ops, limits.fp32_gflops), (int8_ops, limits.int8_gops))
        compute_ms = sum(ops / peak / 1e6 for ops, peak in rates if ops and peak)
    moved = sum(work.bytes for work in works)
    memory_ms = moved / limits.bandwidth_gb_per_s / 1e6 if limits.bandwidth_gb_per_s else None
    return compute_ms, memory_ms


def prefill_roofline(generation: Generation, sidecar: Sidecar | None, pte: Path | None,
                     board_before: Mapping[str, Any] | None, where: str, threads: int | None,
                     method: str = "forward", profile: Profile | None = None) -> PrefillRoofline | None:  # fmt: skip
    """The prefill's work against the limits the bundle recorded; None without the program, its shapes or a TTFT.
    Without the peak there is no share (the bandwidth alone cannot bound a compute-heavy prefill)."""
    recorded = sidecar.generation if sidecar is not None else None
    ttft = generation.ttft_ms
    if recorded is None or pte is None or not ttft:
        return None
    works = prefill_work(pte, method, generation.prompt_len, recorded.max_prompt_len)
    if not works:
        return None
    ops = sum(work.ops for work in works)
    limits, note = bundle_limits(board_before, where, threads)
    compute_ms, memory_ms = _least_ms(works, limits)
    bound: Bound | None = None
    if compute_ms is not None:
        bound = "memory" if memory_ms is not None and memory_ms > compute_ms else "compute"
    least = memory_ms if bound == "memory" else compute_ms
    calls = prompt_calls(generation.prompt_len, recorded.max_prompt_len)
    return PrefillRoofline(
        ops=ops, int8_ops=sum(work.ops for work in works if work.kernel == "int8"),
        bytes=sum(work.bytes for work in works), calls=len(calls),
        achieved_gops=ops / ttft / 1e6, compute_ms=compute_ms, memory_ms=memory_ms, bound=bound,
        share=least / ttft if least is not None else None, kernels_ms=_kernels_ms(profile), note=note,
    )  # fmt: skip
