"""What the partitioner did: delegate call sites, fallback operators, and runtime instruction counts."""

from __future__ import annotations

from collections import Counter
from typing import Any

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
