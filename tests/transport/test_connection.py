"""Connections against real OpenSSH servers (and the local transport): quoting, streams, errors, host keys."""

from __future__ import annotations

import contextlib
import os
import shlex
import subprocess
import sys
import threading
from pathlib import Path

import paramiko
import pytest

from orchestrator.boards.inventory import Board
from orchestrator.errors import BoardError, HostKeyError, UsageError
from orchestrator.transport import (
    OUTPUT_LIMIT,
    AuthError,
    CommandError,
    CommandTimeout,
    LinkError,
    connect,
    is_transient,
)
from orchestrator.transport.hostkeys import KnownHosts, host_id
from orchestrator.transport.local import LocalConnection, open_local
from orchestrator.transport.ssh import SshConnection, open_ssh
from tests.plugins.sshd import NetnsBoard, SshdBoard, SshdLab, keygen

NASTY = [
    "plain",
    "with space",
    "it's",
    'say "hi"',
    "$HOME",
    "${PATH}",
    "a;b",
    "`id`",
    "$(id)",
    "line1\nline2",
    "tab\there",
    "star*?[x]",
    "back\\slash",
    "--option-like",
    "~",
    "",
    "unicodé ✓",
]
NASTY_BOARD_NAME = "board 'q' \"d\" $x; `y` & | <z>"


def nul_split(text: str) -> list[str]:
    return text.split("\0")[:-1]


@pytest.fixture
def local_board(tmp_path: Path) -> Board:
    return Board(name="local", transport="local", workdir=str(tmp_path / "local wd"))


def test_run_round_trips_every_argument_exactly(sshd_boards) -> None:
    (fake,) = sshd_boards(1, names=[NASTY_BOARD_NAME])
    with connect(fake.board) as conn:
        result = conn.run(["printf", "%s\\0", *NASTY])
        assert nul_split(result.stdout) == NASTY
        assert result.exit_code == 0 and result.argv[0] == "printf"
        assert conn.board.name == NASTY_BOARD_NAME


def test_env_values_are_passed_literally(sshd_board: SshdBoard) -> None:
    with connect(sshd_board.board) as conn:
        env = {"ETLAB_A": "$HOME; echo pwned `id`", "ETLAB_B": "two\nlines"}
        result = conn.run(["sh", "-c", 'printf "%s\\0%s\\0" "$ETLAB_A" "$ETLAB_B"'], env=env)
        assert nul_split(result.stdout) == [env["ETLAB_A"], env["ETLAB_B"]]
        with pytest.raises(Exception, match="invalid environment variable name"):
            conn.run(["true"], env={"A B": "x"})


def test_exit_codes_and_check(sshd_board: SshdBoard) -> None:
    with connect(sshd_board.board) as conn:
        result = conn.run_shell("echo out; echo err >&2; exit 7", check=False)
        assert (result.exit_code, result.stdout, result.stderr, result.ok) == (7, "out\n", "err\n", False)
        with pytest.raises(CommandError, match=r"exited 3: boom") as caught:
            conn.run_shell("echo boom >&2; exit 3")
        assert caught.value.result.exit_code == 3
        assert sshd_board.name in str(caught.value)


def test_large_stdout_and_stderr_do_not_deadlock(sshd_board: SshdBoard) -> None:
    # Both streams up to the cap at once (more is refused: tests/transport/test_output_limit.py).
    with connect(sshd_board.board) as conn:
        limit = OUTPUT_LIMIT
        result = conn.run_shell(f"head -c {limit} /dev/zero | tr '\\0' a; head -c {limit} /dev/zero | tr '\\0' b >&2")
        assert len(result.stdout) == limit and set(result.stdout) == {"a"}
        assert len(result.stderr) == limit and set(result.stderr) == {"b"}


def test_command_timeout_stops_the_command(sshd_board: SshdBoard) -> None:
    with connect(sshd_board.board) as conn:
        with pytest.raises(CommandTimeout, match=r"`sleep 30` did not finish within 1 s"):
            conn.run(["sleep", "30"], timeout=1)
        assert conn.run(["echo", "still usable"]).stdout == "still usable\n"


