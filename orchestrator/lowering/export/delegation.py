"""What the partitioner did: delegate call sites, fallback operators, and runtime instruction counts; what stays
outside the delegates: real kernels apart from bookkeeping nodes, and constants stored twice."""

from __future__ import annotations

import dataclasses
from collections import Counter
from pathlib import Path
from typing import Any

from orchestrator.programs.outside import OutsideDelegates, read_outside_delegates

DELEGATE_TARGET = "executorch_call_delegate"


def node_target_name(target: Any) -> str:
    """Operator names the way ExecuTorch users read them: aten.addmm.out, memory.alloc, getitem."""
    if hasattr(target, "_schema") or type(target).__name__ == "OpOverload":
        return str(target)
    name = getattr(target, "__name__", str(target))
    module = getattr(target, "__module__", "") or ""
    if module.startswith("executorch.exir."):
        return f"{module.rsplit('.', 1)[-1]}.{name}"
    return name


def delegation_report(executorch_program_manager: Any) -> dict[str, Any]:
    """Counts from the lowered graph and from the serialized execution plan of `forward`."""
    graph = executorch_program_manager.exported_program().graph_module.graph
    call_sites = 0
    fallback: Counter[str] = Counter()
    for node in graph.nodes:
        if node.op != "call_function":
            continue
        name = node_target_name(node.target)
        if name == DELEGATE_TARGET:
            call_sites += 1
        else:
            fallback[name] += 1

    plan = next(p for p in executorch_program_manager.executorch_program.execution_plan if p.name == "forward")
    instructions: Counter[str] = Counter()
    for chain in plan.chains:
        for instruction in chain.instructions:
            instructions[type(instruction.instr_args).__name__] += 1
    backends = Counter(delegate.id for delegate in plan.delegates)
    return {
        "delegate_call_sites": call_sites,
        "delegate_backends": dict(backends),
        "fallback_ops": sum(fallback.values()),
        "fallback_histogram": dict(fallback.most_common()),
        "instructions": {
            "KernelCall": instructions.get("KernelCall", 0),
            "DelegateCall": instructions.get("DelegateCall", 0),
            "other": sum(v for k, v in instructions.items() if k not in ("KernelCall", "DelegateCall")),
        },
    }


# Graph nodes outside the delegates that emit no kernel call: the categories a user reads instead of operator names.
BOOKKEEPING = {"memory.alloc": "memory_planning", "getitem": "tuple_access", "memory.view": "views"}


def bookkeeping_counts(fallback_histogram: dict[str, int]) -> dict[str, int]:
    """Memory planning (`memory.alloc`), tuple access (`getitem`) and views (`memory.view`) among the graph's
    non-delegated nodes, every category present (0 when none)."""
    counts = dict.fromkeys(BOOKKEEPING.values(), 0)
    for op, count in fallback_histogram.items():
        if op in BOOKKEEPING:
            counts[BOOKKEEPING[op]] += count
    return counts


def outside_delegates(pte: Path, fallback_histogram: dict[str, int]) -> OutsideDelegates:
    """The sidecar's `outside_delegates`: real kernel calls by operator (from the written .pte's plan), the
    bookkeeping nodes apart, and the constants stored both outside and inside the XNNPACK delegates."""
    return dataclasses.replace(read_outside_delegates(pte), bookkeeping=bookkeeping_counts(fallback_histogram))
