"""The checks of a spec file's fields that every model source shares: names, families, choices, and the shapes of
mappings and lists (their contents are the sources' own to check)."""

from __future__ import annotations

import re
from typing import Any

from yaml.nodes import MappingNode, Node, SequenceNode

from orchestrator.config import Check, Checker, Invalid, describe, did_you_mean, line_of, string
from orchestrator.names import is_valid_name


class SpecChecker(Checker):
    """Names fields as `field 'seq_len'`: a spec is flat JSON."""

    def error(self, node: Node, field_name: str, message: str) -> None:
        self.problems.append((line_of(node), f"field {field_name!r}: {message}" if field_name else message))


def one_of(options: tuple[str, ...]) -> Check:
    def check(node: Node, _field: str) -> str:
        value = string(node)
        if value not in options:
            raise Invalid(f"{value!r} is not supported; supported: {', '.join(options)}{did_you_mean(value, options)}")
        return value

    return check


def family_name(node: Node, _field: str) -> str:
    """Only the spelling here: whether transformers knows the family (with a did-you-mean) is checked with it, in
    `models.check_spec`."""
    value = string(node)
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}", value):
        raise Invalid(f"{value!r} is not a model family name (like 'bert', 'llama' or 'vit')")
    return value


def spec_name(node: Node, _field: str) -> str:
    value = string(node)
    if not is_valid_name(value):
        raise Invalid("must be 1-64 letters, digits, '.', '_' or '-', starting with a letter or digit")
    return value


def mapping(node: Node, _field: str) -> dict[str, Any]:
    """Only the shape: the values are taken from the JSON (YAML reads `1e-5` as a string)."""
    if not isinstance(node, MappingNode):
        raise Invalid(f"expected a mapping (JSON object), got {describe(node)}")
    return {}


def sequence(node: Node, _field: str) -> list[Any]:
    """Only the shape: the items are taken from the JSON."""
    if not isinstance(node, SequenceNode):
        raise Invalid(f"expected a list, got {describe(node)}")
    return []
