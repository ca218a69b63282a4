"""`fab lower`: export a model once and lower it to the requested backends and quantized variants (cached)."""

from __future__ import annotations

from typing import Any

from orchestrator.commands import options
from orchestrator.commands.common import LoweringGroup, naming_calibration, naming_keep_float, naming_rewrites
from orchestrator.commands.program_options import ProgramOptions, spec_programs
from orchestrator.commands.programs import lower_exported_task
from orchestrator.commands.render_lowering import print_lowering
from orchestrator.lowering.export import lower as lowering


def lower(given: dict[str, Any]) -> int:
    """`given`: the task's options by name, each taken by its group."""
    program, group = ProgramOptions.take(given), LoweringGroup.take(given)
    exported, etrecord, force = given.pop("exported", None), bool(given.pop("etrecord")), bool(given.pop("force"))
    options.all_taken(given)
    if exported is not None or program.name is not None:  # the user's own ExportedProgram
        return lower_exported_task(exported, program, group, etrecord=etrecord, force=force)
    # Every option before the cache is looked at: a bad value must not invalidate it.
    checked = group.options()
    chosen = group.variants()
    for program_ in spec_programs(program):  # one program per KV cache size (`--context`)
        with (
            naming_calibration(),
            naming_rewrites(program.rewrites),
            naming_keep_float(program_.spec.keep_float and ",".join(program_.spec.keep_float)),
        ):
            result = lowering.lower(
                program_.spec,  # a rewritten program under its own name, beside the model as exported
                variants=chosen,
                weights=checked.weights,
                etrecord=etrecord,
                force=force,
                calibration=checked.calibration,
                jobs=checked.jobs,
                rewrites=program_.rewrites,
            )
        print_lowering(result)
    return 0
