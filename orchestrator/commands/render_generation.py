"""A language model's runs as they are used: the Generation table (time to first token, decode speed, the decode
step's distribution, memory per phase, the ids against eager), and `--markdown`, the same figures to paste into an
issue: first llama-bench's table (`| model | size | params | backend | threads | test | t/s |`, its rows `pp8` for
the prompt and `tg7 @ d8` for the decode steps after it), so they read beside llama.cpp's, then etlab's own."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from orchestrator import console
from orchestrator.results.summary import DecodeRoofline, Generation, PrefillRoofline, RunSummary

# (board, model, backend, the run's summary): one run of a text-generation program
GenerationRun = tuple[str, str, str, RunSummary]

GENERATION_CAPTION = (
    "tokens: prompt + new / KV cache positions; TTFT: the prompt's prefill (median); decode tok/s: the steps after "
    "the first token (median over the generations); step ms: a decode step's p50 / p90 / max; peak MB: RSS while "
    "prefilling / decoding; roofline: the bytes a decode step reads (weights, KV cache filled) x tok/s against the "
    "board's read bandwidth, and the prefill's matrix products against its peak arithmetic rate (setup-board)"
)


@dataclass(frozen=True)
class GenerationFigures:
    """One run's figures as both forms show them: the table and the markdown read these, never the summary."""

    board: str
    model: str
    backend: str
    run_id: str
    tokens: str  # prompt+new/context
    ttft_ms: float | None
    prefill_tokens_per_s: float | None
    prefill_tokens_per_s_sd: float | None
    decode_tokens_per_s: float | None
    decode_tokens_per_s_sd: float | None
    steps_ms: str  # the decode step's median / p90 / max
    peak_mb: str  # peak RSS while prefilling / decoding
    kv_cache: str | None
    ids: str  # the generated ids against eager greedy generation's
    roofline: str  # the decode's share of the board's memory bandwidth
    prefill_roofline: str  # the prefill's share of the board's compute (or memory) roofline
    prompt_len: int
    decode_steps: int  # per generation: the first token comes from the prefill
    generations: int
    size_bytes: int | None
    parameters: int | None
    threads: int | None

    @classmethod
    def of(cls, run: GenerationRun, generation: Generation) -> GenerationFigures:
        board, model, backend, summary = run
        steps, memory = generation.token_ms, generation.memory
        return cls(
            board=board, model=model, backend=backend, run_id=summary.run_id,
            tokens=f"{generation.prompt_len}+{generation.new_tokens}/{generation.context or '?'}",
            ttft_ms=generation.ttft_ms,
            prefill_tokens_per_s=generation.prefill_tokens_per_s,
            prefill_tokens_per_s_sd=generation.prefill_tokens_per_s_sd,
            decode_tokens_per_s=generation.decode_tokens_per_s,
            decode_tokens_per_s_sd=generation.decode_tokens_per_s_sd,
            steps_ms=_in_threes([steps.get(key) for key in ("median", "p90", "max")], "{:.2f}"),
            peak_mb=_in_threes([memory.get(key) for key in ("prefill", "decode")], "{:.1f}", scale=1e-6),
            kv_cache=None if generation.kv_cache_bytes is None else console.format_bytes(generation.kv_cache_bytes),
            ids=generation.ids_text, roofline=generation.roofline.share_text if generation.roofline else "-",
            prefill_roofline=generation.prefill_roofline.share_text if generation.prefill_roofline else "-",
            prompt_len=generation.prompt_len, decode_steps=max(generation.new_tokens - 1, 0),
            generations=generation.generations, size_bytes=summary.model.size_bytes,
            parameters=summary.model.parameters, threads=summary.latency.threads,
        )  # fmt: skip


def decode_text(decode: DecodeRoofline, tokens_per_s: float | None) -> str:
    """One line on a decode step against the board's bandwidth, and where the rest of its time went: "80.4 MB a
    step at 253.3 tok/s: 39% of 52.7 GB/s (1.53 ms a step at the board's bandwidth; in the profiled 4.76 ms step the
    matrix products took 2.58 ms, kernels outside the delegates 0.75 ms in 480 calls, the delegates' other work
    1.43 ms in 183 calls and 915 other operators)": many small costs, or a few large ones."""
    rate = f" at {tokens_per_s:.1f} tok/s" if tokens_per_s else ""
    head = f"{decode.bytes_per_token / 1e6:.1f} MB a step{rate}: {decode.share_text}"
    said = []
    if decode.bandwidth_gb_per_s:
        least_ms = decode.bytes_per_token / decode.bandwidth_gb_per_s / 1e6
        said.append(f"{least_ms:.3g} ms a step at the board's bandwidth")
    step, products, outside = decode.profiled_step_ms, decode.kernels_ms, decode.outside_ms
    if step and products is not None:
        parts = [f"the matrix products took {products:.3g} ms"]
        if outside is not None:
            parts.append(f"kernels outside the delegates {outside:.3g} ms{_in_calls(decode.kernel_calls)}")
            other = f"the delegates' other work {max(step - products - outside, 0.0):.3g} ms"
            parts.append(other + _in_calls(decode.delegate_calls, decode.other_operators))
        said.append(f"in the profiled {step:.3g} ms step " + ", ".join(parts))
    if decode.note:
        said.append(decode.note)
    return head + (f" ({'; '.join(said)})" if said else "")


