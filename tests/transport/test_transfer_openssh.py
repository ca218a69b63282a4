"""Bulk transfers through OpenSSH's ssh client against real OpenSSH servers: which transfers take it, odd names and
paths, the pinned host key, failures classified, a link that drops mid-stream."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from orchestrator.errors import HostKeyError, TransferError
from orchestrator.fsutil import TMP_PREFIX
from orchestrator.transport import AuthError, CommandResult, LinkError, connect
from orchestrator.transport.pull import pull_bundle
from orchestrator.transport.ssh import BULK_FROM, SshConnection
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

# ---------------------------------------------------------------- bulk streams (OpenSSH)


def openssh_sessions(fake: SshdBoard) -> int:
    """How many connections the board's sshd has accepted from OpenSSH's client (sshd logs at DEBUG1)."""
    return fake.log_text().count("remote software version OpenSSH")


def test_auto_mode_sends_large_transfers_through_openssh_and_small_ones_through_paramiko(
    sshd_boards, tmp_path: Path
) -> None:
    (fake,) = sshd_boards(1, sshd_config=["LogLevel DEBUG1"])
    small, small_digest = make_model(tmp_path, 1 << 20, name="small.pte")
    large, large_digest = make_model(tmp_path, BULK_FROM + 1, name="large.pte")
    write_bundle(fake.workdir_path / "bundles" / "small", {"etdump.etdp": os.urandom(1000)})
    write_bundle(fake.workdir_path / "bundles" / "large", {"etdump.etdp": os.urandom(BULK_FROM + 4096)})
    with connect(fake.board) as conn:
        assert conn.bulk_threshold() == BULK_FROM
        push_file(conn, small)
        pull_bundle(conn, "~/.etlab/bundles/small", tmp_path / "small")
        assert openssh_sessions(fake) == 0
        push_file(conn, large)
        assert openssh_sessions(fake) == 1
        pull_bundle(conn, "~/.etlab/bundles/large", tmp_path / "large")
        assert openssh_sessions(fake) == 2
        assert push_file(conn, large).skipped  # asked over paramiko: no second handshake for content it holds
        assert openssh_sessions(fake) == 2
    models = fake.workdir_path / "models"
    assert sha((models / f"{large_digest}.pte").read_bytes()) == large_digest
    assert sha((models / f"{small_digest}.pte").read_bytes()) == small_digest
    pulled, sent = tmp_path / "large" / "etdump.etdp", fake.workdir_path / "bundles" / "large" / "etdump.etdp"
    assert pulled.read_bytes() == sent.read_bytes()
    with connect(fake.board.replace(bulk_transfer="paramiko")) as conn:
        assert conn.bulk_threshold() is None
        push_file(conn, large, kind="again")
        pull_bundle(conn, "~/.etlab/bundles/large", tmp_path / "large-again")
    assert openssh_sessions(fake) == 2


def test_openssh_streams_round_trip_odd_names_and_paths(sshd_boards, tmp_path: Path) -> None:
    # bulk_transfer: openssh sends every transfer through ssh, whose remote command is one shell string.
    (fake,) = sshd_boards(1, names=["pi 'odd' $b;`c`"], workdir=f"~/{ODD}", bulk_transfer="openssh")
    known_hosts = tmp_path / "state 100% $HOME" / "known hosts"  # ssh expands %-tokens and splits on blanks
    board = fake.board.replace(known_hosts=known_hosts)
    folder = tmp_path / ODD
    folder.mkdir()
    model, digest = make_model(folder, 70_000, name="my 'model' $1;`x`.pte")
    remote = fake.home / ODD / "bundles" / f"run {ODD}"
    write_bundle(remote, BUNDLE)
    with connect(board) as conn:
        assert conn.bulk_threshold() == 0
        assert push_file(conn, model, kind="inputs", suffix=".etlt").remote_path == str(
            fake.home / ODD / "inputs" / f"{digest}.etlt"
        )
        assert push_file(conn, model, kind="inputs", suffix=".etlt").skipped
        dest = tmp_path / "pulled" / ODD
        pull_bundle(conn, f"~/{ODD}/bundles/run {ODD}", dest)
        with pytest.raises(TransferError, match="No such file or directory"):
            pull_bundle(conn, f"~/{ODD}/bundles/missing", tmp_path / "missing")
    assert (fake.home / ODD / "inputs" / f"{digest}.etlt").read_bytes() == model.read_bytes()
    assert {name: (dest / name).read_bytes() for name in BUNDLE} == BUNDLE
    assert known_hosts.read_text().count(fake.address) == 1


def test_openssh_checks_the_pinned_host_key_and_never_pins_one_itself(sshd_board: SshdBoard, tmp_path: Path) -> None:
    with connect(sshd_board.board) as conn:  # paramiko pins the key on first use
        assert conn.run(["true"]).ok
    name = f"[{sshd_board.address}]:{sshd_board.port} "
    (pinned,) = [line + "\n" for line in sshd_board.board.known_hosts.read_text().splitlines() if line.startswith(name)]
    for known_hosts, expected in [
        (pinned, None),  # the pinned key: accepted
        ("", HostKeyError),  # unknown to the file: ssh must not trust it on its own
        (
            pinned.replace(pinned.split()[2], "AAAAC3NzaC1lZDI1NTE5AAAAIHhYMQoBqZfRiYKkhCbtXWBMJFdxCoTpxBOZf8cy+gJp"),
            HostKeyError,
        ),  # a different key pinned: refused
    ]:
        path = tmp_path / "kh" / str(len(known_hosts))
        path.parent.mkdir(exist_ok=True)
        path.write_text(known_hosts)
        conn = SshConnection(sshd_board.board, known_hosts=path)
        done = subprocess.run(conn.openssh_argv(["echo", "reached"]), capture_output=True, text=True, timeout=60)
        if expected is None:
            assert (done.returncode, done.stdout) == (0, "reached\n")
        else:
            assert done.returncode == 255 and "reached" not in done.stdout
            error = conn._openssh_failure(CommandResult(("x",), done.returncode, done.stdout, done.stderr, 0.0))
            assert isinstance(error, expected), done.stderr
        assert path.read_text() == known_hosts  # ssh never writes our file


def test_openssh_failures_are_classified(sshd_board: SshdBoard, tmp_path: Path) -> None:
    conn = SshConnection(sshd_board.board)
    with connect(sshd_board.board):  # pins the key
        pass
    stranger = tmp_path / "stranger_ed25519"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(stranger)], check=True)
    refused = SshConnection(sshd_board.board.replace(key=stranger))
    done = subprocess.run(refused.openssh_argv(["true"]), capture_output=True, text=True, timeout=60)
    result = CommandResult(("true",), done.returncode, "", done.stderr, 0.0)
    assert isinstance(refused._openssh_failure(result), AuthError), done.stderr
    sshd_board.stop()
    done = subprocess.run(conn.openssh_argv(["true"]), capture_output=True, text=True, timeout=60)
    result = CommandResult(("true",), done.returncode, "", done.stderr, 0.0)
    assert done.returncode == 255 and isinstance(conn._openssh_failure(result), LinkError), done.stderr


@pytest.mark.timeout(180)
@pytest.mark.parametrize("bulk", BULK_MODES)
def test_pull_recovers_when_the_link_drops_mid_stream(netns_board: NetnsBoard, tmp_path: Path, bulk: str) -> None:
    payload = os.urandom(48 << 20)
    write_bundle(netns_board.workdir_path / "bundles" / "big", {"etdump.etdp": payload})
    dest = tmp_path / "results" / "big"
    with (
        link_cut_once(netns_board, dest.parent, f"{TMP_PREFIX}*/etdump.etdp") as cut,
        connect(netns_board.board.replace(bulk_transfer=bulk)) as conn,
    ):
        pull_bundle(conn, "~/.etlab/bundles/big", dest, retry=RetryPolicy(attempts=8, initial_wait=1.0))
    assert cut.is_set(), "the transfer finished before the link could be cut"
    assert (dest / "etdump.etdp").read_bytes() == payload
    assert leftovers(dest.parent) == []
    shutil.rmtree(netns_board.workdir_path / "bundles" / "big")  # pytest keeps recent temporary folders
    shutil.rmtree(dest)
