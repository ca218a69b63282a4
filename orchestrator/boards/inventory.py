"""The board inventory (inventory.yaml): what boards exist, how to reach them, and how to select them.

Every error names the file, the line and the field, e.g.
`inventory.yaml:12: boards.pi5-a.port: expected an integer 1-65535, got 'abc'`.
"""

from __future__ import annotations

import dataclasses
import getpass
import os
import re
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from orchestrator import paths
from orchestrator.boards.transports import (
    DEFAULT_TRANSPORT,
    LABGRID_TRANSPORT,
    LINK_FIELDS,
    TRANSPORTS,
    SshOptions,
    TransportOptions,
)
from orchestrator.config import (
    Check,
    Checker,
    Invalid,
    Section,
    choice,
    describe,
    did_you_mean,
    field_path,
    integer,
    is_null,
    listing,
    mapping_of_words,
    seconds,
    string,
    tag,
    text,
    value_node,
    words,
    yaml_syntax,
)
from orchestrator.errors import InventoryError, UsageError
from orchestrator.names import is_valid_name

# Where the native runner is built: on the board, cross-built on the workstation, or "auto" (on the board when
# it has g++, else cross-built when the workstation has the cross compiler).
BUILDS = ("auto", "board", "workstation")
GOVERNORS = ("performance", "powersave", "ondemand", "conservative", "schedutil", "userspace")  # Linux cpufreq
DEFAULT_WORKDIR = "~/.etlab"
DEFAULT_GROUP = "default"
DEFAULT_BOARD = "local"
# labgrid's own rules (labgrid.remote.common.TAG_KEY) for tag names; values are kept to plain words, and place
# names to the name rule (orchestrator/names.py).
LABGRID_TAG_KEY = r"[a-z][a-z0-9_]+"
LABGRID_TAG_VALUE = r"[A-Za-z0-9_.-]+"
LABGRID_ENV = "LG_COORDINATOR"  # labgrid-client's own variable for the coordinator address


@dataclass(frozen=True)
class LabgridPlace:
    """A board that is a labgrid place: reached through the place's NetworkService resource, and reserved and
    locked through the coordinator for each job (orchestrator/boards/labgrid.py)."""

    coordinator: str  # HOST:PORT
    place: str | None = None  # None for a tag selector until it is expanded to the matching places
    tags: tuple[tuple[str, str], ...] = ()  # the selector's tags
    wait: float | None = None  # --lg-wait: how long a job waits for the place; None waits as long as it takes
    waited: float | None = None  # once the place is held: how long the job waited for it

    @property
    def selector(self) -> str:
        """`place pi5-a` or `places tagged board=pi5`, for messages."""
        if self.place is not None:
            return f"place {self.place}"
        return "places tagged " + ",".join(f"{k}={v}" for k, v in self.tags)


@dataclass(frozen=True)
class Board:
    """One board and how to reach it: its transport, and that transport's own fields (`link`: boards/transports.py,
    SshOptions for an SSH board). `workdir` is a path on the board (`~` is expanded there). `Board.of` builds one from
    flat settings, as an inventory entry has them."""

    name: str
    transport: str = DEFAULT_TRANSPORT  # a name in boards/transports.py TRANSPORTS
    link: TransportOptions | None = None  # the transport's own fields; None: its defaults
    workdir: str = DEFAULT_WORKDIR
    tags: tuple[str, ...] = ()
    threads: int | None = None
    command_timeout: float | None = None
    build: str = "auto"
    governor: str | None = None  # the cpufreq governor the health job expects; None: not checked
    known_hosts: Path = field(default_factory=lambda: paths.state_dir() / "known_hosts")
    labgrid: LabgridPlace | None = None

    def __post_init__(self) -> None:
        transport = TRANSPORTS.get(self.transport)
        if self.link is None and transport is not None:  # an unknown transport is refused when it connects
            object.__setattr__(self, "link", transport.options())

    @classmethod
    def of(cls, name: str, **settings: Any) -> Board:
        """A board from flat settings (an inventory entry's keys): its transport's own fields into its `link`; another
        transport's fields are ignored (the inventory refuses them by name)."""
        transport = TRANSPORTS.get(settings.get("transport", DEFAULT_TRANSPORT))
        own = {item.name for item in dataclasses.fields(cls)} - {"name", "link"}
        unknown = set(settings) - own - set(LINK_FIELDS)
        if unknown:
            raise TypeError(f"Board.of: unknown settings {sorted(unknown)}")
        link = transport.link(settings) if transport is not None else None
        return cls(name=name, link=link, **{key: value for key, value in settings.items() if key in own})

    @property
    def ssh(self) -> SshOptions:
        """Its SSH fields; a board of another transport has none (a bug in the caller: said as one)."""
        if not isinstance(self.link, SshOptions):
            raise TypeError(f"board {self.name!r} (transport {self.transport}) is not reached over SSH")
        return self.link

    @property
    def is_local(self) -> bool:
        """The board is the workstation itself (its transport's `on_workstation`)."""
        transport = TRANSPORTS.get(self.transport)
        return transport is not None and transport.on_workstation

    @property
    def address(self) -> str:
        """`user@host:port` for messages, or `local` for the workstation."""
        if self.is_local:
            return "local"
        if isinstance(self.link, SshOptions) and self.link.host is None and self.labgrid is not None:
            return f"labgrid {self.labgrid.selector}"
        return self.link.address if self.link is not None else self.transport

    def replace(self, **changes: Any) -> Board:
        """The board with some fields changed, its own or its transport's (`host=`, `key=`, ...)."""
        link_changes = {key: changes.pop(key) for key in list(changes) if key in LINK_FIELDS}
        board = dataclasses.replace(self, **changes)
        if link_changes:
            if board.link is None:
                raise TypeError(f"board {self.name!r}: transport {self.transport!r} has no {sorted(link_changes)}")
            board = dataclasses.replace(board, link=dataclasses.replace(board.link, **link_changes))
        return board


