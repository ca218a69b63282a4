"""A user's .pt2 read the way torch reads it, checked, and rebuilt from what was checked (`checked_archive`).

`torch.export.load` runs code from a .pt2 in several places: it unpickles the example inputs (with
`weights_only=False` when a safe load fails), weights and constants stored pickled, script and opaque objects and
the legacy `data/weights/<model>.pt` files; `sympy.sympify` evals the symbolic-shape expressions (`expr_str`) of the
program's JSON; `ExportedProgram.module()` execs its `guards_code`; compiled AOTInductor code under
`data/aotinductor/` is loaded as a shared library; and a load that fails falls back to the pre-2.8 format, which
unpickles more.

torch finds entries with PyTorchStreamReader, whose lookups ignore ASCII case (miniz without
MZ_ZIP_FLAG_CASE_SENSITIVE) and, of two entries of one name, find either one (a binary search over the sorted
directory); Python's zipfile sees names as written and the last of two. A check of names as written would miss
`data/SAMPLE_INPUTS/model.pt`, which torch unpickles as `data/sample_inputs/model.pt`. So etlab never hands torch
the user's archive:

- every entry's name is normalised the way some reader might take it (backslashes as slashes, `.` and empty
  segments dropped, case folded); a `..` segment, entries outside one top folder and two entries of one
  normalised name are refused (which one torch reads is not what etlab could check);
- the entries `torch.export.load` reads for the program `model` are checked: the example inputs must load with
  `weights_only=True` (they are saved again from what loaded), weights and constants must be plain tensors stored
  as raw bytes that hold every element their shape and strides address, and every expression sympy would eval
  must be arithmetic over shape symbols (`safe_expression`);
- those entries go into a new archive under torch's own names, written by torch's own writer, with `guards_code`
  emptied (guards only check a later call's inputs; etlab calls the program with its own example inputs). Nothing
  else goes in: extra files and unknown entries are left out, AOTInductor code and legacy pickles are refused.

What torch loads is the rebuilt archive, and artifacts/<name>/ keeps that copy (Model Explorer loads it). Anything
refused is a UserProgramError (exit 65) before torch has seen a byte.
"""

from __future__ import annotations

import ast
import builtins
import functools
import io
import json
import re
import sys
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from orchestrator import strictjson
from orchestrator.lowering.export.user_programs import UserProgramError

MODEL = "model"  # the program torch.export.load returns; other programs in the archive are left out
MAX_UNPACKED_FACTOR = 16  # a .pt2 unpacks to at most this many times its size (torch's writer stores, not deflates)
MAX_UNPACKED_FLOOR = 64 << 20
MAX_EXPRESSION_CHARS = 10_000
MAX_EXPRESSION_INT = 1 << 64
_PLAIN_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*")
_SHAPE_SYMBOL = re.compile(r"[a-z]+[0-9]+")  # s77, u0, ...: the names torch gives shape symbols
_NUMBER = re.compile(r"[-+]?(inf|nan|[0-9]+(\.[0-9]*)?([eE][-+]?[0-9]+)?)")

# the archive's layout, as torch.export.save writes it (torch/export/pt2_archive/constants.py)
ARCHIVE_FORMAT = ("archive_format", "pt2")
ARCHIVE_VERSION = ("archive_version", "0")
MODEL_JSON = f"models/{MODEL}.json"
SAMPLE_INPUTS = f"data/sample_inputs/{MODEL}.pt"
WEIGHTS_DIR = "data/weights/"
CONSTANTS_DIR = "data/constants/"
WEIGHTS_CONFIG = f"{WEIGHTS_DIR}{MODEL}_weights_config.json"
CONSTANTS_CONFIG = f"{CONSTANTS_DIR}{MODEL}_constants_config.json"
LEGACY_PICKLES = (f"{WEIGHTS_DIR}{MODEL}.pt", f"{CONSTANTS_DIR}{MODEL}.pt")
AOTINDUCTOR_DIR = "data/aotinductor/"
TENSOR_CONSTANT = "tensor_"  # constants stored as tensors; custom_obj_ and opaque_obj_ payloads are pickles

Refuse = Callable[[str], UserProgramError]


