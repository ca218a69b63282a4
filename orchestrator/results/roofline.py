"""How close a run came to its board's limits: an LLM decode step against the memory roofline.

A decode step reads every weight once and the KV cache filled so far, so tokens/s x bytes per token cannot exceed
the board's read bandwidth (setup-board's probe, boards/limits.py, as the bundle's `board_info_before.json` records
it). The share of that roofline is what the decode achieved:

- weights: the program's stored bytes (constants and delegate data), each tensor once (a tied embedding held both
  outside the delegates for the gather and inside for the head is read once a token, by the head). This is the
  measure llama.cpp's figures use (its model size), so the two compare; an untied embedding table, of which a
  token reads one row, is counted whole (the share is then an upper bound).
- KV cache: etlab's attention reads the filled rows only, P + i at step i (their mean over the run's steps); sdpa
  attention reads (and copies) the whole cache every step.

A step whose bytes fit the board's last-level cache is not bound by memory (a tiny model: its share can pass
100%): it is marked so.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from orchestrator.boards.limits import recorded_bandwidth
from orchestrator.lowering.attention.choice import SDPA
from orchestrator.lowering.sidecar import Sidecar
from orchestrator.records import RecordError
from orchestrator.results.summary import DecodeRoofline, Generation


def weights_bytes(sidecar: Sidecar) -> int:
    """The program's weights, each stored tensor once."""
    twice = sidecar.outside_delegates.stored_twice_bytes if sidecar.outside_delegates is not None else 0
    return sidecar.memory.constants_bytes + sidecar.memory.delegate_data_bytes - twice


def kv_bytes_per_step(generation: Generation, kv_cache_bytes: int, context: int, attention: str | None) -> int:
    """The KV cache a decode step reads, on average over the run's N - 1 steps."""
    if attention == SDPA or context <= 0:
        return kv_cache_bytes
    steps = max(generation.new_tokens - 1, 1)
    mean_rows = generation.prompt_len + (steps + 1) / 2  # step i attends over P + i rows, i = 1..N-1
    return round(kv_cache_bytes * min(mean_rows, context) / context)


def decode_roofline(generation: Generation, sidecar: Sidecar | None, board_before: Mapping[str, Any] | None,
                    where: str) -> DecodeRoofline | None:  # fmt: skip
    """The decode's bytes per token and achieved bandwidth, and its share of the board's read bandwidth (None with a
    note when the board has no usable measure). None without the program's memory or a decode rate."""
    recorded = sidecar.generation if sidecar is not None else None
    rate = generation.decode_tokens_per_s
    if sidecar is None or recorded is None or not rate:
        return None
    kv = kv_bytes_per_step(generation, recorded.kv_cache_bytes, recorded.context, recorded.attention)
    per_token = weights_bytes(sidecar) + kv
    achieved = per_token * rate
    state = (board_before or {}).get("state")
    note = None
    try:
        bandwidth = recorded_bandwidth(state if isinstance(state, dict) else None, where)
    except RecordError as exc:  # untrusted like all the board sent: said, and the run's analysis goes on
        bandwidth, note = None, f"the board's recorded bandwidth is refused ({exc})"
    if bandwidth is None and note is None:
        note = "the board's read bandwidth is not measured: fab setup-board measures it"
    return DecodeRoofline(
        weights_bytes=weights_bytes(sidecar),
        kv_bytes_per_token=kv,
        bytes_per_token=per_token,
        achieved_gb_per_s=achieved / 1e9,
        bandwidth_gb_per_s=bandwidth.gb_per_s if bandwidth is not None else None,
        bandwidth_threads=bandwidth.threads if bandwidth is not None else None,
        share=achieved / bandwidth.bytes_per_s if bandwidth is not None else None,
        note=note,
        fits_in_cache=bandwidth is not None and per_token <= bandwidth.llc_bytes,
    )
