"""`fab models`' table: one line per model, or the detailed tables (`--long`).

Light on purpose: `fab models` is a static list, so this imports neither the deploy's tables nor what lowered the
models (their types only).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from orchestrator import console

if TYPE_CHECKING:  # the types only: rendering a table must not import what produced it
    from orchestrator.lowering.lowered import LoweredModel
    from orchestrator.lowering.spec import InputSpec, ModelSpec


def _inputs_cell(inputs: Sequence[tuple[Any, Any, Any]], *, dtypes: bool = True) -> str:
    """(name, dtype, shape) → `input_ids, attention_mask int64 1×128`: inputs of one dtype and shape share it;
    without `dtypes` (one line per model), `input_ids, attention_mask 1×128`."""
    groups: dict[tuple[str, str], list[str]] = {}
    for name, dtype, shape in inputs:
        groups.setdefault((str(dtype), "×".join(map(str, shape or ()))), []).append(str(name))
    return "; ".join(
        f"{', '.join(names)}{f' {dtype}' if dtypes else ''} {shape}" for (dtype, shape), names in groups.items()
    )


def _lowered_cell(variants: Sequence[str], *, whole: bool) -> str:
    """The variants lowered: `xnnpack, xnnpack-int8-dynamic +2`, or all of them (`whole`); `no` for none."""
    if not variants:
        return "no"
    shown = variants if whole or len(variants) <= 2 else variants[:2]
    return ", ".join(shown) + (f" +{len(variants) - len(shown)}" if len(shown) < len(variants) else "")


def _origin(model: LoweredModel, *, whole_path: bool) -> str:
    """Where a lowered model is from: its spec file (its name, or `whole_path`), your own program, or a built-in
    (a program chosen of it: rewrites, layers kept in float, which its name says)."""
    if model.spec_file:
        if not whole_path:
            return Path(model.spec_file).name
        from orchestrator.commands.render import short_path  # `--long` only: render imports the deploy's tables

        return short_path(Path(model.spec_file))
    return f"your {model.sidecar.origin.model_source}" if model.user_file else "built-in"


def _lowered_inputs(model: LoweredModel, *, dtypes: bool = True) -> str:
    cells = [(i.get("name"), i.get("dtype"), i.get("shape")) for i in model.sidecar.inputs]
    return _inputs_cell(cells, dtypes=dtypes)


def print_models(
    builtins: Sequence[ModelSpec],
    lowered: Sequence[LoweredModel],
    inputs: Mapping[str, Sequence[InputSpec]],
    backends: Mapping[str, Sequence[str]],
    *,
    long: bool = False,
) -> None:
    """`fab models`: every name `--model` takes, one line each: where it is from, its task, what it takes, which
    variants are lowered (`backends`, by name). `inputs`: the built-ins', by name. `long`: two tables, the
    built-ins' with their source, output and description, the lowered models' with their spec file's path."""
    if long:
        _print_models_long(builtins, lowered, inputs, backends)
        return
    rows: list[list[Any]] = [
        [spec.name, "built-in", spec.task,
         _inputs_cell([(i.name, i.dtype, i.shape) for i in inputs[spec.name]], dtypes=False),
         _lowered_cell(backends.get(spec.name, ()), whole=False)]
        for spec in builtins
    ]  # fmt: skip
    for model in lowered:
        task = model.sidecar.spec.get("task")  # a program of your own has none
        rows.append([model.name, _origin(model, whole_path=False), task if isinstance(task, str) else None,
                     _lowered_inputs(model, dtypes=False),
                     _lowered_cell(backends.get(model.name, ()), whole=False)])  # fmt: skip
    console.table("Models (--model NAME)", ["name", "from", "task", "inputs", "lowered"], rows, whole=["name"],
                  caption="fab models --long: dtypes, sources, outputs, descriptions, every variant")  # fmt: skip


def _print_models_long(
    builtins: Sequence[ModelSpec],
    lowered: Sequence[LoweredModel],
    inputs: Mapping[str, Sequence[InputSpec]],
    backends: Mapping[str, Sequence[str]],
) -> None:
    from orchestrator.lowering.spec import OUTPUT_TASKS, OUTPUT_WORDS  # `fab models --long` only

    rows = [
        [spec.name, spec.model_source, spec.task, _inputs_cell([(i.name, i.dtype, i.shape) for i in inputs[spec.name]]),
         f"{spec.output}: {OUTPUT_WORDS[spec.output]}" if spec.task in OUTPUT_TASKS else None, spec.description,
         _lowered_cell(backends.get(spec.name, ()), whole=True)]
        for spec in builtins
    ]  # fmt: skip
    columns = ["name", "source", "task", "inputs", "output", "description", "lowered"]
    console.table("Built-in models (--model NAME)", columns, rows, whole=["name"])
    if not lowered:
        console.info("no models lowered from a spec file or your own program yet (fab lower --spec FILE)")
        return
    rows = [
        [model.name, _origin(model, whole_path=True), _lowered_inputs(model),
         _lowered_cell(backends.get(model.name, ()), whole=True), model.sidecar.created.replace("T", " ")[:16]]
        for model in lowered
    ]  # fmt: skip
    columns = ["name", "from", "inputs", "lowered", "at"]
    console.table("Lowered from a spec or your own file (--model NAME)", columns, rows, fold=["from"])
