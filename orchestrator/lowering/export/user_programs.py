"""A program the user lowered themselves (`--pte model.pte`), given an artifacts folder like any lowered model.

The .pte is copied to `artifacts/<name>/<name>_<backend>.pte` (backend `xnnpack` when it holds XNNPACK delegates,
else `portable`) with reference inputs made from the program's declared inputs and a sidecar saying where it came
from (`spec.model_source: user-program`, the file and its sha256), so push, run, analysis and the overlays work on
it unchanged. There are no eager outputs to compare with: correctness is "not checked" unless the user gives their
own reference outputs (an ETLT file), which must match the program's outputs one by one.

Nothing here imports torch: the program is read with the flatbuffer reader of programs/.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import shutil
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Any

from orchestrator import console
from orchestrator.errors import AnalysisError, ArtifactError
from orchestrator.fsutil import atomic_path, read_json, sha256_file
from orchestrator.lowering.artifacts import Artifact, ArtifactPaths, file_record, valid_sidecar
from orchestrator.lowering.export.source_map import SOURCE_MAP_SUFFIX
from orchestrator.lowering.program import ProgramName
from orchestrator.lowering.sidecar import (
    Delegation,
    FileRecord,
    LoweringCost,
    Memory,
    OutputRecord,
    Sidecar,
    section,
    write_sidecar,
)
from orchestrator.lowering.sources.pte import pte_spec
from orchestrator.lowering.spec import is_user_program
from orchestrator.lowering.variants import Variant
from orchestrator.names import is_valid_name
from orchestrator.programs.memory import read_program_memory
from orchestrator.programs.plan import PROGRAM_IDENTIFIER, read_program_plan
from orchestrator.programs.signature import MethodSignature, read_signature

if TYPE_CHECKING:  # tensorfile imports numpy: a warm deploy's start finds a model's artifacts without it
    from orchestrator.tensorfile import NamedTensor

XNNPACK_BACKEND = "XnnpackBackend"  # the delegate id XNNPACK's partitioner writes
INPUTS_NOTE = "generated: standard normal floats (seed 0), zeros for integer inputs, true for booleans"
# The inputs etlab makes for a user's .pte, each and all together: a program's declared shapes are the file's word,
# and a 2 KB file can declare gigabytes. Real inputs (an image batch, a few thousand tokens) are far below.
MAX_GENERATED_BYTES = 256 << 20
_DRAW_BYTES = 8  # numpy draws normal floats as float64, then casts them to the declared dtype
_MEMORY_HEADROOM = 0.5  # of MemAvailable: the inputs are held, written and hashed beside everything else


class UserProgramError(ArtifactError):
    """A user's program or reference file that etlab cannot use (exit 65); the message names the file."""


class ReferenceMismatch(UserProgramError):
    """Reference outputs that do not fit the program's outputs; the command layer names the option."""


class NameTaken(ArtifactError):
    """artifacts/<name>/ holds a lowering of another model; the command layer names the option that renames."""


def program_name(path: Path) -> str:
    """The artifacts name a user's file gets by default: its stem, if that is a valid name."""
    return path.stem


def check_program_file(path: Path) -> None:
    """A readable ExecuTorch program: its flatbuffer identifier says so (UserProgramError, exit 65, otherwise)."""
    try:
        with open(path, "rb") as handle:
            head = handle.read(8)
    except OSError as exc:
        raise UserProgramError(f"{path}: cannot read the program ({exc.strerror or exc})") from None
    if len(head) < 8 or head[4:8] != PROGRAM_IDENTIFIER:
        raise UserProgramError(
            f"{path}: not an ExecuTorch program (its flatbuffer identifier is {head[4:8]!r}, "
            f"a .pte has {PROGRAM_IDENTIFIER!r})",
            hint="make one with executorch.exir's to_edge(...).to_executorch() and write_to_file",
        )


def _size(size: int) -> str:
    return f"{size / 2**20:,.1f} MiB" if size < 2**30 else f"{size / 2**30:,.1f} GiB"


def check_input_sizes(signature: MethodSignature, where: Path, available: int | None) -> None:
    """The declared inputs fit MAX_GENERATED_BYTES and `available` memory (MemAvailable, None: unknown), before a
    byte of them is made (UserProgramError, exit 65, the input, its shape, its size and the limit named)."""
    import numpy as np

    total = peak = 0
    for slot in signature.inputs:
        if slot.kind != "tensor" or slot.dtype is None:
            continue  # refused by generated_inputs, naming its kind
        nbytes = slot.elements * np.dtype(slot.dtype).itemsize
        total += nbytes
        peak = max(peak, total + (slot.elements * _DRAW_BYTES if slot.dtype.startswith("float") else 0))
        if nbytes > MAX_GENERATED_BYTES:
            raise UserProgramError(
                f"{where}: input {slot.index} of {signature.method} declares {slot.describe()}, {_size(nbytes)} to "
                f"generate: more than etlab's limit of {_size(MAX_GENERATED_BYTES)} for a program's inputs",
                hint="export the program with the input shapes it runs on",
            )
    if total > MAX_GENERATED_BYTES:
        shapes = "; ".join(f"input {slot.index}: {slot.describe()}" for slot in signature.inputs)
        raise UserProgramError(
            f"{where}: the inputs of {signature.method} ({shapes}) take {_size(total)} together: more than etlab's "
            f"limit of {_size(MAX_GENERATED_BYTES)} for a program's inputs",
            hint="export the program with the input shapes it runs on",
        )
    if available is not None and peak > _MEMORY_HEADROOM * available:
        raise UserProgramError(
            f"{where}: generating the inputs of {signature.method} needs about {_size(peak)}, more than half of the "
            f"{_size(available)} of memory available now"
        )


