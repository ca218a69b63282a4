"""The source map of a lowered program: for each top-level instruction and each node inside an XNNPACK delegate, the
modules and lines of the user's model it came from (`<name>_<variant>.sources.json` beside the .pte).

Built from the ExecuTorch program manager `lower_exported` returns, without an ETRecord. What ExecuTorch 1.5.1 keeps,
found on distilbert-tiny (xnnpack and portable):

- to_edge's DebugHandleGeneratorPass gives every edge node a `debug_handle`, the same one to every node decomposed
  from one source node (its root `from_node`): an SDPA call decomposed into a dozen nodes, the layer's mask arithmetic
  included, all carry one handle. A handle therefore names a source node, not an operator.
- The emitter walks the final graph's nodes in order and appends one instruction per operator node: a KernelCall per
  operator (the plan names it `aten::mm.out`, a default overload bare: `etlab::attend`), a DelegateCall per
  `executorch_call_delegate`, a FreeCall per `memory.free`, an `executorch_prim::et_view` KernelCall per
  `memory.view` unless the view is static and memory planned (then nothing), nothing for getitem and alloc; moves
  come at the output. So the n-th such node *is* the n-th operator instruction of the plan, and each instruction's
  sources are its own node's (`nn_module_stack`, `stack_trace`). A handle is never trusted to name an instruction:
  a node the emitter did not emit (a view, a getitem) keeps its original handle, which can equal an unrelated
  instruction's id (smollm2-gen-tiny's named a DelegateCall as a kernel call, and the analysis refused the map).
  Each pair is checked against the plan (kind and operator) and, for a node the emitter gave a handle, against the
  handle the emitter overwrote with the instruction's index (`debug_handle_map` keeps the original: a list of the
  delegated subgraph's handles for a delegate call); a pair that disagrees is left out and counted (`unmatched`).
  Each row says its operator (`op`), which the analysis checks against the plan.
- A delegate's nodes come from `lowered_module.original_module`, whose nodes keep their original handles; the
  serialized XNN nodes carry those same handles (`XNode.debug_handle`), so an XNN node's sources are the subgraph's
  nodes with its handle (a fused node lists each distinct source). `delegate_map` is empty for XNNPACK. A node
  XNNPACK's lowering inserted itself (a layout conversion: MobileNetV2's NCHW -> NHWC input transpose, Whisper's
  around its convolutions) carries no handle of the graph (65535): it is there for the node that reads its output,
  so it takes that node's sources (the first reader's; walked from the last node back, so chains resolve).
- nn_module_stack keys are `<id>@<call>` under transformers 5.25; the values (path, class) are used. Paths are as
  the exported module names them; etlab's wrappers hold the user's model as `model`, so when every path starts with
  `model.`, that component is dropped and the paths are the model's own (`distilbert.transformer.layer.0.attention`).
- Each node's `from_node` provenance ends at the node of the graph lowering started from (torch.fx.traceback.NodeSource:
  its root's `name`). When that graph is the saved `.pt2` (the fp32 variants; a quantized one is exported again), the
  roots are the `.pt2`'s node names, the ids Model Explorer's PyTorch adapter gives its nodes: each row lists them
  (`exported`), so a run's cost can be painted on the `.pt2` too. Roots that are not `.pt2` nodes are left out.
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

from orchestrator import console
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


def module_stack(node: Any) -> list[tuple[str, str]]:
    """A node's modules, outermost first: (path as exported, class)."""
    return _modules(node)


def user_location(stack_trace: str | None) -> dict[str, Any]:
    """The innermost frame of a stack trace in the user's code: file basename, line, function, path."""
    return _location(stack_trace, _library_roots_once())


@functools.cache
def _library_roots_once() -> tuple[str, ...]:
    return _library_roots()


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


def _roots(node: Any) -> Iterator[str]:
    """The names at the ends of a node's `from_node` chains: the nodes of the graph lowering started from."""
    pending = list(node.meta.get("from_node") or ())
    while pending:
        source = pending.pop()
        parents = getattr(source, "from_node", None)
        if parents:
            pending.extend(parents)
        elif isinstance(getattr(source, "name", None), str):
            yield source.name


