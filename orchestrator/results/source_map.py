"""A program's source map read back (`<name>_<variant>.sources.json`, written by lowering/export/source_map.py) and
laid on a profile: each kernel call and each XNNPACK node gets the module and the line of the model it came from.

The map is untrusted: an artifacts folder can be edited. It is read strictly (strictjson's size and number rules),
built into typed records (orchestrator/records.py: the field named when wrong), and checked against the program it
claims to describe (every instruction id and node index must exist in the profile, every source index in the map):
anything else is a SourceMapError, exit 65, naming the file.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated

import msgspec

from orchestrator.errors import AnalysisError
from orchestrator.fsutil import read_json, unreadable
from orchestrator.records import Count, Document, RecordError, read_document
from orchestrator.results.profile import Attribution, Profile

MAX_ROWS = 1_000_000  # far above any program's instructions or nodes; a longer list is not etlab's
MAX_TEXT = 4096
Text = Annotated[str, msgspec.Meta(max_length=MAX_TEXT)]
Indices = Annotated[tuple[Count, ...], msgspec.Meta(max_length=MAX_ROWS)]
# The exported program's node names (an FX node's name is an identifier): Model Explorer's node ids of the .pt2.
NodeName = Annotated[str, msgspec.Meta(pattern=r"^[A-Za-z_][A-Za-z0-9_]{0,255}$")]
NodeNames = Annotated[tuple[NodeName, ...], msgspec.Meta(max_length=MAX_ROWS)]
ExportedFile = Annotated[str, msgspec.Meta(pattern=r"^[A-Za-z0-9_][A-Za-z0-9_.+-]{0,254}\.pt2$")]


class SourceMapError(RecordError, AnalysisError):
    """A source map that is not what lowering writes, or not of this program (exit 65)."""


@dataclass(frozen=True)
class SourceRecord:
    module: Text | None = None  # "distilbert.transformer.layer.0.attention.q_lin"
    module_type: Text | None = None  # "torch.nn.modules.linear.Linear"
    file: Text | None = None  # "modeling_distilbert.py"
    line: Count | None = None
    function: Text | None = None
    path: Text | None = None  # the file's full path where it was lowered

    @property
    def location(self) -> str | None:
        """`file:line in function`."""
        if self.file is None:
            return None
        line = f":{self.line}" if self.line is not None else ""
        return f"{self.file}{line} in {self.function}" if self.function else f"{self.file}{line}"


@dataclass(frozen=True)
class InstructionSources:
    instruction: Count
    sources: Indices = ()
    handles: Annotated[tuple[int, ...], msgspec.Meta(max_length=MAX_ROWS)] = ()
    op: Text | None = None  # the kernel the node calls, as the plan names it ("aten::mm.out")
    exported: NodeNames = ()  # the .pt2 nodes it was lowered from


@dataclass(frozen=True)
class NodeSources:
    node: Count
    sources: Indices = ()
    handle: int | None = None
    exported: NodeNames = ()


@dataclass(frozen=True)
class DelegateSources:
    instruction: Count
    nodes: Annotated[tuple[NodeSources, ...], msgspec.Meta(max_length=MAX_ROWS)] = ()


@dataclass(frozen=True)
class SourceMap(Document):
    method: Text
    sources: Annotated[tuple[SourceRecord, ...], msgspec.Meta(max_length=MAX_ROWS)]
    instructions: Annotated[tuple[InstructionSources, ...], msgspec.Meta(max_length=MAX_ROWS)] = ()
    delegates: Annotated[tuple[DelegateSources, ...], msgspec.Meta(max_length=MAX_ROWS)] = ()
    pte: Text | None = None
    modules: Annotated[dict[Text, Text], msgspec.Meta(max_length=MAX_ROWS)] = field(default_factory=dict)
    unmatched: Count = 0  # operator nodes lowering left out: their instruction was not the plan's next one
    exported_program: ExportedFile | None = None  # the .pt2 the rows' `exported` names are nodes of, beside the map


def source_map_path(pte: Path) -> Path:
    """Where lowering writes a program's map: `<name>_<variant>.sources.json` beside the .pte."""
    return pte.with_name(f"{pte.stem}.sources.json")