def generated_inputs(signature: MethodSignature, where: Path, available: int | None = None) -> list[NamedTensor]:
    """Deterministic inputs of the declared shapes and dtypes (INPUTS_NOTE): valid for any vocabulary or index.
    Their sizes are checked first (check_input_sizes), against `available` bytes of memory when known."""
    import numpy as np

    from orchestrator.tensorfile import NamedTensor  # here, not at the top: it imports numpy

    check_input_sizes(signature, where, available)
    rng = np.random.default_rng(0)
    tensors = []
    for slot in signature.inputs:
        if slot.kind != "tensor" or slot.dtype is None:
            raise UserProgramError(
                f"{where}: input {slot.index} of {signature.method} is {slot.describe()}: etlab feeds tensors "
                "of the dtypes ETLT stores (float, int, bool)"
            )
        if slot.dtype.startswith("float"):
            array = rng.standard_normal(slot.shape).astype(slot.dtype)
        elif slot.dtype == "bool":
            array = np.ones(slot.shape, dtype=bool)
        else:
            array = np.zeros(slot.shape, dtype=slot.dtype)
        tensors.append(NamedTensor(f"input_{slot.index}", array))
    return tensors


def checked_reference(reference: Path, signature: MethodSignature, pte: Path) -> list[NamedTensor]:
    """The user's reference outputs, read and matched to the program's outputs one by one."""
    from orchestrator.tensorfile import TensorFileError, read_tensors  # here, not at the top: it imports numpy

    try:
        tensors = read_tensors(reference)
    except OSError as exc:
        raise ReferenceMismatch(f"{reference}: cannot read ({exc.strerror or exc})") from None
    except TensorFileError as exc:
        raise ReferenceMismatch(str(exc)) from None
    outputs = signature.outputs
    if len(tensors) != len(outputs):
        raise ReferenceMismatch(
            f"{reference}: {len(tensors)} tensors, but {pte.name} has {len(outputs)} outputs "
            f"({'; '.join(slot.describe() for slot in outputs)})"
        )
    for tensor, slot in zip(tensors, outputs, strict=True):
        if slot.kind != "tensor" or tensor.dtype != slot.dtype or tuple(tensor.shape) != slot.shape:
            raise ReferenceMismatch(
                f"{reference}: tensor {slot.index} ({tensor.name!r}) is {tensor.dtype} {tensor.shape}, but output "
                f"{slot.index} of {pte.name} is {slot.describe()}"
            )
    return tensors


def _delegation(pte: Path, method: str) -> tuple[dict[str, Any], Counter[str]]:
    """The sidecar's delegation section, read from the serialized plan (there is no lowered graph to count)."""
    plan = read_program_plan(pte, method)
    kernels = Counter(instruction.op or "?" for instruction in plan.instructions if instruction.kind == "KernelCall")
    backends = Counter(instruction.backend or "?" for instruction in plan.delegates())
    calls = Counter(instruction.kind for instruction in plan.instructions)
    report = {
        "delegate_call_sites": sum(backends.values()),
        "delegate_backends": dict(backends),
        "fallback_ops": sum(kernels.values()),
        "fallback_histogram": dict(kernels.most_common()),
        "instructions": {
            "KernelCall": calls.get("KernelCall", 0),
            "DelegateCall": calls.get("DelegateCall", 0),
            "other": sum(count for kind, count in calls.items() if kind not in ("KernelCall", "DelegateCall")),
        },
    }
    return report, backends


def check_folder(artifact_paths: ArtifactPaths, source: Path) -> None:
    """artifacts/<name>/ is new, or holds earlier lowerings of user files: never another model's lowering."""
    for sidecar_path in sorted(artifact_paths.folder.glob(f"{artifact_paths.name}_*.json")):
        if sidecar_path.name.endswith(SOURCE_MAP_SUFFIX):
            continue
        try:
            spec = read_json(sidecar_path).get("spec", {})
            origin = spec.get("model_source") if isinstance(spec, dict) else None
        except (OSError, ValueError, AttributeError):
            continue  # unreadable: no artifact, and nothing of value to protect
        if not is_user_program(origin):
            folder = artifact_paths.folder
            raise NameTaken(f"{folder} holds the lowering of model {artifact_paths.name!r}, not of {source}")