def normalised_name(name: str) -> tuple[str, str] | None:
    """An entry's (top folder, path below it), both case-folded, as the most lenient reader would take them.

    None for a name with a `..` segment or no path below a folder (which no reader of torch's would find).
    """
    segments = [part for part in name.replace("\\", "/").split("/") if part not in ("", ".")]
    if ".." in segments or len(segments) < 2:
        return None
    return segments[0].casefold(), "/".join(segments[1:]).casefold()


def checked_archive(data: bytes, where: Path) -> bytes:
    """The .pt2's program rebuilt from its checked entries, for torch.export.load (UserProgramError, exit 65)."""

    def refuse(why: str) -> UserProgramError:
        return UserProgramError(
            f"{where}: {why}; torch.export.load would run code from it, so etlab does not load it",
            hint="export plain tensors (no tensor subclasses or script objects) and save with torch.export.save "
            "from a current torch",
        )

    entries = _entries(data, where, refuse)
    for key in entries:
        if key.startswith(AOTINDUCTOR_DIR):
            raise refuse(f"{key} is compiled AOTInductor code, which torch loads as a shared library")
        if key in LEGACY_PICKLES:
            raise refuse(f"{key} holds weights in the legacy pickled format")
    if MODEL_JSON not in entries:
        raise refuse(f"no {MODEL_JSON}: an older .pt2 format (or not an ExportedProgram)")
    for path, value in (ARCHIVE_FORMAT, ARCHIVE_VERSION):
        if entries.get(path, b"").strip() != value.encode():
            raise refuse(f"{path} is not {value!r}: not the archive format of a current torch.export.save")
    try:  # torch writes strict JSON; a float32 mask constant (-3.4e38) is as large as its numbers get
        program, weights, constants = (
            strictjson.loads(entries.get(name, b"null"), where=f"{where}: {name}", max_magnitude=sys.float_info.max)
            for name in (MODEL_JSON, WEIGHTS_CONFIG, CONSTANTS_CONFIG)
        )
    except strictjson.JsonDataError as exc:
        raise UserProgramError(f"unreadable .pt2 archive: {exc}") from None
    if not isinstance(program, dict):
        raise UserProgramError(f"{where}: unreadable .pt2 archive ({MODEL_JSON} is not a JSON object)")
    for expression in _expressions(program):
        if (why := safe_expression(expression)) is not None:
            raise refuse(f"{MODEL_JSON} holds the shape expression {expression[:80]!r}, which sympy would eval ({why})")
    program["guards_code"] = []  # Python source that ExportedProgram.module() would exec
    records = {
        MODEL_JSON: json.dumps(program).encode(),
        SAMPLE_INPUTS: _sample_inputs(entries.get(SAMPLE_INPUTS, b""), refuse, where),
    }
    for config_name, config, folder in (
        (WEIGHTS_CONFIG, weights, WEIGHTS_DIR),
        (CONSTANTS_CONFIG, constants, CONSTANTS_DIR),
    ):
        if config is None:
            continue
        for path_name in _payloads(config, config_name, constants=folder == CONSTANTS_DIR, refuse=refuse, where=where):
            key = (folder + path_name).casefold()
            if key not in entries:
                raise UserProgramError(
                    f"{where}: {config_name} names {folder + path_name}, which is not in the archive"
                )
            records[key] = entries[key]
        _check_extents(config, config_name, folder, entries, where)
        records[config_name] = json.dumps(config).encode()
    return _written(records)


def _entries(data: bytes, where: Path, refuse: Refuse) -> dict[str, bytes]:
    """The archive's entries by normalised name below the one top folder; ambiguous archives refused."""
    try:
        archive = zipfile.ZipFile(io.BytesIO(data))
        infos = [info for info in archive.infolist() if not info.is_dir()]
    except (zipfile.BadZipFile, ValueError, OSError, EOFError) as exc:
        raise UserProgramError(f"{where}: not a .pt2 archive of torch.export.save ({exc})") from None
    unpacked_cap = max(MAX_UNPACKED_FLOOR, MAX_UNPACKED_FACTOR * len(data))
    if sum(info.file_size for info in infos) > unpacked_cap:
        raise UserProgramError(f"{where}: the archive unpacks to more than {unpacked_cap} bytes, which etlab refuses")
    folders: set[str] = set()
    names: dict[str, str] = {}
    entries: dict[str, bytes] = {}
    for info in infos:
        normalised = normalised_name(info.filename)
        if normalised is None:
            raise refuse(f"the entry {info.filename!r} is not a path inside the archive's folder")
        folder, key = normalised
        folders.add(folder)
        if key in names:
            raise refuse(
                f"the entries {names[key]!r} and {info.filename!r} have one name for torch's reader, "
                "which may read either"
            )
        names[key] = info.filename
        try:
            entries[key] = archive.read(info)
        except (zipfile.BadZipFile, ValueError, OSError, EOFError, NotImplementedError, RuntimeError) as exc:
            raise UserProgramError(f"{where}: unreadable .pt2 archive ({info.filename}: {exc})") from None
    if len(folders) > 1:
        raise refuse(f"its entries are in {len(folders)} top folders, where torch.export.save writes one")
    return entries


