"""Everything a board sends is untrusted: hostile bundles on real sshd boards, a corrupt model under the real
agent, a full board disk, non-finite outputs, and bundles edited after they were pulled."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click
import numpy as np
import pytest

from orchestrator.boards.inventory import Board
from orchestrator.deploy.runs import RunParams, profile, pull, push_artifact
from orchestrator.errors import AnalysisError, BoardError, BundleError, ExitCode
from orchestrator.fsutil import TMP_PREFIX
from orchestrator.lowering.artifacts import load_artifact
from orchestrator.lowering.variants import VARIANTS
from orchestrator.paths import PROJECT_ROOT
from orchestrator.results.analysis import analyze_bundle
from orchestrator.results.bundle import MANIFEST
from orchestrator.results.store import new_run_id
from orchestrator.tensorfile import NamedTensor, read_tensors, write_tensors
from orchestrator.transport import connect
from orchestrator.transport.pull import pull_bundle
from tests.plugins.agent import AGENT_DIR, AgentCli
from tests.plugins.analysis import BundleCopy, analyze, edit_json, remanifest
from tests.plugins.artifacts import ARTIFACT_CACHE
from tests.plugins.boards import write_inventory
from tests.plugins.runner import RunnerModels
from tests.plugins.sshd import SshdBoard


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def install_agent(fake: SshdBoard) -> None:
    """The agent on a fake board, as provisioning lays it out (board/agent and click in pylib); no runner needed
    to list bundles."""
    workdir = fake.workdir_path
    shutil.copytree(AGENT_DIR, workdir / "board" / "agent", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(Path(click.__file__).parent, workdir / "pylib" / "click", ignore=shutil.ignore_patterns("*.pyc"))


def board_bundle(fake: SshdBoard, run_id: str, labels: dict[str, str], files: dict[str, bytes] | None = None) -> Path:
    """A bundle as the agent leaves it: run.json with labels, the files, result_manifest.json last."""
    folder = fake.workdir_path / "bundles" / run_id
    folder.mkdir(parents=True)
    contents = {"run.json": json.dumps({"run_id": run_id, "labels": labels}).encode(), **(files or {})}
    for name, data in contents.items():
        (folder / name).write_bytes(data)
    listed = {name: {"sha256": sha(data), "size": len(data)} for name, data in contents.items()}
    manifest = {"schema": 1, "run_id": run_id, "status": "ok", "files": listed}
    (folder / MANIFEST).write_text(json.dumps(manifest))
    return folder


def fab(*args: str, results: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "ETLAB_RESULTS": str(results)}
    return subprocess.run(
        [sys.executable, "-m", "fabric", *args], cwd=PROJECT_ROOT, env=env, capture_output=True, text=True, timeout=300
    )


def files_under(folder: Path) -> set[str]:
    return {str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file()} if folder.exists() else set()


# ---------------------------------------------------------------- 1. a board cannot choose where results land

HOSTILE_NAMES = {
    "model label climbs out": ("run-1", {"model": "../../../escaped", "backend": "xnnpack"}, "labels.model"),
    "absolute backend label": ("run-1", {"model": "tiny", "backend": "{outside}/abs"}, "labels.backend"),
    "run id with a space": ("run 1", {"model": "tiny", "backend": "xnnpack"}, "run_id"),
}


@pytest.mark.parametrize("case", list(HOSTILE_NAMES), ids=list(HOSTILE_NAMES))
def test_fab_pull_refuses_names_a_board_chose_and_keeps_the_raw_bundle(
    sshd_board: SshdBoard, tmp_path: Path, case: str
) -> None:
    run_id, labels, field = HOSTILE_NAMES[case]
    outside = tmp_path / "outside"
    outside.mkdir()
    labels = {key: value.replace("{outside}", str(outside)) for key, value in labels.items()}
    install_agent(sshd_board)
    hostile = board_bundle(sshd_board, run_id, labels, {"outputs.etlt": b"x" * 100})
    good = board_bundle(sshd_board, "run-good", {"model": "tiny", "backend": "portable"})
    before = files_under(hostile)
    results = tmp_path / "a" / "b" / "results"  # deep, so '../../..' stays inside tmp_path
    inventory = write_inventory(tmp_path / "inventory.yaml", [sshd_board.board])

    pull = fab("pull", "--board", sshd_board.name, "--inventory", str(inventory), results=results)

    output = pull.stdout + pull.stderr
    assert pull.returncode == ExitCode.DATA, output
    assert sshd_board.name in output and field in output and "refused" in output, output
    # Nothing of the hostile bundle landed anywhere; the good one did, where it belongs.
    assert files_under(results) == {f"{sshd_board.name}/tiny/portable/run-good/{n}" for n in ("run.json", MANIFEST)}
    assert list(outside.iterdir()) == [] and not (tmp_path / "escaped").exists()
    assert not any("escaped" in str(p) for p in tmp_path.rglob("*") if "home" not in p.parts)
    assert files_under(hostile) == before and good.is_dir()  # the raw bundles stay on the board


def test_a_manifest_entry_with_a_bad_name_is_refused(sshd_board: SshdBoard, tmp_path: Path) -> None:
    folder = board_bundle(sshd_board, "run-1", {"model": "tiny", "backend": "xnnpack"})
    manifest = json.loads((folder / MANIFEST).read_text())
    manifest["files"]["../../evil.txt"] = {"sha256": sha(b""), "size": 0}
    (folder / MANIFEST).write_text(json.dumps(manifest))
    dest = tmp_path / "results" / "run-1"
    with connect(sshd_board.board) as conn, pytest.raises(BundleError, match=r"'\.\./\.\./evil\.txt': not a valid"):
        pull_bundle(conn, "~/.etlab/bundles/run-1", dest)
    assert not dest.exists() and not (tmp_path / "evil.txt").exists()


FAKE_TAR = r"""#!{python}
# Test-only: a hostile board's tar. It sends a manifest declaring 1000 bytes for big.bin, then 64 MiB of it, and
# records that the whole archive went out (a workstation that checks sizes while streaming stops reading first).
import json, sys, tarfile
out = sys.stdout.buffer
def member(name, data_size):
    info = tarfile.TarInfo(name)
    info.size = data_size
    out.write(info.tobuf(format=tarfile.USTAR_FORMAT))
