"""`--model NAME` for a model lowered earlier from a spec file (or a program of the user's own): the spec from its
sidecar (lowering/lowered.py), and what the command line says about it."""

from __future__ import annotations

from typing import TYPE_CHECKING

from orchestrator.errors import UsageError

if TYPE_CHECKING:
    from orchestrator.lowering.spec import ModelSpec


def lowered_model_spec(model: str, *, trust_remote_code: bool = False, trust_code: bool = False) -> ModelSpec | None:
    """`--model NAME` of a model lowered earlier with `--spec FILE` (its spec from its sidecar), else None. Running
    its code (`--trust-remote-code`, a factory's `--trust-code`) is what this command line allows, never what the
    lowering that wrote the sidecar was allowed."""
    # here, not at the top: fab imports the command modules at start-up
    from orchestrator import console
    from orchestrator.lowering.lowered import find_lowered, spec_of_lowered
    from orchestrator.lowering.spec import SOURCES

    found = find_lowered(model)
    if found is None:
        return None
    if found.user_file:
        origin = found.sidecar.origin
        assert origin.model_source is not None  # a user's own program says which (user_file)
        source = SOURCES[origin.model_source]  # a user's own program's: its option brings the file
        raise UsageError(
            f"model {model!r} is a program you made yourself ({origin.source}): etlab has no spec to lower it from",
            hint=f"profile it with: fab run --model {model}; a new version of its file comes in by {source.given_by}",
        )
    lowered = spec_of_lowered(found, trust_remote_code=trust_remote_code, trust_code=trust_code)
    rewritten = f" with the rewrites {', '.join(found.rewrites)}" if found.rewrites else ""
    if lowered.stale is None:
        console.info(console.escape(f"{model}: using the spec lowered from {lowered.spec_file}{rewritten}"))
    else:
        console.warn(
            console.escape(
                f"{model}: {lowered.spec_file} {lowered.stale}: the artifacts are from the spec as it was when "
                f"lowered ({found.sidecar.created}); to lower the file as it is now, run: "
                f"fab lower --spec {lowered.spec_file}"
                + (f" --rewrites {','.join(found.rewrites)}" if found.rewrites else "")
            )
        )
    return lowered.spec


def known_lowered_models() -> list[str]:
    """Names `--model` finds beyond the built-ins: models lowered from spec files, and the user's own programs."""
    # here, not at the top: fab imports the command modules at start-up
    from orchestrator.lowering.lowered import lowered_names

    return lowered_names()
