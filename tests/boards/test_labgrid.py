"""Shared labs on labgrid, end to end through `fab`: a real labgrid coordinator and exporter on 127.0.0.1 publish the
suite's sshd boards as places (made with `labgrid-client`); etlab resolves, reserves, locks and releases them.

"alice" is another person of the lab: `labgrid-client` run with LG_USERNAME=alice.
"""

from __future__ import annotations

import getpass
import json
import os
import re
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from orchestrator import paths
from orchestrator.boards.inventory import Board, parse_inventory
from orchestrator.errors import InventoryError
from orchestrator.lowering.lower import LoweringResult
from orchestrator.paths import PROJECT_ROOT
from orchestrator.testing.labgrid import LabgridLab, SilentPort
from orchestrator.testing.sshd import SshdBoard, SshdLab
from tests.plugins.artifacts import ARTIFACT_CACHE
from tests.plugins.processes import reaped

PLACES = ["lg-a", "lg-b"]
SILENT = "lg-silent"  # a place whose board never answers SSH: a job there stays busy for its connect_timeout
ALICE = "alice"


def our_client() -> str:
    """The name etlab has on the coordinator, as labgrid forms it (`host/user`)."""
    host = os.environ.get("LG_HOSTNAME", socket.gethostname())
    return f"{host}/{os.environ.get('LG_USERNAME', getpass.getuser())}"


@dataclass
class Lab:
    labgrid: LabgridLab
    fakes: dict[str, SshdBoard]
    inventory: Path
    folder: Path

    def alice(self, command: str, place: str) -> None:
        self.labgrid.client(command, place=place, user=ALICE)


def write_inventory(path: Path, sshd: SshdLab, coordinator: str, *, nightly: dict[str, Any] | None = None) -> Path:
    document: dict[str, Any] = {
        "defaults": {
            "key": str(sshd.client_key),
            "known_hosts": str(sshd.known_hosts),
            "connect_timeout": 5,
            "keepalive": 2,
            "tcp_user_timeout": 10,
            "labgrid": {"coordinator": coordinator},
        },
        "boards": {
            **{place: {"labgrid": {"place": place}} for place in PLACES},
            "pis": {"labgrid": {"tags": {"board": "pi5"}}},
            SILENT: {"labgrid": {"place": SILENT}, "connect_timeout": 12},
        },
    }
    if nightly:
        document["nightly"] = nightly
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    return path


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


def fab_argv(*args: str, lab: Lab) -> list[str]:
    return [sys.executable, "-m", "fabric", *args, "--inventory", str(lab.inventory)]


def fab_env(results: Path) -> dict[str, str]:
    # Wide enough that the boards table never cuts a cell the tests read.
    return {**os.environ, "ETLAB_ARTIFACTS": str(ARTIFACT_CACHE), "ETLAB_RESULTS": str(results), "ETLAB_WIDTH": "400"}


def fab(*args: str, lab: Lab, results: Path, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        fab_argv(*args, lab=lab), cwd=PROJECT_ROOT, env=fab_env(results), capture_output=True, text=True,
        timeout=timeout,
    )  # fmt: skip