def _exported_nodes(nodes: Iterable[Any], known: frozenset[str]) -> list[str]:
    """The `.pt2` nodes `nodes` came from, sorted; none when the program was not lowered from the `.pt2`."""
    return sorted({name for node in nodes for name in _roots(node) if name in known})


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


_NON_OPERATOR = ("MoveCall", "FreeCall", "JumpFalseCall")  # instructions no operator node is emitted as


def _operator_name(target: Any, overload: str | None = None) -> str:
    """The plan's name of the kernel the emitter calls for `target` (`_emit_operator`): "aten::mean.out", or the bare
    name for a default overload ("etlab::attend")."""
    name = target._overloadpacket._qualified_op_name
    overload = target._overloadname if overload is None else overload
    return name if overload in ("", "default") else f"{name}.{overload}"


def _emitted(node: Any) -> tuple[str, str | None] | None:
    """The instruction the emitter (executorch/exir/emit/_emitter.py, `call_function`) makes of `node`: (kind,
    operator), None for a node it makes none of (getitem, alloc, a static planned view), and ("?", None) for one this
    map does not follow (control flow: a sub-chain with jumps)."""
    from executorch.exir import memory
    from executorch.exir.delegate import executorch_call_delegate

    target = node.target
    if node.op != "call_function" or target in (operator.getitem, memory.alloc):
        return None
    if target is memory.view:  # `_emit_view`: elided when static and memory planned, else an et_view kernel call
        spec = node.meta.get("spec")
        planned = spec is not None and spec.mem_id is not None and spec.mem_offset is not None
        planned = planned or (spec is not None and spec.const and spec.storage is not None)
        if spec is not None and spec.is_static_shape_tensor and planned:
            return None
        return "KernelCall", "executorch_prim::et_view.default"
    if target is memory.free:
        return "FreeCall", None
    if target is executorch_call_delegate:
        return "DelegateCall", None
    if hasattr(target, "_overloadpacket") and hasattr(target, "_overloadname"):
        return "KernelCall", _operator_name(target)
    return "?", None


def _operator_of(node: Any) -> str | None:
    """The operator the node calls, by the node's own target (the plan's spelling): each map row says it, and the
    analysis checks it against the plan."""
    emitted = _emitted(node)
    return emitted[1] if emitted else None


def _aligned(graph: Any, plan: Any) -> tuple[list[tuple[Any, Any]], int]:
    """The emitted graph's operator nodes paired with the plan's instructions, in order: the emitter walks the nodes
    in order and appends each one's instruction to the chain, so the n-th operator node is the n-th operator
    instruction (moves and frees in between passed over). A pair is kept only when the plan's kind and operator are
    the node's own; a node whose instruction the plan does not have next is left out and counted (never seen on
    etlab's programs: a count above 0 is a bug of this reading of the emitter). Nodes after a control-flow operator
    are counted too: its sub-chains are not followed."""
    chain = [instruction for instruction in plan.instructions if instruction.chain == 0]
    pairs: list[tuple[Any, Any]] = []
    unmatched = 0
    position = 0
    stopped = False
    for node in graph.nodes:
        expected = _emitted(node)
        if expected is None:
            continue
        kind, op = expected
        if stopped or kind == "?":
            stopped = True
            unmatched += kind != "FreeCall"
            continue
        at = position
        while at < len(chain) and chain[at].kind in _NON_OPERATOR and chain[at].kind != kind:
            at += 1
        if at < len(chain) and chain[at].kind == kind and (op is None or chain[at].op == op):
            pairs.append((node, chain[at]))
            position = at + 1
        elif kind != "FreeCall":
            unmatched += 1
    return pairs, unmatched


def _inserted_nodes_take_their_readers(rows: list[dict[str, Any]], xnodes: list[Any], handles: set[int]) -> None:
    """A node whose handle is none of the delegated graph's takes the sources of the first node reading its output."""
    readers: dict[int, int] = {}
    for xnode in xnodes:
        for value in xnode.inputs:
            readers.setdefault(value, xnode.index)
    for row, xnode in zip(reversed(rows), reversed(xnodes), strict=True):
        reader = readers.get(xnode.output) if xnode.output is not None else None
        if xnode.debug_handle in handles or reader is None or reader <= xnode.index:
            continue
        row["sources"] = list(rows[reader]["sources"])
        if "exported" in rows[reader]:
            row["exported"] = list(rows[reader]["exported"])


