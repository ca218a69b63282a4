"""The `exported-program` model source, spec side (no torch): an ExportedProgram the user saved
(`torch.export.save`) and lowers with `fab lower --exported FILE.pt2`, never named by a spec file's `source`.

Its spec is made from the file: `source` is the .pt2 (resolved), its options the file's sha256 and the program's
inputs once loaded; the sidecar records those (ModelSpec.to_dict). The build side is export/exported.py.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from orchestrator.lowering.spec import ModelSource, ModelSpec, SourceOptions, register_source
from orchestrator.records import Sha256

EXPORTED_PROGRAM = "exported-program"  # its source's name, the recorded spec's model_source and its task
FILE_SUFFIX = ".pt2"  # what `--exported` takes (torch.export.save's archive)


@dataclass(frozen=True)
class ExportedOptions(SourceOptions):
    """What identifies a user's ExportedProgram beside its file: the file's sha256, and its inputs as loaded (names,
    shapes, dtypes: empty until it is)."""

    sha256: Sha256
    inputs: list[dict[str, Any]] = field(default_factory=list)  # as the sidecar records them (a JSON list)


EXPORTED = register_source(
    ModelSource(
        EXPORTED_PROGRAM,
        "orchestrator.lowering.export.exported:lower_exported_program",
        {},
        (),
        options=ExportedOptions,
        given_by=f"fab lower --exported FILE{FILE_SUFFIX}",
    )
)


def exported_spec(name: str, path: Path, sha256: str, inputs: list[dict[str, Any]] | None = None) -> ModelSpec:
    """The spec of the user's .pt2 `path` lowered under artifacts/`name`/."""
    options = ExportedOptions(sha256=sha256, inputs=list(inputs or ()))
    source = str(Path(path).resolve())
    return ModelSpec(
        name, EXPORTED_PROGRAM, EXPORTED_PROGRAM, options=options, source=source, model_source=EXPORTED_PROGRAM
    )
