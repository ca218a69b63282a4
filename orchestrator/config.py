"""One checker for etlab's configuration files: the inventory, its nightly matrix, and model spec files.

Files are read as YAML nodes (JSON is YAML too), so every problem names the file, the line and the field:
`inventory.yaml:12: boards.pi5-a.port: expected an integer 1-65535, got 'abc'`. The checker records a
problem and goes on, so a file's mistakes come out together; unknown keys get a did-you-mean.
"""

from __future__ import annotations

import difflib
import json
import math
import re
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import yaml
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from orchestrator.strictjson import MAX_MAGNITUDE


class Invalid(Exception):
    """One value is wrong; raised by a check, recorded by the Checker against the value's line and field."""


Check = Callable[[Node, str], Any]


def did_you_mean(word: str, choices: Iterable[str]) -> str:
    """` (did you mean 'x'?)` for the closest choice, or "" when nothing is close."""
    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


def listing(names: Iterable[str]) -> str:
    listed = sorted(names)
    return ", ".join(repr(n) for n in listed) if listed else "(none)"


def field_path(parent: str, key: str | int) -> str:
    """`boards.pi5-a`, `matrix[0]`, or `boards["odd name"]` for keys that are not plain words."""
    if isinstance(key, int):
        return f"{parent}[{key}]"
    part = key if re.fullmatch(r"[A-Za-z0-9_-]+", key) else f"[{json.dumps(key)}]"
    if not parent:
        return part
    return f"{parent}{part}" if part.startswith("[") else f"{parent}.{part}"


def describe(node: Node) -> str:
    if isinstance(node, MappingNode):
        return "a mapping"
    if isinstance(node, SequenceNode):
        return "a list"
    if node.tag.endswith(":null"):
        return "nothing (null)"
    return repr(node.value)


def tag(node: Node) -> str:
    return node.tag.rsplit(":", 1)[-1]


def is_null(node: Node) -> bool:
    return isinstance(node, ScalarNode) and node.tag.endswith(":null")


def line_of(node: Node) -> int:
    return node.start_mark.line + 1


def value_node(node: Node, key: str) -> Node | None:
    """The value node of `key` in a mapping node, if there."""
    if not isinstance(node, MappingNode):
        return None
    return next((value for k, value in node.value if isinstance(k, ScalarNode) and k.value == key), None)


# ---------------------------------------------------------------- checks: (node, field) -> value, or Invalid


def string(node: Node, what: str = "a string") -> str:
    if not isinstance(node, ScalarNode) or tag(node) != "str" or node.value == "":
        raise Invalid(f"expected {what}, got {describe(node)}")
    return node.value


def text(node: Node, _field: str) -> str:
    return string(node)


def _number_value(node: Node) -> float | int | None:
    if not isinstance(node, ScalarNode) or tag(node) not in ("int", "float"):
        return None
    loader = yaml.SafeLoader("")
    return loader.construct_yaml_int(node) if tag(node) == "int" else loader.construct_yaml_float(node)


def integer(low: int, high: int | None = None) -> Check:
    def check(node: Node, _field: str) -> int:
        want = f"an integer {low}-{high}" if high is not None else f"an integer >= {low}"
        value = _number_value(node)
        if value is None or tag(node) != "int":
            raise Invalid(f"expected {want}, got {describe(node)}")
        if value < low or (high is not None and value > high):
            raise Invalid(f"expected {want}, got {value}")
        return int(value)

    return check


def number(low: float, *, above: bool = False, high: float | None = None, unit: str = "a number") -> Check:
    """A finite number >= low (> low when `above`), and <= high if given."""

    def check(node: Node, _field: str) -> float:
        bound = f"> {low:g}" if above else f">= {low:g}"
        want = f"{unit} {bound}" + (f" and <= {high:g}" if high is not None else "")
        value = _number_value(node)
        if value is None:
            raise Invalid(f"expected {want}, got {describe(node)}")
        value = float(value)
        if not math.isfinite(value) or value < low or (above and value == low) or (high is not None and value > high):
            raise Invalid(f"expected {want}, got {node.value}")
        return value

    return check


seconds = number(0, above=True, unit="a number of seconds")


def boolean(node: Node, _field: str) -> bool:
    if not isinstance(node, ScalarNode) or tag(node) != "bool":
        raise Invalid(f"expected true or false, got {describe(node)}")
    return bool(yaml.SafeLoader("").construct_yaml_bool(node))


def choice(choices: Iterable[str]) -> Check:
    options = tuple(choices)

    def check(node: Node, _field: str) -> str:
        value = string(node, "one of " + ", ".join(options))
        if value not in options:
            raise Invalid(f"expected one of {', '.join(options)}, got {value!r}{did_you_mean(value, options)}")
        return value

    return check


