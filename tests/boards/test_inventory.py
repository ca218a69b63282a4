"""inventory.yaml: loading, defaults, validation errors (file:line: field: reason) and board selection."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from orchestrator import paths
from orchestrator.boards.inventory import Board, Inventory, load_inventory, parse_inventory
from orchestrator.boards.transports import LocalOptions, SshOptions
from orchestrator.errors import InventoryError, UsageError

GOOD = """\
defaults:
  user: pi
  key: keys/lab_ed25519
  connect_timeout: 4
  keepalive: 3
  tcp_user_timeout: 12.5
  command_timeout: 600
  known_hosts: state/known_hosts
boards:
  local:
    transport: local
    tags: [x86]
  pi5-a:
    host: 192.168.1.50
    tags: [pi5, aarch64]
    threads: 4
  "pi 4; $(reboot) `x` 'q'":
    host: pi4.local
    port: 2222
    user: admin
    agent: true
    workdir: /srv/etlab
    tags: [pi4, aarch64]
    bulk_transfer: paramiko
    bulk_cipher: chacha20-poly1305@openssh.com
    build: workstation
groups:
  pis: [pi5-a, "pi 4; $(reboot) `x` 'q'"]
nightly:
  models: [distilbert]
  backends: [xnnpack]
"""


def write(tmp_path: Path, text: str, name: str = "inventory.yaml") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


def line_of(text: str, marker: str = "# <-") -> int:
    """The 1-based line carrying `marker` in the (dedented) YAML text."""
    for number, line in enumerate(textwrap.dedent(text).splitlines(), start=1):
        if marker in line:
            return number
    raise AssertionError(f"no {marker!r} in the text")


def test_shipped_inventory_has_the_local_board_and_it_is_the_default() -> None:
    inventory = load_inventory(paths.PROJECT_ROOT / "inventory.yaml")
    assert "local" in inventory.boards
    local = inventory.boards["local"]
    assert local.is_local and local.link == LocalOptions()
    assert local.workdir == str(paths.state_dir() / "boards" / "local")
    assert inventory.select() == [local]
    # The commented Raspberry Pi examples stay comments: they are not boards.
    assert set(inventory.boards) == {"local"}
    text = (paths.PROJECT_ROOT / "inventory.yaml").read_text()
    assert "# pi5-a:" in text and "# pi4-a:" in text and "# nightly:" in text
    # The shipped nightly runs on the workstation out of the box.
    assert inventory.nightly is not None and inventory.nightly["matrix"][0]["boards"] == ["local"]


def test_a_full_inventory_applies_defaults_and_resolves_paths(tmp_path: Path) -> None:
    inventory = load_inventory(write(tmp_path, GOOD))
    pi5 = inventory.boards["pi5-a"]
    assert pi5 == Board.of(
        "pi5-a",
        transport="ssh",
        host="192.168.1.50",
        port=22,
        user="pi",
        key=tmp_path / "keys" / "lab_ed25519",
        agent=False,
        workdir="~/.etlab",
        tags=("pi5", "aarch64"),
        threads=4,
        connect_timeout=4.0,
        command_timeout=600.0,
        keepalive=3.0,
        tcp_user_timeout=12.5,
        known_hosts=tmp_path / "state" / "known_hosts",
    )
    odd = inventory.boards["pi 4; $(reboot) `x` 'q'"]
    assert (odd.ssh.port, odd.ssh.user, odd.ssh.agent, odd.workdir) == (2222, "admin", True, "/srv/etlab")
    assert (odd.ssh.bulk_transfer, pi5.ssh.bulk_transfer) == ("paramiko", "auto")
    assert (odd.ssh.bulk_cipher, pi5.ssh.bulk_cipher) == ("chacha20-poly1305@openssh.com", "auto")
    # the transport's own fields are its record, not the board's (boards/transports.py)
    assert isinstance(pi5.link, SshOptions) and pi5.link.host == "192.168.1.50" and pi5.address == "pi@192.168.1.50:22"
    assert (odd.build, pi5.build) == ("workstation", "auto")
    assert inventory.groups == {"pis": ("pi5-a", "pi 4; $(reboot) `x` 'q'")}
    assert inventory.nightly == {"models": ["distilbert"], "backends": ["xnnpack"]}
    # A local board gets its workdir under the state folder, named after the board.
    assert inventory.boards["local"].workdir == str(paths.state_dir() / "boards" / "local")


def test_default_known_hosts_is_in_the_state_folder(tmp_path: Path) -> None:
    inventory = load_inventory(write(tmp_path, "boards:\n  a:\n    host: h\n"))
    assert inventory.boards["a"].known_hosts == paths.state_dir() / "known_hosts"
    assert inventory.boards["a"].ssh.connect_timeout == 10.0
    assert inventory.boards["a"].workdir == "~/.etlab"


MALFORMED = {
    "port not a number": (
        """\
        boards:
          pi5-a:
            host: 10.0.0.2
            port: abc  # <-
        """,
        "boards.pi5-a.port",
        "expected an integer 1-65535, got 'abc'",
    ),
    "port out of range": (
        """\
        boards:
          pi5-a:
            host: 10.0.0.2
            port: 70000  # <-
        """,
        "boards.pi5-a.port",
        "expected an integer 1-65535, got 70000",
    ),
    "unknown board key": (
        """\
        boards:
          pi5-a:
            hots: 10.0.0.2  # <-
        """,
        "boards.pi5-a.hots",
        "did you mean 'host'?",
    ),
    "unknown top-level key": (
        """\
        defaults:
          user: pi
        board:  # <-
          a: {host: h}
        """,
        "board",
        "did you mean 'boards'?",
    ),
    "duplicate board name": (
        """\
        boards:
          pi5-a:
            host: 10.0.0.2
          pi5-a:  # <-
            host: 10.0.0.3
        """,
        "boards.pi5-a",
        "duplicate key (first defined on line 2)",
    ),
    "group names a missing board": (
        """\
        boards:
          pi5-a: {host: 10.0.0.2}
        groups:
          lab: [pi5-a, pi5-b]  # <-
        """,
        "groups.lab",
        "unknown board 'pi5-b' (did you mean 'pi5-a'?)",
    ),
    "bad transport": (
        """\
        boards:
          pi5-a:
            host: 10.0.0.2
            transport: telnet  # <-
        """,
        "boards.pi5-a.transport",
        "expected one of ssh, local, got 'telnet'",
    ),
    "bad bulk_transfer": (
        """\
        defaults:
          bulk_transfer: opensssh  # <-
        boards:
          pi5-a: {host: 10.0.0.2}
        """,
        "defaults.bulk_transfer",
        "expected one of auto, openssh, paramiko, got 'opensssh' (did you mean 'openssh'?)",
    ),
    "bad build": (
        """\
        boards:
          pi5-a:
            host: 10.0.0.2
            build: cross  # <-
        """,
        "boards.pi5-a.build",
        "expected one of auto, board, workstation, got 'cross'",
    ),
    "bad bulk_cipher": (
        """\
        defaults:
          bulk_cipher: chacha20  # <-
        boards:
          pi4-a: {host: 10.0.0.3}
        """,
        "defaults.bulk_cipher",
        "expected one of auto, aes128-gcm@openssh.com, aes256-gcm@openssh.com, chacha20-poly1305@openssh.com",
    ),
    "bulk_cipher on a local board": (
        """\
        boards:
          here:
            transport: local
            bulk_cipher: aes128-gcm@openssh.com  # <-
        """,
        "boards.here.bulk_cipher",
        "not used by a board with transport 'local'",
    ),
    "ssh board without host": (
        """\
        boards:
          local: {transport: local}
          pi5-a:  # <-
            user: pi
        """,
        "boards.pi5-a",
        "an ssh board needs 'host'",
    ),
    "tags not a list": (
        """\
        boards:
          pi5-a:
            host: 10.0.0.2
            tags: pi5  # <-
        """,
        "boards.pi5-a.tags",
        "expected a list of tags, got 'pi5'",
    ),
    "agent not a boolean": (
        """\
        defaults:
          agent: maybe  # <-
        boards:
          a: {host: h}
        """,
        "defaults.agent",
        "expected true or false, got 'maybe'",
    ),
    "timeout not positive": (
        """\
        boards:
          a:
            host: h
            tcp_user_timeout: 0  # <-
        """,
        "boards.a.tcp_user_timeout",
        "expected a number of seconds > 0",
    ),
    "board name with a slash": (
        """\
        boards:
          lab/pi5:  # <-
            host: h
        """,
        'boards["lab/pi5"]',
        "must not contain '/'",
    ),
    "ssh setting on a local board": (
        """\
        boards:
          here:
            transport: local
            host: 10.0.0.2  # <-
        """,
        "boards.here.host",
        "not used by a board with transport 'local'",
    ),
    "board settings not a mapping": (
        """\
        boards:
          a: [h]  # <-
        """,
        "boards.a",
        "expected a mapping, got a list",
    ),
    "nightly not a mapping": (
        """\
        boards:
          a: {host: h}
        nightly: every day  # <-
        """,
        "nightly",
        "expected a mapping, got 'every day'",
    ),
    "YAML syntax error": (
        """\
        boards:
          a: {host: h
          b: [  # <-
        """,
        "unclosed",
        "",
    ),
}


@pytest.mark.parametrize("case", list(MALFORMED), ids=list(MALFORMED))
def test_malformed_inventory_names_file_line_and_field(tmp_path: Path, case: str) -> None:
    text, field, reason = MALFORMED[case]
    path = write(tmp_path, text)
    with pytest.raises(InventoryError) as caught:
        load_inventory(path)
    message = str(caught.value)
    if case == "YAML syntax error":
        # The parser reports where it noticed the problem, which is at or after the broken line.
        assert message.startswith(f"{path}:")
        reported = int(message.split(":")[1])
        assert reported >= line_of(text) - 1 and "unclosed '{' (opened on line 2)" in message, message
        return
    assert f"{path}:{line_of(text)}: {field}: " in message, message
    assert reason in message


def test_empty_inventory_is_refused(tmp_path: Path) -> None:
    for text in ("", "# only a comment\n", "---\n"):
        with pytest.raises(InventoryError, match=r"inventory.yaml:1: \(file\): the inventory is empty"):
            load_inventory(write(tmp_path, text))


def test_inventory_without_boards_is_refused(tmp_path: Path) -> None:
    with pytest.raises(InventoryError, match=r":1: boards: required"):
        load_inventory(write(tmp_path, "defaults:\n  user: pi\n"))
    with pytest.raises(InventoryError, match=r":1: boards: expected at least one board"):
        load_inventory(write(tmp_path, "boards:\n"))


def test_every_problem_is_reported_at_once_in_file_order(tmp_path: Path) -> None:
    text = """\
    boards:
      a:
        host: h
        port: x
      b:
        transport: nope
    groups:
      g: [c]
    """
    with pytest.raises(InventoryError) as caught:
        load_inventory(write(tmp_path, text))
    lines = str(caught.value).splitlines()
    assert [line.split(": ", 1)[0].rsplit(":", 1)[1] for line in lines] == ["4", "6", "8"]
    assert "boards.a.port" in lines[0] and "boards.b.transport" in lines[1] and "groups.g" in lines[2]


def test_missing_inventory_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(InventoryError, match="inventory file not found"):
        load_inventory(tmp_path / "nope.yaml")


def test_unsafe_yaml_tags_are_refused(tmp_path: Path) -> None:
    text = "boards:\n  a: !!python/object/apply:os.system ['true']\n"
    with pytest.raises(InventoryError) as caught:
        load_inventory(write(tmp_path, text))
    assert ":2: boards.a: expected a mapping" in str(caught.value)


@pytest.fixture
def lab(tmp_path: Path) -> Inventory:
    return load_inventory(write(tmp_path, GOOD))


def test_select_by_names_group_and_tag(lab: Inventory) -> None:
    odd = "pi 4; $(reboot) `x` 'q'"
    assert [b.name for b in lab.select(["pi5-a", "local", "pi5-a"])] == ["pi5-a", "local"]
    assert [b.name for b in lab.select(group="pis")] == ["pi5-a", odd]
    assert [b.name for b in lab.select(group="pis", tag="pi4")] == [odd]
    assert [b.name for b in lab.select(tag="aarch64")] == ["pi5-a", odd]
    assert [b.name for b in lab.select()] == ["local"]


def test_selection_errors_are_clear(lab: Inventory) -> None:
    with pytest.raises(UsageError, match=r"unknown board 'pi5a' \(did you mean 'pi5-a'\?\)") as unknown:
        lab.select(["pi5a"])
    assert f"hint: add it to {lab.path} under `boards:`" in str(unknown.value)  # where a new board goes
    with pytest.raises(UsageError, match=r"unknown group 'pi' \(did you mean 'pis'\?\)"):
        lab.select(group="pi")
    with pytest.raises(UsageError, match=r"unknown tag 'pi6'"):
        lab.select(tag="pi6")
    with pytest.raises(UsageError, match=r"no board in group 'pis' has tag 'x86'"):
        lab.select(group="pis", tag="x86")
    with pytest.raises(UsageError, match="not both"):
        lab.select(["pi5-a"], group="pis")


def test_default_group_wins_over_the_local_board(tmp_path: Path) -> None:
    text = GOOD.replace("groups:\n", "groups:\n  default: [pi5-a]\n")
    assert [b.name for b in load_inventory(write(tmp_path, text)).select()] == ["pi5-a"]


def test_no_default_selection_is_an_error(tmp_path: Path) -> None:
    inventory = parse_inventory("boards:\n  a: {host: h}\n", tmp_path / "inventory.yaml")
    with pytest.raises(UsageError, match="no board selected and there is no default"):
        inventory.select()


def test_nightly_matrix_uses_the_inventory_checker(tmp_path: Path) -> None:
    """The nightly section's mistakes come out together, each with its line and field, like the rest of the file."""
    from orchestrator.lab.matrix import load_config

    text = textwrap.dedent(
        """\
        boards:
          local: {transport: local}
        nightly:
          weights: maybe
          iterations: abc
          matrix:
            - models: [distilbert-tinny]
              backends: [xnnpack, vulkan]
              threds: 2
        """
    )
    path = write(tmp_path, text)
    with pytest.raises(InventoryError) as excinfo:
        load_config(load_inventory(path))
    lines = str(excinfo.value).splitlines()
    assert lines[0] == f"{path}:4: nightly.weights: expected one of auto, pretrained, random, got 'maybe'"
    assert lines[1] == f"{path}:5: nightly.iterations: expected an integer 1-1000000, got 'abc'"
    assert lines[2].startswith(f"{path}:7: nightly.matrix[0].models: unknown model 'distilbert-tinny'")
    assert "did you mean 'distilbert-tiny'" in lines[2]
    assert lines[3] == f"{path}:8: nightly.matrix[0].backends: unknown backend 'vulkan'"
    assert lines[4].startswith(f"{path}:9: nightly.matrix[0].threds: unknown key 'threds' (did you mean 'threads'?)")


SYNTAX_ERRORS = {
    "tab": ("boards:\n  local: {transport: local}\n\tpi: {host: a}\n", 3, "a tab is not allowed for indentation"),
    "unclosed double quote": ('boards:\n  local: {transport: local}\n  pi: {host: "a}\n  pj: {host: b}\n', 3,
                              "unclosed quote"),
    "unclosed single quote": ("boards:\n  pi: {host: 'a}\n", 2, "unclosed quote"),
    "unclosed bracket": ("boards:\n  local: {transport: local}\ngroups:\n  g: [local\n", 5,
                         "unclosed '[' (opened on line 4)"),
    "key without colon": ("boards:\n  local: {transport: local}\n  pi\n", 3, "a key without ':'"),
    "indented too far": ("boards:\n  local: {transport: local}\n    pi: {host: b}\n", 3,
                         "the indentation does not match the lines above it"),
    "list and keys mixed": ("boards:\n  - a\n  b: c\n", 3, "the indentation does not match"),
}  # fmt: skip


@pytest.mark.parametrize("case", list(SYNTAX_ERRORS), ids=list(SYNTAX_ERRORS))
def test_a_yaml_syntax_error_is_said_in_plain_words_with_its_line(tmp_path: Path, case: str) -> None:
    """Issue 38 item 13: PyYAML's own terms (`expected <block end>, but found '<block mapping start>'`, `found
    character '\\t' that cannot start any token`) became words, at the line to fix."""
    text, line, words = SYNTAX_ERRORS[case]
    path = tmp_path / "inventory.yaml"
    path.write_text(text)
    with pytest.raises(InventoryError) as caught:
        load_inventory(path)
    message = str(caught.value)
    assert message.startswith(f"{path}:{line}: {words}"), message
    assert not any(term in message for term in ("<block", "scalar", "stream", "token", "invalid YAML")), message
    assert caught.value.exit_code == 64  # as every malformed inventory


def test_fab_says_a_yaml_syntax_error_in_one_line(tmp_path: Path) -> None:
    path = tmp_path / "inventory.yaml"
    path.write_text(SYNTAX_ERRORS["tab"][0])
    command = [sys.executable, "-m", "fabric", "boards", "--inventory", str(path)]
    result = subprocess.run(command, cwd=paths.PROJECT_ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 64, result.stderr
    assert (
        result.stderr.strip() == f"error: {path}:3: a tab is not allowed for indentation (or to start a value): "
        "indent with spaces"
    ), result.stderr
