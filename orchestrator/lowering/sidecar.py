"""The lowering sidecar (`<name>_<backend>.json`) as types: the lowering writes a Sidecar, every reader gets one back.

The file keeps its layout (docs/DESIGN.md "Artifacts"): a record's field order is the file's key order, and a section
an older sidecar lacks (`outside_delegates`, `rewrites`, `generation`, an output's `kind`) is read as unknown and not
written back, so sidecars already on disk (caches, boards) stay valid and read by the previous etlab (a field with a
default that a section lacks is not set by msgspec, so it stays absent too: the round-trip tests hold it). The types
carry the checks (orchestrator/records.py): a wrong shape is an ArtifactError (exit 65) naming the file and the field,
instead of a KeyError or a silent `None` somewhere downstream. The spec stays a mapping (ModelSpec's own record, the
cache key's input); what readers take from it is typed (`Sidecar.origin`), and the program's identity is recorded
as its record (`program`: lowering/program.py's ProgramName; an older sidecar's is read from its name, `identity`).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal

import msgspec

from orchestrator.errors import ArtifactError
from orchestrator.fsutil import atomic_write_json, read_json, unreadable
from orchestrator.lowering.outputs import kind_from_shape
from orchestrator.lowering.program import ProgramName
from orchestrator.lowering.variants import UnknownVariant, Variant
from orchestrator.programs.outside_record import OutsideDelegates
from orchestrator.records import (
    Count,
    Dimension,
    Document,
    Duration,
    RecordError,
    RecordT,
    Sha256,
    from_data,
    read_document,
    write_document,
)

# A number kept as written (an integer stays one), so that a sidecar writes back the JSON it was read from.
Amount = Count | Duration
OutputKind = Literal["logits", "values"]  # outputs.py OUTPUT_KINDS
Attention = Literal["etlab", "sdpa"]  # attention/choice.py ATTENTIONS


@dataclass(frozen=True)
class FileRecord:
    """What a sidecar stores about a file so that its validity is cheap to re-check."""

    file: str
    size: Count
    mtime_ns: int
    sha256: Sha256


@dataclass(frozen=True, kw_only=True)
class OutputRecord:
    """One output of the program: its name, shape, dtype and kind (outputs.py: logits or values).

    Sidecars written before kinds were recorded lack `kind`: it is then guessed from the shape, `kind_recorded` is
    False, and the sidecar is written back without it.
    """

    name: str
    if TYPE_CHECKING:
        kind: OutputKind  # always one once built
    else:
        kind: OutputKind | msgspec.UnsetType = msgspec.UNSET  # absent (not null) in older sidecars: guessed below
    shape: tuple[Dimension, ...]
    dtype: str

    def __post_init__(self) -> None:
        if self.kind is msgspec.UNSET:
            object.__setattr__(self, "kind", kind_from_shape(self.shape, self.dtype))
            object.__setattr__(self, "_guessed", True)

    @property
    def kind_recorded(self) -> bool:
        return not self.__dict__.get("_guessed", False)


@dataclass(frozen=True)
class Delegation:
    """Counts from the lowered graph and the serialized execution plan of `forward` (lowering/delegation.py)."""

    delegate_call_sites: Count
    delegate_backends: dict[str, Count]
    fallback_ops: Count
    fallback_histogram: dict[str, Count]  # most common first, as written
    instructions: dict[str, Count]  # KernelCall, DelegateCall, other

    def __post_init__(self) -> None:
        for kind in ("KernelCall", "DelegateCall"):
            if kind not in self.instructions:
                raise ValueError(f"instructions.{kind} is missing")


@dataclass(frozen=True)
class Memory:
    """The plan's memory read from the written .pte (programs/memory.py `ProgramMemory.to_sidecar`)."""

    method: str
    planned_arenas: tuple[Count, ...]
    planned_bytes: Count
    constants_bytes: Count
    delegate_data_bytes: Count
    pte_bytes: Count
    peak_live_bytes: Count
    live_bytes: dict[str, Count]  # per instruction node, e.g. forward_0_3


@dataclass(frozen=True)
class Calibration:
    source: str
    samples: Count


@dataclass(frozen=True, kw_only=True)
class QuantizedNodes:
    """The quantized program's XNNPACK nodes by datatype (quantize/xnn_types.py `node_report`)."""

    fully_connected: dict[str, Count]
    quantized_fully_connected: Count | None = None
    float_fully_connected: Count | None = None
    expected_fully_connected: Any = None
    linears_outside_delegates: dict[str, Count] | None = None
    convolution: dict[str, Count] | None = None  # absent in older sidecars
    quantized_convolution: Count | None = None
    float_convolution: Count | None = None
    expected_convolution: Any = None
    convolutions_outside_delegates: dict[str, Count] | None = None


