"""What users see of a language model's run (commands/render_generation.py), on two real nights of smollm2-gen-tiny
(tests/plugins/generation.py): the Generation table at 140 columns cuts nothing, a tiny KV cache has a unit that
shows it, and `--markdown` gives llama-bench's table (`| model | size | params | backend | threads | test | t/s |`)
with the numbers the table shows, then etlab's own. `fab compare --markdown`: test_compare_generation.py."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from orchestrator import console
from orchestrator.commands.render import print_generation
from orchestrator.commands.render_generation import generation_markdown
from orchestrator.results.documents import load_summary
from orchestrator.results.summary import RunSummary
from tests.plugins.generation import GenerationNights

# A program's whole name (its context and attention) and a quantized backend: as long as they come
PROGRAM = "smollm2-gen-tiny.ctx1024.etlab-attention"
BACKEND = "xnnpack-8da4w"


def night_summaries(nights: GenerationNights) -> list[tuple[Path, RunSummary]]:
    runs = sorted(nights.records(), key=lambda r: r.night)
    return [(Path(str(run.bundle_path)), load_summary(Path(str(run.bundle_path)))) for run in runs]


def markdown_tables(text: str) -> list[list[list[str]]]:
    """Each markdown table in `text`: its rows of cells, the header first, the alignment row left out."""
    tables: list[list[list[str]]] = []
    previous = ""
    for line in text.splitlines():
        if line.startswith("|") and line.endswith("|"):
            cells = [cell.strip() for cell in line[1:-1].split("|")]
            if not previous.startswith("|"):
                tables.append([])
            if not all(set(cell) <= set("-:") for cell in cells):
                tables[-1].append(cells)
        previous = line
    return tables


def test_the_generation_table_cuts_nothing_at_140_columns(
    generation_nights: GenerationNights, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(console.out, "width", 140)  # piped output and CI logs
    (_, summary), _ = night_summaries(generation_nights)
    generation = summary.generation
    assert generation is not None and generation.kv_cache_bytes is not None
    print_generation([("local", PROGRAM, BACKEND, summary), ("local", "smollm2-gen-tiny", "xnnpack", summary)])
    out = capsys.readouterr().out
    assert "…" not in out, out  # no name, header or figure ends in an ellipsis
    assert out.count(PROGRAM) == 1 and out.count(BACKEND) == 1, out
    for header in ("board", "model", "backend", "TTFT ms", "decode tok/s", "KV cache"):
        assert header in out, out
    # A tiny model's KV cache (32 kB) in a unit that shows it, not "0.0"/"0.030" MB
    kv_cache = console.format_bytes(generation.kv_cache_bytes)
    assert kv_cache.endswith(" kB") and kv_cache in out, out


def test_byte_amounts_keep_three_significant_digits() -> None:
    shown = [console.format_bytes(n) for n in (0, 999, 32_768, 14_323_712, 999_999_999, 2_500_000_000)]
    assert shown == ["0 B", "999 B", "32.8 kB", "14.3 MB", "1.00 GB", "2.50 GB"]


def test_markdown_is_llama_bench_s_table_with_the_table_s_numbers(
    generation_nights: GenerationNights, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(console.out, "width", 400)
    (bundle, summary), _ = night_summaries(generation_nights)
    generation = summary.generation
    assert generation is not None and generation.decode_tokens_per_s and generation.prefill_tokens_per_s
    text = generation_markdown([("local", "smollm2-gen-tiny", "xnnpack", summary)])
    assert text is not None
    bench, own = markdown_tables(text)
    assert bench[0] == ["model", "size", "params", "backend", "threads", "test", "t/s"]  # llama-bench's, in order
    (prefill, decode) = [dict(zip(bench[0], row, strict=True)) for row in bench[1:]]
    n, steps = generation.prompt_len, generation.new_tokens - 1  # the first token is the prefill's
    assert (prefill["test"], decode["test"]) == (f"pp{n}", f"tg{steps} @ d{n}")
    size, parameters = summary.model.size_bytes, summary.model.parameters
    assert size and parameters and summary.latency.threads
    assert prefill["size"] == f"{size / 1024**2:.2f} MiB" and prefill["params"] == f"{parameters / 1e6:.2f} M"
    assert prefill["threads"] == str(summary.latency.threads) and prefill["backend"] == "xnnpack"
    # t/s: the table's median ± the standard deviation over the timed generations, counted here from timings.json
    timed = [
        run for run in json.loads((bundle / "timings.json").read_text())["generation"]["runs"] if not run["warmup"]
    ]
    decode_rates = [len(run["decode_ms"]) / sum(run["decode_ms"]) * 1000 for run in timed]
    prefill_rates = [n / run["prefill_ms"] * 1000 for run in timed]
    for row, rates, median in ((prefill, prefill_rates, generation.prefill_tokens_per_s),
                               (decode, decode_rates, generation.decode_tokens_per_s)):  # fmt: skip
        value, spread = row["t/s"].split(" ± ")
        assert value == f"{median:.2f}" and float(spread) == pytest.approx(np.std(rates, ddof=1), abs=0.006)
    # The same decode speed as the Generation table's
    print_generation([("local", "smollm2-gen-tiny", "xnnpack", summary)])
    assert f"{generation.decode_tokens_per_s:,.1f}" in capsys.readouterr().out
    # etlab's own figures beside: TTFT, the decode step's distribution, memory, KV cache, the ids against eager
    assert own[0][:2] == ["model", "backend"] and len(own) == 2
    mine = dict(zip(own[0], own[1], strict=True))
    assert float(mine["TTFT ms"]) == pytest.approx(generation.ttft_ms, abs=5e-4)
    assert mine["step ms p50/p90/max"] == "/".join(f"{generation.token_ms[k]:.2f}" for k in ("median", "p90", "max"))
    peaks = [generation.memory[phase] or 0 for phase in ("prefill", "decode")]
    assert mine["peak MB prefill/decode"] == "/".join(f"{peak / 1e6:.1f}" for peak in peaks) and all(peaks)
    assert mine["KV cache"].endswith(" kB") and mine["ids vs eager greedy"] == generation.ids_text == "= eager (8)"