def _in_calls(calls: int | None, operators: int | None = None) -> str:
    """ " in 480 calls", " in 183 calls and 915 other operators", or "" when not counted."""
    if not calls:
        return ""
    said = f" in {calls} call" + ("s" if calls != 1 else "")
    return said + (f" and {operators} other operators" if operators else "")


def prefill_text(prefill: PrefillRoofline, ttft_ms: float | None) -> str:
    """One line on the prefill against the board's limits, and where the rest of its time went: "13.6 GOP in 1
    call at 170 GOP/s: 41% of the compute roofline (33.1 ms at the peaks; the matrix products took 52.0 ms of the
    80.0 ms TTFT)"."""
    calls = f"{prefill.calls} call" + ("s" if prefill.calls != 1 else "")
    work = f"{prefill.ops / 1e9:.1f} GOP" if prefill.ops >= 1e8 else f"{prefill.ops / 1e6:.2f} MOP"
    head = f"{work} in {calls} at {prefill.achieved_gops:.1f} GOP/s: {prefill.share_text}"
    least = prefill.memory_ms if prefill.bound == "memory" else prefill.compute_ms
    said = []
    if least is not None:
        said.append(f"{least:.3g} ms at the board's {'bandwidth' if prefill.bound == 'memory' else 'peaks'}")
    if prefill.kernels_ms is not None and ttft_ms and prefill.calls == 1:
        said.append(f"the matrix products took {prefill.kernels_ms:.3g} ms of the {ttft_ms:.3g} ms TTFT")
    if prefill.note:
        said.append(prefill.note)
    return head + (f" ({'; '.join(said)})" if said else "")


def generation_figures(runs: Sequence[GenerationRun]) -> list[GenerationFigures]:
    """The runs of text-generation programs among `runs`, each with its figures."""
    return [GenerationFigures.of(run, run[3].generation) for run in runs if run[3].generation is not None]


# Short headers, each word shorter than its column's figures: no header is cut (the caption says the rest)
TABLE_COLUMNS = (
    "board", "model", "backend", "tokens", "TTFT ms", "decode tok/s", "step ms", "peak MB", "KV cache", "ids vs eager",
    "roofline",
)  # fmt: skip


def print_generation(runs: Sequence[GenerationRun]) -> None:
    """A language model as it is used: time to first token, decode speed, per-token latency, memory per phase."""
    figures = generation_figures(runs)
    if not figures:
        return
    rows = [
        [f.board, f.model, f.backend, f.tokens, f.ttft_ms, f.decode_tokens_per_s, f.steps_ms, f.peak_mb, f.kv_cache,
         f.ids, f"decode {f.roofline}; prefill {f.prefill_roofline}"]
        for f in figures
    ]  # fmt: skip
    # The names (a program's says its context and attention) and the single figures are never cut or broken; the
    # headers and the figures in threes wrap at their spaces instead, so the table fits 140 columns and cuts nothing.
    whole = ("model", "backend", "TTFT ms", "decode tok/s", "KV cache")
    console.table("Generation", TABLE_COLUMNS, rows, caption=GENERATION_CAPTION, whole=whole,
                  fold=[column for column in TABLE_COLUMNS if column not in whole])  # fmt: skip
    for board, model, backend, summary in runs:
        text = summary.generation.text if summary.generation else None
        if text:  # the ids equal eager's: this is what the board generated
            console.info(console.escape(f"{board}: {model}/{backend}: {text['prompt']!r} → {text['generated']!r}"))


# llama-bench's markdown columns, each with its width (negative: left-aligned), as its markdown printer pads them
LLAMA_BENCH_COLUMNS = {"model": -30, "size": 10, "params": 10, "backend": -10, "threads": 10, "test": 15, "t/s": 20}
ETLAB_COLUMNS = {
    "model": -30, "backend": -10, "board": -10, "prompt+new/ctx": 14, "TTFT ms": 10, "step ms p50/p90/max": 20,
    "peak MB prefill/decode": 22, "KV cache": 10, "ids vs eager greedy": -20, "decode roofline": -22,
    "prefill roofline": -22,
}  # fmt: skip


