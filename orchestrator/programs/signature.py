"""A method's declared inputs and outputs, read from a .pte without torch or ExecuTorch.

A program a user lowered themselves comes with no sidecar: its inputs are made from these shapes and dtypes, and
a `--reference` file is checked against its outputs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from orchestrator.errors import AnalysisError
from orchestrator.programs.plan import program_bytes

_TENSOR = 5  # KernelTypes.Tensor in the program schema
MAX_RANK = 16  # ExecuTorch's kTensorDimensionLimit: a runtime refuses more dimensions


@dataclass(frozen=True)
class TensorSlot:
    """One input or output of a method: a tensor of a fixed shape, or a value of another kind (`kind`)."""

    index: int
    kind: str  # "tensor", or the EValue kind: Int, Double, TensorList, ...
    dtype: str | None = None  # numpy's name (float32, int64, ...); None when not a tensor or unknown
    shape: tuple[int, ...] = ()

    def describe(self) -> str:
        if self.kind != "tensor":
            return f"a {self.kind}"
        return f"{self.dtype} {list(self.shape)}"

    @property
    def elements(self) -> int:
        """The declared element count (Python ints: a hostile shape does not overflow)."""
        return math.prod(self.shape)


class _Undeclarable(Exception):
    """A tensor declaration no program can hold (the caller names the slot)."""


@dataclass(frozen=True)
class MethodSignature:
    method: str
    inputs: tuple[TensorSlot, ...]
    outputs: tuple[TensorSlot, ...]


def read_signature(pte: Path, method: str = "forward") -> MethodSignature:
    """`method`'s inputs and outputs as declared in the program (AnalysisError on a file that is not one)."""
    from pte_adapter_model_explorer.executorch_flatbuffer import program_generated as pg

    from orchestrator.tensorfile import CODE_DTYPES  # here, not at the top: it imports numpy

    pte = Path(pte)
    data, _ = program_bytes(pte)
    kinds = {value: name for name, value in vars(pg.KernelTypes).items() if not name.startswith("_")}
    try:
        program = pg.Program.GetRootAs(data, 0)
        plans = {}
        for i in range(program.ExecutionPlanLength()):
            name = program.ExecutionPlan(i).Name()
            plans[name.decode() if isinstance(name, bytes) else str(name)] = program.ExecutionPlan(i)
        if method not in plans:
            raise AnalysisError(f"{pte}: no method {method!r} (methods: {', '.join(sorted(plans)) or 'none'})")
        plan = plans[method]

        def slot(position: int, value_index: int) -> TensorSlot:
            value = plan.Values(value_index)
            kind = value.ValType()
            if kind != _TENSOR:
                return TensorSlot(position, kinds.get(kind, f"value type {kind}"))
            tensor = pg.Tensor()
            table = value.Val()
            tensor.Init(table.Bytes, table.Pos)
            rank = tensor.SizesLength()
            if rank > MAX_RANK:
                raise _Undeclarable(f"{rank} dimensions, more than ExecuTorch's {MAX_RANK}")
            shape = tuple(int(tensor.Sizes(d)) for d in range(rank))
            if any(size < 0 for size in shape):
                raise _Undeclarable(f"the shape {list(shape)}, which has a negative size")
            return TensorSlot(position, "tensor", CODE_DTYPES.get(tensor.ScalarType()), shape)

        def slots(kind: str, count: int, value_index: Any) -> tuple[TensorSlot, ...]:
            found = []
            for i in range(count):
                try:
                    found.append(slot(i, value_index(i)))
                except _Undeclarable as exc:
                    raise AnalysisError(f"{pte}: {kind} {i} of {method} declares {exc}: no tensor has it") from None
            return tuple(found)

        inputs = slots("input", plan.InputsLength(), plan.Inputs)
        outputs = slots("output", plan.OutputsLength(), plan.Outputs)
    except AnalysisError:
        raise
    except Exception as exc:  # the generated reader raises struct/index errors on garbage
        raise AnalysisError(f"{pte}: unreadable program flatbuffer ({exc})") from None
    return MethodSignature(method, inputs, outputs)