def _sample_inputs(payload: bytes, refuse: Refuse, where: Path) -> bytes:
    """The example inputs loaded with weights_only=True and saved again: torch unpickles only what we wrote."""
    import torch

    if not payload:
        return b""  # a program saved without example inputs
    try:
        loaded = torch.load(io.BytesIO(payload), weights_only=True)
    except Exception as exc:  # weights_only refuses any class it does not know: that is the check
        raise refuse(
            f"{SAMPLE_INPUTS} does not load with weights_only=True ({str(exc).splitlines()[0][:160]})"
        ) from None
    if not isinstance(loaded, (tuple, dict)):
        raise UserProgramError(f"{where}: {SAMPLE_INPUTS} holds a {type(loaded).__name__}, not example inputs")
    buffer = io.BytesIO()
    torch.save(loaded, buffer)
    return buffer.getvalue()


def _payloads(config: Any, config_name: str, *, constants: bool, refuse: Refuse, where: Path) -> Iterator[str]:
    """The raw tensor files a weights or constants config names, each payload checked to be no pickle."""
    entries = config.get("config") if isinstance(config, dict) else None
    if not isinstance(entries, dict):
        raise UserProgramError(f"{where}: unreadable .pt2 archive ({config_name} has no config object)")
    for fqn, payload in entries.items():
        if not isinstance(payload, dict):
            raise UserProgramError(f"{where}: unreadable .pt2 archive ({config_name}: {fqn!r} is not an object)")
        path_name = payload.get("path_name")
        if payload.get("use_pickle") is not False:
            raise refuse(f"{fqn!r} is stored pickled (a tensor subclass)")
        if not isinstance(path_name, str) or not _PLAIN_NAME.fullmatch(path_name):
            raise refuse(f"{config_name}: {fqn!r} names the file {path_name!r}, which is no plain file name")
        if constants and not path_name.startswith(TENSOR_CONSTANT):
            raise refuse(f"constant {fqn!r} is a script or opaque object")
        yield path_name


def _check_extents(
    config: dict[str, Any], config_name: str, folder: str, entries: dict[str, bytes], where: Path
) -> None:
    """Each tensor's shape, strides and offset stay inside its file: torch allocates no more than the file holds."""
    from torch._export.serde.serialize import _SERIALIZE_TO_TORCH_DTYPE

    for fqn, payload in config["config"].items():
        meta = payload.get("tensor_meta")
        try:
            dtype = _SERIALIZE_TO_TORCH_DTYPE[meta["dtype"]]
            sizes = [int(value["as_int"]) for value in meta["sizes"]]
            strides = [int(value["as_int"]) for value in meta["strides"]]
            offset = int(meta["storage_offset"]["as_int"])
        except (KeyError, TypeError, ValueError):
            raise UserProgramError(f"{where}: {config_name}: {fqn!r} has no plain tensor shape") from None
        if len(sizes) != len(strides) or min([offset, *sizes, *strides]) < 0:
            raise UserProgramError(f"{where}: {config_name}: {fqn!r} has a negative or mismatched shape or stride")
        elements = (
            0
            if 0 in sizes
            else offset + 1 + sum((size - 1) * stride for size, stride in zip(sizes, strides, strict=True))
        )
        stored = len(entries[(folder + payload["path_name"]).casefold()])
        if elements * dtype.itemsize > stored:
            raise UserProgramError(
                f"{where}: {config_name}: {fqn!r} of shape {sizes} needs {elements * dtype.itemsize} bytes, "
                f"its file holds {stored}"
            )