def test_resolve_path_uses_the_board_home(sshd_board: SshdBoard) -> None:
    with connect(sshd_board.board) as conn:
        assert conn.resolve_path("~") == str(sshd_board.home)
        assert conn.resolve_path("~/a b/c") == str(sshd_board.home / "a b" / "c")
        assert conn.resolve_path("rel") == str(sshd_board.home / "rel")
        assert conn.resolve_path("/abs/x") == "/abs/x"
        assert conn.workdir == str(sshd_board.home / ".etlab")
        with pytest.raises(Exception, match=r"only '~' and '~/\.\.\.'"):
            conn.resolve_path("~other/x")


def test_streams_carry_binary_data_both_ways(sshd_board: SshdBoard, tmp_path: Path) -> None:
    payload = os.urandom(3 << 20) + b"\0\n\r\xff" * 1000
    target = sshd_board.home / "dir with 'quote'" / "f $x;`y`"
    target.parent.mkdir(parents=True)
    with connect(sshd_board.board) as conn:
        with conn.open_write_stream(["sh", "-c", 'echo ready; cat > "$1"; echo stored', "sh", str(target)]) as stream:
            assert stream.first_line(timeout=30) == "ready"  # the command can answer before it is fed
            for offset in range(0, len(payload), 1 << 20):
                stream.write(payload[offset : offset + (1 << 20)])
        assert stream.result is not None and stream.result.stdout == "ready\nstored\n"
        assert target.read_bytes() == payload
        with conn.open_read_stream(["cat", str(target)]) as reader:
            assert reader.read() == payload


def test_a_failing_stream_command_reports_its_stderr(sshd_board: SshdBoard) -> None:
    with connect(sshd_board.board) as conn:
        with pytest.raises(CommandError, match="no-such-file"), conn.open_read_stream(["cat", "/no-such-file"]) as r:
            r.read()
        # A receiver that quits early is a command failure with its reason, not a lost link.
        with pytest.raises(CommandError, match=r"exited 5: refusing") as caught:  # noqa: SIM117
            with conn.open_write_stream(["sh", "-c", "echo refusing >&2; exit 5"]) as stream:
                for _ in range(64):
                    stream.write(b"x" * (1 << 20))
        assert not is_transient(caught.value)


@pytest.mark.timeout(120)
def test_rekeying_during_streams_never_stalls(sshd_boards, monkeypatch: pytest.MonkeyPatch) -> None:
    # paramiko is told to rekey every MiB (as it does every 512 MiB): a channel closing in the middle of a
    # rekey paramiko started used to stall its transport for 30 s and kill the link. The second board's
    # server rekeys every MiB itself, which must keep working.
    monkeypatch.setattr(paramiko.packet.Packetizer, "REKEY_BYTES", 1 << 20)
    (plain,) = sshd_boards(1)
    (rekeying,) = sshd_boards(1, sshd_config=["RekeyLimit 1M"])
    payload = os.urandom(3 << 20)
    for fake in (plain, rekeying):
        source, back = fake.home / "payload.bin", fake.home / "back.bin"
        source.write_bytes(payload)
        with connect(fake.board) as conn:
            for round_number in range(10):
                with conn.open_read_stream(["cat", str(source)]) as reader:
                    assert reader.read() == payload, round_number
                with conn.open_write_stream(["sh", "-c", 'cat > "$1"', "sh", str(back)]) as stream:
                    stream.write(payload)
                assert back.read_bytes() == payload, round_number


def test_first_connect_pins_the_host_key_and_reconnects_verify_it(sshd_board: SshdBoard) -> None:
    board = sshd_board.board
    known = KnownHosts(board.known_hosts)
    name = host_id(board.ssh.host or "", board.ssh.port)
    assert known.pinned(name) == {}
    with connect(board) as conn:
        conn.run(["true"])
    pinned = known.pinned(name)
    assert list(pinned) == ["ssh-ed25519"]
    served = sshd_board.host_key.with_name(sshd_board.host_key.name + ".pub").read_text().split()[1]
    assert pinned["ssh-ed25519"].get_base64() == served
    sshd_board.restart()  # same host key: accepted without a new entry
    with connect(board) as conn:
        conn.run(["true"])
    lines = [line for line in board.known_hosts.read_text().splitlines() if line.startswith(name + " ")]
    assert len(lines) == 1


