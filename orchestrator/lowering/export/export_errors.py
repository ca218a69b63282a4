"""When a model cannot become a program: which stage failed, at which operator or line of the model's code, and why.

torch.export, `to_edge` and `to_executorch` fail with long internal tracebacks. A model that cannot be exported is
bad input (exit 65), not an etlab bug (exit 70): `lowering_stage` turns any failure inside one stage into an
ExportError naming the stage, the operator (an op outside the Core ATen set, or one without a kernel), or the line
of the model's own code that torch could not trace (data-dependent control flow or sizes), and a hint.
"""

from __future__ import annotations

import contextlib
import re
import sys
import sysconfig
import traceback
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from orchestrator.errors import EtlabError, ExitCode
from orchestrator.interrupts import caused_by_interrupt

# The stages of turning a module into a .pte, as messages name them.
EXPORT = "torch.export"
TO_EDGE = "to_edge (lowering to the edge dialect and partitioning)"
TO_EXECUTORCH = "to_executorch (memory planning and serialisation)"

# Libraries that hold models' code: their line is shown when the model itself has no frame (a HuggingFace model).
_MODEL_LIBRARIES = ("transformers", "torchvision", "timm")

# "Operator torch._ops.aten.cumprod.default is not in Core ATen opset", "Missing out variants: {'aten::_foo'}", ...
_OPERATOR_PATTERNS = (
    re.compile(r"Operator (?:torch\._ops\.)?(?P<op>[\w.:]+) is not in Core ATen opset"),
    re.compile(r"[Mm]issing out variants?:? \{?'?(?P<op>[\w.:]+)"),
    re.compile(r"(?:no|could not find an?|cannot find) (?:out variant|kernel) for (?:operator )?'?(?P<op>[\w.:]+)"),
)
_FILE_LINE = re.compile(r'File "(?P<file>[^"]+)", line (?P<line>\d+)')
_DATA_DEPENDENT = (
    "data-dependent",
    "data dependent",
    "GuardOnDataDependentSymNode",
    "Could not guard on",
    "Could not extract specialized integer",
)


@dataclass(frozen=True)
class CodeLine:
    """One line of the model's code: where torch stopped."""

    file: str
    line: int
    code: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line}" + (f" `{self.code}`" if self.code else "")


class ExportError(EtlabError):
    """A model that cannot be exported or lowered (exit 65): the stage, what in the model, and a hint."""

    exit_code = ExitCode.DATA

    def __init__(
        self,
        message: str,
        *,
        stage: str,
        operator: str | None = None,
        code_line: CodeLine | None = None,
        hint: str | None = None,
    ) -> None:
        super().__init__(message, hint=hint)
        self.stage = stage
        self.operator = operator
        self.code_line = code_line

    def __reduce__(self) -> tuple[Any, ...]:
        # A lowering worker's failure crosses a process boundary: keep the fields, not only the message.
        return (_rebuild, (self.args[0], self.stage, self.operator, self.code_line, self.hint))


def _rebuild(message: str, stage: str, operator: str | None, code_line: CodeLine | None, hint: str | None) -> Any:
    return ExportError(message, stage=stage, operator=operator, code_line=code_line, hint=hint)


@contextlib.contextmanager
def lowering_stage(stage: str, model: str, program: Any = None) -> Iterator[None]:
    """Any failure inside becomes an ExportError for `model` at `stage`; `program` (the exported program being
    lowered, if any) finds the model's line of an operator it names. Ctrl+C and etlab's own errors pass."""
    try:
        yield
    except (EtlabError, KeyboardInterrupt, MemoryError):
        raise
    except Exception as exc:
        if caused_by_interrupt(exc):  # Ctrl+C inside a pass, which torch's pass manager wraps in an Exception
            raise KeyboardInterrupt from exc
        raise explain(exc, stage, model, program) from exc  # the cause stays for a debugger, never shown


