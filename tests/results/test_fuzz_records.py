"""Fuzzing the typed readers of an analysis's own files (issue 34.4): summary.json (RunSummary), ops.json (OpsRecord)
and advice.json (Advice), with one value of a real document replaced by anything JSON holds (NaN, ±Infinity,
integers past 2**63, bools, text, lists, mappings, negative numbers). Each reader returns its record or raises
AnalysisError naming the file and the field; whatever it returns, its readers use without crashing: the dashboard's
run page (rendered, its JSON block strict), compare and the advisor end in an EtlabError at worst.

Settings: tests/plugins/fuzz.py. The same values through real processes: test_extreme_values.py.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from orchestrator.advice.advisor import advise
from orchestrator.advice.documents import load_advice, write_advice
from orchestrator.advice.findings import RunFacts
from orchestrator.errors import AnalysisError, EtlabError
from orchestrator.records import to_data
from orchestrator.results.compare import compare_runs
from orchestrator.results.documents import load_summary
from orchestrator.results.ops_record import load_ops
from orchestrator.results.summary import Counters, Generation, TokenCheck, read_summary, summary_data
from orchestrator.results.summary_outputs import Accuracy
from orchestrator.servers.dashboard import data, pages
from orchestrator.servers.dashboard.records import RunPage
from tests.advice.advice_helpers import facts_of, recorded
from tests.plugins.fuzz import FUZZ, FUZZ_TIMEOUT

pytestmark = FUZZ_TIMEOUT
RUN_A, RUN_B = "20261201T000000Z-000aaa", "20261201T000001Z-000bbb"
PAGE_DATA = re.compile(r'<script type="application/json" id="page-data">(.*?)</script>', re.S)
FILES = ("summary.json", "ops.json", "advice.json")


def seeds() -> dict[str, Any]:
    """Real documents: a recorded run's summary (with a generation, an accuracy and a counters section added, as
    their writers make them), its ops.json and the advice the advisor writes for it."""
    raw = recorded("gpt2-tiny")
    summary = read_summary(raw["summary"])
    summary = dataclasses.replace(
        summary,
        generation=Generation(8, 8, 64, 3, 1.5, 5333.3, 120.0, {"median": 8.3, "p90": 9.1, "max": 9.9}, 20.0, 4096,
                              {"prefill": 10_000_000, "decode": 11_000_000}, TokenCheck(8, 6, 0.75, 6, 8),
                              prompt_source="generated", text={"prompt": "a", "generated": "b"}),
        accuracy=Accuracy("int8-dynamic", "pass", True, 0.01, 1.0, 1.0, 35.0, 1.0, {"min_sqnr_db": 10.0}, ("ok",)),
        counters=Counters("ok", None, ("task_clock",), ("task_clock",), ("ipc",), ({"name": "cycles", "error":
                          "ENOENT", "reason": "no PMU"},), 1, "thread", False, "none", 4, {"task_clock": 2.5e6}),
    )  # fmt: skip
    advice = advise(facts_of(raw))
    assert advice.findings, "findings to damage"
    return {"summary.json": summary_data(summary), "ops.json": raw["ops"], "advice.json": to_data(advice)}


SEEDS = seeds()


def places(document: Any, prefix: tuple[str | int, ...] = ()) -> list[tuple[str | int, ...]]:
    """Every place in a document: the document itself, each key and the first two items of each list."""
    found = [prefix]
    if isinstance(document, dict):
        for key, value in document.items():
            found += places(value, (*prefix, key))
    elif isinstance(document, list):
        for index, value in enumerate(document[:2]):
            found += places(value, (*prefix, index))
    return found


PLACES = {name: places(document) for name, document in SEEDS.items()}
HOSTILE = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.sampled_from([math.nan, math.inf, -math.inf, -1.0, -1e-9, 0.0, 1e300]),
    st.floats(),
    st.text(max_size=4),
    st.lists(st.integers(-3, 3) | st.text(max_size=2) | st.none(), max_size=2),
    st.dictionaries(st.text(max_size=3), st.integers(-3, 3) | st.none() | st.booleans(), max_size=2),
)


def replaced(document: Any, place: tuple[str | int, ...], value: Any) -> Any:
    if not place:
        return value
    copy = json.loads(json.dumps(document))
    target = copy
    for part in place[:-1]:
        target = target[part]
    target[place[-1]] = value
    return copy


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """results/ with two analysed runs of one program (A and B, B the one damaged): manifests, no board files."""
    root = tmp_path_factory.mktemp("records") / "results"
    for run_id in (RUN_A, RUN_B):
        run = root / "pi" / "gpt2-tiny" / "xnnpack" / run_id
        (run / "analysis").mkdir(parents=True)
        (run / "result_manifest.json").write_text(json.dumps({"schema": 1, "run_id": run_id, "files": {}}))
        write_analysis(run, SEEDS)
    return root


def write_analysis(run: Path, documents: dict[str, Any]) -> None:
    for name, document in documents.items():
        (run / "analysis" / name).write_text(json.dumps(document))  # NaN and Infinity as Python writes them


def strict(text: str) -> Any:
    def refuse(constant: str) -> None:
        raise ValueError(f"{constant} in the page data")

    return json.loads(text, parse_constant=refuse)


@settings(FUZZ, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_a_damaged_analysis_file_is_a_record_or_an_analysis_error(results: Path, data: st.DataObject) -> None:
    name = data.draw(st.sampled_from(FILES), label="file")
    place = data.draw(st.sampled_from(PLACES[name]), label="place")
    value = data.draw(HOSTILE, label="value")
    run_b = results / "pi" / "gpt2-tiny" / "xnnpack" / RUN_B
    write_analysis(run_b, {**SEEDS, name: replaced(SEEDS[name], place, value)})
    loader = {"summary.json": load_summary, "ops.json": load_ops, "advice.json": load_advice}[name]
    try:
        loader(run_b)
        event(f"{name}: read")
    except AnalysisError as exc:
        event(f"{name}: refused")
        assert f"{name}: " in str(exc), str(exc)  # the file, then the field or the JSON's fault

    # Whatever was read is used without a crash: the dashboard's page (its JSON block strict), compare, the advisor.
    page = pages.render_page("run", data_of(results, RUN_B), pages.Links())
    (block,) = PAGE_DATA.findall(page)
    strict(block)
    try:
        compare_runs(run_b.parent / RUN_A, run_b, allow_rebuilt=True, write=False)
        advise(RunFacts(load_ops(run_b), load_summary(run_b)))
    except EtlabError:
        pass


def data_of(results: Path, run_id: str) -> RunPage:
    return data.run_page(data.Lab(results), run_id)


def test_the_seeds_read_back(results: Path) -> None:
    run = results / "pi" / "gpt2-tiny" / "xnnpack" / RUN_A
    summary = load_summary(run)
    assert summary.generation is not None and summary.accuracy is not None and summary.counters is not None
    assert summary_data(summary) == SEEDS["summary.json"]
    assert load_advice(run) is not None and load_ops(run).instructions
    advice = load_advice(run)
    assert advice is not None
    write_advice(run, advice)  # what the advisor writes reads back
