"""A language model in the nightly matrix, on the local board (tests/plugins/generation.py runs two real nights of
smollm2-gen-tiny): each night's cell is recorded with its generation figures, read back typed, and both reports show
time to first token and decode speed. The history's migration of an older database: test_history.py."""

from __future__ import annotations

import html.parser
from pathlib import Path

from orchestrator.results.documents import load_summary
from orchestrator.results.summary import Generation
from tests.plugins.generation import GENERATION_MODEL, GENERATION_NIGHTS, GenerationNights


class TableText(html.parser.HTMLParser):
    """The cells' text of the table with `table_id`, row by row."""

    def __init__(self, table_id: str) -> None:
        super().__init__()
        self.table_id, self.inside = table_id, False
        self.rows: list[list[str]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "table":
            self.inside = dict(attrs).get("id") == self.table_id
        elif self.inside and tag == "tr":
            self.rows.append([])
        elif self.inside and tag in ("td", "th"):
            self.rows[-1].append("")

    def handle_endtag(self, tag: str) -> None:
        if tag == "table":
            self.inside = False

    def handle_data(self, data: str) -> None:
        if self.inside and self.rows and self.rows[-1]:
            self.rows[-1][-1] += data


def test_a_language_model_cell_is_recorded_with_its_generation_figures(generation_nights: GenerationNights) -> None:
    for night, proc in generation_nights.outputs.items():
        assert proc.returncode == 0, f"{night}: {proc.stdout}{proc.stderr}"
    records = generation_nights.records()
    assert sorted(r.night for r in records) == list(GENERATION_NIGHTS)
    for record in records:
        assert (record.model, record.status) == (GENERATION_MODEL, "ok"), record.error
        assert record.bundle_path and record.generation is not None
        # What the history gives back is what the run's own summary.json says, typed the same way.
        summary = load_summary(Path(record.bundle_path))
        assert isinstance(record.generation, Generation) and record.generation == summary.generation
        generation = record.generation
        assert (generation.prompt_len, generation.new_tokens, generation.context) == (8, 8, 64)
        assert generation.ttft_ms and generation.ttft_ms > 0
        assert generation.decode_tokens_per_s and generation.decode_tokens_per_s > 0
        assert generation.token_ms["median"] and generation.kv_cache_bytes
        assert generation.memory["decode"] and generation.memory["prefill"]
        assert generation.token_agreement == 1.0 and generation.ids_text == "= eager (8)"


def test_both_reports_show_time_to_first_token_and_decode_speed(generation_nights: GenerationNights) -> None:
    night = GENERATION_NIGHTS[-1]
    (record,) = [r for r in generation_nights.records() if r.night == night]
    generation = record.generation
    assert generation is not None and generation.ttft_ms and generation.decode_tokens_per_s
    ttft, decode = f"{generation.ttft_ms:,.2f}", f"{generation.decode_tokens_per_s:,.2f}"

    markdown = (generation_nights.reports / f"nightly-{night}.md").read_text()
    assert "## Generation" in markdown and "| TTFT ms |" in markdown and "| decode tok/s |" in markdown
    (row,) = [
        line for line in markdown.splitlines() if line.startswith(f"| local | {GENERATION_MODEL} | xnnpack | 8+8/64")
    ]
    assert f"| {ttft} |" in row and f"| {decode} |" in row and "= eager (8)" in row

    table = TableText("generation")
    table.feed((generation_nights.reports / f"nightly-{night}.html").read_text())
    header, *cells = [[text.strip() for text in row] for row in table.rows]
    assert len(cells) == 1, table.rows
    shown = dict(zip(header, cells[0], strict=True))
    assert (shown["model"], shown["TTFT ms"], shown["decode tok/s"]) == (GENERATION_MODEL, ttft, decode)
    assert shown["ids vs eager"] == "= eager (8)"
    assert shown["token ms (median)"] == f"{generation.token_ms['median']:,.2f}"

    # The terminal's night table is followed by the same figures.
    said = generation_nights.outputs[night].stdout
    assert "Generation" in said and "TTFT ms" in said and "decode tok/s" in said
    (line,) = [line for line in said.splitlines() if GENERATION_MODEL in line and "8+8/64" in line]
    assert ttft in line and decode in line and "= eager (8)" in line