def words(what: str) -> Check:
    """A list of words (tags), de-duplicated in order."""

    def check(node: Node, _field: str) -> tuple[str, ...]:
        if not isinstance(node, SequenceNode):
            raise Invalid(f"expected a list of {what}s, got {describe(node)}")
        found = []
        for item in node.value:
            if not isinstance(item, ScalarNode) or tag(item) not in ("str", "int") or item.value == "":
                raise Invalid(f"expected each {what} to be a word, got {describe(item)}")
            found.append(item.value)
        return tuple(dict.fromkeys(found))

    return check


def names(node: Node, _field: str) -> tuple[str, ...]:
    """A name, or a list of names."""
    if isinstance(node, ScalarNode) and not is_null(node) and node.value != "":
        return (str(node.value),)
    if not isinstance(node, SequenceNode) or not node.value:
        raise Invalid(f"expected a name or a list of names, got {describe(node)}")
    found = []
    for item in node.value:
        if not isinstance(item, ScalarNode) or is_null(item) or item.value == "":
            raise Invalid(f"expected a name, got {describe(item)}")
        found.append(str(item.value))
    return tuple(found)


def mapping_of_words(what: str, key_pattern: str, value_pattern: str) -> Check:
    """A mapping of word -> word (e.g. labgrid tags), each side matching its pattern; returned as sorted pairs."""

    def check(node: Node, _field: str) -> tuple[tuple[str, str], ...]:
        if not isinstance(node, MappingNode) or not node.value:
            raise Invalid(f"expected a non-empty mapping of {what}s (name: value), got {describe(node)}")
        found: dict[str, str] = {}
        for key_node, value_node in node.value:
            key = key_node.value if isinstance(key_node, ScalarNode) else None
            value = value_node.value if isinstance(value_node, ScalarNode) and not is_null(value_node) else None
            if key is None or not re.fullmatch(key_pattern, str(key)):
                raise Invalid(f"{what} name {describe(key_node)} must match {key_pattern}")
            if value is None or not re.fullmatch(value_pattern, str(value)):
                raise Invalid(f"{what} {key}: value {describe(value_node)} must match {value_pattern}")
            if key in found:
                raise Invalid(f"{what} {key} is given twice")
            found[str(key)] = str(value)
        return tuple(sorted(found.items()))

    return check


class Section:
    """A nested mapping checked field by field against its own schema (e.g. a board's `labgrid:`)."""

    def __init__(self, schema: dict[str, Check]) -> None:
        self.schema = schema

    def __call__(self, node: Node, _field: str) -> Any:
        raise AssertionError("a Section is checked by Checker.fields")


def plain(node: Node, _field: str) -> Any:
    """Any value, as plain Python data (e.g. a mapping of overrides)."""
    return yaml.SafeLoader("").construct_object(node, deep=True)


# ---------------------------------------------------------------- the checker