@dataclass(frozen=True, kw_only=True)
class Quantization:
    """A quantized variant's report (lowering/quantize/), in the order the lowering writes it."""

    scheme: str
    method: str | None = None
    conv1d_swapped_to_linear: Count | None = None
    linear_layers: Count
    quantized_linears: Count
    float_linears: tuple[str, ...]
    # The graph's convolutions, as the linears above; 0 and () in sidecars written before they were counted.
    convolutions: Count = 0
    quantized_convolutions: Count = 0
    float_convolutions: tuple[str, ...] = ()
    calibration: Calibration | None = None  # calibrated schemes only
    # 8-bit embeddings (a language model's recipe); 0 and () when the scheme left every embedding alone.
    embeddings: Count = 0
    quantized_embeddings: Count = 0
    float_embeddings: tuple[str, ...] = ()
    # Linears whose input features the 4-bit group did not divide, quantized padded with zero columns (the LLM recipe)
    padded_linears: tuple[str, ...] = ()
    # A tied head reading its embedding's quantized table, stored once: "lm_head shares model.embed_tokens' 4-bit table"
    shared_heads: tuple[str, ...] = ()
    # Layers kept in float as asked (a mixed-precision program, `--keep-float`): not a warning, a choice
    kept_float: tuple[str, ...] = ()
    nodes: QuantizedNodes | None = None
    pte_bytes: Count | None = None

    @property
    def fully_connected(self) -> dict[str, int]:
        """FullyConnected datatypes in the serialized XNNPACK graphs → node count."""
        return dict(self.nodes.fully_connected) if self.nodes else {}

    @property
    def convolution(self) -> dict[str, int]:
        """The same for Convolution nodes (Conv2d, DepthwiseConv2d); {} in older sidecars."""
        return dict(self.nodes.convolution or {}) if self.nodes else {}

    @property
    def calibration_source(self) -> str | None:
        return self.calibration.source if self.calibration else None

    @property
    def calibration_samples(self) -> int | None:
        return self.calibration.samples if self.calibration else None

    def float_notes(self) -> list[str]:
        """`3 of 8 linears stay in float: a, b, c`, and the same for convolutions: what a report warns about. Layers
        kept in float as asked are no warning: `kept in float as asked: d`."""
        notes = []
        kept = set(self.kept_float)
        for names, total, kind in (
            (self.float_linears, self.linear_layers, "linears"),
            (self.float_convolutions, self.convolutions, "convolutions"),
            (self.float_embeddings, self.embeddings, "embeddings"),
        ):
            unasked = [name for name in names if name not in kept]
            if unasked:
                shown = ", ".join(unasked[:8]) + (f" … ({len(unasked) - 8} more)" if len(unasked) > 8 else "")
                left = total - self._quantized(kind) - (len(names) - len(unasked))
                notes.append(f"{left} of {total} {kind} stay in float: {shown}")
        return notes

    def _quantized(self, kind: str) -> int:
        counts = {"linears": self.quantized_linears, "embeddings": self.quantized_embeddings}
        return counts.get(kind, self.quantized_convolutions)


@dataclass(frozen=True)
class LoweringCost:
    """What the lowering of this variant cost; parallel lowering budgets memory from it next time."""

    seconds: Amount
    peak_rss_bytes: Count


@dataclass(frozen=True)
class Generation:
    """A text-generation program's KV cache and the run defaults it was lowered with (generation.py)."""

    context: Count  # the cache's positions: a prompt and its new tokens share them
    max_prompt_len: Count  # the program's upper bound on the sequence length
    prompt_len: Count  # the reference prompt's length (the spec's seq_len)
    new_tokens: Count  # the reference generation's length
    kv_cache_bytes: Count
    prompt_source: str | None = None  # tokenized text, or deterministic ids (and why)
    prompt_text: str | None = None  # with a cached tokenizer: the prompt and eager greedy generation, decoded
    reference_text: str | None = None
    # how the program attends (attention/choice.py): etlab or sdpa; None: lowered before the choice (sdpa)
    attention: Attention | None = None

    def __post_init__(self) -> None:
        if self.context < 2:
            raise ValueError(f"context: expected an integer >= 2, got {self.context}")
        # the runner is told these: a program whose own defaults do not fit its cache would write past it
        if self.max_prompt_len >= self.context:
            raise ValueError(f"max_prompt_len: {self.max_prompt_len} leaves no room in a cache of {self.context}")
        if self.prompt_len + self.new_tokens > self.context:
            raise ValueError(
                f"new_tokens: a prompt of {self.prompt_len} tokens and {self.new_tokens} new ones need "
                f"{self.prompt_len + self.new_tokens} positions; the KV cache holds {self.context}"
            )


@dataclass(frozen=True)
class SpecOrigin:
    """Where the spec a sidecar records came from: its model source (spec.py SOURCES: huggingface, a user's `pte`,
    ...) and its `source` (built-in, the spec file's path, or the user's own file)."""

    model_source: str | None = None  # None: not recorded
    source: str | None = None


def section(kind: type[RecordT], data: Any, field: str) -> RecordT:
    """One section of a sidecar being written, as its record (a wrong shape names the field: a bug in the lowering)."""
    return from_data(data, kind, where="sidecar", field=field)


