"""A model that cannot become a program (lowering/export_errors.py): small modules of our own that torch.export or
ExecuTorch refuse, through the entry points every model source lowers with (`lower.export_module`,
`lower.lower_exported`). Each failure is an ExportError, exit 65, naming the stage, the operator or the line of the
model's code, and a hint; through a task's `handle_errors` it is one message, never a traceback or exit 70."""

from __future__ import annotations

import inspect
import pickle
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from invoke.exceptions import Exit

from orchestrator.commands.handling import handle_errors
from orchestrator.errors import ExitCode
from orchestrator.interrupts import Interrupted
from orchestrator.lowering.artifacts import ArtifactPaths
from orchestrator.lowering.builtins import BUILTIN_SPECS
from orchestrator.lowering.export import lower as lowering
from orchestrator.lowering.export.export_errors import EXPORT, TO_EDGE, ExportError, explain, lowering_stage
from orchestrator.lowering.export.program import export_module, lower_exported
from orchestrator.lowering.variants import VARIANTS


class BranchOnValue(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.sum() > 0:  # data-dependent control flow
            return x * 2
        return x - 1


class SizeFromValue(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        count = int(x.sum().item())  # a size read from a tensor's value
        return torch.zeros(count)


class CumulativeProduct(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cumprod(x, 0) + 1  # aten.cumprod: outside the Core ATen operator set


def line_of(method: Callable[..., Any], marker: str) -> int:
    """The line of `method`'s source that holds `marker`."""
    lines, first = inspect.getsourcelines(method)
    return first + next(index for index, line in enumerate(lines) if marker in line)


def export_failure(module: torch.nn.Module) -> ExportError:
    with pytest.raises(ExportError) as caught:
        export_module(module, (torch.ones(4),), model="mine")
    return caught.value


@pytest.mark.parametrize(
    ("module", "marker"),
    [(BranchOnValue(), "if x.sum() > 0:"), (SizeFromValue(), "count = int(x.sum().item())")],
    ids=["branch-on-value", "item-as-size"],
)
def test_data_dependent_code_names_the_models_line_and_a_hint(module: torch.nn.Module, marker: str) -> None:
    error = export_failure(module)
    assert error.exit_code == ExitCode.DATA == 65
    assert error.stage == EXPORT
    assert error.operator is None
    assert error.code_line is not None
    assert (error.code_line.file, error.code_line.line) == (__file__, line_of(type(module).forward, marker))
    assert error.code_line.code.startswith(marker)
    message = str(error)
    cause = "control flow or a size depends on a tensor's value"
    assert message.startswith(f"mine: {EXPORT} failed: {cause} at {__file__}:")
    assert "torch says: GuardOnDataDependentSymNode" in message
    assert "hint:" in message and "strict=False" in message and "torch.where" in message
    assert "Traceback" not in message


def test_an_operator_without_an_executorch_kernel_names_the_operator_and_its_line() -> None:
    program = export_module(CumulativeProduct(), (torch.ones(4),), model="mine")  # torch.export itself takes it
    for backend in ("portable", "xnnpack"):
        with pytest.raises(ExportError) as caught:
            lower_exported(program, VARIANTS[backend], model="mine")
        error = caught.value
        assert error.exit_code == 65
        assert error.stage == TO_EDGE
        assert error.operator == "aten.cumprod.default"
        assert error.code_line is not None
        assert (error.code_line.file, error.code_line.line) == (__file__, line_of(CumulativeProduct.forward, "cumprod"))
        assert str(error).startswith(f"mine: {TO_EDGE} failed: operator aten.cumprod.default at {__file__}:")
        assert "aten.cumprod.default is outside the Core ATen operator set" in (error.hint or "")


def test_a_task_shows_one_message_and_exits_65(capsys: pytest.CaptureFixture[str]) -> None:
    @handle_errors
    def lower_task() -> int:
        export_module(BranchOnValue(), (torch.ones(4),), model="mine")
        return 0

    with pytest.raises(Exit) as caught:
        lower_task()
    assert caught.value.code == 65
    shown = capsys.readouterr()
    text = shown.err + shown.out
    assert "control flow or a size depends on a tensor's value" in text
    assert "if x.sum() > 0:" in text
    assert "Traceback" not in text and "internal error" not in text


def test_an_export_error_crosses_a_process_boundary_whole() -> None:
    """Quantized variants lower in worker processes: their ExportError is pickled back to the main process."""
    error = export_failure(BranchOnValue())
    copied = pickle.loads(pickle.dumps(error))
    assert type(copied) is ExportError
    assert (str(copied), copied.stage, copied.operator, copied.code_line, copied.hint) == (
        str(error),
        error.stage,
        error.operator,
        error.code_line,
        error.hint,
    )


def test_a_failure_of_no_known_kind_still_names_the_stage_and_the_models_line() -> None:
    def forward() -> None:
        raise ValueError("something torch did not expect")

    try:
        forward()
    except ValueError as exc:
        error = explain(exc, EXPORT, "mine")
    assert error.exit_code == 65 and error.operator is None
    assert error.code_line is not None and error.code_line.line == line_of(forward, "raise ValueError")
    assert str(error).splitlines()[0] == f"mine: {EXPORT} failed at {error.code_line}"
    assert "torch says: ValueError: something torch did not expect" in str(error)
    assert error.hint and "example inputs" in error.hint


def test_a_model_that_exports_is_not_touched() -> None:
    program = export_module(CumulativeProduct().eval(), (torch.ones(4),), model="mine")
    assert any("cumprod" in str(node.target) for node in program.graph_module.graph.nodes)


def test_the_spec_path_exports_through_the_same_entry_point(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A model source whose module cannot be exported: `lower()` ends in the ExportError naming the spec's model."""
    from orchestrator.lowering.sources.builders import models
    from orchestrator.tensorfile import NamedTensor

    loaded = models.LoadedModel(BranchOnValue(), "random", "", 0)
    monkeypatch.setattr(models, "load_model", lambda spec, weights: loaded)
    monkeypatch.setattr(models, "example_inputs", lambda spec, module: [NamedTensor("x", np.ones(4, np.float32))])
    with pytest.raises(ExportError) as caught:
        lowering.lower(
            BUILTIN_SPECS["distilbert-tiny"], variants=[VARIANTS["portable"]], weights="random", root=tmp_path, jobs=1
        )
    assert caught.value.stage == EXPORT
    assert str(caught.value).startswith(f"distilbert-tiny: {EXPORT} failed: control flow")
    assert caught.value.code_line is not None and caught.value.code_line.file == __file__
    assert not ArtifactPaths.for_model("distilbert-tiny", tmp_path).sidecar(VARIANTS["portable"]).exists()


def _wrapped_by_a_pass_manager(inner: BaseException) -> Exception:
    """As torch.fx's pass manager reports a failing pass: a bare Exception raised from what the pass raised."""
    try:
        try:
            raise inner
        except BaseException as exc:
            raise Exception("An error occurred when running the 'ConvertToUpsampleBilinear2d' pass") from exc
    except Exception as outer:
        return outer


@pytest.mark.parametrize(
    "inner",
    [KeyboardInterrupt(), RuntimeError("KeyboardInterrupt"), Interrupted("interrupted")],
    ids=["keyboard-interrupt", "by-name", "etlab-interrupted"],
)
def test_ctrl_c_inside_a_pass_stays_an_interrupt_not_an_export_failure(inner: BaseException) -> None:
    """Ctrl+C in the middle of a lowering pass reaches etlab wrapped in the pass manager's Exception (seen in CI: exit
    65 "to_edge failed" instead of 130). The stage lets it through as the interrupt it is."""
    with pytest.raises(KeyboardInterrupt), lowering_stage("to_edge", "distilbert-tiny"):
        raise _wrapped_by_a_pass_manager(inner)
    with pytest.raises(ExportError), lowering_stage("to_edge", "distilbert-tiny"):  # a real failure stays one
        raise _wrapped_by_a_pass_manager(RuntimeError("shape mismatch"))
