"""bench_llm.py's roofline table: how close each engine's decode and prefill come to the machine's own limits.

The limits are measured in the same run, with etlab's own probes (boards/limits.py, deploy/board_limits.py), run
here straight through the runner: the read bandwidth over a buffer 4x the last-level cache (DRAM), the same probe
over each program's working set (the bytes a decode step reads: on a machine whose cache holds the model this is
the level the weights really come from), and XNNPACK's fp32 and int8 GEMM peaks.

- etlab: its decode and prefill against the limits exactly as `fab analyze` puts them (results/roofline.py
  decode_roofline and prefill_roofline, fed the measured limits as a board state): bytes per token = the weights a
  step reads (each stored tensor once; of an embedding table only a gather reads, one row) + the KV cache filled.
- llama.cpp: bytes per token = its model size (llama_model_size: every tensor once, a tied head read whole) plus
  the KV cache filled so far at its cache type (the mean over the steps, as etlab's); its prefill against the same
  least time as etlab's on that scheme (the same products on the same weights, fp32 or int8 kernels alike).
"""

from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from orchestrator import console
from orchestrator.boards.limits import ComputePeak, ReadBandwidth, compute_state_value, read_probe, state_value
from orchestrator.lowering.sidecar import Sidecar
from orchestrator.programs.outside import gathered_tables
from orchestrator.results.roofline import decode_roofline, prefill_roofline
from orchestrator.results.summary import DecodeRoofline, Generation, PrefillRoofline

ITERATIONS, WARMUP = 6, 1  # as setup-board's compute probe: the best of six


@dataclass(frozen=True)
class Limits:
    dram: ReadBandwidth
    peak: ComputePeak

    def board_before(self) -> dict[str, Any]:
        """board_info_before.json as a bundle carries the board's state."""
        return {"schema": 1, "state": {"limits": state_value(self.dram), "compute": compute_state_value(self.peak)}}


def bandwidth(runner: Path, threads: int, buffer_bytes: int | None = None) -> ReadBandwidth:
    command = [str(runner), "--probe-bandwidth", "--threads", str(threads)]
    command += ["--probe-bytes", str(buffer_bytes)] if buffer_bytes else []
    done = subprocess.run(command, capture_output=True, text=True, check=True, timeout=600)
    return read_probe(done.stdout.strip().splitlines()[-1], "local", "0" * 64)


def gemm_rate(runner: Path, program: Path, threads: int, work: Path) -> float:
    """Operations per second of the probe program's best iteration."""
    from orchestrator.deploy.board_limits import GEMM

    timings = work / "probe-timings.json"
    subprocess.run([str(runner), "--model", str(program), "--warmup", str(WARMUP), "--iterations", str(ITERATIONS),
                    "--threads", str(threads), "--timings", str(timings)], check=True, capture_output=True,
                   timeout=600)  # fmt: skip
    m, k, n = GEMM
    return 2.0 * m * k * n / (min(json.loads(timings.read_text())["iterations_ms"]) / 1000.0)


def measure(runner: Path, threads: int, work: Path) -> Limits:
    from orchestrator.deploy.board_limits import GEMM, probe_programs

    programs = probe_programs()
    rates = {kind: gemm_rate(runner, program, threads, work) for kind, program in programs.items()}
    dram = bandwidth(runner, threads)
    peak = ComputePeak(fp32_flops_per_s=rates["fp32"], int8_ops_per_s=rates["int8"], threads=threads, gemm=GEMM,
                       runner_source_sha256="0" * 64, measured_at=dram.measured_at)  # fmt: skip
    return Limits(dram, peak)


def figures(prompt_len: int, new_tokens: int, context: int, ttft_ms: float, decode_tok_s: float) -> Generation:
    return Generation(prompt_len=prompt_len, new_tokens=new_tokens, context=context, generations=1, ttft_ms=ttft_ms,
                      prefill_tokens_per_s=prompt_len / ttft_ms * 1e3, decode_tokens_per_s=decode_tok_s)  # fmt: skip


def etlab_rooflines(generation: Generation, sidecar: Sidecar, pte: Path, limits: Limits,
                    threads: int) -> tuple[DecodeRoofline | None, PrefillRoofline | None]:  # fmt: skip
    board = limits.board_before()
    return (decode_roofline(generation, sidecar, board, "bench", gathered_tables(pte)),
            prefill_roofline(generation, sidecar, pte, board, "bench", threads))  # fmt: skip


def llama_kv_bytes_per_step(config: Any, kv_type: int, prompt_len: int, new_tokens: int) -> int:
    """The KV cache a llama.cpp decode step reads: the filled rows' keys and values of every layer (mean over the
    steps), at its cache type (ggml f32: 4 bytes, f16: 2)."""
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    per_row = config.num_hidden_layers * 2 * config.num_key_value_heads * head_dim * (4 if kv_type == 0 else 2)
    steps = max(new_tokens - 1, 1)
    return round(per_row * (prompt_len + (steps + 1) / 2))


def roofline_rows(rows: list[list[Any]], limits: Limits, at_working_set: dict[int, float]) -> None:
    """The table: each engine's decode GB/s against the DRAM bandwidth and the bandwidth at its working set, and its
    prefill against the least time the limits allow."""
    console.table(
        f"Against the roofline (this run's limits: {limits.dram.gb_per_s:.1f} GB/s DRAM at {limits.dram.threads} "
        f"threads, LLC {limits.dram.llc_bytes / 2**20:.0f} MiB; peaks fp32 {limits.peak.fp32_gflops:.0f} GFLOP/s, "
        f"int8 {limits.peak.int8_gops:.0f} GOP/s)",
        ["scheme", "engine", "MB/token", "decode tok/s", "achieved GB/s", "% of DRAM", "% of DRAM, per round",
         "GB/s at its set",
         "% at its set", "prefill GOP", "TTFT ms", "least ms", "% of prefill roofline"],
        rows,
        caption="bytes/token: the weights each stored tensor once (llama.cpp: its model size) + the KV cache filled; "
        "'per round': the median over the rounds of each round's decode against the higher of the DRAM probes just "
        "before and after it; "
        "'at its set': the probe over a buffer of that many bytes (in cache where it fits); prefill: XNNPACK's "
        "matrix products over the prompt, least ms = max(ops at the peaks, bytes at the DRAM bandwidth), the same "
        f"for both engines of a scheme; sets probed: {', '.join(f'{b / 1e6:.0f} MB' for b in at_working_set)}",
    )  # fmt: skip
