"""The program options, parsed once for every task that names a program (lower, push, run, deploy-and-profile):
which model (`--model`, `--spec`) or the user's own file (`--pte`), and what makes it another program
(`--attention`, `--context`, `--rewrites`), into `Program`s (lowering/program.py). Each value is checked here, the
combination with the model in program.py's one place, and a refusal names the option it came from (exit 64).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from orchestrator.commands import options
from orchestrator.commands.common import split_list
from orchestrator.commands.lowered import known_lowered_models, lowered_model_spec
from orchestrator.config import did_you_mean
from orchestrator.errors import UsageError
from orchestrator.lowering.attention.choice import ATTENTIONS
from orchestrator.lowering.builtins import BUILTIN_SPECS, resolve_spec
from orchestrator.lowering.lowered import recorded_rewrites
from orchestrator.lowering.program import (
    KEEP_FLOAT,
    REWRITES_CHOICE,
    Program,
    ProgramChoice,
    ProgramRefused,
    program_name,
    programs,
    refusals,
)
from orchestrator.lowering.rewrites.registry import RewriteRequest, UnknownRewrite, parse_rewrites
from orchestrator.lowering.spec import MAX_CONTEXT, MIN_CONTEXT, ModelSpec, RemoteCodeInSpec, UnknownModel


@dataclass(frozen=True)
class ProgramOptions(options.OptionGroup):
    """A task's program options as given (strings from the command line); a task without one of them leaves it
    unset."""

    model: str | None = None
    spec: str | None = None
    pte: str | None = None
    reference: str | None = None
    name: str | None = None
    rewrites: Any = "none"
    context: Any = None
    attention: Any = None
    keep_float: Any = None
    trust_remote_code: bool = False
    trust_code: bool = False


def model_spec(
    model: str | None, spec: str | None, *, trust_remote_code: bool = False, trust_code: bool = False
) -> ModelSpec:
    """`--model NAME` or `--spec FILE`, exactly one (exit 64, the options named)."""
    if (model is None) == (spec is None):
        raise UsageError("give exactly one of --model NAME or --spec FILE")
    try:
        return resolve_spec(model, spec, trust_remote_code=trust_remote_code, trust_code=trust_code)
    except UnknownModel as exc:
        assert model is not None  # a spec file is never unknown
        found = lowered_model_spec(model, trust_remote_code=trust_remote_code, trust_code=trust_code)
        if found is not None:
            return found
        lowered = known_lowered_models()
        if lowered:
            exc.args = (f"{exc.args[0]}; lowered from spec files or your own programs: {', '.join(lowered)}",)
        exc.hint = "or pass your own spec with --spec path/to/model_spec.json"
        raise
    except RemoteCodeInSpec as exc:
        exc.hint = "pass --trust-remote-code on the command line if you trust the model folder's code"
        raise


def spec_of(given: ProgramOptions) -> ModelSpec:
    """The model `--model`/`--spec` names, with the command line's permissions to run code."""
    return model_spec(given.model, given.spec, trust_remote_code=given.trust_remote_code, trust_code=given.trust_code)


def attention_value(value: Any) -> str | None:
    """`--attention etlab|sdpa`; None when not given."""
    if value is None:
        return None
    if value not in ATTENTIONS:
        meant = did_you_mean(str(value), ATTENTIONS)
        raise UsageError(f"--attention must be one of {', '.join(ATTENTIONS)}, got {value!r}{meant}")
    return str(value)


def context_values(value: Any) -> tuple[int, ...]:
    """`--context 128,512,1024`: KV cache sizes, in order, once each; () when not given."""
    if value is None:
        return ()
    items = split_list(str(value)) or []
    contexts = [options.count("--context", item, minimum=MIN_CONTEXT, maximum=MAX_CONTEXT) for item in items]
    if not contexts:
        raise UsageError("--context: give one or more KV cache sizes, e.g. --context 128,512,1024")
    return tuple(dict.fromkeys(contexts))


def rewrite_request(value: Any, target: ModelSpec) -> RewriteRequest:
    """`--rewrites auto|none|a,b` for `target`'s model: a RewriteRequest (whether it applies is program.py's
    check). A rewritten program found by its artifacts (`--model gpt2-tiny.tanh-gelu`) gets the rewrites its sidecar
    records: it is lowered again only with them, under its own name."""
    try:
        request = parse_rewrites(str(value))
    except UnknownRewrite as exc:
        raise UsageError(f"--rewrites {value}: {exc}", hint=exc.hint) from None
    if target.name in BUILTIN_SPECS:
        return request
    recorded = recorded_rewrites(target.name)
    if recorded and program_name(target, RewriteRequest(names=recorded)) == target.name:
        if request not in (RewriteRequest(), RewriteRequest(names=recorded)) and request.resolve(target) != recorded:
            raise UsageError(
                f"--rewrites {value}: {target.name} is a rewritten program, lowered with {', '.join(recorded)}",
                hint="lower the model as exported with the rewrites you want: each set gets its own name",
            )
        return RewriteRequest(names=recorded)
    return request


def keep_float_layers(value: Any, target: ModelSpec) -> tuple[str, ...]:
    """`--keep-float a.b,c.d`: the layers a quantized program keeps in float, in order, once each; () when not
    given. A mixed-precision program found by its artifacts keeps its own, and takes no other set (exit 64)."""
    layers = tuple(dict.fromkeys(split_list(str(value)) or [])) if value is not None else ()
    if value is not None and not layers:
        raise UsageError("--keep-float: give one or more layers, e.g. --keep-float encoder.layer.0.ffn.lin2")
    if target.keep_float and layers and tuple(sorted(layers)) != target.keep_float:
        raise UsageError(
            f"--keep-float {value}: {target.name} is a mixed-precision program keeping {', '.join(target.keep_float)}",
            hint="lower the model itself with the layers you want: each set gets its own name",
        )
    return layers


def program_choice(given: ProgramOptions, target: ModelSpec) -> ProgramChoice:
    """The choices the options make of `target`'s model, each value checked (exit 64, the option named)."""
    return ProgramChoice(
        attention=attention_value(given.attention),
        contexts=context_values(given.context),
        rewrites=rewrite_request(given.rewrites, target),
        keep_float=keep_float_layers(given.keep_float, target),
    )


def spec_programs(given: ProgramOptions, new_tokens: int | None = None) -> list[Program]:
    """The programs `--model`/`--spec` and the choices name, one per `--context`, each under its own name; a choice
    that cannot apply to the model refused with its option (exit 64)."""
    target = spec_of(given)
    choice = program_choice(given, target)
    try:
        return programs(target, choice, new_tokens)
    except ProgramRefused as first:  # named with its option, with every reason of that choice and value
        raw = {REWRITES_CHOICE: given.rewrites, KEEP_FLOAT: given.keep_float}.get(first.choice, first.value)
        reasons = "; ".join(refused.reason for refused in refusals(target, choice, new_tokens)
                            if refused.choice == first.choice and refused.value == first.value)  # fmt: skip
        raise UsageError(f"--{first.choice}{'' if raw is None else f' {raw}'}: {reasons}") from None


def no_choices_for_own_program(given: ProgramOptions, what: str) -> None:
    """The user's own program is profiled as they made it: no attention, context, rewrites or layers kept in float
    (exit 64)."""
    asked = [f"--{option.replace('_', '-')}" for option in ("attention", "context", "rewrites", "keep_float")
             if getattr(given, option) not in (None, "none")]  # fmt: skip
    if asked:
        raise UsageError(f"{', '.join(asked)}: {what} is a program of your own, lowered as you exported it")