class Checker:
    """Walks one file's nodes; `problems` collects (line, "field: message") in any order."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.problems: list[tuple[int, str]] = []

    @property
    def errors(self) -> list[str]:
        """Every problem found, in file order, as `file:line: field: message`."""
        return [f"{self.path}:{line}: {message}" for line, message in sorted(self.problems, key=lambda p: p[0])]

    def error(self, node: Node, field_name: str, message: str) -> None:
        self.problems.append((line_of(node), f"{field_name or '(file)'}: {message}"))

    def mapping(
        self, node: Node, field_name: str, allowed: Iterable[str] | None = None
    ) -> list[tuple[str, Node, Node]]:
        """The (key, key node, value node) items of a mapping; refuses duplicate and (if `allowed`) unknown keys."""
        if not isinstance(node, MappingNode):
            self.error(node, field_name, f"expected a mapping, got {describe(node)}")
            return []
        known = list(allowed) if allowed is not None else None
        items: list[tuple[str, Node, Node]] = []
        seen: dict[str, int] = {}
        for key_node, value_node in node.value:
            if not isinstance(key_node, ScalarNode) or key_node.value == "" or tag(key_node) == "null":
                self.error(key_node, field_name, f"expected a name as key, got {describe(key_node)}")
                continue
            key = key_node.value
            where = field_path(field_name, key)
            if key in seen:
                self.error(key_node, where, f"duplicate key (first defined on line {seen[key]})")
                continue
            seen[key] = line_of(key_node)
            if known is not None and key not in known:
                self.error(
                    key_node, where, f"unknown key {key!r}{did_you_mean(key, known)}; allowed: {', '.join(known)}"
                )
                continue
            items.append((key, key_node, value_node))
        return items

    def value(self, node: Node, field_name: str, check: Check) -> Any:
        """One checked value, or None (with the problem recorded)."""
        try:
            return check(node, field_name)
        except Invalid as exc:
            self.error(node, field_name, str(exc))
            return None

    def fields(self, node: Node, field_name: str, schema: dict[str, Check]) -> dict[str, Any]:
        """A mapping checked against `schema` (field -> check, or a Section for a nested mapping); null values
        count as absent."""
        values: dict[str, Any] = {}
        if is_null(node):
            return values
        for key, _key_node, value_node in self.mapping(node, field_name, schema):
            if is_null(value_node):
                continue
            before = len(self.problems)
            check = schema[key]
            if isinstance(check, Section):
                nested = self.fields(value_node, field_path(field_name, key), check.schema)
                if len(self.problems) == before:
                    values[key] = nested
                continue
            checked = self.value(value_node, field_path(field_name, key), check)
            if len(self.problems) == before:
                values[key] = checked
        return values

    def items(self, node: Node, field_name: str) -> list[Node]:
        """The items of a non-empty list."""
        if not isinstance(node, SequenceNode) or not node.value:
            self.error(node, field_name, f"expected a non-empty list, got {describe(node)}")
            return []
        return list(node.value)


_LONG_INTEGER = re.compile(r"-?\d{19,}")  # may pass int64; shorter ones cannot


def leaves(value: Any) -> list[Any]:
    """The scalars inside nested lists and mappings (iterative: JSON may nest deeper than Python recurses)."""
    leaves, pending = [], [value]
    while pending:
        item = pending.pop()
        if isinstance(item, dict):
            pending.extend(item.values())
        elif isinstance(item, list):
            pending.extend(item)
        else:
            leaves.append(item)
    return leaves


def field_node(root: Node, key: str) -> Node | None:
    """The node of `name`, `inputs[1]` or `inputs[1].dtype` under `root` (its line is the field's), or None."""
    found = re.fullmatch(r"(\w+)(?:\[(\d+)\])?(?:\.(\w+))?", key)
    if found is None:
        return None
    node = value_node(root, found[1])
    if found[2] is not None and isinstance(node, SequenceNode) and int(found[2]) < len(node.value):
        node = node.value[int(found[2])]
        if found[3] is not None:
            node = value_node(node, found[3]) or node
    return node


def huge_integers(root: Node) -> list[tuple[Node, str]]:
    """Every integer under `root` beyond ±(2**63-1) (a 400-digit vocab_size), with its field path, in line
    order: JSON reads it, but no size or id can be one."""
    found: list[tuple[Node, str]] = []
    pending: list[tuple[Node, str]] = [(root, "")]
    while pending:
        node, name = pending.pop()
        if isinstance(node, MappingNode):
            pending += [(value, f"{name}.{key.value}" if name else str(key.value)) for key, value in node.value]
        elif isinstance(node, SequenceNode):
            pending += [(item, f"{name}[{index}]") for index, item in enumerate(node.value)]
        elif (
            isinstance(node, ScalarNode)
            and _LONG_INTEGER.fullmatch(node.value)
            and abs(int(node.value)) > MAX_MAGNITUDE
        ):
            found.append((node, name))
    return sorted(found, key=lambda item: line_of(item[0]))


def yaml_syntax(exc: yaml.YAMLError, path: Path) -> str:
    """A YAML syntax error in plain words with its file and line (`inventory.yaml:7: a tab is not allowed for
    indentation`), never PyYAML's own terms (`expected <block end>, but found '<block mapping start>'`)."""
    if not isinstance(exc, yaml.MarkedYAMLError):
        return f"{path}: not valid YAML: {exc}"
    problem, context = str(exc.problem or ""), str(exc.context or "")
    at = exc.problem_mark or exc.context_mark
    line = at.line + 1 if at is not None else 1
    opened = exc.context_mark.line + 1 if exc.context_mark is not None else None
    if "'\\t'" in problem:
        said = "a tab is not allowed for indentation (or to start a value): indent with spaces"
    elif "quoted scalar" in context:
        line = opened or line
        said = "unclosed quote: the quoted value that starts on this line never ends"
    elif "flow mapping" in context or "flow sequence" in context:
        bracket, close = ("{", "}") if "mapping" in context else ("[", "]")
        said = f"unclosed '{bracket}' (opened on line {opened}): a ',' or '{close}' is missing before here"
    elif "simple key" in context:
        line = opened or line
        said = "a key without ':' (each key is followed by ': ' and its value)"
    elif "block" in context or "mapping values are not allowed" in problem:
        where = f" (the block begins on line {opened})" if opened else ""
        said = (
            "the indentation does not match the lines above it: the keys of one mapping, and the '- ' items of one "
            f"list, start in the same column, and a value holding ': ' needs quotes{where}"
        )
    else:
        said = f"not valid YAML: {problem or exc}"
    return f"{path}:{line}: {said}"