def test_a_changed_host_key_is_refused_and_the_message_says_how_to_clear_it(sshd_board: SshdBoard) -> None:
    board = sshd_board.board
    with connect(board):
        pass
    before = board.known_hosts.read_text()
    sshd_board.regenerate_host_key()
    with pytest.raises(HostKeyError) as caught:
        connect(board)
    message = str(caught.value)
    address = f"{board.ssh.host}:{board.ssh.port}"
    assert repr(board.name) in message and address in message
    assert message.count("SHA256:") == 2
    assert not is_transient(caught.value)
    assert board.known_hosts.read_text() == before  # nothing was pinned over the old key
    # The hint's command really clears the entry; after it the new key is pinned on first use.
    command = message.split("clear the old key with: ", 1)[1].strip()
    assert command.startswith("ssh-keygen -R ")
    subprocess.run(shlex.split(command), check=True, capture_output=True)
    with connect(board) as conn:
        conn.run(["true"])
    served = sshd_board.host_key.with_name(sshd_board.host_key.name + ".pub").read_text().split()[1]
    pinned = KnownHosts(board.known_hosts).pinned(host_id(board.ssh.host or "", board.ssh.port))
    assert pinned["ssh-ed25519"].get_base64() == served


def test_parallel_first_connects_pin_every_board_once(sshd_lab: SshdLab, sshd_boards, tmp_path: Path) -> None:
    fakes = sshd_boards(4)
    known_hosts = tmp_path / "state" / "known_hosts"
    errors: list[BaseException] = []

    def connect_twice(fake: SshdBoard) -> None:
        try:
            for _ in range(2):
                with connect(fake.board, known_hosts=known_hosts) as conn:
                    conn.run(["true"])
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=connect_twice, args=(fake,)) for fake in fakes for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    lines = known_hosts.read_text().splitlines()
    assert sorted(line.split()[0] for line in lines) == sorted(f"[{f.address}]:{f.port}" for f in fakes)


def test_refused_connection_names_the_board_and_is_transient(sshd_board: SshdBoard) -> None:
    sshd_board.stop()
    with pytest.raises(LinkError, match=rf"board '{sshd_board.name}' .*connection refused") as caught:
        connect(sshd_board.board)
    assert is_transient(caught.value)


def test_unknown_host_name_is_not_retried() -> None:
    board = Board.of("ghost", host="no-such-board.invalid", key=None)
    with pytest.raises(BoardError, match=r"board 'ghost'.*cannot resolve host 'no-such-board.invalid'") as caught:
        connect(board)
    assert not is_transient(caught.value)


def test_wrong_key_is_an_auth_error(sshd_board: SshdBoard, tmp_path: Path) -> None:
    stranger = tmp_path / "stranger_key"
    keygen(stranger, "not authorized")
    with pytest.raises(AuthError, match=rf"board '{sshd_board.name}'.*authentication failed as 'root'") as caught:
        connect(sshd_board.board.replace(key=stranger))
    assert not is_transient(caught.value)
    with pytest.raises(BoardError, match=r"key file .* not found"):
        connect(sshd_board.board.replace(key=tmp_path / "missing_key"))


def test_connection_reopens_after_the_server_restarts(sshd_board: SshdBoard) -> None:
    conn = connect(sshd_board.board)
    assert isinstance(conn, SshConnection)
    try:
        conn.run(["true"])
        sshd_board.restart()
        # The first command may see the dead link; the next one reconnects by itself.
        with contextlib.suppress(LinkError):
            conn.run(["true"])
        assert conn.run(["echo", "back"]).stdout == "back\n"
    finally:
        conn.close()


@pytest.mark.timeout(120)
def test_blackholed_link_during_a_long_command_is_reported(netns_board: NetnsBoard) -> None:
    board = netns_board.board
    assert (board.ssh.keepalive, board.ssh.tcp_user_timeout) == (1.0, 3.0)
    with connect(board) as conn:
        assert conn.run(["echo", "up"]).stdout == "up\n"
        cut = threading.Timer(1.0, netns_board.blackhole)
        cut.start()
        try:
            with pytest.raises(LinkError, match=rf"board '{board.name}' .*connection lost while running `sleep 300`"):
                conn.run(["sleep", "300"])
        finally:
            cut.join()
    # While the link stays down, a new connection fails after connect_timeout, as a transient error.
    with pytest.raises(LinkError, match=r"no answer within 3 s|timed out"):
        connect(board)
    netns_board.restore()
    with connect(board) as conn:
        assert conn.run(["echo", "again"]).stdout == "again\n"


