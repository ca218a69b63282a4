"""Everything a board sends is untrusted (2/2): non-finite outputs, bundles edited after they were pulled,
counters and timings out of range, runner versions, scripted agent answers, manifest keys checked before they
touch the disk."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import pytest

from orchestrator.errors import AnalysisError
from orchestrator.lowering.variants import VARIANTS
from orchestrator.results.bundle import MANIFEST
from orchestrator.tensorfile import NamedTensor, read_tensors, write_tensors
from orchestrator.transport import connect
from tests.plugins.analysis import BundleCopy, analyze, edit_json, remanifest
from tests.plugins.sshd import SshdBoard
from tests.results.board_data_helpers import sha

# ---------------------------------------------------------------- 4. non-finite outputs never pass


@pytest.mark.parametrize("value", [np.nan, np.inf])
def test_non_finite_outputs_make_the_run_invalid(bundle_copy: BundleCopy, value: float) -> None:
    case = bundle_copy("distilbert_xnnpack")
    outputs = case.path / "outputs.etlt"
    tensors = read_tensors(outputs)
    poisoned = tensors[0].array.copy()
    poisoned.reshape(-1)[3] = value
    write_tensors(outputs, [NamedTensor(tensors[0].name, poisoned), *tensors[1:]])
    remanifest(case.path)

    summary = analyze(case)

    correctness = summary.data["correctness"]
    assert correctness["checked"] and correctness["ok"] is False, correctness
    assert correctness["non_finite"] == 1 and correctness["max_abs_error"] is None
    assert "non-finite" in correctness["reason"]
    assert summary.validity == "invalid"
    text = (case.path / "analysis" / "summary.json").read_text()
    json.loads(text, parse_constant=lambda constant: pytest.fail(f"summary.json holds {constant}: not strict JSON"))


# ---------------------------------------------------------------- also: a bundle re-analysed is re-validated


def test_reanalysis_refuses_a_link_planted_in_a_pulled_bundle(bundle_copy: BundleCopy, tmp_path: Path) -> None:
    case = bundle_copy("distilbert_xnnpack")
    elsewhere = tmp_path / "elsewhere.etlt"
    shutil.move(case.path / "outputs.etlt", elsewhere)
    (case.path / "outputs.etlt").symlink_to(elsewhere)  # same bytes, so the manifest still matches
    with pytest.raises(AnalysisError, match="symbolic links"):
        analyze(case)
    assert not (case.path / "analysis" / "summary.json").exists()


@pytest.mark.parametrize(
    ("document", "change", "field"),
    [
        ("run.json", {"labels": {"model": "../../x", "backend": "xnnpack"}}, "labels.model"),
        ("result_manifest.json", {"run_id": "../../../tmp/x"}, "run_id"),
    ],
)
def test_reanalysis_refuses_names_that_break_the_rule(
    bundle_copy: BundleCopy, document: str, change: dict[str, Any], field: str
) -> None:
    case = bundle_copy("distilbert_xnnpack")
    edit_json(case.path / document, **change)
    with pytest.raises(AnalysisError, match=rf"{field} .* is not a valid name"):
        analyze(case)
    assert not (case.path / "analysis" / "summary.json").exists()


# ---------------------------------------------------------------- board data that used to escape validation

COUNTER_COLUMNS = ["event_index", "chain", "instruction", "task_clock"]


def write_counters(bundle: Path, document: Any, timings: str | None = None) -> None:
    """A counters pass as a board could have written it: counters.json, and counters_timings.json if given."""
    bundle.mkdir(parents=True, exist_ok=True)
    (bundle / "counters.json").write_text(json.dumps(document))
    if timings is not None:
        (bundle / "counters_timings.json").write_text(timings)


def test_counter_names_that_are_not_strings_are_not_painted(tmp_path: Path) -> None:
    from orchestrator.results.counters_profile import read_counter_profile

    document = {"captured": [["x"], {"a": 1}, 5, "task_clock"], "columns": COUNTER_COLUMNS, "executions": [[]]}
    write_counters(tmp_path, document)
    profile = read_counter_profile(tmp_path)
    assert profile is not None and profile.captured == ["task_clock"]


@pytest.mark.parametrize(
    "timings", ["[]", "null", '"text"', "not json", "{" * 50000, '{"warmup_ms": 1' + "0" * 5000 + "}"]
)
def test_a_malformed_counters_timings_file_is_an_analysis_error(tmp_path: Path, timings: str) -> None:
    from orchestrator.results.counters_profile import read_counter_profile

    write_counters(tmp_path, {"captured": ["task_clock"], "columns": COUNTER_COLUMNS, "executions": [[]]}, timings)
    with pytest.raises(AnalysisError, match=r"counters_timings\.json"):
        read_counter_profile(tmp_path)


def test_counter_values_out_of_the_runners_range_are_dropped(bundle_copy: BundleCopy, tmp_path: Path) -> None:
    """Rows keyed by a real ETDump; values the runner's uint64 deltas cannot be (or that wrapped) are dropped."""
    from orchestrator.results.counters_profile import INSTRUCTION_EVENTS, read_counter_profile
    from orchestrator.results.etdump import read_etdump

    case = bundle_copy("distilbert_xnnpack")
    counters = tmp_path / "counters-bundle"
    counters.mkdir()
    shutil.copy(case.path / "etdump.etdp", counters / "counters_etdump.etdp")
    blocks = read_etdump(counters / "counters_etdump.etdp").execute_blocks
    executions = [
        [
            [event, int(block.chain[event]), int(block.instruction[event]), 1000]
            for event in range(len(block))
            if block.event_names[event] in INSTRUCTION_EVENTS
        ]
        for block in blocks
    ]
    assert executions and executions[0], "the ETDump has instruction events to key rows by"
    good = executions[0][0]
    executions[0] += [[*good[:3], bad] for bad in (2**64 - 1, 2**63, -1)]
    write_counters(counters, {"captured": ["task_clock"], "columns": COUNTER_COLUMNS, "executions": executions})

    profile = read_counter_profile(counters)

    assert profile is not None and profile.dropped_rows == 3
    assert set(profile.values["task_clock"].values()) == {1000.0}  # only the plausible rows count

    # No uint64 is 400 digits long: the strict reader refuses the file, naming the field
    executions[0].append([*good[:3], 10**400])
    write_counters(counters, {"captured": ["task_clock"], "columns": COUNTER_COLUMNS, "executions": executions})
    with pytest.raises(AnalysisError, match=rf"counters\.json: executions\[0\]\[{len(executions[0]) - 1}\]\[3\]: "):
        read_counter_profile(counters)


