"""Pushes and pulls against real OpenSSH servers and the local board: content addressing, verification, retries, a
link that dies mid-transfer. OpenSSH bulk streams: test_transfer_openssh.py; hostile archives: test_pull_archives.py."""

from __future__ import annotations

import json
import os
import shutil
import threading
import time
from pathlib import Path

import pytest

from orchestrator import console
from orchestrator.boards.inventory import Board
from orchestrator.errors import BundleError, EtlabError, TransferError
from orchestrator.fsutil import TMP_PREFIX
from orchestrator.results.bundle import MANIFEST
from orchestrator.transport import connect, transfer
from orchestrator.transport.pull import pull_bundle
from orchestrator.transport.transfer import RetryPolicy, push_file
from tests.plugins.sshd import NetnsBoard, SshdBoard
from tests.transport.transfer_helpers import (
    BULK_MODES,
    BUNDLE,
    ODD,
    leftovers,
    link_cut_once,
    make_model,
    sha,
    write_bundle,
)


@pytest.fixture
def local_board(tmp_path: Path) -> Board:
    return Board(name="local", transport="local", workdir=str(tmp_path / "local board"))


# ---------------------------------------------------------------- push


def test_push_is_content_addressed_and_skips_unchanged_content(sshd_board: SshdBoard, tmp_path: Path) -> None:
    model, digest = make_model(tmp_path, 3 << 20)
    with connect(sshd_board.board) as conn, console.transfer_progress() as progress:
        first = push_file(conn, model, progress=progress)
        again = push_file(conn, model, sha256=digest, progress=progress)
    assert [task.completed for task in progress.tasks] == [3 << 20, 3 << 20]
    assert progress.tasks[1].description.endswith("(already there)")
    models = sshd_board.workdir_path / "models"
    final = models / f"{digest}.pte"
    assert (first.skipped, again.skipped) == (False, True)
    assert first.remote_path == again.remote_path == str(final)
    assert (first.sha256, first.size, first.attempts) == (digest, 3 << 20, 1)
    assert final.read_bytes() == model.read_bytes()
    assert (models / f"{digest}.pte.sha256").read_text() == f"{digest}  {digest}.pte\n"
    assert sorted(p.name for p in models.iterdir()) == [f"{digest}.pte", f"{digest}.pte.sha256"]


def test_push_repairs_a_truncated_final_file(sshd_board: SshdBoard, tmp_path: Path) -> None:
    model, digest = make_model(tmp_path, 1 << 20)
    with connect(sshd_board.board) as conn:
        push_file(conn, model)
        final = sshd_board.workdir_path / "models" / f"{digest}.pte"
        final.write_bytes(model.read_bytes()[:1000])  # e.g. a board that lost power mid-write
        repaired = push_file(conn, model)
    assert not repaired.skipped and sha(final.read_bytes()) == digest


def test_push_round_trips_odd_paths_and_names(sshd_boards, tmp_path: Path) -> None:
    (fake,) = sshd_boards(1, names=["pi 'odd' $b;`c`"], workdir=f"~/{ODD}")
    folder = tmp_path / ODD
    folder.mkdir()
    model, digest = make_model(folder, 70_000, name="my 'model' $1;`x`.pte")
    with connect(fake.board) as conn:
        result = push_file(conn, model, kind="inputs", suffix=".etlt")
        assert push_file(conn, model, kind="inputs", suffix=".etlt").skipped
    stored = fake.home / ODD / "inputs" / f"{digest}.etlt"
    assert result.remote_path == str(stored)
    assert stored.read_bytes() == model.read_bytes()


def test_push_refuses_bad_arguments(sshd_board: SshdBoard, tmp_path: Path) -> None:
    model, _ = make_model(tmp_path, 10)
    with connect(sshd_board.board) as conn:
        with pytest.raises(EtlabError, match="invalid kind"):
            push_file(conn, model, kind="../etc")
        with pytest.raises(EtlabError, match="invalid suffix"):
            push_file(conn, model, suffix=".pte; rm -rf ~")
        with pytest.raises(EtlabError, match="invalid sha256"):
            push_file(conn, model, sha256="abc")
        with pytest.raises(EtlabError, match="not a file"):
            push_file(conn, tmp_path / "missing.pte")