def test_local_connection_has_the_same_interface(local_board: Board, tmp_path: Path) -> None:
    conn = connect(local_board)
    assert isinstance(conn, LocalConnection)
    with conn:
        assert nul_split(conn.run(["printf", "%s\\0", *NASTY]).stdout) == NASTY
        assert conn.run_shell('printf %s "$ETLAB_X"', env={"ETLAB_X": "$y `z`"}).stdout == "$y `z`"
        with pytest.raises(CommandError, match="exited 4"):
            conn.run_shell("exit 4")
        with pytest.raises(CommandTimeout):
            conn.run(["sleep", "30"], timeout=0.5)
        assert conn.run(["no-such-program-etlab"], check=False).exit_code == 127
        assert conn.workdir == str(tmp_path / "local wd")
        assert conn.resolve_path("~/x") == str(Path.home() / "x")
        target = tmp_path / "a 'b' $c"
        with conn.open_write_stream(["sh", "-c", 'echo go; cat > "$1"', "sh", str(target)]) as stream:
            assert stream.first_line() == "go"
            stream.write(b"\0payload\n")
        assert target.read_bytes() == b"\0payload\n"
        with conn.open_read_stream(["cat", str(target)]) as reader:
            assert reader.read() == b"\0payload\n"
        with pytest.raises(CommandError), conn.open_read_stream(["cat", str(tmp_path / "missing")]) as reader:
            reader.read()
        with pytest.raises(CommandError, match=r"exited 5: refusing"):  # noqa: SIM117
            with conn.open_write_stream(["sh", "-c", "echo refusing >&2; exit 5"]) as stream:
                for _ in range(64):
                    stream.write(b"x" * (1 << 20))
        # The local board's python3 is the interpreter etlab runs on (no PATH lookup, no pyenv shim), in streams too.
        here = conn.run(["python3", "-c", "import sys; print(sys.executable)"]).stdout.strip()
        assert here == sys.executable
        # as the board agent is started: after `env NAME=value`
        agent_like = [
            "env",
            "ETLAB_X=1",
            "python3",
            "-c",
            "import os, sys; print(sys.executable, os.environ['ETLAB_X'])",
        ]
        assert conn.run(agent_like).stdout.split() == [sys.executable, "1"]
        with conn.open_read_stream(["python3", "-c", "import sys; print(sys.executable)"]) as reader:
            assert reader.read().decode().strip() == sys.executable


# ---------------------------------------------------------------- the transport registry


def test_every_inventory_transport_has_an_opener_in_the_transport_package() -> None:
    """boards/transports.py TRANSPORTS is the one list: the inventory accepts its names, connect() opens each one
    through its opener, a function of orchestrator/transport/ returning a BoardConnection."""
    import inspect
    import typing

    from orchestrator.boards.inventory import _BOARD_FIELDS
    from orchestrator.boards.transports import LINK_FIELDS, TRANSPORTS
    from orchestrator.transport import BoardConnection, opener

    assert TRANSPORTS, "no transport"
    for name, transport in TRANSPORTS.items():
        assert transport.name == name
        assert transport.opener.startswith("orchestrator.transport."), transport.opener
        function = opener(name)
        assert function.__module__ == transport.opener.partition(":")[0]
        returned = typing.get_type_hints(function)["return"]
        assert issubclass(returned, BoardConnection), (name, returned)
        assert set(inspect.signature(function).parameters) == {"board", "known_hosts"}, name
        assert set(transport.uses) <= set(LINK_FIELDS) and set(transport.needs) <= set(_BOARD_FIELDS), name
        assert set(transport.uses) == set(transport.options.FIELDS), name  # each field of its record is checked
    assert opener("ssh") is open_ssh and opener("local") is open_local
    # The inventory's transport field offers exactly these names.
    inventory = Path("inventory.yaml")
    from orchestrator.boards.inventory import parse_inventory
    from orchestrator.errors import InventoryError

    with pytest.raises(InventoryError, match=r"expected one of ssh, local, got 'sssh' \(did you mean 'ssh'\?\)"):
        parse_inventory("boards:\n  a: {transport: sssh, host: h}\n", inventory)


def test_connect_names_the_board_of_an_unknown_transport() -> None:
    board = Board(name="pi9", transport="serial", workdir="/tmp")  # the inventory refuses it; a Board made in code
    with pytest.raises(UsageError, match=r"unknown transport 'serial' of board 'pi9'; known: ssh, local"):
        connect(board)