def test_a_cell_records_only_the_finite_latencies_of_its_timings(tmp_path: Path) -> None:
    from orchestrator.deploy.cells import CellOutcome
    from orchestrator.lab.nightly import record_from_cell

    timings = {"iterations_ms": [1.5, None, {"a": 1}, "2", True, 2]}
    (tmp_path / "timings.json").write_text(json.dumps(timings))
    cell = CellOutcome("pi5-a", "tiny", VARIANTS["xnnpack"], run_id="run-1", bundle=tmp_path)
    assert record_from_cell(cell, "2024-01-01", {}, None).latencies_ms == [1.5, 2.0]
    for document in ({"iterations_ms": None}, {"iterations_ms": {"0": 1.0}}, [1.0, 2.0]):
        (tmp_path / "timings.json").write_text(json.dumps(document))
        assert record_from_cell(cell, "2024-01-01", {}, None).latencies_ms == []
    for odd in ("NaN", "Infinity", "1" * 400):  # the strict reader refuses the file: nothing of it is recorded
        (tmp_path / "timings.json").write_text(f'{{"iterations_ms": [1.5, {odd}, 2]}}')
        assert record_from_cell(cell, "2024-01-01", {}, None).latencies_ms == []


def test_a_runner_without_a_version_string_means_provisioning(tmp_path: Path) -> None:
    from orchestrator.deploy import provision
    from orchestrator.errors import BoardDataError
    from orchestrator.versions import executorch_version

    state = {"executorch_version": executorch_version(), "board_tree_sha256": "tree"}
    for answer in ({"executorch_version": None}, {}):
        facts = {"state": state, "runner": answer, "agent_present": True}  # as quick_check lets them through
        assert provision._problems(facts, "tree") == ["runner missing or built for another executorch"]

    real = json.loads(
        subprocess.run(
            [sys.executable, "-c", provision.PROBE_SOURCE.read_text(), str(tmp_path)],
            capture_output=True, text=True, check=True,
        ).stdout
    )  # fmt: skip
    for key, value, field in [
        ("runner", {"executorch_version": ["1.0"]}, "runner.executorch_version"),
        ("runner", {"runner_version": 7}, "runner.runner_version"),
        ("state", {"executorch_version": {"v": 1}}, "state.executorch_version"),
        ("state", {"runner_path": 5}, "state.runner_path"),
    ]:
        with pytest.raises(BoardDataError, match=rf"pi5-a: the board probe sent malformed output: {field} is"):
            provision.checked_facts("pi5-a", json.dumps({**real, key: value}))
    facts = provision.checked_facts("pi5-a", json.dumps({**real, "runner": {"executorch_version": None}}))
    assert facts["runner"] == {"executorch_version": None}  # null is "unknown": full provisioning decides


SCRIPTED_AGENT = r"""
# Test-only: an agent on a hostile board prints answer.txt (@WORKDIR@ is its --workdir) and exits with exit.txt.
import pathlib, sys
here = pathlib.Path(__file__).parent
workdir = sys.argv[sys.argv.index("--workdir") + 1]
sys.stdout.write((here / "answer.txt").read_text().replace("@WORKDIR@", workdir))
sys.exit(int((here / "exit.txt").read_text()))
"""