def explain(exc: BaseException, stage: str, model: str, program: Any = None) -> ExportError:
    """What `exc`, raised while `stage` ran on `model`, means for the user."""
    text = str(exc)
    operator = _operator(text)
    code_line = _code_line(exc, text, operator, program)
    torch_says = _first_line(text) or type(exc).__name__
    where = f" at {code_line}" if code_line else ""
    if operator is not None:
        message = f"{model}: {stage} failed: operator {operator}{where} is not supported by ExecuTorch"
        hint = (
            f"{operator} is outside the Core ATen operator set that ExecuTorch's portable kernels and XNNPACK "
            "implement; rewrite that part of the model with supported operators (or decompose it) before lowering"
        )
    elif _data_dependent(exc, text):
        message = f"{model}: {stage} failed: control flow or a size depends on a tensor's value{where}"
        hint = (
            "etlab exports with strict=False and the fixed shapes of the example inputs: a branch on a tensor's "
            "value (`if x.sum() > 0`) or a size read from one (`.item()`, `nonzero`) cannot be traced; make it "
            "branchless (torch.where), use torch.cond, or derive sizes from input shapes"
        )
    else:
        message = f"{model}: {stage} failed{where}"
        hint = (
            "etlab exports with strict=False and the fixed shapes of the example inputs; check that the model "
            "runs eagerly on them and uses no Python-side state that changes between calls"
        )
    return ExportError(
        f"{message}\n  torch says: {type(exc).__name__}: {torch_says}",
        stage=stage,
        operator=operator,
        code_line=code_line,
        hint=hint,
    )


def _first_line(text: str) -> str:
    return next((line.strip() for line in text.splitlines() if line.strip()), "")


def _operator(text: str) -> str | None:
    for pattern in _OPERATOR_PATTERNS:
        found = pattern.search(text)
        if found:
            return found.group("op").replace("::", ".").rstrip(".'\"")
    return None


def _data_dependent(exc: BaseException, text: str) -> bool:
    names = {cls.__name__ for cls in type(exc).__mro__}
    return "GuardOnDataDependentSymNode" in names or any(marker in text for marker in _DATA_DEPENDENT)


def _code_line(exc: BaseException, text: str, operator: str | None, program: Any) -> CodeLine | None:
    """The deepest frame of the model's own code; else of a model library (transformers, ...); else none."""
    stack = traceback.extract_tb(exc.__traceback__)
    frames = [(frame.filename, frame.lineno or 0, frame.line or "") for frame in stack]
    # torch quotes the user's frame in its message when its own traceback does not reach it (dynamo, verifiers)
    frames += [(found["file"], int(found["line"]), "") for found in _FILE_LINE.finditer(text)]
    if operator is not None and program is not None:
        frames += _operator_frames(program, operator)
    for wanted in (_is_model_code, _is_model_library):
        chosen = [frame for frame in frames if wanted(frame[0])]
        if chosen:
            file, line, code = chosen[-1]
            return CodeLine(file, line, code.strip() or _source_line(file, line))
    return None


def _operator_frames(program: Any, operator: str) -> list[tuple[str, int, str]]:
    """Frames of the nodes calling `operator` in the exported program (torch.export keeps each node's stack)."""
    frames: list[tuple[str, int, str]] = []
    with contextlib.suppress(Exception):  # a best effort: the program's layout is torch's, not ours
        for node in program.graph_module.graph.nodes:
            if node.op == "call_function" and str(node.target).removeprefix("aten::") in (operator, f"aten.{operator}"):
                trace = node.meta.get("stack_trace") or ""
                frames += [(found["file"], int(found["line"]), "") for found in _FILE_LINE.finditer(trace)]
    return frames


def _source_line(file: str, line: int) -> str:
    with contextlib.suppress(OSError, UnicodeDecodeError, IndexError):
        return Path(file).read_text(encoding="utf-8").splitlines()[line - 1].strip()
    return ""


def _top_package(file: str) -> str | None:
    """The top-level package a file of an installed library or of etlab belongs to; None for anything else."""
    path = Path(file).resolve()
    roots = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
    roots |= {p for p in sys.path if p.endswith(("site-packages", "dist-packages"))}
    for root in (Path(p).resolve() for p in roots):
        with contextlib.suppress(ValueError):
            return path.relative_to(root).parts[0]
    etlab_root = Path(__file__).resolve().parents[1]
    if path.is_relative_to(etlab_root):
        return "orchestrator"
    return None


def _is_standard_library(file: str) -> bool:
    if file.startswith("<"):  # <frozen ...>, <string>, <eval_with_key>: generated, not the model's code
        return True
    stdlib = Path(sysconfig.get_paths()["stdlib"]).resolve()
    return Path(file).resolve().is_relative_to(stdlib) and "site-packages" not in file


def _is_model_code(file: str) -> bool:
    return not _is_standard_library(file) and _top_package(file) is None


def _is_model_library(file: str) -> bool:
    return _top_package(file) in _MODEL_LIBRARIES