@dataclass(frozen=True)
class Inventory:
    path: Path
    boards: dict[str, Board]
    groups: dict[str, tuple[str, ...]]
    nightly: dict[Hashable, Any] | None = None  # as YAML reads it: any key (the matrix checker names a bad one)
    # The `nightly:` section as read, so the matrix checker (lab/matrix.py) reports its lines and fields.
    nightly_node: Node | None = field(default=None, compare=False, repr=False)
    # The `lab:` section as read (several workstations share a night: lab/lab_settings.py checks it).
    lab_node: Node | None = field(default=None, compare=False, repr=False)

    def default_selection(self) -> list[Board]:
        if DEFAULT_GROUP in self.groups:
            return [self.boards[name] for name in self.groups[DEFAULT_GROUP]]
        if DEFAULT_BOARD in self.boards:
            return [self.boards[DEFAULT_BOARD]]
        raise UsageError(
            f"{self.path}: no board selected and there is no default",
            hint=f"pass boards or a group, or define a group '{DEFAULT_GROUP}' or a board '{DEFAULT_BOARD}'",
        )

    def board(self, name: str) -> Board:
        if name not in self.boards:
            raise UsageError(
                f"unknown board {name!r}{did_you_mean(name, self.boards)}; known: {listing(self.boards)}",
                hint=f'add it to {self.path} under `boards:` (host, user: README "A lab of Raspberry Pis" shows one)',
            )
        return self.boards[name]

    def select(
        self, boards: Sequence[str] | None = None, group: str | None = None, tag: str | None = None
    ) -> list[Board]:
        """Boards named, or a group's boards, or the default selection; then keep those with `tag`."""
        if boards and group:
            raise UsageError("select boards by name or by group, not both")
        if boards:
            selected = [self.board(name) for name in dict.fromkeys(boards)]
            source = "the boards named"
        elif group is not None:
            if group not in self.groups:
                raise UsageError(
                    f"unknown group {group!r}{did_you_mean(group, self.groups)}; known: {listing(self.groups)}"
                )
            selected = [self.boards[name] for name in self.groups[group]]
            source = f"group {group!r}"
        elif tag is not None:
            selected = list(self.boards.values())
            source = "the inventory"
        else:
            return self.default_selection()
        if tag is not None:
            known_tags = {t for board in self.boards.values() for t in board.tags}
            if tag not in known_tags:
                raise UsageError(f"unknown tag {tag!r}{did_you_mean(tag, known_tags)}; known: {listing(known_tags)}")
            selected = [board for board in selected if tag in board.tags]
            if not selected:
                raise UsageError(f"no board in {source} has tag {tag!r}")
        return selected


def load_inventory(path: Path | None = None) -> Inventory:
    """Read and validate an inventory file (default: orchestrator.paths.default_inventory())."""
    path = Path(path) if path is not None else paths.default_inventory()
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise InventoryError(f"{path}: inventory file not found") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise InventoryError(f"{path}: cannot read the inventory: {exc}") from None
    return parse_inventory(text, path)


def parse_inventory(text: str, path: Path) -> Inventory:
    checker = _Checker(path)
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError as exc:
        raise InventoryError(yaml_syntax(exc, path)) from None
    if root is None or (isinstance(root, ScalarNode) and root.tag.endswith(":null")):
        raise InventoryError(f"{path}:1: (file): the inventory is empty; it needs at least a 'boards' mapping")
    inventory = checker.inventory(root)
    if checker.errors:
        raise InventoryError("\n".join(checker.errors))
    assert inventory is not None
    return inventory