def generation_markdown(runs: Sequence[GenerationRun]) -> str | None:
    """The runs' generation figures as markdown to paste into an issue (None: no run generated text): llama-bench's
    table, a prefill row and a decode row per run, then etlab's own figures; the same figures the table shows."""
    figures = generation_figures(runs)
    if not figures:
        return None
    # As llama-bench adds a column for a parameter that varies: the board when there are several, the run when two
    # runs share their board, model and backend (`compare` of two nights)
    extra = {"board": -10} if len({f.board for f in figures}) > 1 else {}
    if len({(f.board, f.model, f.backend) for f in figures}) < len(figures):
        extra["run"] = -24
    columns = dict(LLAMA_BENCH_COLUMNS)
    bench = {**{k: columns.pop(k) for k in ("model", "size", "params", "backend", "threads")}, **extra, **columns}
    rows = []
    for f in figures:
        ident = {"model": f.model, "size": _size(f.size_bytes), "params": _parameters(f.parameters),
                 "backend": f.backend, "threads": _text(f.threads), "board": f.board, "run": f.run_id}  # fmt: skip
        prefill = _rate(f.prefill_tokens_per_s, f.prefill_tokens_per_s_sd)
        rows.append({**ident, "test": f"pp{f.prompt_len}", "t/s": prefill})
        if f.decode_steps:
            rows.append({**ident, "test": f"tg{f.decode_steps} @ d{f.prompt_len}",
                         "t/s": _rate(f.decode_tokens_per_s, f.decode_tokens_per_s_sd)})  # fmt: skip
    own = dict(ETLAB_COLUMNS, **({"run": -24} if "run" in extra else {}))
    mine = [
        {"model": f.model, "backend": f.backend, "board": f.board, "run": f.run_id, "prompt+new/ctx": f.tokens,
         "TTFT ms": _text(f.ttft_ms), "step ms p50/p90/max": f.steps_ms.replace(" ", ""),
         "peak MB prefill/decode": f.peak_mb.replace(" ", ""), "KV cache": _text(f.kv_cache),
         "ids vs eager greedy": f.ids, "decode roofline": f.roofline, "prefill roofline": f.prefill_roofline}
        for f in figures
    ]  # fmt: skip
    counts = sorted({f.generations for f in figures})
    note = (
        f"t/s: the median over {' or '.join(map(str, counts))} timed generations ± their standard deviation; "
        "pp: the prompt's prefill, tg N @ d P: the N decode steps after a prompt of P tokens; size: the .pte"
    )
    return "\n".join([*_markdown_table(bench, rows), "", note, "", *_markdown_table(own, mine)]) + "\n"


def print_generation_markdown(runs: Sequence[GenerationRun]) -> None:
    """`--markdown`: the generation figures as markdown on stdout, unbroken, to paste as they are."""
    text = generation_markdown(runs)
    if text is None:
        console.warn("--markdown: no text-generation run here: the markdown form is a language model's figures")
        return
    console.plain(text, stderr=False)


def _markdown_table(columns: dict[str, int], rows: Sequence[dict[str, str]]) -> list[str]:
    """A table as llama-bench prints one: each column padded to its width (or its widest cell), `---:` under a
    right-aligned one."""
    widths = {
        name: max(abs(width), len(name), *(len(row[name]) for row in rows)) * (1 if width > 0 else -1)
        for name, width in columns.items()
    }
    lines = ["|" + "".join(f" {_pad(name, width)} |" for name, width in widths.items())]
    lines.append("|" + "".join(f" {'-' * (abs(width) - 1)}{':' if width > 0 else '-'} |" for width in widths.values()))
    lines += ["|" + "".join(f" {_pad(row[name], width)} |" for name, width in widths.items()) for row in rows]
    return lines


def _pad(value: str, width: int) -> str:
    cell = value.replace("|", "\\|")
    return cell.rjust(width) if width > 0 else cell.ljust(-width)


def _in_threes(values: Sequence[float | int | None], style: str, scale: float = 1.0) -> str:
    """A few figures of one kind, "0.08 / 0.30 / 0.40"; "-" for one not measured."""
    return " / ".join("-" if value is None else style.format(value * scale) for value in values)


def _rate(value: float | None, spread: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:.2f}" if spread is None else f"{value:.2f} ± {spread:.2f}"


def _size(count: int | None) -> str:
    """llama-bench's: MiB below a GiB, GiB above."""
    if count is None:
        return "-"
    return f"{count / 1024**2:.2f} MiB" if count < 1024**3 else f"{count / 1024**3:.2f} GiB"


def _parameters(count: int | None) -> str:
    """llama-bench's: millions below a billion, billions above."""
    if count is None:
        return "-"
    return f"{count / 1e6:.2f} M" if count < 1e9 else f"{count / 1e9:.2f} B"


def _text(value: object) -> str:
    if value is None:
        return "-"
    return f"{value:.3f}" if isinstance(value, float) else str(value)
