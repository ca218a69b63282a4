"""Shared labs on labgrid, end to end through `fab`: a real labgrid coordinator and exporter on 127.0.0.1 publish the
suite's sshd boards as places (made with `labgrid-client`); etlab resolves, reserves, locks and releases them.

"alice" is another person of the lab: `labgrid-client` run with LG_USERNAME=alice.
What fails (the inventory section, a lost or unreachable coordinator, hostile place names): test_labgrid_failures.py.
"""

from __future__ import annotations

import json
import re
import shutil
import signal
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from orchestrator.boards.inventory import Board
from orchestrator.lowering.export.lower import LoweringResult
from orchestrator.testing.labgrid import LabgridLab, SilentPort
from orchestrator.testing.sshd import SshdLab
from tests.boards.labgrid_helpers import (
    ALICE,
    PLACES,
    SILENT,
    Lab,
    fab,
    fab_background,
    no_reservation_of_ours,
    our_client,
    output,
    pushed_models,
    run_to_end,
    wait_for,
    write_inventory,
)
from tests.plugins.artifacts import ARTIFACT_CACHE
from tests.plugins.processes import reaped


@pytest.fixture(scope="module")
def lab(labgrid_lab: LabgridLab, sshd_lab: SshdLab, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    fakes = {name: sshd_lab.board(name) for name in PLACES}
    silent = SilentPort()
    services = {name: (fake.address, fake.port) for name, fake in fakes.items()}
    exporter = labgrid_lab.publish({**services, SILENT: (silent.address, silent.port)})
    labgrid_lab.add_places(exporter, {**{name: {"board": "pi5"} for name in PLACES}, SILENT: {}})
    folder = tmp_path_factory.mktemp("labgrid-lab")
    inventory = write_inventory(folder / "inventory.yaml", sshd_lab, labgrid_lab.address)
    yield Lab(labgrid_lab, fakes, inventory, folder)
    silent.close()
    for fake in fakes.values():
        sshd_lab.discard(fake)


# ---------------------------------------------------------------- through fab, against the real coordinator


def test_a_task_resolves_boards_from_places(
    lab: Lab, tiny_artifacts: dict[str, LoweringResult], tmp_path: Path
) -> None:
    """`--board pis` is a tag selector: every place tagged board=pi5, reached through its NetworkService."""
    pushed = fab("push", "--model", "distilbert-tiny", "--board", "pis", lab=lab, results=tmp_path / "results")
    assert pushed.returncode == 0, pushed.stdout + pushed.stderr
    for name, fake in lab.fakes.items():
        assert name in pushed.stdout
        assert pushed_models(fake), f"nothing pushed to {name}"
        assert lab.labgrid.holder(name) is None  # released after the job
    assert no_reservation_of_ours(lab)
    assert SILENT not in pushed.stdout  # not tagged: not selected


def test_waits_for_a_place_held_by_another_client_then_proceeds(
    lab: Lab, tiny_artifacts: dict[str, LoweringResult], tmp_path: Path
) -> None:
    lab.alice("acquire", "lg-a")
    log = tmp_path / "fab.log"
    try:
        process = fab_background("push", "--model", "gpt2-tiny", "--board", "lg-a", lab=lab, results=tmp_path, log=log)
        with reaped(process):
            wait_for(lambda: re.search(rf"waiting for labgrid place lg-a: held by \S+/{ALICE}", output(log)),
                     "etlab to wait for alice's place")  # fmt: skip
            assert process.poll() is None, output(log)  # still waiting
            assert not any(_is_gpt2(m) for m in pushed_models(lab.fakes["lg-a"]))  # nothing touched yet
            lab.alice("release", "lg-a")
            code = run_to_end(process)
    finally:
        lab.labgrid.client("release", place="lg-a", user=ALICE, check=False)
    assert code == 0, output(log)
    assert any(_is_gpt2(m) for m in pushed_models(lab.fakes["lg-a"])), "pushed once the place was free"
    assert lab.labgrid.holder("lg-a") is None
    assert no_reservation_of_ours(lab)


def _is_gpt2(model: Path) -> bool:
    sidecar = ARTIFACT_CACHE / "gpt2-tiny" / "gpt2-tiny_xnnpack.json"
    return model.stem == json.loads(sidecar.read_text())["sha256"]


def test_lg_wait_expires_naming_the_holder(lab: Lab, tiny_artifacts: dict[str, LoweringResult], tmp_path: Path) -> None:
    """The board whose place stays held fails, naming alice; the other board of the fan-out is done."""
    lab.alice("acquire", "lg-b")
    try:
        done = fab("push", "--model", "distilbert-tiny", "--board", "lg-a,lg-b", "--lg-wait", "1", lab=lab,
                   results=tmp_path)  # fmt: skip
        holder = lab.labgrid.holder("lg-b")
        assert holder is not None and holder.endswith(f"/{ALICE}")  # alice keeps her place
    finally:
        lab.alice("release", "lg-b")
    text = done.stdout + done.stderr
    assert done.returncode == 69, text  # the only failure: a board that could not be had
    assert re.search(
        rf"labgrid place lg-b is still held by \S+/{ALICE} after waiting .* \(the wait allowed: 1 s\)", text
    ), text
    assert "lg-a" in done.stdout and ("pushed" in done.stdout or "already there" in done.stdout), text
    assert no_reservation_of_ours(lab)
    refused = fab("push", "--model", "distilbert-tiny", "--board", "lg-a", "--lg-wait", "-1", lab=lab,
                  results=tmp_path)  # fmt: skip
    assert refused.returncode == 64 and "--lg-wait" in refused.stderr, refused.stderr


def test_two_etlab_processes_on_one_place_serialize(
    lab: Lab, tiny_artifacts: dict[str, LoweringResult], tmp_path: Path
) -> None:
    """Both queue behind alice; once she leaves, the coordinator's own log shows each lock taken and released in
    turn, never two at once."""
    coordinator_log = lab.labgrid.root / "coordinator.log"
    offset = len(coordinator_log.read_text(errors="replace"))
    lab.alice("acquire", "lg-b")
    logs = [tmp_path / "first.log", tmp_path / "second.log"]
    try:
        processes = [
            fab_background("push", "--model", "distilbert-tiny", "--board", "lg-b", lab=lab, results=tmp_path, log=log)
            for log in logs
        ]
        with reaped(processes[0]), reaped(processes[1]):
            for log in logs:
                wait_for(lambda log=log: "waiting for labgrid place lg-b" in output(log), f"{log.name} to queue")
            lab.alice("release", "lg-b")
            codes = [run_to_end(process) for process in processes]
    finally:
        lab.labgrid.client("release", place="lg-b", user=ALICE, check=False)
    assert codes == [0, 0], output(logs[0]) + output(logs[1])
    events = re.findall(r"^lg-b: place (acquired|released)", coordinator_log.read_text(errors="replace")[offset:], re.M)
    # alice's lock, then etlab's two, each released before the next is taken
    assert events == ["acquired", "released"] * 3, events
    assert lab.labgrid.holder("lg-b") is None
    assert no_reservation_of_ours(lab)


def test_ctrl_c_and_sigterm_release_the_place_while_waiting_and_while_holding(lab: Lab, tmp_path: Path) -> None:
    # While waiting in the queue: the reservation is cancelled.
    lab.alice("acquire", SILENT)
    log = tmp_path / "waiting.log"
    try:
        process = fab_background("gc", "--board", SILENT, lab=lab, results=tmp_path, log=log)
        with reaped(process):
            wait_for(lambda: f"waiting for labgrid place {SILENT}" in output(log), "etlab to queue")
            assert not no_reservation_of_ours(lab)  # its reservation is in the queue
            process.send_signal(signal.SIGINT)
            assert run_to_end(process) == 130, output(log)
    finally:
        lab.alice("release", SILENT)
    assert no_reservation_of_ours(lab), lab.labgrid.reservation_owners()

    # While holding the place (the job is connecting to a board that never answers): released on the way out,
    # for Ctrl+C and for SIGTERM (a cancelled CI job).
    for signum in (signal.SIGINT, signal.SIGTERM):
        log = tmp_path / f"holding-{signum.name}.log"
        process = fab_background("gc", "--board", SILENT, lab=lab, results=tmp_path, log=log)
        with reaped(process):
            wait_for(lambda log=log: f"labgrid place {SILENT} locked" in output(log), "etlab to lock the place")
            assert lab.labgrid.holder(SILENT) == our_client()
            process.send_signal(signum)
            assert run_to_end(process) == 130, output(log)
        assert lab.labgrid.holder(SILENT) is None, output(log)
        assert no_reservation_of_ours(lab), lab.labgrid.reservation_owners()


def test_sigkill_leaves_a_place_the_next_etlab_recovers(lab: Lab, tmp_path: Path) -> None:
    """A killed etlab cannot release; its place stays locked by our user, as README says, and the next etlab on
    this workstation sees the dead pid in its note and releases the place before reserving it again."""
    log = tmp_path / "killed.log"
    process = fab_background("gc", "--board", SILENT, lab=lab, results=tmp_path, log=log)
    with reaped(process):
        wait_for(lambda: f"labgrid place {SILENT} locked" in output(log), "etlab to lock the place")
        process.send_signal(signal.SIGKILL)
        process.wait()
    assert lab.labgrid.holder(SILENT) == our_client()  # left locked: nothing runs in a SIGKILLed process

    again = fab("gc", "--board", SILENT, "--lg-wait", "30", lab=lab, results=tmp_path)
    text = again.stdout + again.stderr
    assert f"released labgrid place {SILENT}, left locked by an etlab that died (pid {process.pid})" in text, text
    assert again.returncode == 69, text  # then the job itself: its board never answers
    assert "still held" not in text
    assert lab.labgrid.holder(SILENT) is None
    assert no_reservation_of_ours(lab), lab.labgrid.reservation_owners()


def test_fab_boards_shows_places_with_their_holders(lab: Lab, tmp_path: Path) -> None:
    lab.alice("acquire", "lg-b")
    try:
        shown = fab("boards", "--board", "lg-a,lg-b", lab=lab, results=tmp_path)
        holder = lab.labgrid.holder("lg-b")
        assert holder is not None and holder.endswith(f"/{ALICE}")  # fab boards only looks: it took nothing
    finally:
        lab.alice("release", "lg-b")
    assert shown.returncode == 0, shown.stdout + shown.stderr
    rows = {line.split("│")[1].strip(): line for line in shown.stdout.splitlines() if line.startswith("│")}
    assert "labgrid place" in shown.stdout
    assert "lg-a: free" in rows["lg-a"] and "yes" in rows["lg-a"]
    assert re.search(rf"lg-b: locked by \S+/{ALICE}", rows["lg-b"]), rows["lg-b"]
    fake = lab.fakes["lg-a"]
    assert f"root@{fake.address}:{fake.port}" in rows["lg-a"]  # the address came from the NetworkService


def test_nightly_over_two_places(
    lab: Lab, local_board: Board, sshd_lab: SshdLab, tiny_artifacts: dict[str, LoweringResult], tmp_path: Path
) -> None:
    """Every board of the matrix (a tag selector: both places) is reserved through labgrid for all its cells; the
    report names the places and how long their cells waited. The places' boards use a copy of the provisioned
    local board's workdir (same machine), so no runner is built here."""
    workdir = tmp_path / "board-workdir"
    shutil.copytree(local_board.workdir, workdir, ignore=lambda folder, names: _top_level_skips(folder, local_board))
    section = {
        "history": f"sqlite:///{tmp_path / 'history.sqlite'}",
        "reports": str(tmp_path / "reports"),
        "iterations": 5,
        "warmup": 1,
        "cooldown_seconds": 1,  # a degraded cell's re-measure need not wait the default minute here
        "matrix": [{"models": ["distilbert-tiny"], "backends": ["xnnpack"], "boards": ["pis"]}],
    }
    inventory = write_inventory(tmp_path / "inventory.yaml", sshd_lab, lab.labgrid.address, nightly=section)
    document = yaml.safe_load(inventory.read_text())
    document["boards"]["pis"]["workdir"] = str(workdir)
    inventory.write_text(yaml.safe_dump(document, sort_keys=False))
    nightly_lab = Lab(lab.labgrid, lab.fakes, inventory, tmp_path)

    lab.alice("acquire", "lg-b")
    log = tmp_path / "nightly.log"
    try:
        process = fab_background("nightly", "--night", "2026-11-30", lab=nightly_lab, results=tmp_path / "results",
                                 log=log)  # fmt: skip
        with reaped(process):
            wait_for(lambda: "waiting for labgrid place lg-b" in output(log), "the nightly to queue for lg-b")
            lab.alice("release", "lg-b")
            code = run_to_end(process, timeout=900)
    finally:
        lab.labgrid.client("release", place="lg-b", user=ALICE, check=False)
    text = output(log)
    assert code == 0, text
    report = (tmp_path / "reports" / "nightly-2026-11-30.md").read_text()
    assert "## Labgrid places" in report, report
    for place in PLACES:
        row = re.search(rf"^\| {place} / distilbert-tiny / xnnpack \| {place} \| {re.escape(lab.labgrid.address)} \| "
                        r"([0-9.]+) s \|$", report, re.M)  # fmt: skip
        assert row, report
    html_report = (tmp_path / "reports" / "nightly-2026-11-30.html").read_text()
    assert "<table id='places'>" in html_report
    for place in PLACES:
        assert lab.labgrid.holder(place) is None
    assert no_reservation_of_ours(lab)
    events = re.findall(r"^lg-b: place (acquired|released)", lab.labgrid.log("coordinator"), re.M)
    assert events[-2:] == ["acquired", "released"]  # etlab's one lock for all of the board's cells


def _top_level_skips(folder: str, board: Board) -> list[str]:
    """Copy a provisioned workdir without what a run does not need (the SDK, old bundles, caches)."""
    return ["runtime", "bundles", "wheels", "cache", "lock", "lock.json"] if folder == board.workdir else []


def test_a_cell_recorded_meanwhile_by_another_nightly_is_skipped(
    lab: Lab, local_board: Board, sshd_lab: SshdLab, tiny_artifacts: dict[str, LoweringResult], tmp_path: Path
) -> None:
    """The night's lock file is removed under a running nightly (a cleanup job, a person), so a second nightly of the
    night starts too. Both plan the cell and queue for the place alice holds; whichever gets the place second finds
    the cell recorded when it is about to run it, and skips it: one measurement, no conflict."""
    workdir = tmp_path / "board-workdir"
    shutil.copytree(local_board.workdir, workdir, ignore=lambda folder, names: _top_level_skips(folder, local_board))
    night = "2026-11-29"
    section = {
        "history": f"sqlite:///{tmp_path / 'history.sqlite'}", "reports": str(tmp_path / "reports"),
        "iterations": 5, "warmup": 1, "cooldown_seconds": 0,
        "matrix": [{"models": ["distilbert-tiny"], "backends": ["xnnpack"], "boards": ["lg-a"]}],
    }  # fmt: skip
    inventory = write_inventory(tmp_path / "inventory.yaml", sshd_lab, lab.labgrid.address, nightly=section)
    document = yaml.safe_load(inventory.read_text())
    document["boards"]["lg-a"]["workdir"] = str(workdir)
    inventory.write_text(yaml.safe_dump(document, sort_keys=False))
    nightly_lab = Lab(lab.labgrid, lab.fakes, inventory, tmp_path)

    lab.alice("acquire", "lg-a")
    logs = [tmp_path / "first.log", tmp_path / "second.log"]
    try:
        first = fab_background("nightly", "--night", night, lab=nightly_lab, results=tmp_path / "results", log=logs[0])
        with reaped(first):
            wait_for(lambda: "waiting for labgrid place lg-a" in output(logs[0]), "the first nightly to queue")
            for lock in tmp_path.glob(f"history.sqlite.night-{night}.*"):
                lock.unlink()
            second = fab_background("nightly", "--night", night, lab=nightly_lab, results=tmp_path / "results",
                                    log=logs[1])  # fmt: skip
            with reaped(second):
                wait_for(lambda: "waiting for labgrid place lg-a" in output(logs[1]), "the second nightly to queue")
                lab.alice("release", "lg-a")
                codes = [run_to_end(first, timeout=600), run_to_end(second, timeout=600)]
    finally:
        lab.labgrid.client("release", place="lg-a", user=ALICE, check=False)
    texts = [output(log) for log in logs]
    assert codes == [0, 0], texts
    skipped = [text for text in texts if "lg-a / distilbert-tiny / xnnpack: recorded meanwhile: skipped" in text]
    assert len(skipped) == 1, texts
    assert "distilbert-tiny/xnnpack run" not in skipped[0], "the second never ran the cell"
    assert all("IntegrityError" not in text and "not recorded" not in text for text in texts), texts
    with sqlite3.connect(tmp_path / "history.sqlite") as connection:
        assert connection.execute("select count(*) from runs").fetchone()[0] == 1
    connection.close()