# ---------------------------------------------------------------- validation


def _host_port(node: Node, _field: str) -> str:
    """A coordinator address, HOST:PORT (an IPv6 host in brackets)."""
    value = string(node, "HOST:PORT")
    match = re.fullmatch(r"(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_.-]+):([0-9]{1,5})", value)
    if not match or not 1 <= int(match.group(2)) <= 65535:
        raise Invalid(f"expected HOST:PORT (port 1-65535), got {value!r}")
    return value


def _place_name(node: Node, _field: str) -> str:
    value = string(node, "a place name")
    if not is_valid_name(value):  # the name rule: a place's name also names files (boards/labgrid.py)
        raise Invalid(f"expected a place name (1-64 letters, digits, '.', '_', '-', starting with a letter or digit), "
                      f"got {value!r}")  # fmt: skip
    return value


_LABGRID_DEFAULT_FIELDS: dict[str, Check] = {"coordinator": _host_port}
_LABGRID_BOARD_FIELDS: dict[str, Check] = {
    "place": _place_name,
    "tags": mapping_of_words("tag", LABGRID_TAG_KEY, LABGRID_TAG_VALUE),
    "coordinator": _host_port,
}

# The fields a board may set; `defaults` may set the same ones (minus host and transport) plus known_hosts.
_BOARD_FIELDS: dict[str, Check] = {
    **LINK_FIELDS,  # each transport's own (boards/transports.py), refused on a board of another transport
    "transport": choice(tuple(TRANSPORTS)),
    "workdir": text,
    "tags": words("tag"),
    "threads": integer(1, None),
    "command_timeout": seconds,
    "build": choice(BUILDS),
    "governor": choice(GOVERNORS),
    "labgrid": Section(_LABGRID_BOARD_FIELDS),
}
_DEFAULT_FIELDS: dict[str, Check] = {
    **{k: v for k, v in _BOARD_FIELDS.items() if k not in ("host", "transport", "tags", "labgrid")},
    "known_hosts": text,
    "labgrid": Section(_LABGRID_DEFAULT_FIELDS),
}
# What a labgrid place provides itself (from its NetworkService resource), so a labgrid board must not set it.
_FROM_THE_PLACE = ("host", "port", "user")
_TOP_LEVEL = ("defaults", "boards", "groups", "nightly", "lab")


def _local_user() -> str | None:
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return None


def path_in_file(file: Path, text: str) -> Path:
    """A workstation path written in `file`: `~` expanded, relative paths taken from the file's folder."""
    path = Path(text).expanduser()
    return path if path.is_absolute() else (file.parent / path).resolve()