def fab_background(*args: str, lab: Lab, results: Path, log: Path) -> subprocess.Popen[bytes]:
    """A `fab` task in the background, its output (stdout and stderr) going to `log`."""
    with open(log, "wb") as out:
        return subprocess.Popen(
            fab_argv(*args, lab=lab), cwd=PROJECT_ROOT, env=fab_env(results), stdout=out, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip


def wait_for(condition: Any, what: str, timeout: float = 120) -> None:
    """Poll `condition()` until true; fail naming `what` (a bound on a hang, never a timing assertion)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def output(log: Path) -> str:
    return log.read_text(errors="replace")


def pushed_models(fake: SshdBoard) -> list[Path]:
    models = fake.workdir_path / "models"
    return sorted(models.glob("*.pte")) if models.exists() else []


def no_reservation_of_ours(lab: Lab) -> bool:
    return our_client() not in lab.labgrid.reservation_owners()


def run_to_end(process: subprocess.Popen[bytes], timeout: float = 300) -> int:
    return process.wait(timeout=timeout)


# ---------------------------------------------------------------- inventory


def test_labgrid_inventory_section_is_checked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("LG_COORDINATOR", raising=False)
    text = """\
defaults:
  labgrid: {coordinator: "lab:20408"}
boards:
  good: {labgrid: {place: pi5-a}, threads: 4}
  selector: {labgrid: {tags: {board: pi5}}}
  both: {labgrid: {place: x, tags: {board: a}}}
  address: {labgrid: {place: x}, host: 10.0.0.1}
  typo: {labgrid: {plase: x}}
  tag: {labgrid: {tags: {Board: x}}}
  coordinator: {labgrid: {place: x, coordinator: nowhere}}
"""
    with pytest.raises(InventoryError) as caught:
        parse_inventory(text, tmp_path / "inventory.yaml")
    lines = str(caught.value).splitlines()
    where = str(tmp_path / "inventory.yaml")
    assert lines == [
        f"{where}:6: boards.both.labgrid: give either 'place' (one place) or 'tags' (every place with those tags)",
        f"{where}:7: boards.address.host: not allowed with 'labgrid': comes from the labgrid place's NetworkService",
        f"{where}:8: boards.typo.labgrid.plase: unknown key 'plase' (did you mean 'place'?); allowed: place, tags, "
        "coordinator",
        f"{where}:9: boards.tag.labgrid.tags: tag name 'Board' must match [a-z][a-z0-9_]+",
        f"{where}:10: boards.coordinator.labgrid.coordinator: expected HOST:PORT (port 1-65535), got 'nowhere'",
    ]
    good = "\n".join(text.splitlines()[:5]) + "\n"
    inventory = parse_inventory(good, tmp_path / "inventory.yaml")
    assert inventory.boards["good"].labgrid is not None and inventory.boards["good"].labgrid.place == "pi5-a"
    assert inventory.boards["good"].labgrid.coordinator == "lab:20408" and inventory.boards["good"].host is None
    assert inventory.boards["selector"].labgrid is not None
    assert inventory.boards["selector"].labgrid.tags == (("board", "pi5"),)

    # Without defaults.labgrid the coordinator comes from LG_COORDINATOR, and without either it is an error.
    bare = "boards:\n  one: {labgrid: {place: p}}\n"
    with pytest.raises(InventoryError, match=r"inventory.yaml:2: boards.one.labgrid.coordinator: no labgrid coord"):
        parse_inventory(bare, tmp_path / "inventory.yaml")
    monkeypatch.setenv("LG_COORDINATOR", "ci-lab:20408")
    one = parse_inventory(bare, tmp_path / "inventory.yaml").boards["one"]
    assert one.labgrid is not None and one.labgrid.coordinator == "ci-lab:20408"


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
        assert lab.labgrid.holder("lg-b").endswith(f"/{ALICE}")  # alice keeps her place
    finally:
        lab.alice("release", "lg-b")
    text = done.stdout + done.stderr
    assert done.returncode == 69, text  # the only failure: a board that could not be had
    assert re.search(rf"labgrid place lg-b is still held by \S+/{ALICE} after waiting .* \(--lg-wait 1\)", text), text
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


def test_a_lost_coordinator_fails_the_affected_boards_without_a_hang(
    private_labgrid_lab: LabgridLab, sshd_lab: SshdLab, tmp_path: Path
) -> None:
    lg = private_labgrid_lab
    silent = SilentPort()
    try:
        exporter = lg.publish({SILENT: (silent.address, silent.port)})
        lg.add_place(SILENT, exporter, SILENT)
        inventory = write_inventory(tmp_path / "inventory.yaml", sshd_lab, lg.address)
        private = Lab(lg, {}, inventory, tmp_path)
        log = tmp_path / "fab.log"
        process = fab_background("gc", "--board", SILENT, lab=private, results=tmp_path, log=log)
        with reaped(process):
            wait_for(lambda: f"labgrid place {SILENT} locked" in output(log), "etlab to lock the place")
            assert lg.holder(SILENT) == our_client()
            lg.kill_coordinator()
            code = run_to_end(process, timeout=120)  # the bound on a hang
    finally:
        silent.close()
    text = output(log)
    assert code == 69, text
    assert f"lost the labgrid coordinator {lg.address} while holding place {SILENT}" in text, text
    assert f"labgrid-client -x {lg.address} -p {SILENT} release" in text  # how to free it once the coordinator is back
    # The note that lets the next etlab recover the place stays (the coordinator could not be told); this test's
    # coordinator is gone for good, so its note goes too.
    notes = list((paths.state_dir() / "labgrid").glob(f"127.0.0.1_{lg.port}--*.json"))
    assert len(notes) == 1
    notes[0].unlink()


def test_an_unreachable_coordinator_fails_clearly(sshd_lab: SshdLab, tmp_path: Path) -> None:
    closed = SilentPort()
    address = f"127.0.0.1:{closed.port}"
    closed.close()  # nothing listens there any more
    inventory = write_inventory(tmp_path / "inventory.yaml", sshd_lab, address)
    done = fab("gc", "--board", "lg-a", lab=Lab(None, {}, inventory, tmp_path), results=tmp_path)  # type: ignore[arg-type]
    text = done.stdout + done.stderr
    assert done.returncode == 69, text
    assert f"labgrid coordinator {address} is unavailable" in text and "lg-a (labgrid):" in text, text
    assert "Traceback" not in text and "ERROR:root" not in text


def test_fab_boards_shows_places_with_their_holders(lab: Lab, tmp_path: Path) -> None:
    lab.alice("acquire", "lg-b")
    try:
        shown = fab("boards", "--board", "lg-a,lg-b", lab=lab, results=tmp_path)
        assert lab.labgrid.holder("lg-b").endswith(f"/{ALICE}")  # fab boards only looks: it took nothing
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


def test_a_place_whose_name_is_not_a_board_name_is_refused(private_labgrid_lab: LabgridLab, tmp_path: Path) -> None:
    """Places named `..` or holding `/` on the coordinator, matching a tag selector: refused by name (exit 65), never a
    board name, a results folder or a note's path; `fab nightly` refuses them before it opens the history."""
    lg = private_labgrid_lab
    for place in ("..", "evil/../../../escape"):
        lg.client("create", place=place)
        lg.client("set-tags", "board=hostile", place=place)
    inventory = tmp_path / "inventory.yaml"
    history = tmp_path / "history.sqlite"
    inventory.write_text(yaml.safe_dump({
        "defaults": {"labgrid": {"coordinator": lg.address}},
        "boards": {"hostile": {"labgrid": {"tags": {"board": "hostile"}}}},
        "nightly": {"history": f"sqlite:///{history}", "reports": str(tmp_path / "reports"),
                    "matrix": [{"models": ["distilbert-tiny"], "backends": ["xnnpack"], "boards": ["hostile"]}]},
    }))  # fmt: skip
    lab = Lab(lg, {}, inventory, tmp_path)
    results = tmp_path / "results"
    for args in (("boards", "--board", "hostile"), ("gc", "--board", "hostile"), ("nightly",)):
        done = fab(*args, lab=lab, results=results)
        text = done.stdout + done.stderr
        assert done.returncode == 65, text
        assert f"labgrid place '..' on {lg.address} matches places tagged board=hostile" in text, text
        assert "cannot be a board name" in text and "Traceback" not in text, text
    assert not history.exists() and not results.exists()
    assert not list((paths.state_dir() / "labgrid").glob(f"127.0.0.1_{lg.port}--*")), "no note of a hostile place"
    assert lg.reservation_owners() == [], "nothing reserved"


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
