"""The source map of a lowered program: for each top-level instruction and each node inside an XNNPACK delegate, the
modules and lines of the user's model it came from (`<name>_<variant>.sources.json` beside the .pte).

Built from the ExecuTorch program manager `lower_exported` returns, without an ETRecord. What ExecuTorch 1.5.1 keeps,
found on distilbert-tiny (xnnpack and portable):

- to_edge's DebugHandleGeneratorPass gives every edge node a `debug_handle`, the same one to every node decomposed
  from one source node (its root `from_node`): an SDPA call decomposed into a dozen nodes, the layer's mask arithmetic
  included, all carry one handle. A handle therefore names a source node, not an operator.
- The emitter then *overwrites* `meta["debug_handle"]` of each node it emits as an instruction with the instruction's
  index in the chain, and keeps the original in `debug_handle_map` (instruction id -> handle; a list of the
  delegated subgraph's handles for a delegate call). The executorch graph's emitted nodes still hold their
  `nn_module_stack` and `stack_trace`, so a kernel call's sources are its own node's. A `getitem` after a delegate
  keeps its original handle, which can equal an unrelated instruction id: only emitted operator nodes are read.
- A delegate's nodes come from `lowered_module.original_module`, whose nodes keep their original handles; the
  serialized XNN nodes carry those same handles (`XNode.debug_handle`), so an XNN node's sources are the subgraph's
  nodes with its handle (a fused node lists each distinct source). `delegate_map` is empty for XNNPACK.
- nn_module_stack keys are `<id>@<call>` under transformers 5.25; the values (path, class) are used. Paths are as
  the exported module names them; etlab's wrappers hold the user's model as `model`, so when every path starts with
  `model.`, that component is dropped and the paths are the model's own (`distilbert.transformer.layer.0.attention`).
- A stack trace's innermost frame is usually torch's (nn.Linear's forward): the source is the innermost frame
  outside torch, ExecuTorch, torchao and etlab itself, the user's own code (`modeling_distilbert.py:182 in forward`).

The file is deterministic (sorted keys, sources in order of first use), as the artifact cache is content-addressed.
"""

from __future__ import annotations

import functools
import operator
import re
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from orchestrator.fsutil import atomic_write_json
from orchestrator.programs.plan import read_program_plan
from orchestrator.programs.xnn import XNNPACK_BACKEND, read_xnn_nodes

SOURCE_MAP_SCHEMA = 1
SOURCE_MAP_SUFFIX = ".sources.json"  # beside the sidecars (`<name>_<variant>.json`): never read as one
_FRAME = re.compile(r'^\s*File "(?P<path>[^"]+)", line (?P<line>\d+), in (?P<function>\S+)\s*$')
_WRAPPER_ROOT = "model"
_EMPTY_STACK = "_empty_nn_module_stack_from_metadata_hook"  # torch/_export/passes/_node_metadata_hook.py
_MODULE_PATH = re.compile(r"(\w+(\.\w+)*)?")  # attribute names and indices: "model.layers.0.self_attn", "" the root


def source_map_path(pte: Path) -> Path:
    """`<name>_<variant>.sources.json` beside `<name>_<variant>.pte`."""
    return pte.with_name(f"{pte.stem}{SOURCE_MAP_SUFFIX}")


def _library_roots() -> tuple[str, ...]:
    """Folders whose frames are never the user's code: torch, ExecuTorch, torchao and etlab."""
    import importlib.util

    roots = []
    for package in ("torch", "executorch", "torchao", "orchestrator"):
        spec = importlib.util.find_spec(package)
        for location in (spec.submodule_search_locations or []) if spec else []:
            roots.append(str(Path(location).resolve()) + "/")
    return tuple(roots)


def _frames(stack_trace: str) -> list[tuple[str, int, str]]:
    frames = []
    for line in stack_trace.splitlines():
        match = _FRAME.match(line)
        if match:
            frames.append((match["path"], int(match["line"]), match["function"]))
    return frames


@functools.cache
def _resolved(path: str) -> str:
    return str(Path(path).resolve())


def _location(stack_trace: str | None, library: tuple[str, ...]) -> dict[str, Any]:
    """The innermost frame in the user's code (else the innermost frame): file basename, line, function, path."""
    frames = _frames(stack_trace or "")
    if not frames:
        return {}
    own = [frame for frame in frames if not _resolved(frame[0]).startswith(library)]
    path, line, function = (own or frames)[-1]
    return {"file": Path(path).name, "line": line, "function": function, "path": path}


