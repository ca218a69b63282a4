"""Shared labs on labgrid when something is wrong: the inventory's labgrid section checked, a coordinator lost while
etlab holds a place or unreachable from the start, and places whose names are not board names; each on a coordinator
of the test's own or none. The lab that works: test_labgrid.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from orchestrator import paths
from orchestrator.boards.inventory import parse_inventory
from orchestrator.errors import InventoryError
from orchestrator.testing.labgrid import LabgridLab, SilentPort
from orchestrator.testing.sshd import SshdLab
from tests.boards.labgrid_helpers import (
    SILENT,
    Lab,
    fab,
    fab_background,
    our_client,
    output,
    run_to_end,
    wait_for,
    write_inventory,
)
from tests.plugins.processes import reaped

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
    assert inventory.boards["good"].labgrid.coordinator == "lab:20408" and inventory.boards["good"].ssh.host is None
    assert inventory.boards["selector"].labgrid is not None
    assert inventory.boards["selector"].labgrid.tags == (("board", "pi5"),)

    # Without defaults.labgrid the coordinator comes from LG_COORDINATOR, and without either it is an error.
    bare = "boards:\n  one: {labgrid: {place: p}}\n"
    with pytest.raises(InventoryError, match=r"inventory.yaml:2: boards.one.labgrid.coordinator: no labgrid coord"):
        parse_inventory(bare, tmp_path / "inventory.yaml")
    monkeypatch.setenv("LG_COORDINATOR", "ci-lab:20408")
    one = parse_inventory(bare, tmp_path / "inventory.yaml").boards["one"]
    assert one.labgrid is not None and one.labgrid.coordinator == "ci-lab:20408"


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