def build_source_map(
    program: Any, pte: Path, method: str = "forward", exported: tuple[str, Any] | None = None
) -> dict[str, Any]:
    """The source map of `program` (an ExecutorchProgramManager) written as `pte`: see the module docstring.
    `exported` is (file name, ExportedProgram) of the `.pt2` the program was lowered from, when it was."""
    from executorch.exir.delegate import executorch_call_delegate

    known = frozenset(node.name for node in (exported[1].graph.nodes if exported else ()) if node.op == "call_function")

    handles: dict[int, Any] = program.debug_handle_map.get(method, {}) if method else {}
    graph_module = program.exported_program(method).graph_module
    plan = read_program_plan(pte, method)
    sources = _Sources()
    instructions: list[dict[str, Any]] = []
    delegated: dict[int, dict[int, list[Any]]] = {}  # instruction -> original handle -> subgraph nodes
    pairs, unmatched = _aligned(graph_module.graph, plan)
    for node, planned in pairs:
        instruction = planned.index
        # The emitter gave each node it emitted with a handle its instruction's index: one that disagrees with the
        # order is not this instruction's node.
        own = node.meta.get("debug_handle")
        if instruction in handles and own != instruction:
            unmatched += 1
            continue
        if node.target is executorch_call_delegate:
            lowered = getattr(graph_module, node.args[0].target)
            if lowered.backend_id != planned.backend:
                unmatched += 1
                continue
            by_handle: dict[int, list[Any]] = {}
            for inner in _operator_nodes(lowered.original_module.graph):
                handle = inner.meta.get("debug_handle")
                if isinstance(handle, int):
                    by_handle.setdefault(handle, []).append(inner)
            delegated[instruction] = by_handle
            continue
        if planned.kind != "KernelCall":
            continue
        original = handles.get(instruction)
        found = [original] if isinstance(original, int) else list(original or [])
        row = {"instruction": instruction, "op": _operator_of(node), "handles": found}
        if known:
            row["exported"] = _exported_nodes([node], known)
        instructions.append({**row, "sources": sources.of([node])})

    delegates = []
    for planned in plan.delegates():
        if planned.backend != XNNPACK_BACKEND or planned.delegate is None or planned.index not in delegated:
            continue
        by_handle = delegated[planned.index]
        nodes = []
        xnodes = read_xnn_nodes(planned.delegate, pte)
        for xnode in xnodes:
            inner = by_handle.get(xnode.debug_handle, [])
            row = {"node": xnode.index, "handle": xnode.debug_handle, "sources": sources.of(inner)}
            if known:
                row["exported"] = _exported_nodes(inner, known)
            nodes.append(row)
        _inserted_nodes_take_their_readers(nodes, xnodes, set(by_handle))
        delegates.append({"instruction": planned.index, "nodes": nodes})
    modules = _strip_wrapper(sources.rows, sources.modules)
    return {
        "schema": SOURCE_MAP_SCHEMA,
        "method": method,
        "pte": pte.name,
        **({"exported_program": exported[0]} if exported else {}),
        "modules": modules,
        "sources": sources.rows,
        "instructions": sorted(instructions, key=lambda row: row["instruction"]),
        "delegates": delegates,
        "unmatched": unmatched,
    }


def write_source_map(program: Any, pte: Path, method: str = "forward", exported: tuple[str, Any] | None = None) -> Path:
    """The source map written beside `pte` (same program, same bytes); `exported` as build_source_map's."""
    path = source_map_path(pte)
    data = build_source_map(program, pte, method, exported)
    if data["unmatched"]:
        console.warn(f"{pte.name}: {data['unmatched']} instruction(s) left out of the source map (not the plan's)")
    atomic_write_json(path, data, durable=False, indent=None)
    return path
