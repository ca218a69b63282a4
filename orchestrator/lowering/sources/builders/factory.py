"""The `factory` model source: the user's own `nn.Module`, built by the user's own Python function.

A spec names the function, `path/to/file.py:build` (relative to the spec file's folder) or `package.module:build`,
and optionally its keyword arguments (`kwargs`, JSON scalars). The function returns `(module, example_inputs)`:
the inputs a dict name -> tensor (in the order of the module's `forward` parameters) or a tuple of tensors (named
`input_0`, `input_1`, ...). The program is the module as the user built it, in eval mode, with its own weights
("own": `--weights` does not apply).

This runs the user's code, so only the command line can allow it (`ModelSpec.trust_code`); a spec file never can,
and without it nothing of the factory is imported. The factory's file is part of the lowering cache key
(`ModelSpec.identity`): an edited factory is lowered again.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import json
import sys
import traceback
import weakref
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from orchestrator import console
from orchestrator.errors import EtlabError, ExitCode, SpecError
from orchestrator.lowering.outputs import NotTensorOutputs, eager_outputs
from orchestrator.lowering.sources.builders.models import OWN, LoadedModel, SourceBuilder, SpecCheck
from orchestrator.lowering.sources.factory import FactoryOptions, factory_file
from orchestrator.lowering.spec import SPEC_HINT, ModelSpec, UntrustedFactory
from orchestrator.lowering.spec_errors import brief, spec_failure, too_large
from orchestrator.lowering.weights import OWN_WEIGHTS, WeightsChoice
from orchestrator.tensorfile import DTYPE_CODES, NamedTensor

_FLOAT_BYTES = 4
# The example inputs of each module a factory returned, until the lowering asks for them.
_EXAMPLES: weakref.WeakKeyDictionary[torch.nn.Module, list[NamedTensor]] = weakref.WeakKeyDictionary()
# A factory run by the check before lowering, kept for the load that follows in this process.
_CHECKED: dict[str, LoadedModel] = {}


class FactoryError(EtlabError):
    """The user's factory ran and failed, or gave something etlab cannot lower (exit 65: the data is wrong)."""

    exit_code = ExitCode.DATA


def _where(exc: BaseException, path: Path | None) -> str:
    """` (file.py:12)`: the innermost line of the factory's own file in the traceback, if any."""
    frames = traceback.extract_tb(exc.__traceback__)
    own = [f for f in frames if path is not None and Path(f.filename).resolve() == path.resolve()]
    frame = own[-1] if own else (frames[-1] if frames else None)
    return f" ({frame.filename}:{frame.lineno})" if frame is not None else ""


def _function(spec: ModelSpec) -> Callable[..., Any]:
    """Import the factory's module (running the user's code) and return the function."""
    factory = spec.options_of(FactoryOptions).factory
    where, _, name = factory.rpartition(":")
    path = factory_file(factory)
    if path is None or not path.is_file():
        raise spec_failure([("factory", f"{where} is not a file or an importable module")], spec)
    try:
        if where.endswith(".py"):
            loaded = importlib.util.spec_from_file_location(f"etlab_factory_{path.stem}", path)
            assert loaded is not None and loaded.loader is not None
            module = importlib.util.module_from_spec(loaded)
            sys.modules[loaded.name] = module  # dataclasses and pickling look their module up there
            loaded.loader.exec_module(module)
        else:
            module = importlib.import_module(where)
    except Exception as exc:
        raise FactoryError(
            spec.problem("factory", f"importing {where} failed{_where(exc, path)}: {brief(exc)}"), hint=SPEC_HINT
        ) from exc
    function = getattr(module, name, None)
    if not callable(function):
        raise spec_failure([("factory", f"{where} has no function {name!r}")], spec)
    return function


def _named_inputs(spec: ModelSpec, module: torch.nn.Module, given: Any) -> list[NamedTensor]:
    """The example inputs as named arrays, in the order `forward` takes them."""
    if isinstance(given, torch.Tensor):
        given = (given,)
    if isinstance(given, dict):
        parameters = list(inspect.signature(module.forward).parameters)
        unknown = [key for key in given if key not in parameters]
        if unknown:
            raise _bad(spec, f"example input {unknown[0]!r} is not a parameter of forward{tuple(parameters)}")
        items = sorted(given.items(), key=lambda item: parameters.index(item[0]))
    elif isinstance(given, tuple | list):
        items = [(f"input_{index}", value) for index, value in enumerate(given)]
    else:
        raise _bad(spec, f"example inputs are a {type(given).__name__}; give a dict name -> tensor or a tuple")
    named = []
    for name, value in items:
        if not isinstance(value, torch.Tensor):
            raise _bad(spec, f"example input {name!r} is a {type(value).__name__}, not a tensor")
        dtype = str(value.dtype).removeprefix("torch.")
        if dtype not in DTYPE_CODES:
            raise _bad(spec, f"example input {name!r} is {dtype}; supported: {', '.join(DTYPE_CODES)}")
        named.append(NamedTensor(str(name), value.detach().cpu().contiguous().numpy()))
    if not named:
        raise _bad(spec, "the factory gave no example inputs")
    return named


