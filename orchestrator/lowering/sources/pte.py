"""The `user-program` model source, spec side: a .pte the user lowered themselves, given to push, run and
deploy-and-profile with `--pte FILE.pte`, never named by a spec file's `source`.

Its spec is made from the file: `source` is the .pte (resolved), its options the file's sha256 and the user's
reference outputs (`--reference`, resolved, or None); the sidecar records those (ModelSpec.to_dict). The build side
is export/user_programs.py, which gives the program an artifacts folder.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from orchestrator.lowering.spec import ModelSource, ModelSpec, SourceOptions, register_source
from orchestrator.records import Sha256

USER_PROGRAM = "user-program"  # its source's name, the recorded spec's model_source and its task
FILE_SUFFIX = ".pte"  # what `--pte` takes


@dataclass(frozen=True)
class PteOptions(SourceOptions):
    """What identifies a user's .pte beside its file: its sha256, and the reference outputs given with it."""

    sha256: Sha256
    reference_outputs: str | None = None


PTE = register_source(
    ModelSource(
        USER_PROGRAM,
        "orchestrator.lowering.export.user_programs:import_program",
        {},
        (),
        options=PteOptions,
        given_by=f"--pte FILE{FILE_SUFFIX}",
    )
)


def pte_spec(name: str, path: Path, sha256: str, reference: Path | None = None) -> ModelSpec:
    """The spec of the user's .pte `path` (with its reference outputs) under artifacts/`name`/."""
    references = str(Path(reference).resolve()) if reference is not None else None
    options = PteOptions(sha256=sha256, reference_outputs=references)
    return ModelSpec(
        name, USER_PROGRAM, USER_PROGRAM, options=options, source=str(Path(path).resolve()), model_source=USER_PROGRAM
    )
