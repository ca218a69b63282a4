"""Your own programs: `fab lower --exported model.pt2`, and `--pte model.pte` for push, run and deploy-and-profile.

The options are checked here (exit 64, the option named); what the files hold is checked below (exit 65), and
the errors that an option mends get it named here.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from orchestrator.commands.program_options import ProgramOptions, no_choices_for_own_program, spec_programs
from orchestrator.errors import UsageError
from orchestrator.lowering.sources import exported as exported_source
from orchestrator.lowering.sources import pte as pte_source
from orchestrator.names import is_valid_name

if TYPE_CHECKING:
    from orchestrator.commands.common import LoweringGroup
    from orchestrator.lowering.artifacts import Artifact
    from orchestrator.lowering.program import Program


def _existing(option: str, value: str, suffix: str) -> Path:
    path = Path(value)
    if not path.is_file():
        raise UsageError(f"{option} {value}: no such file")
    if path.suffix.lower() != suffix:
        raise UsageError(f"{option} {value}: not a {suffix} file (its name ends in {path.suffix or 'nothing'})")
    return path


def artifacts_name(path: Path, name: str | None) -> str:
    """`--name`, else the file's stem: the folder under artifacts/ (exit 64 when it is no valid name)."""
    chosen = name if name is not None else path.stem
    if not is_valid_name(chosen):
        option = "--name" if name is not None else f"the file name {path.name}"
        raise UsageError(
            f"{option}: {chosen!r} is not a valid artifacts name (1-64 letters, digits, '.', '_' or '-')",
            hint=None if name is not None else "pass --name NAME",
        )
    return chosen


def exclusive(pte: str | None, model: str | None, spec: str | None) -> None:
    """`--pte` profiles the program as it is: no model or spec to lower beside it."""
    given = [option for option, value in (("--model", model), ("--spec", spec)) if value is not None]
    if pte is not None and given:
        raise UsageError(f"give --pte or {' / '.join(given)}, not both")


def user_program(pte: str, reference: str | None = None, name: str | None = None) -> Artifact:
    """The artifact of the user's own .pte (copied under artifacts/<name>/ with a sidecar saying where from)."""
    # here, not at the top: fab imports the command modules at start-up
    from orchestrator.lowering.export.user_programs import NameTaken, ReferenceMismatch, import_program

    path = _existing("--pte", pte, pte_source.FILE_SUFFIX)
    reference_path = _existing("--reference", reference, ".etlt") if reference is not None else None
    try:
        return import_program(path, artifacts_name(path, name), reference=reference_path)
    except ReferenceMismatch as exc:
        exc.args = (f"--reference {exc}",)
        raise
    except NameTaken as exc:
        exc.hint = "choose another folder with --name NAME"
        raise


def profiled(given: ProgramOptions, new_tokens: int | None = None) -> list[Program] | Artifact:
    """What lower and deploy-and-profile work on: the user's own program (`--pte`, an Artifact), or a model's
    programs (program_options.spec_programs), with the options that go with each checked (exit 64)."""
    exclusive(given.pte, given.model, given.spec)
    reference_without_pte(given.pte, given.reference)
    if given.pte is not None:
        no_choices_for_own_program(given, given.pte)
        return user_program(given.pte, given.reference, given.name)
    if given.name is not None:
        raise UsageError("--name names the artifacts of --pte FILE: give it with --pte")
    return spec_programs(given, new_tokens)


def reference_without_pte(pte: str | None, reference: str | None) -> None:
    if reference is not None and pte is None:
        raise UsageError(
            "--reference compares a program you lowered yourself: give it with --pte",
            hint="a model etlab lowers is compared with its eager outputs already",
        )


def lower_exported_task(
    exported: str | None, program: ProgramOptions, lowering: LoweringGroup, *, etrecord: bool, force: bool
) -> int:
    """`fab lower --exported model.pt2`: the user's ExportedProgram lowered like a model's."""
    # here, not at the top: fab imports the command modules at start-up
    from orchestrator.commands.render_lowering import print_lowering
    from orchestrator.lowering.export.exported import lower_exported_program

    if exported is None:
        raise UsageError("--name names the artifacts of --exported FILE: give it with --exported")
    given = [option for option, value in (("--model", program.model), ("--spec", program.spec)) if value is not None]
    if given:
        raise UsageError(f"give --exported or {' / '.join(given)}, not both")
    unused = [option for option, given_ in (
        ("--calibration", lowering.calibration is not None), ("--trust-remote-code", program.trust_remote_code),
        ("--trust-code", program.trust_code), ("--weights", lowering.weights != "auto"),
        ("--jobs", lowering.jobs is not None), ("--rewrites", program.rewrites != "none"),
        ("--context", program.context is not None), ("--attention", program.attention is not None),
        ("--keep-float", program.keep_float is not None),
    ) if given_]  # fmt: skip
    if unused:
        raise UsageError(f"{', '.join(unused)}: not for --exported (the program is lowered as you exported it)")
    path = _existing("--exported", exported, exported_source.FILE_SUFFIX)
    chosen = lowering.variants()
    artifacts = artifacts_name(path, program.name)
    result = lower_exported_program(path, artifacts, variants=chosen, etrecord=etrecord, force=force)
    print_lowering(result)
    return 0