def test_a_wrong_sha256_is_caught_on_the_board_and_leaves_nothing(sshd_board: SshdBoard, tmp_path: Path) -> None:
    model, _ = make_model(tmp_path, 2 << 20)
    wrong = "0" * 64
    with connect(sshd_board.board) as conn, pytest.raises(TransferError, match="arrived with sha256") as caught:
        push_file(conn, model, sha256=wrong)
    assert sha(model.read_bytes()) in str(caught.value)
    models = sshd_board.workdir_path / "models"
    assert list(models.iterdir()) == []


@pytest.mark.parametrize("receive_hashing", [False, True], ids=["hash after", "hash while receiving"])
@pytest.mark.parametrize("hasher", ["sha256sum", "python3", "openssl"])
def test_push_verifies_with_whichever_hasher_the_board_has(
    sshd_boards, tmp_path: Path, hasher: str, receive_hashing: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Hashing while receiving needs python3 on the board; the other boards fall back to hashing afterwards.
    monkeypatch.setattr(transfer, "RECEIVE_HASHING_FROM", 0 if receive_hashing else 1 << 40)
    tools = ["sh", "cat", "tee", "mv", "rm", "mkdir", "find", "wc", hasher]
    bin_dir = tmp_path / "board-bin"
    bin_dir.mkdir()
    for tool in tools:  # the system's tools, as on a board (not this process's PATH, which may hold shims)
        (bin_dir / tool).symlink_to(shutil.which(tool, path="/usr/bin:/bin") or tool)
    (fake,) = sshd_boards(1, session_env={"PATH": str(bin_dir)})
    model, digest = make_model(tmp_path, 1 << 20)
    with connect(fake.board) as conn:
        found = conn.run(["sh", "-c", "for t in openssl sha256sum python3; do command -v $t; done; true"]).stdout
        assert [Path(line).name for line in found.split()] == [hasher]
        push_file(conn, model)
        with pytest.raises(TransferError, match="arrived with sha256"):
            push_file(conn, model, sha256="e" * 64)
    assert (fake.workdir_path / "models" / f"{digest}.pte").read_bytes() == model.read_bytes()


def test_push_removes_old_temporaries_of_the_same_content_only(sshd_board: SshdBoard, tmp_path: Path) -> None:
    model, digest = make_model(tmp_path, 1000)
    models = sshd_board.workdir_path / "models"
    models.mkdir(parents=True)
    old = models / f"{TMP_PREFIX}{digest}.pte.deadbeef"  # left by a push that died long ago
    recent = models / f"{TMP_PREFIX}{digest}.pte.feedface"  # perhaps another workstation's push, right now
    other = models / f"{TMP_PREFIX}{'1' * 64}.pte.cafe"  # other content: not ours to judge
    for path in (old, recent, other):
        path.write_bytes(b"partial")
    an_hour_ago = time.time() - 3600
    os.utime(old, (an_hour_ago, an_hour_ago))
    os.utime(other, (an_hour_ago, an_hour_ago))
    with connect(sshd_board.board) as conn:
        push_file(conn, model)
    assert leftovers(models) == sorted([recent.name, other.name])


@pytest.mark.timeout(300)
@pytest.mark.parametrize("bulk", BULK_MODES)
def test_push_survives_sshd_dying_mid_transfer_and_never_shows_a_corrupt_file(
    sshd_boards, tmp_path: Path, capsys: pytest.CaptureFixture[str], bulk: str
) -> None:
    (sshd_board,) = sshd_boards(1, bulk_transfer=bulk)
    size = 128 << 20
    model, digest = make_model(tmp_path, size)
    models = sshd_board.workdir_path / "models"
    final, sidecar = models / f"{digest}.pte", models / f"{digest}.pte.sha256"
    violations: list[str] = []
    killed = threading.Event()
    done = threading.Event()

    def watch() -> None:
        # Poll the board's folder throughout: the final name and the sidecar may only ever appear complete,
        # and the sidecar never before the file.
        while not done.is_set():
            if sidecar.exists() and not final.exists():
                violations.append("sidecar without the file")
            if final.exists() and final.stat().st_size != size:
                violations.append(f"final file of {final.stat().st_size} bytes")
            if not killed.is_set():
                temps = [p for p in models.glob(f"{TMP_PREFIX}*")] if models.exists() else []
                if any(p.stat().st_size > 16 << 20 for p in temps if p.exists()):
                    sshd_board.stop()  # kills sshd and the session writing the file, as a power cut would
                    killed.set()
                    time.sleep(1.0)
                    sshd_board.start()
            time.sleep(0.002)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        with connect(sshd_board.board) as conn:
            result = push_file(conn, model, sha256=digest, retry=RetryPolicy(attempts=6, initial_wait=0.5))
    finally:
        done.set()
        watcher.join()
    assert killed.is_set(), "the transfer finished before the server could be killed"
    assert violations == []
    assert result.attempts >= 2 and not result.skipped
    assert sha(final.read_bytes()) == digest
    assert sidecar.read_text().startswith(digest)
    assert leftovers(models) == []  # the dead attempt's temporary was removed by the retry
    warning = capsys.readouterr().err
    assert "retry 2/6" in warning and sshd_board.name in warning
    model.unlink()  # pytest keeps recent temporary folders: do not leave 256 MiB behind
    final.unlink()


@pytest.mark.timeout(120)
@pytest.mark.parametrize("bulk", BULK_MODES)
def test_push_over_a_dead_link_fails_as_a_transfer_error(netns_board: NetnsBoard, tmp_path: Path, bulk: str) -> None:
    model, _ = make_model(tmp_path, 8 << 20)
    with connect(netns_board.board.replace(bulk_transfer=bulk)) as conn:
        netns_board.blackhole()
        try:
            with pytest.raises(TransferError, match=r"push of model.pte failed after 2 attempt\(s\)"):
                push_file(conn, model, retry=RetryPolicy(attempts=2, initial_wait=0.1))
        finally:
            netns_board.restore()
        assert push_file(conn, model).attempts == 1


@pytest.mark.timeout(180)
@pytest.mark.parametrize("bulk", BULK_MODES)
def test_push_recovers_when_the_link_drops_mid_write(netns_board: NetnsBoard, tmp_path: Path, bulk: str) -> None:
    """A 5-second blackhole mid-write fails the attempt under way, and the retry delivers the file whole. A push
    survives such a cut in one attempt only when the cut came after its last reply (a watcher starved on a loaded
    machine saw the file late): that sample proves nothing either way, so a new file is pushed (at most 3)."""
    size = 48 << 20
    models = netns_board.workdir_path / "models"
    for _ in range(3):
        model, digest = make_model(tmp_path, size)
        with (
            link_cut_once(netns_board, models, f"{TMP_PREFIX}*") as cut,
            connect(netns_board.board.replace(bulk_transfer=bulk)) as conn,
        ):
            result = push_file(conn, model, sha256=digest, retry=RetryPolicy(attempts=8, initial_wait=1.0))
        assert cut.is_set(), "the transfer finished before the link could be cut"
        assert sha((models / f"{digest}.pte").read_bytes()) == digest
        model.unlink()
        (models / f"{digest}.pte").unlink()
        if result.attempts >= 2:
            break
    assert result.attempts >= 2


def test_local_board_push_uses_the_same_rules(local_board: Board, tmp_path: Path) -> None:
    model, digest = make_model(tmp_path, 1 << 20)
    with connect(local_board) as conn:
        first = push_file(conn, model)
        again = push_file(conn, model)
        with pytest.raises(TransferError, match="arrived with sha256"):
            push_file(conn, model, sha256="f" * 64)
    models = Path(local_board.workdir) / "models"
    assert (first.skipped, again.skipped) == (False, True)
    assert (models / f"{digest}.pte").read_bytes() == model.read_bytes()
    assert (models / f"{digest}.pte.sha256").read_text() == f"{digest}  {digest}.pte\n"
    assert not (models / f"{'f' * 64}.pte").exists() and leftovers(models) == []


# ---------------------------------------------------------------- pull


def test_pull_copies_and_verifies_a_bundle(sshd_board: SshdBoard, tmp_path: Path) -> None:
    remote = sshd_board.workdir_path / "bundles" / f"run {ODD}"
    write_bundle(remote, BUNDLE)
    dest = tmp_path / "results" / f"board {ODD}" / "run-1"
    with connect(sshd_board.board) as conn:
        assert pull_bundle(conn, f"~/.etlab/bundles/run {ODD}", dest) == dest
        for name, data in BUNDLE.items():
            assert (dest / name).read_bytes() == data
        assert json.loads((dest / MANIFEST).read_text())["files"].keys() == BUNDLE.keys()
        assert leftovers(dest.parent) == []
        with pytest.raises(EtlabError, match="already exists"):
            pull_bundle(conn, f"~/.etlab/bundles/run {ODD}", dest)
    assert (dest / "timings.json").read_bytes() == BUNDLE["timings.json"]  # untouched by the refused pull


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        ("tamper", r"etdump.etdp: sha256 [0-9a-f]{64}, the manifest says"),
        ("extra", r"stray.txt: not listed in the manifest"),
        ("missing", r"outputs.etlt: listed in the manifest but missing"),
        ("no manifest", r"has no result_manifest.json: it is incomplete"),
        ("bad manifest", r"result_manifest.json: not valid JSON"),
    ],
)
def test_pull_refuses_a_bundle_that_does_not_match_its_manifest(
    sshd_board: SshdBoard, tmp_path: Path, damage: str, message: str
) -> None:
    remote = sshd_board.workdir_path / "bundles" / "r1"
    write_bundle(remote, BUNDLE)
    if damage == "tamper":
        data = bytearray((remote / "etdump.etdp").read_bytes())
        data[1000] ^= 0xFF
        (remote / "etdump.etdp").write_bytes(bytes(data))
    elif damage == "extra":
        (remote / "stray.txt").write_text("not in the manifest")
    elif damage == "missing":
        (remote / "outputs.etlt").unlink()
    elif damage == "no manifest":
        (remote / MANIFEST).unlink()
    else:
        (remote / MANIFEST).write_text('{"files": ')
    dest = tmp_path / "results" / "r1"
    with connect(sshd_board.board) as conn, pytest.raises(BundleError, match=message):
        pull_bundle(conn, "~/.etlab/bundles/r1", dest)
    assert not dest.exists() and leftovers(dest.parent) == []