def _expressions(value: Any) -> Iterator[str]:
    """Every `expr_str` in the program's JSON: what sympy.sympify will eval."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            for key, inner in item.items():
                if key == "expr_str":
                    yield inner if isinstance(inner, str) else repr(inner)
                else:
                    stack.append(inner)
        elif isinstance(item, list):
            stack.extend(item)


_ALLOWED_NODES = (
    ast.Expression,
    ast.Call,
    ast.Name,
    ast.Constant,
    ast.keyword,
    ast.BinOp,
    ast.UnaryOp,
    ast.Compare,
    ast.BoolOp,
    ast.Load,
    ast.operator,
    ast.unaryop,
    ast.cmpop,
    ast.boolop,
)


def safe_expression(text: str) -> str | None:
    """Why eval'ing this shape expression could do more than arithmetic, or None when it cannot.

    torch writes sympy's srepr: `Add(Mul(Integer(2), Symbol('s77', positive=True, integer=True)), Integer(1))`.
    Allowed are calls of sympy's and torch's math classes by name, shape symbols, numbers, keyword flags and
    operators; no attributes, subscripts, lambdas, builtins or other strings (sympy's constructors sympify strings).
    """
    if len(text) > MAX_EXPRESSION_CHARS:
        return f"longer than {MAX_EXPRESSION_CHARS} characters"
    try:
        tree = ast.parse(text, mode="eval")
    except (SyntaxError, ValueError):
        return "not an expression"
    for node in ast.walk(tree):
        if not isinstance(node, _ALLOWED_NODES):
            return f"a {type(node).__name__}"
        if isinstance(node, ast.Call) and not isinstance(node.func, ast.Name):
            return "a call of something that is not a name"
        if (exponent := _exponent(node)) is not None and not _literal_or_symbol(exponent):
            return "a power or shift by a computed amount"
        if isinstance(node, ast.keyword) and (node.arg is None or node.arg.startswith("_")):
            return "a ** argument or a private keyword"
        if isinstance(node, ast.Name) and not _math_name(node.id):
            return f"the name {node.id!r}"
        if isinstance(node, ast.Constant):
            value = node.value
            if isinstance(value, str) and not (_SHAPE_SYMBOL.fullmatch(value) or _NUMBER.fullmatch(value)):
                return f"the string {value[:40]!r}"
            if isinstance(value, int) and abs(value) > MAX_EXPRESSION_INT:
                return "an integer beyond 2**64"
            if not isinstance(value, (str, int, float, bool)) and value is not None:
                return f"a {type(value).__name__} constant"
    return None


_POWERS = {"Pow", "PowByNatural", "FloatPow", "LShift", "RShift"}


def _exponent(node: ast.AST) -> ast.AST | None:
    """The exponent (or shift) of a power: sympy computes it when both sides are numbers, however large."""
    if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Pow, ast.LShift, ast.RShift)):
        return node.right
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in _POWERS and node.args:
        return node.args[-1]
    return None


def _literal_or_symbol(node: ast.AST) -> bool:
    """A small integer (as `2`, `-2` or `Integer(2)`) or a symbol: an exponent sympy computes no huge number from."""
    if isinstance(node, ast.UnaryOp):
        node = node.operand
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("Integer", "Symbol"):
        if node.func.id == "Symbol":
            return True
        node = node.args[0] if len(node.args) == 1 else node
    if isinstance(node, ast.Name):
        return True
    return isinstance(node, ast.Constant) and isinstance(node.value, int) and abs(node.value) <= 1024


@functools.lru_cache(maxsize=1024)
def _math_name(name: str) -> bool:
    """A name sympy's eval resolves to a math class or value, or to a new symbol: never a function that acts."""
    import sympy
    from torch.utils._sympy import functions as torch_functions

    if name.startswith("_") or name in vars(builtins):
        return False
    for namespace in (torch_functions, sympy):
        found = getattr(namespace, name, None)
        if found is not None:
            return (isinstance(found, type) and issubclass(found, sympy.Basic)) or isinstance(found, sympy.Basic)
    return True  # unknown to the namespace: sympy makes it a Symbol (or an undefined Function when called)


def _written(records: dict[str, bytes]) -> bytes:
    """A .pt2 of these records, written by torch's own writer (its layout, its version files)."""
    from torch.export.pt2_archive._package import PT2ArchiveWriter

    buffer = io.BytesIO()
    with PT2ArchiveWriter(buffer) as writer:
        for name, payload in records.items():
            writer.write_bytes(name, payload)
    return buffer.getvalue()