class _Checker(Checker):
    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.defined_boards: list[str] = []
        self.default_coordinator: str | None = None

    def inventory(self, root: Node) -> Inventory | None:
        sections = {key: (key_node, value) for key, key_node, value in self.mapping(root, "", _TOP_LEVEL)}
        if not isinstance(root, MappingNode):
            return None
        defaults = self.fields(sections["defaults"][1], "defaults", _DEFAULT_FIELDS) if "defaults" in sections else {}
        base = self.resolve_defaults(defaults)
        boards: dict[str, Board] = {}
        if "boards" not in sections:
            self.error(root, "boards", "required: a mapping of board name -> settings")
        else:
            boards_node = sections["boards"][1]
            items = [] if is_null(boards_node) else self.mapping(boards_node, "boards")
            if is_null(boards_node) or (isinstance(boards_node, MappingNode) and not boards_node.value):
                self.error(boards_node, "boards", "expected at least one board")
            self.defined_boards = [name for name, _, _ in items]
            for name, key_node, value_node in items:
                board = self.board(name, key_node, value_node, base)
                if board is not None:
                    boards[name] = board
        groups: dict[str, tuple[str, ...]] = {}
        if "groups" in sections and not is_null(sections["groups"][1]):
            for name, _key_node, value_node in self.mapping(sections["groups"][1], "groups"):
                members = self.group(name, value_node, boards)
                if members is not None:
                    groups[name] = members
        nightly: dict[Hashable, Any] | None = None
        if "nightly" in sections and not is_null(sections["nightly"][1]):
            node = sections["nightly"][1]
            if isinstance(node, MappingNode):
                try:
                    nightly = yaml.SafeLoader("").construct_mapping(node, deep=True)
                except yaml.YAMLError as exc:
                    self.error(node, "nightly", f"cannot read: {exc}")
            else:
                self.error(node, "nightly", f"expected a mapping, got {describe(node)}")
        nightly_node = sections["nightly"][1] if nightly is not None else None
        lab_node = sections["lab"][1] if "lab" in sections and not is_null(sections["lab"][1]) else None
        return Inventory(
            path=self.path, boards=boards, groups=groups, nightly=nightly, nightly_node=nightly_node, lab_node=lab_node
        )

    def resolve_defaults(self, defaults: dict[str, Any]) -> dict[str, Any]:
        base: dict[str, Any] = {"user": _local_user(), "known_hosts": paths.state_dir() / "known_hosts"}
        self.default_coordinator = (defaults.pop("labgrid", None) or {}).get("coordinator")
        for key, value in defaults.items():
            base[key] = self.local_path(value) if key in ("known_hosts", "key") else value
        return base

    def local_path(self, text: str) -> Path:
        return path_in_file(self.path, text)

    def board(self, name: str, key_node: Node, node: Node, base: dict[str, Any]) -> Board | None:
        where = field_path("boards", name)
        if "/" in name or "\0" in name or name in (".", ".."):
            self.error(key_node, where, "a board name must not contain '/' or NUL, nor be '.' or '..'")
            return None
        before = len(self.errors)
        own = self.fields(node, where, _BOARD_FIELDS)
        if len(self.errors) > before:
            return None
        transport = TRANSPORTS[own.get("transport", DEFAULT_TRANSPORT)]  # choice(TRANSPORTS) checked the name
        settings = {**base, **own}
        if "key" in own:
            settings["key"] = self.local_path(own["key"])
        if "labgrid" in own:
            settings["labgrid"] = self.labgrid_place(where, node, own)
            if settings["labgrid"] is None:
                return None
            settings.update(host=None, port=22, transport=LABGRID_TRANSPORT)
        else:
            misplaced = [key for key in LINK_FIELDS if key in own and key not in transport.uses]
            if misplaced:
                at = next(k for k, _ in node.value if isinstance(k, ScalarNode) and k.value == misplaced[0])
                message = f"not used by a board with transport {transport.name!r}"
                self.error(at, field_path(where, misplaced[0]), message)
                return None
            missing = [key for key in transport.needs if not own.get(key)]
            if missing:
                self.error(key_node, where, f"an {transport.name} board needs {missing[0]!r}")
                return None
            if transport.on_workstation:
                workdir = own.get("workdir")
                local = self.local_path(workdir) if workdir else paths.state_dir() / "boards" / name
                settings["workdir"] = str(local)
        known = {f.name for f in dataclasses.fields(Board)} | set(LINK_FIELDS)
        return Board.of(name, **{k: v for k, v in settings.items() if k in known and k != "name"})

    def labgrid_place(self, where: str, node: Node, own: dict[str, Any]) -> LabgridPlace | None:
        """A board's `labgrid:` section: one place or a tag selector, on the board's or the default coordinator."""
        section_node = value_node(node, "labgrid")
        assert section_node is not None
        at = field_path(where, "labgrid")
        misplaced = [key for key in (*_FROM_THE_PLACE, "transport") if key in own]
        if misplaced:
            key = misplaced[0]
            why = (
                "comes from the labgrid place's NetworkService"
                if key != "transport"
                else f"a labgrid board is {LABGRID_TRANSPORT}"
            )
            self.error(value_node(node, key) or node, field_path(where, key), f"not allowed with 'labgrid': {why}")
            return None
        section = own["labgrid"]
        if ("place" in section) == ("tags" in section):
            self.error(section_node, at, "give either 'place' (one place) or 'tags' (every place with those tags)")
            return None
        coordinator = section.get("coordinator") or self.default_coordinator or os.environ.get(LABGRID_ENV)
        if not coordinator:
            self.error(
                section_node,
                field_path(at, "coordinator"),
                f"no labgrid coordinator: set defaults.labgrid.coordinator (HOST:PORT) or {LABGRID_ENV}",
            )
            return None
        return LabgridPlace(coordinator=coordinator, place=section.get("place"), tags=section.get("tags", ()))

    def group(self, name: str, node: Node, boards: dict[str, Board]) -> tuple[str, ...] | None:
        where = field_path("groups", name)
        if not isinstance(node, SequenceNode) or not node.value:
            self.error(node, where, f"expected a non-empty list of board names, got {describe(node)}")
            return None
        members: list[str] = []
        for item in node.value:
            if not isinstance(item, ScalarNode) or tag(item) == "null" or item.value == "":
                self.error(item, where, f"expected a board name, got {describe(item)}")
                continue
            if item.value not in boards:
                if item.value not in self.defined_boards:
                    known = self.defined_boards
                    hint = did_you_mean(item.value, known)
                    self.error(item, where, f"unknown board {item.value!r}{hint}; known: {listing(known)}")
                continue  # a defined but invalid board is reported where it is defined
            members.append(item.value)
        return tuple(dict.fromkeys(members))
