"""A method's declared inputs and outputs, read from a .pte without torch or ExecuTorch.

A program a user lowered themselves comes with no sidecar: its inputs are made from these shapes and dtypes, and
a `--reference` file is checked against its outputs.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from orchestrator.errors import AnalysisError
from orchestrator.programs.plan import program_bytes
from orchestrator.tensorfile import CODE_DTYPES

_TENSOR = 5  # KernelTypes.Tensor in the program schema


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


@dataclass(frozen=True)
class MethodSignature:
    method: str
    inputs: tuple[TensorSlot, ...]
    outputs: tuple[TensorSlot, ...]


def read_signature(pte: Path, method: str = "forward") -> MethodSignature:
    """`method`'s inputs and outputs as declared in the program (AnalysisError on a file that is not one)."""
    from pte_adapter_model_explorer.executorch_flatbuffer import program_generated as pg

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
            shape = tuple(int(tensor.Sizes(d)) for d in range(tensor.SizesLength()))
            return TensorSlot(position, "tensor", CODE_DTYPES.get(tensor.ScalarType()), shape)

        inputs = tuple(slot(i, plan.Inputs(i)) for i in range(plan.InputsLength()))
        outputs = tuple(slot(i, plan.Outputs(i)) for i in range(plan.OutputsLength()))
    except AnalysisError:
        raise
    except Exception as exc:  # the generated reader raises struct/index errors on garbage
        raise AnalysisError(f"{pte}: unreadable program flatbuffer ({exc})") from None
    return MethodSignature(method, inputs, outputs)