@dataclass(frozen=True, kw_only=True)
class Sidecar(Document):
    """One lowered variant's sidecar; the field order is the file's key order, `schema` first."""

    SCHEMA: ClassVar[int] = 1

    model: str
    model_id: str | None
    task: str
    backend: str  # the variant's name (`variant` below)
    method: str
    exported_program: str
    pte: str
    pte_size_mb: Amount
    seq_len: Count | None  # the token models' sequence length; null for an image model
    weights: str
    weights_note: str
    parameters: Count
    sha256: Sha256
    versions: dict[str, str]  # torch, executorch, transformers
    inputs: list[dict[str, Any]]  # name, shape, dtype per input
    outputs: tuple[OutputRecord, ...]
    reference_inputs: str
    reference_outputs: str
    etrecord: str | None
    delegation: Delegation
    memory: Memory
    outside_delegates: OutsideDelegates | None = None  # absent in older sidecars
    quantization: Quantization | None
    lowering: LoweringCost
    spec: dict[str, Any]  # the spec as lowered (ModelSpec.to_dict)
    # The rewrites applied before export (rewrites/); None: an older sidecar, which had none
    rewrites: tuple[str, ...] | None = None
    generation: Generation | None = None  # text-generation only
    # What the program is (lowering/program.py): its base model, attention, context and rewrites; None: an older
    # sidecar, whose name says it (`identity`)
    program: ProgramName | None = None
    cache_key: str
    files: dict[str, FileRecord]  # role (pte, exported_program, reference_inputs, ...) → record
    created: str

    def __post_init__(self) -> None:
        try:
            variant = Variant.parse(self.backend)
        except UnknownVariant as exc:
            raise ValueError(f"backend: {exc}") from None
        for role in ("pte", "reference_inputs"):  # what every reader relies on: the program and its inputs
            if role not in self.files:
                raise ValueError(f"files.{role}: a file record is missing")
        recorded = self.quantization.scheme if self.quantization is not None else None
        if recorded != (variant.scheme.name if variant.quantized else None):
            raise ValueError(f"quantization ({recorded or 'none'}) does not match backend ({variant})")
        if self.program is not None and str(self.program) != self.model:
            raise ValueError(f"program: {self.program} is not the program {self.model!r}")

    @cached_property
    def variant(self) -> Variant:
        return Variant.parse(self.backend)  # checked when read

    @cached_property
    def origin(self) -> SpecOrigin:
        """Where its spec came from, read through its record (a spec without a source is refused by name)."""
        try:
            return from_data(self.spec, SpecOrigin, where="sidecar", field="spec")
        except RecordError as exc:
            raise ArtifactError(str(exc)) from None

    @property
    def identity(self) -> ProgramName:
        """What the program is: as recorded, or (an older sidecar) its name taken apart."""
        return self.program if self.program is not None else ProgramName.parse(self.model)

    @property
    def applied_rewrites(self) -> tuple[str, ...]:
        """The rewrites applied to the model before export; none for a sidecar older than them."""
        return self.rewrites or ()

    @property
    def reference_inputs_sha256(self) -> str:
        """The reference inputs' hash, as the board's content-addressed inputs/ names them."""
        return self.files["reference_inputs"].sha256  # a sidecar without the record is refused when read


SIDECAR_SCHEMA = Sidecar.SCHEMA
ABSENT_WHEN_UNKNOWN = ("outside_delegates", "rewrites", "generation", "program")  # sections older sidecars lack


def sidecar_from_data(data: Any, where: str | Path = "sidecar") -> Sidecar:
    """The sidecar in `data` (read from `where`), or an ArtifactError naming `where` and the bad field."""
    try:
        return read_document(data, Sidecar, where=str(where))
    except RecordError as exc:
        raise ArtifactError(str(exc)) from None


def sidecar_data(sidecar: Sidecar) -> dict[str, Any]:
    """The sidecar as its file holds it: what is unknown (a section or an output kind an older one lacks) stays out."""
    data = {
        key: value
        for key, value in write_document(sidecar).items()
        if not (key in ABSENT_WHEN_UNKNOWN and value is None)
    }
    for output, written in zip(sidecar.outputs, data["outputs"], strict=True):
        if not output.kind_recorded:
            del written["kind"]
    return data


def read_sidecar(path: Path) -> Sidecar:
    """The sidecar at `path`; an unreadable file or a wrong shape is an ArtifactError naming it."""
    try:
        data = read_json(path)
    except (OSError, ValueError) as exc:
        raise ArtifactError(f"sidecar {unreadable(path, exc)}") from None
    return sidecar_from_data(data, path)


def write_sidecar(path: Path, sidecar: Sidecar) -> Sidecar:
    """Write `sidecar` (the artifact's commit point) once it reads back: a sidecar built with a value its types refuse
    (a negative count) must not become a valid artifact. Returns it as read back."""
    data = sidecar_data(sidecar)
    checked = sidecar_from_data(data, path.name)
    atomic_write_json(path, data)
    return checked