class Answer(Protocol):
    def __call__(self, text: str, exit_code: int = 0) -> None: ...


def scripted_agent(fake: SshdBoard) -> Answer:
    """Install SCRIPTED_AGENT on the fake board; returns answer(text, exit_code) that sets what it says next."""
    package = fake.workdir_path / "board" / "agent" / "etlab_agent"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "__main__.py").write_text(SCRIPTED_AGENT)

    def answer(text: str, exit_code: int = 0) -> None:
        (package / "answer.txt").write_text(text)
        (package / "exit.txt").write_text(str(exit_code))

    return answer


def test_an_agent_answer_with_a_huge_integer_is_unparseable(sshd_board: SshdBoard) -> None:
    from orchestrator.deploy.agent_client import AgentError, BoardAgent

    answer = scripted_agent(sshd_board)
    answer('{"free_mb": ' + "9" * 5000 + "}", 1)
    with connect(sshd_board.board) as conn, pytest.raises(AgentError, match="unparseable agent output"):
        BoardAgent(conn, conn.workdir).call("info")


def test_the_bundle_a_profile_pulls_from_is_ours_not_the_boards(sshd_board: SshdBoard) -> None:
    from orchestrator.boards.workdir import BoardWorkdir
    from orchestrator.deploy.agent_client import BoardAgent
    from orchestrator.errors import BoardDataError

    answer = scripted_agent(sshd_board)

    def profile(bundle: str) -> dict[str, Any]:
        answer(json.dumps({"run_id": "run-1", "status": "ok", "bundle": bundle}))
        with connect(sshd_board.board) as conn:
            return BoardAgent(conn, conn.workdir).profile(
                model="m.pte", run_id="run-1", inputs=None, labels={}, warmup=0, iterations=1, threads=None,
                max_seconds=None, timeout=60, lock_timeout=5,
            )[0]  # fmt: skip

    for elsewhere in ("/tmp/elsewhere/bundles/run-1", "@WORKDIR@/x/bundles/run-1", "bundles/run-1"):
        with pytest.raises(BoardDataError, match="agent profile sent malformed output: bundle"):
            profile(elsewhere)
    with connect(sshd_board.board) as conn:
        ours = BoardWorkdir(conn.workdir).bundle("run-1")
    assert profile("@WORKDIR@/bundles/run-1")["bundle"] == ours
    assert profile("@WORKDIR@/./bundles//run-1")["bundle"] == ours  # the same folder, spelled another way


def test_a_malformed_retest_timings_file_is_board_data_error(sshd_board: SshdBoard) -> None:
    from orchestrator.deploy.abtest import _timings
    from orchestrator.errors import BoardDataError

    folder = sshd_board.workdir_path / "bundles" / "ab-1"
    folder.mkdir(parents=True)
    with connect(sshd_board.board) as conn:
        bundle = f"{conn.workdir}/bundles/ab-1"
        (folder / "timings.json").write_text(json.dumps({"iterations_ms": [2.0, "x", None, 3]}))
        assert _timings(conn, bundle) == [2.0, 3.0]
        for odd, field in ((10**400, r"iterations_ms\[0\]"), (float("nan"), r"iterations_ms\[0\]")):
            (folder / "timings.json").write_text(json.dumps({"iterations_ms": [odd, 2.0]}))
            with pytest.raises(BoardDataError, match=rf"timings\.json in .*: {field}: .* is out of range"):
                _timings(conn, bundle)
        for text in (json.dumps({"iterations_ms": {"0": 1.0}}), json.dumps({"iterations_ms": None}), "[]", "{" * 50000):
            (folder / "timings.json").write_text(text)
            with pytest.raises(BoardDataError, match=r"timings\.json"):
                _timings(conn, bundle)


@pytest.mark.parametrize("key", ["/etc/hostname", "/etc/no-such-file-here", "../../x", "../run.json"])
def test_manifest_keys_are_checked_before_they_touch_the_disk(tmp_path: Path, key: str) -> None:
    """A key outside the bundle is refused by name, whether or not something exists there (no probing)."""
    from orchestrator.results.bundle_reader import read_bundle

    bundle = tmp_path / "a" / "run-1"
    bundle.mkdir(parents=True)
    (tmp_path / "a" / "run.json").write_text("{}")
    run = json.dumps({"run_id": "run-1"}).encode()
    (bundle / "run.json").write_bytes(run)
    files = {"run.json": {"sha256": sha(run), "size": len(run)}, key: {"sha256": sha(b"{}"), "size": 2}}
    (bundle / MANIFEST).write_text(json.dumps({"schema": 1, "run_id": "run-1", "status": "ok", "files": files}))
    with pytest.raises(AnalysisError, match="not a valid file name") as excinfo:
        read_bundle(bundle)
    assert "missing" not in str(excinfo.value)