manifest = json.dumps({{"schema": 1, "run_id": "big", "status": "ok",
                       "files": {{"big.bin": {{"sha256": "0" * 64, "size": 1000}}}}}}).encode()
member("./result_manifest.json", len(manifest))
out.write(manifest + bytes(-len(manifest) % 512))
member("./big.bin", 64 << 20)
for _ in range(64):
    out.write(bytes(1 << 20))
out.write(bytes(1024))
out.flush()
open({marker!r}, "w").write("the whole archive was sent")
"""


@pytest.mark.parametrize("bulk", ["auto", "paramiko"])
def test_a_pull_stops_as_soon_as_a_file_outgrows_its_manifest_entry(
    sshd_boards: Callable[..., list[SshdBoard]], tmp_path: Path, bulk: str
) -> None:
    fake_bin = tmp_path / "hostile bin"
    fake_bin.mkdir()
    marker = tmp_path / "sent-everything"
    tar = fake_bin / "tar"
    tar.write_text(FAKE_TAR.format(python=sys.executable, marker=str(marker)))
    tar.chmod(0o755)
    (fake,) = sshd_boards(1, session_env={"PATH": f"{fake_bin}:/usr/bin:/bin"}, bulk_transfer=bulk)
    board_bundle(fake, "big", {})
    dest = tmp_path / "results" / "big"
    with (
        connect(fake.board) as conn,
        pytest.raises(BundleError, match=r"big\.bin: size 67108864, the manifest says 1000"),
    ):
        pull_bundle(conn, "~/.etlab/bundles/big", dest)
    assert not dest.exists() and not [p for p in dest.parent.iterdir() if p.name.startswith(TMP_PREFIX)]
    assert not marker.exists(), "the workstation read the whole oversized file before refusing it"


# ---------------------------------------------------------------- 3. the board runs only the model it was given


def place_model(agent: AgentCli, source: Path, kind: str = "models", suffix: str = ".pte") -> Path:
    """Lay a file out as a push does: content-addressed, with its sha256 sidecar."""
    digest = sha(source.read_bytes())
    path = agent.workdir / kind / f"{digest}{suffix}"
    path.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(source, path)
    Path(f"{path}.sha256").write_text(f"{digest}  {path.name}\n")
    return path


def flip_a_byte(path: Path, offset: int = 200) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x01
    path.write_bytes(bytes(data))  # same size: only a hash can tell


@pytest.mark.parametrize("what", ["model", "inputs file"])
def test_a_model_corrupted_on_the_board_never_runs_and_is_removed(
    provisioned_agent: AgentCli, runner_models: RunnerModels, what: str
) -> None:
    agent = provisioned_agent
    model = place_model(agent, runner_models.xnnpack_pte)
    inputs = place_model(agent, runner_models.inputs_etlt, "inputs", ".etlt")
    victim = model if what == "model" else inputs
    flip_a_byte(victim)

    result = agent.run("profile", "--model", model, "--inputs", inputs, "--run-id", "run-1", "--iterations", "1")

    assert result.returncode == 1, result.stdout + result.stderr
    assert result.document["error"].startswith(f"{what} on board is corrupt"), result.document
    assert "bundle" not in result.document
    assert not victim.exists() and not Path(f"{victim}.sha256").exists()  # so the next push sends it again
    survivor = inputs if what == "model" else model
    assert survivor.exists() and Path(f"{survivor}.sha256").exists()
    assert not list((agent.workdir / "bundles").iterdir())  # no bundle, no temporary left behind


def test_a_full_board_disk_is_reported_and_the_temporary_bundle_removed(
    provisioned_agent: AgentCli, runner_models: RunnerModels, tmp_path: Path
) -> None:
    agent = provisioned_agent
    model = place_model(agent, runner_models.xnnpack_pte)
    bundles = agent.workdir / "bundles"
    bundles.mkdir()
    answer, listing = tmp_path / "answer.json", tmp_path / "listing.txt"
    # A 4 KiB tmpfs over bundles/ in a private mount namespace: the board's disk is full, nothing else is.
    script = (
        'mount -t tmpfs -o size=4k tmpfs "$1" || exit 99\n'
        'shift; out="$1"; list="$2"; shift 2\n'
        '"$@" > "$out"; rc=$?\n'
        'ls -A "$BUNDLES" > "$list"; exit $rc'
    )
    argv = agent.argv(["profile", "--model", model, "--run-id", "run-1", "--iterations", "1", "--warmup", "0"])
    done = subprocess.run(
        ["unshare", "--mount", "sh", "-c", script, "sh", str(bundles), str(answer), str(listing), *argv],
        env={**os.environ, "PYTHONPATH": str(AGENT_DIR), "PYTHONDONTWRITEBYTECODE": "1", "BUNDLES": str(bundles)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode != 99, f"cannot mount a tmpfs here: {done.stderr}"
    document = json.loads(answer.read_text())
    assert done.returncode == 1, done.stderr
    assert document["error"].startswith(f"no space left on {bundles}"), document
    assert "internal error" not in document["error"]
    assert listing.read_text().split() == []  # the run's .tmp- folder went at once


def test_a_corrupt_model_fails_the_run_and_the_next_push_sends_it_again(
    local_board: Board, tiny_artifacts: dict[str, Any], tmp_path: Path
) -> None:
    artifact = load_artifact("distilbert-tiny", VARIANTS["portable"], ARTIFACT_CACHE)
    params = RunParams(warmup=0, iterations=1)
    with connect(local_board) as conn:
        pushed = push_artifact(conn, artifact)
        flip_a_byte(Path(pushed.model.remote_path))
        assert push_artifact(conn, artifact).model.skipped  # re-pushing stays quick: the run does the check
        with pytest.raises(BoardError, match="model on board is corrupt"):
            profile(conn, artifact, pushed, params, new_run_id())
        repushed = push_artifact(conn, artifact)
        assert not repushed.model.skipped
        run = profile(conn, artifact, repushed, params, new_run_id())
        assert run.status == "ok", run.error
        bundle = pull(conn, run, artifact, tmp_path / "results")
    run_json = json.loads((bundle / "run.json").read_text())
    assert run_json["model_sha256"] == artifact.sha256 and run_json["model_sha256_source"] == "computed"
    assert json.loads((bundle / MANIFEST).read_text())["model_sha256"] == artifact.sha256
    summary = analyze_bundle(bundle, pte=artifact.pte, sidecar=artifact.sidecar)
    assert summary.data["latency"]["hashing_ms"]["model"] >= 0


# ---------------------------------------------------------------- also: agent answers are validated


HOSTILE_AGENT = """import json, sys
# Test-only: an agent on a hostile board answers `bundles` with entries of the wrong shape.
print(json.dumps({"bundles": [{"run_id": 5, "labels": {"model": ["x"]}}]}))
"""


def test_a_malformed_agent_answer_is_a_clear_board_error(sshd_board: SshdBoard, tmp_path: Path) -> None:
    package = sshd_board.workdir_path / "board" / "agent" / "etlab_agent"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "__main__.py").write_text(HOSTILE_AGENT)
    inventory = write_inventory(tmp_path / "inventory.yaml", [sshd_board.board])
    results = tmp_path / "results"

    pull = fab("pull", "--board", sshd_board.name, "--inventory", str(inventory), results=results)

    output = pull.stdout + pull.stderr
    assert pull.returncode == ExitCode.DATA, output  # the board answered: bad data, not unreachable
    assert "agent bundles sent malformed output" in output and "TypeError" not in output, output
    assert files_under(results) == set()


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
    executions[0] += [[*good[:3], bad] for bad in (10**400, 2**64 - 1, 2**63, -1)]
    write_counters(counters, {"captured": ["task_clock"], "columns": COUNTER_COLUMNS, "executions": executions})

    profile = read_counter_profile(counters)

    assert profile is not None and profile.dropped_rows == 4
    assert set(profile.values["task_clock"].values()) == {1000.0}  # only the plausible rows count


def test_a_cell_records_only_the_finite_latencies_of_its_timings(tmp_path: Path) -> None:
    from orchestrator.deploy.cells import CellOutcome
    from orchestrator.lab.nightly import record_from_cell

    timings = {"iterations_ms": [1.5, None, float("nan"), float("inf"), {"a": 1}, "2", True, 10**400, 2]}
    (tmp_path / "timings.json").write_text(json.dumps(timings))
    cell = CellOutcome("pi5-a", "tiny", VARIANTS["xnnpack"], run_id="run-1", bundle=tmp_path)
    assert record_from_cell(cell, "2024-01-01", {}, None).latencies_ms == [1.5, 2.0]
    for document in ({"iterations_ms": None}, {"iterations_ms": {"0": 1.0}}, [1.0, 2.0]):
        (tmp_path / "timings.json").write_text(json.dumps(document))
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


def scripted_agent(fake: SshdBoard) -> Callable[[str, int], None]:
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
        (folder / "timings.json").write_text(json.dumps({"iterations_ms": [10**400, 2.0, float("nan"), None, 3]}))
        assert _timings(conn, bundle) == [2.0, 3.0]
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