def _modules(node: Any) -> list[tuple[str, str]]:
    """A node's modules, outermost first: (path as exported, class). Entries that name no module are passed over:
    the placeholder torch's metadata hook gives a node without a stack, and functions a model's code calls through a
    global (`G['__import_transformers_..._llama'].apply_rotary_pos_emb`)."""
    found = []
    for path, kind in (node.meta.get("nn_module_stack") or {}).values():
        if path == _EMPTY_STACK or not _MODULE_PATH.fullmatch(str(path)):
            continue
        found.append((str(path), kind if isinstance(kind, str) else f"{kind.__module__}.{kind.__qualname__}"))
    return found


class _Sources:
    """Distinct sources, numbered in order of first use."""

    def __init__(self) -> None:
        self.library = _library_roots()
        self.rows: list[dict[str, Any]] = []
        self.index: dict[tuple[Any, ...], int] = {}
        self.modules: dict[str, str] = {}  # every module any source sits in, its ancestors too: path -> class

    def of(self, nodes: Iterable[Any]) -> list[int]:
        found: list[int] = []
        for node in nodes:
            stack = _modules(node)
            self.modules.update(stack)
            module = stack[-1] if stack else None
            location = _location(node.meta.get("stack_trace"), self.library)
            if module is None and not location:
                continue
            row = {"module": module[0] if module else None, "module_type": module[1] if module else None, **location}
            key = tuple(sorted((k, str(v)) for k, v in row.items()))
            if key not in self.index:
                self.index[key] = len(self.rows)
                self.rows.append(row)
            if self.index[key] not in found:
                found.append(self.index[key])
        return found


def _operator_nodes(graph: Any) -> Iterator[Any]:
    from executorch.exir.memory import alloc

    for node in graph.nodes:
        if node.op == "call_function" and node.target not in (operator.getitem, alloc):
            yield node


def _strip_wrapper(rows: list[dict[str, Any]], modules: dict[str, str]) -> dict[str, str]:
    """Paths as the user's model names them: etlab's wrappers hold it as `model`. The module classes by path."""
    paths = [path for path in modules if path]
    if not paths or not all(path == _WRAPPER_ROOT or path.startswith(_WRAPPER_ROOT + ".") for path in paths):
        return dict(sorted(modules.items()))
    for row in rows:
        if row["module"]:
            row["module"] = row["module"][len(_WRAPPER_ROOT) + 1 :]
    return dict(sorted((path[len(_WRAPPER_ROOT) + 1 :], kind) for path, kind in modules.items() if path))


def build_source_map(program: Any, pte: Path, method: str = "forward") -> dict[str, Any]:
    """The source map of `program` (an ExecutorchProgramManager) written as `pte`: see the module docstring."""
    from executorch.exir.delegate import executorch_call_delegate

    handles: dict[int, Any] = program.debug_handle_map.get(method, {}) if method else {}
    graph_module = program.exported_program(method).graph_module
    sources = _Sources()
    instructions: list[dict[str, Any]] = []
    delegated: dict[int, dict[int, list[Any]]] = {}  # instruction -> original handle -> subgraph nodes
    for node in _operator_nodes(graph_module.graph):
        instruction = node.meta.get("debug_handle")
        if not isinstance(instruction, int) or instruction not in handles:
            continue
        if node.target is executorch_call_delegate:
            lowered = getattr(graph_module, node.args[0].target)
            by_handle: dict[int, list[Any]] = {}
            for inner in _operator_nodes(lowered.original_module.graph):
                handle = inner.meta.get("debug_handle")
                if isinstance(handle, int):
                    by_handle.setdefault(handle, []).append(inner)
            delegated[instruction] = by_handle
            continue
        original = handles[instruction]
        row = {"instruction": instruction, "handles": [original] if isinstance(original, int) else list(original)}
        instructions.append({**row, "sources": sources.of([node])})

    delegates = []
    plan = read_program_plan(pte, method)
    for planned in plan.delegates():
        if planned.backend != XNNPACK_BACKEND or planned.delegate is None or planned.index not in delegated:
            continue
        by_handle = delegated[planned.index]
        nodes = []
        for xnode in read_xnn_nodes(planned.delegate, pte):
            found = sources.of(by_handle.get(xnode.debug_handle, []))
            nodes.append({"node": xnode.index, "handle": xnode.debug_handle, "sources": found})
        delegates.append({"instruction": planned.index, "nodes": nodes})
    modules = _strip_wrapper(sources.rows, sources.modules)
    return {
        "schema": SOURCE_MAP_SCHEMA,
        "method": method,
        "pte": pte.name,
        "modules": modules,
        "sources": sources.rows,
        "instructions": sorted(instructions, key=lambda row: row["instruction"]),
        "delegates": delegates,
    }


def write_source_map(program: Any, pte: Path, method: str = "forward") -> Path:
    """The source map written beside `pte` (same program, same bytes)."""
    path = source_map_path(pte)
    atomic_write_json(path, build_source_map(program, pte, method), durable=False, indent=None)
    return path
