"""One language model at several KV cache sizes (`--context 128,512,1024`): how prefill time, decode speed and
memory grow with the context, as rows and one picture.

Each context is its own program (`smollm2-135m-gen.ctx512`), so the rows come from the runs' summaries: whatever
the board measured, nothing recomputed here.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from orchestrator.results.summary import RunSummary

PLOT_DIR = "context-scaling"  # under results/, beside the boards' folders


@dataclass(frozen=True)
class ContextRow:
    board: str
    model: str  # the program's name (`<model>.ctx<C>`)
    backend: str
    context: int
    ttft_ms: float | None
    prefill_tokens_per_s: float | None
    decode_tokens_per_s: float | None
    token_median_ms: float | None
    decode_peak_bytes: int | None
    kv_cache_bytes: int | None


def context_rows(runs: Sequence[tuple[str, str, str, RunSummary]]) -> list[ContextRow]:
    """(board, program, backend, summary) of text-generation runs → one row each, by board, backend, context."""
    rows = []
    for board, model, backend, summary in runs:
        generation = summary.generation
        if generation is None or generation.context is None:
            continue
        rows.append(
            ContextRow(
                board,
                model,
                backend,
                generation.context,
                generation.ttft_ms,
                generation.prefill_tokens_per_s,
                generation.decode_tokens_per_s,
                generation.token_ms.get("median"),
                generation.memory.get("decode"),
                generation.kv_cache_bytes,
            )
        )
    return sorted(rows, key=lambda row: (row.board, row.backend, row.context))


def write_plot(rows: Sequence[ContextRow], results_root: Path, model: str) -> Path | None:
    """Time to first token, decode speed and memory against the context, one line per board and backend: a PNG
    under results/context-scaling/. None when fewer than two contexts were measured."""
    if len({row.context for row in rows}) < 2:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(13, 3.6), dpi=110)
    panels = (
        ("time to first token (ms)", lambda r: r.ttft_ms),
        ("decode tokens / s", lambda r: r.decode_tokens_per_s),
        ("MB: peak while decoding (solid), KV cache (dashed)", lambda r: _mb(r.decode_peak_bytes)),
    )
    lines = sorted({(row.board, row.backend) for row in rows})
    for ax, (title, value) in zip(axes, panels, strict=True):
        for board, backend in lines:
            mine = [row for row in rows if (row.board, row.backend) == (board, backend)]
            points = [(row.context, value(row)) for row in mine if value(row) is not None]
            if points:
                ax.plot(*zip(*points, strict=True), marker="o", label=f"{board} / {backend}")
            if value is panels[2][1]:
                cache = [(row.context, _mb(row.kv_cache_bytes)) for row in mine if row.kv_cache_bytes]
                if cache:
                    ax.plot(*zip(*cache, strict=True), marker=".", linestyle="--", color="grey")
        ax.set_xscale("log", base=2)
        ax.set_xticks(sorted({row.context for row in rows}), [str(c) for c in sorted({row.context for row in rows})])
        ax.set_xlabel("context (KV cache positions)")
        ax.set_title(title, fontsize=10)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.suptitle(f"{model}: against the context", fontsize=11)
    fig.tight_layout()
    stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    path = results_root / PLOT_DIR / f"{model}-{stamp}.png"
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return path


def _mb(value: int | None) -> float | None:
    return None if value is None else value / 1e6