def _bad(spec: ModelSpec, message: str) -> FactoryError:
    return FactoryError(spec.problem("factory", message), hint=SPEC_HINT)


def _check(spec: ModelSpec, choice: WeightsChoice, available: int | None) -> SpecCheck:
    if not spec.trust_code:
        message = (
            f"{spec.options_of(FactoryOptions).factory} is your own Python code: etlab runs it only when the command "
            "line allows it, never "
            "because a spec file asks"
        )
        raise UntrustedFactory(spec.problem("factory", message), hint=SPEC_HINT)
    loaded = _load(spec, choice)
    _CHECKED[_run_key(spec)] = loaded  # the lowering in this process takes it: the factory runs once
    if available is not None and _FLOAT_BYTES * loaded.parameters > available:
        raise spec_failure([("factory", too_large(loaded.parameters, available, ""))], spec)
    return SpecCheck(None, loaded.parameters)


def _run_key(spec: ModelSpec) -> str:
    """One factory run: its file's content, its function and its keyword arguments."""
    options = spec.options_of(FactoryOptions)
    return json.dumps([options.factory, spec.identity().get("factory_sha256"), options.kwargs], sort_keys=True)


def _load(spec: ModelSpec, choice: WeightsChoice) -> LoadedModel:
    if not spec.trust_code:  # a worker gets the same spec: never reached without the permission
        raise UntrustedFactory(spec.problem("factory", "running it was not allowed"), hint=SPEC_HINT)
    function = _function(spec)
    options = spec.options_of(FactoryOptions)
    name = options.factory.rpartition(":")[2]
    console.info(console.escape(f"running factory {name} from {factory_file(options.factory)} (--trust-code)"))
    try:
        returned = function(**options.kwargs)
    except Exception as exc:
        message = f"the factory raised{_where(exc, factory_file(options.factory))}: {brief(exc)}"
        raise _bad(spec, message) from exc
    if not (isinstance(returned, tuple) and len(returned) == 2 and isinstance(returned[0], torch.nn.Module)):
        raise _bad(spec, f"returned a {type(returned).__name__}; expected (torch.nn.Module, example inputs)")
    module, given = returned
    module.eval()
    inputs = _named_inputs(spec, module, given)
    try:
        with torch.no_grad():
            output = module(*(torch.from_numpy(t.array) for t in inputs))
    except Exception as exc:
        raise _bad(spec, f"the module fails on its example inputs{_where(exc, None)}: {brief(exc)}") from exc
    try:
        eager_outputs(output)  # tensors, or tuples, lists and dicts of them: compared one by one
    except NotTensorOutputs as exc:
        raise _bad(spec, f"the module {exc}") from None
    _EXAMPLES[module] = inputs
    parameters = sum(p.numel() for p in module.parameters())
    return LoadedModel(module, OWN_WEIGHTS, f"the factory's own ({options.factory})", parameters)


def _load_once(spec: ModelSpec, choice: WeightsChoice) -> LoadedModel:
    """What the check in this process already built, else the factory run now (a lowering worker)."""
    return _CHECKED.pop(_run_key(spec), None) or _load(spec, choice)


class Factory(SourceBuilder):
    """The `factory` source (its record: sources/factory.py): a user's module, whose inputs mean nothing to etlab."""

    def input_kind(self, spec: ModelSpec, names: Sequence[str]) -> str:
        return OWN

    def calibration(
        self, spec: ModelSpec, module: torch.nn.Module, example_args: tuple[torch.Tensor, ...], kind: str, samples: int
    ) -> tuple[list[tuple[torch.Tensor, ...]], str]:
        return [example_args], "the factory's example inputs (one sample)"

    def check(self, spec: ModelSpec, choice: WeightsChoice, available: int | None) -> SpecCheck:
        return _check(spec, choice, available)

    def load(self, spec: ModelSpec, choice: WeightsChoice) -> LoadedModel:
        return _load_once(spec, choice)

    def example_inputs(self, spec: ModelSpec, module: torch.nn.Module) -> list[NamedTensor]:
        if module not in _EXAMPLES:  # a module this builder did not load
            raise SpecError(spec.problem("factory", "no example inputs for this module"), hint=SPEC_HINT)
        return _EXAMPLES[module]


FACTORY = Factory()