def test_pull_refuses_a_symlink_out_of_the_bundle(sshd_board: SshdBoard, tmp_path: Path) -> None:
    remote = sshd_board.workdir_path / "bundles" / "evil"
    write_bundle(remote, {"timings.json": b"{}"})
    secret = tmp_path / "secret"
    secret.write_text("workstation secret")
    (remote / "link").symlink_to(secret)
    dest = tmp_path / "results" / "evil"
    with connect(sshd_board.board) as conn, pytest.raises(BundleError, match="'link' is a symbolic link"):
        pull_bundle(conn, "~/.etlab/bundles/evil", dest)
    assert not dest.exists() and leftovers(dest.parent) == []
    assert secret.read_text() == "workstation secret"


def test_pull_of_a_missing_bundle_says_why(sshd_board: SshdBoard, tmp_path: Path) -> None:
    with connect(sshd_board.board) as conn, pytest.raises(TransferError, match="No such file or directory"):
        pull_bundle(conn, "~/.etlab/bundles/nope", tmp_path / "nope")
    assert not (tmp_path / "nope").exists()


def test_pull_from_the_local_board(local_board: Board, tmp_path: Path) -> None:
    remote = Path(local_board.workdir) / "bundles" / "r1"
    write_bundle(remote, BUNDLE)
    dest = tmp_path / "results" / "r1"
    with connect(local_board) as conn:
        pull_bundle(conn, str(remote), dest)
    assert {str(p.relative_to(dest)) for p in dest.rglob("*") if p.is_file()} == {*BUNDLE, MANIFEST}


def test_local_pull_refuses_a_symlink_while_tar_is_still_writing(local_board: Board, tmp_path: Path) -> None:
    remote = Path(local_board.workdir) / "bundles" / "evil"
    write_bundle(remote, {"etdump.etdp": os.urandom(4 << 20), "timings.json": os.urandom(4 << 20)})
    (remote / "link").symlink_to("/etc/passwd")
    dest = tmp_path / "results" / "evil"
    with connect(local_board) as conn, pytest.raises(BundleError, match="'link' is a symbolic link"):
        pull_bundle(conn, str(remote), dest)
    assert not dest.exists() and leftovers(dest.parent) == []