def read_source_map(path: Path) -> SourceMap:
    """The map in `path`, every field checked, every source index inside the map: SourceMapError naming the file."""
    try:
        data = read_json(path)
    except (OSError, ValueError) as exc:
        raise AnalysisError(unreadable(path, exc)) from None
    try:
        found = read_document(data, SourceMap, where=str(path))
    except RecordError as exc:
        raise SourceMapError(exc.where, exc.field, exc.problem) from None
    count = len(found.sources)
    rows = [(f"instructions[{k}]", row.sources) for k, row in enumerate(found.instructions)]
    rows += [
        (f"delegates[{k}].nodes[{n}]", node.sources)
        for k, delegate in enumerate(found.delegates)
        for n, node in enumerate(delegate.nodes)
    ]
    for row_name, indices in rows:
        bad = next((index for index in indices if index >= count), None)
        if bad is not None:
            raise SourceMapError(str(path), f"{row_name}.sources", f"source {bad} does not exist (the map has {count})")
    return found


def _common_module(modules: list[str]) -> str | None:
    """The deepest module holding all of `modules` ("" when only the model itself does)."""
    if not modules:
        return None
    parts = [module.split(".") if module else [] for module in modules]
    common: list[str] = []
    for names in zip(*parts, strict=False):
        if len(set(names)) != 1:
            break
        common.append(names[0])
    return ".".join(common)


def attribution(records: list[SourceRecord], exported: tuple[str, ...] = ()) -> Attribution:
    modules = [record.module for record in records if record.module is not None]
    module = _common_module(modules)
    types = {record.module_type for record in records if record.module == module}
    locations = list(dict.fromkeys(loc for loc in (record.location for record in records) if loc is not None))
    kind = types.pop() if len(types) == 1 else None
    return Attribution(module, kind, "; ".join(locations) or None, tuple(sorted(set(exported))))


def attribute(profile: Profile, source_map: SourceMap, where: str) -> None:
    """Each kernel call and XNNPACK node of `profile` given its module and source; a map naming an instruction or a
    node the program does not have is a SourceMapError naming `where`."""
    if source_map.method != profile.method:
        problem = f"the map is of method {source_map.method!r}, the run of {profile.method!r}"
        raise SourceMapError(where, "method", problem)
    profile.module_types = dict(source_map.modules)
    profile.exported_program = source_map.exported_program
    instructions = {i.index: i for i in profile.instructions if i.chain == 0}
    delegates = {d.node_id: d for d in profile.delegates}

    def records(indices: tuple[int, ...]) -> list[SourceRecord]:
        return [source_map.sources[index] for index in indices]

    for k, row in enumerate(source_map.instructions):
        instruction = instructions.get(row.instruction)
        if instruction is None or instruction.kind != "KernelCall":
            raise SourceMapError(
                where, f"instructions[{k}].instruction", f"the program has no kernel call {row.instruction}"
            )
        if row.op is not None and row.op != instruction.op:
            problem = f"instruction {row.instruction} calls {instruction.op}, not {row.op}"
            raise SourceMapError(where, f"instructions[{k}].op", problem)
        instruction.source = attribution(records(row.sources), row.exported)
    for k, delegated in enumerate(source_map.delegates):
        instruction = instructions.get(delegated.instruction)
        if instruction is None or instruction.kind != "DelegateCall":
            raise SourceMapError(
                where, f"delegates[{k}].instruction", f"the program has no delegate call {delegated.instruction}"
            )
        profile_delegate = delegates.get(instruction.node_id)
        known = profile_delegate.node_types if profile_delegate is not None else {}
        nodes = {node.node: node for node in profile_delegate.nodes} if profile_delegate is not None else {}
        everything: list[SourceRecord] = []
        exported: list[str] = []
        for n, node in enumerate(delegated.nodes):
            if known and str(node.node) not in known:
                raise SourceMapError(
                    where,
                    f"delegates[{k}].nodes[{n}].node",
                    f"delegate {delegated.instruction} has no node {node.node}",
                )
            found = records(node.sources)
            everything += found
            exported += node.exported
            traced = attribution(found, node.exported)
            if profile_delegate is not None:
                profile_delegate.node_sources[str(node.node)] = traced
            if str(node.node) in nodes:
                nodes[str(node.node)].source = traced
        instruction.source = attribution(everything, tuple(exported))
        if profile_delegate is not None:
            profile_delegate.source = instruction.source


def load_source_map(pte: Path | None, recorded: Path | None = None) -> tuple[SourceMap | None, Path | None]:
    """The map of `pte` (the sidecar's record of it when there is one): (None, None) when the program has none."""
    if pte is None:
        return None, None
    path = recorded if recorded is not None else source_map_path(pte)
    if not path.is_file():
        return None, None
    return read_source_map(path), path
