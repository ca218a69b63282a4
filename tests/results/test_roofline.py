"""A decode step against the board's memory roofline (results/roofline.py), on a recorded run of a tiny language
model: the bytes a step reads (weights each stored once, the KV cache each attention reads), the share of the
board's bandwidth as its state recorded it, and a bandwidth that is missing or malformed said, not fatal. End to
end on the local board: tests/e2e/test_generation_e2e.py."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest

from orchestrator.boards.limits import ReadBandwidth, state_value
from orchestrator.commands.render_generation import decode_text
from orchestrator.lowering.sidecar import Attention, Sidecar, sidecar_from_data
from orchestrator.results.roofline import decode_roofline, kv_bytes_per_step, weights_bytes
from orchestrator.results.summary import Generation, read_summary
from tests.advice.advice_helpers import recorded

BANDWIDTH = ReadBandwidth(
    bytes_per_s=10e9, median_bytes_per_s=9e9, threads=2, buffer_bytes=1 << 30, llc_bytes=1 << 20,
    runner_source_sha256="c" * 64, measured_at="2026-12-06T15:00:00+00:00",
)  # fmt: skip


def _run(attention: Attention = "sdpa") -> tuple[Generation, Sidecar]:
    raw = recorded("smollm2-gen-tiny.sdpa")
    sidecar = sidecar_from_data(raw["sidecar"])
    assert sidecar.generation is not None
    sidecar = dataclasses.replace(sidecar, generation=dataclasses.replace(sidecar.generation, attention=attention))
    generation = read_summary(raw["summary"]).generation
    assert generation is not None
    return generation, sidecar


def _board(state: dict[str, Any] | None) -> dict[str, Any]:
    return {"schema": 1, "state": state}


def test_the_weights_are_counted_once_and_the_cache_as_each_attention_reads_it() -> None:
    generation, sidecar = _run("sdpa")
    memory = sidecar.memory
    # the tied embedding (1000 x 64 fp32) sits outside the delegates for the gather and inside for the head: once
    assert weights_bytes(sidecar) == memory.constants_bytes + memory.delegate_data_bytes - 256_000
    # sdpa reads (and copies) the whole cache every step; etlab's attention the rows filled so far: a prompt of 8
    # and 7 decode steps attend over 9..15 rows, 12 on average, of the 64
    assert kv_bytes_per_step(generation, 32768, 64, "sdpa") == 32768
    assert kv_bytes_per_step(generation, 32768, 64, "etlab") == 32768 * 12 // 64


@pytest.mark.parametrize("attention", ["sdpa", "etlab"])
def test_the_decode_s_share_of_the_board_s_bandwidth(attention: Attention) -> None:
    generation, sidecar = _run(attention)
    roofline = decode_roofline(generation, sidecar, _board({"limits": state_value(BANDWIDTH)}), "board_info")
    assert roofline is not None and roofline.note is None
    assert roofline.bytes_per_token == weights_bytes(sidecar) + roofline.kv_bytes_per_token
    rate = generation.decode_tokens_per_s
    assert rate is not None
    assert roofline.achieved_gb_per_s == pytest.approx(roofline.bytes_per_token * rate / 1e9)
    assert roofline.share == pytest.approx(roofline.bytes_per_token * rate / 10e9)
    assert (roofline.bandwidth_gb_per_s, roofline.bandwidth_threads) == (10.0, 2)
    assert roofline.fits_in_cache  # 0.6 MB a step against a 1 MiB last-level cache: memory does not bind it
    assert roofline.share_text == f"{roofline.share:.0%} of 10.0 GB/s (fits in cache)"


@pytest.mark.parametrize(
    ("state", "said"),
    [
        (None, "not measured: fab setup-board measures it"),
        ({"runner_path": "/x"}, "not measured: fab setup-board measures it"),
        ({"limits": "{"}, "refused"),
        ({"limits": state_value(BANDWIDTH).replace("10000000000.0", "5e13")}, "refused"),  # 50 TB/s: absurd
        ({"limits": json.dumps({"bytes_per_s": 1.0})}, "refused"),
    ],
)
def test_a_board_without_a_usable_bandwidth_keeps_the_bytes_and_says_why(state: Any, said: str) -> None:
    generation, sidecar = _run()
    roofline = decode_roofline(generation, sidecar, _board(state), "board_info_before.json")
    assert roofline is not None and roofline.share is None and roofline.bandwidth_gb_per_s is None
    assert roofline.note is not None and said in roofline.note
    assert roofline.bytes_per_token > 0 and roofline.achieved_gb_per_s > 0
    assert "board not measured" in roofline.share_text
    # `fab analyze`'s line says the same: the bytes, what is missing and why; no profile, so no split of the step
    line = decode_text(roofline, generation.decode_tokens_per_s)
    assert line.startswith(f"{roofline.bytes_per_token / 1e6:.1f} MB a step at ") and "board not measured" in line
    assert roofline.note in line and "matrix products" not in line and "at the board's bandwidth" not in line


def test_no_roofline_without_the_program_or_a_decode() -> None:
    generation, sidecar = _run()
    assert decode_roofline(generation, None, None, "x") is None
    assert decode_roofline(dataclasses.replace(generation, decode_tokens_per_s=None), sidecar, None, "x") is None


def test_the_decode_line_splits_the_profiled_step() -> None:
    generation, sidecar = _run("etlab")
    roofline = decode_roofline(generation, sidecar, _board({"limits": state_value(BANDWIDTH)}), "board_info")
    assert roofline is not None
    split = dataclasses.replace(roofline, kernels_ms=2.5, outside_ms=0.5, profiled_step_ms=4.0)
    line = decode_text(split, 250.0)
    assert f"at 250.0 tok/s: {roofline.share_text} (" in line
    assert f"{roofline.bytes_per_token / 10e9 * 1e3:.3g} ms a step at the board's bandwidth" in line
    # the rest of the step is what neither the products nor the kernels outside the delegates took
    assert (
        "in the profiled 4 ms step the matrix products took 2.5 ms, kernels outside the delegates 0.5 ms, "
        "the delegates' other work 1 ms" in line
    )
    # with the step's counts, what the rest is made of: many small calls and operators
    counted = decode_text(dataclasses.replace(split, kernel_calls=480, delegate_calls=183, other_operators=915), None)
    assert (
        "kernels outside the delegates 0.5 ms in 480 calls, "
        "the delegates' other work 1 ms in 183 calls and 915 other operators" in counted
    )
    one = decode_text(dataclasses.replace(split, kernel_calls=1, delegate_calls=1, other_operators=0), None)
    assert "0.5 ms in 1 call, the delegates' other work 1 ms in 1 call)" in one