def import_program(
    pte: Path, name: str, *, reference: Path | None = None, root: Path | None = None, method: str = "forward"
) -> Artifact:
    """Give the user's program an artifacts folder (cached: the same file and reference are taken as they are)."""
    pte = Path(pte)
    if not is_valid_name(name):
        raise UserProgramError(f"{name!r} is not a valid artifacts name: 1-64 letters, digits, '.', '_' or '-'")
    check_program_file(pte)
    try:
        signature = read_signature(pte, method)
        delegation, backends = _delegation(pte, method)
    except AnalysisError as exc:
        raise UserProgramError(str(exc)) from None
    variant = Variant("xnnpack" if XNNPACK_BACKEND in backends else "portable")
    references = checked_reference(Path(reference), signature, pte) if reference is not None else None
    # here, not at the top: lower.py brings the whole lowering, which a user's program needs nothing else of;
    # tensorfile imports numpy
    from orchestrator.lowering.export.lower import available_memory
    from orchestrator.tensorfile import write_tensors

    inputs = generated_inputs(signature, pte, available_memory())

    artifact_paths = ArtifactPaths.for_model(name, root)
    pte_sha = sha256_file(pte)
    key_material = {"pte": pte_sha, "reference": sha256_file(Path(reference)) if reference else None}
    key = hashlib.sha256(json.dumps(key_material, sort_keys=True).encode()).hexdigest()
    if artifact_paths.folder.is_dir():
        check_folder(artifact_paths, pte)
        cached, _ = valid_sidecar(artifact_paths, variant)
        if cached is not None and cached.cache_key == key:
            return Artifact(artifact_paths, variant, cached)
    artifact_paths.folder.mkdir(parents=True, exist_ok=True)
    for stale in Variant("portable"), Variant("xnnpack"):  # from here until the new sidecar lands: no artifact
        artifact_paths.sidecar(stale).unlink(missing_ok=True)

    target = artifact_paths.pte(variant)
    with atomic_path(target) as tmp:
        shutil.copyfile(pte, tmp)
    write_tensors(artifact_paths.reference_inputs, inputs)
    files = {"pte": file_record(target), "reference_inputs": file_record(artifact_paths.reference_inputs)}
    if references is not None:
        write_tensors(artifact_paths.reference_outputs, references)
        files["reference_outputs"] = file_record(artifact_paths.reference_outputs)
    else:
        artifact_paths.reference_outputs.unlink(missing_ok=True)  # an earlier import's must not be compared
    if files["pte"]["sha256"] != pte_sha:
        raise UserProgramError(f"{pte}: changed while it was copied; try again")

    spec = pte_spec(name, pte, pte_sha, reference)
    sidecar = Sidecar(
        model=name,
        model_id=None,
        task=spec.task,
        backend=variant.name,
        method=method,
        exported_program=artifact_paths.exported_program.name,
        pte=target.name,
        pte_size_mb=round(files["pte"]["size"] / 1e6, 3),
        seq_len=None,
        weights="as lowered",
        weights_note=f"a program you lowered yourself ({pte.name})",
        parameters=0,  # unknown: the program's constants are counted in bytes (memory.constants_bytes)
        sha256=pte_sha,
        versions={},  # unknown: the user's toolchain made it
        inputs=[{"name": t.name, "shape": list(t.array.shape), "dtype": str(t.array.dtype)} for t in inputs],
        outputs=section(  # their kinds unknown: guessed from the shape when read, as an older sidecar's
            tuple[OutputRecord, ...],
            [
                {"name": f"output_{slot.index}", "shape": list(slot.shape), "dtype": slot.dtype}
                for slot in signature.outputs
            ],
            "outputs",
        ),
        reference_inputs=artifact_paths.reference_inputs.name,
        reference_outputs=artifact_paths.reference_outputs.name if references is not None else "",
        etrecord=None,
        delegation=section(Delegation, delegation, "delegation"),
        memory=section(Memory, read_program_memory(target, method).to_sidecar(), "memory"),
        quantization=None,
        lowering=LoweringCost(0, 0),
        spec=spec.to_dict(),
        program=ProgramName(name),  # the user's name, whole: its dots are not etlab's choices
        cache_key=key,
        files=section(dict[str, FileRecord], files, "files"),
        created=dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
    )
    sidecar = write_sidecar(artifact_paths.sidecar(variant), sidecar)  # the commit point: written last
    shown = ", ".join(f"{t.name} {t.dtype} {t.shape}" for t in inputs) or "none"
    console.info(console.escape(f"{name}: your program {pte.name} ({variant}) in {artifact_paths.folder}"))
    console.info(console.escape(f"  inputs, {INPUTS_NOTE}: {shown}"))
    return Artifact(artifact_paths, variant, sidecar)


def reference_outputs_of(artifact: Artifact) -> Path | None:
    """The eager outputs to compare with, or None when there are none (a user program without --reference)."""
    return artifact.paths.reference_outputs if "reference_outputs" in artifact.sidecar.files else None
