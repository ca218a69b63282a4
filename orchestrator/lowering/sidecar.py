"""The lowering sidecar (`<name>_<backend>.json`) as types: the lowering writes a Sidecar, every reader gets one back.

The file keeps its layout (docs/DESIGN.md "Artifacts"): `to_dict()` gives back exactly what `from_dict()` read, key
order included, so sidecars already on disk (caches, boards) stay valid. `from_dict()` refuses a wrong shape with an
ArtifactError naming the file and the field, instead of a KeyError or a silent `None` somewhere downstream. Sections
that are reports in their own right (the spec, the quantization report beyond what is read) stay mappings.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from orchestrator.errors import ArtifactError
from orchestrator.fsutil import atomic_write_json, read_json, unreadable
from orchestrator.lowering.outputs import OUTPUT_KINDS, kind_from_shape
from orchestrator.lowering.variants import UnknownVariant, Variant

SIDECAR_SCHEMA = 1


class _Reader:
    """Checks one field at a time, naming the file and the dotted field in every refusal."""

    def __init__(self, where: str) -> None:
        self.where = where

    def fail(self, field: str, wanted: str, value: Any) -> ArtifactError:
        got = "nothing" if value is _MISSING else type(value).__name__
        return ArtifactError(f"{self.where}: sidecar field {field!r} must be {wanted}, got {got}")

    def mapping(self, data: Any, field: str) -> dict[str, Any]:
        if not isinstance(data, dict):
            raise self.fail(field, "a mapping", data)
        return data

    def text(self, data: dict[str, Any], key: str, prefix: str = "", *, optional: bool = False) -> Any:
        value = data.get(key, _MISSING)
        if isinstance(value, str) or (optional and value is None):
            return value
        raise self.fail(prefix + key, "text" + (" or null" if optional else ""), value)

    def variant(self, data: dict[str, Any], key: str) -> Variant:
        name = self.text(data, key)
        try:
            return Variant.parse(name)
        except UnknownVariant as exc:
            raise ArtifactError(f"{self.where}: sidecar field {key!r}: {exc}") from None

    def integer(self, data: dict[str, Any], key: str, prefix: str = "", *, optional: bool = False) -> Any:
        value = data.get(key, _MISSING)
        if (isinstance(value, int) and not isinstance(value, bool)) or (optional and value is None):
            return value
        raise self.fail(prefix + key, "an integer" + (" or null" if optional else ""), value)

    def number(self, data: dict[str, Any], key: str, prefix: str = "") -> Any:
        value = data.get(key, _MISSING)
        if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
            return value  # kept as written (int or float) so that to_dict() gives back the same JSON
        raise self.fail(prefix + key, "a finite number", value)

    def counts(self, data: dict[str, Any], key: str, prefix: str = "") -> dict[str, int]:
        value = self.mapping(data.get(key, _MISSING), prefix + key)
        for name, count in value.items():
            if not isinstance(count, int) or isinstance(count, bool):
                raise self.fail(f"{prefix}{key}.{name}", "an integer", count)
        return dict(value)

    def records(self, data: dict[str, Any], key: str) -> list[dict[str, Any]]:
        value = data.get(key, _MISSING)
        if not isinstance(value, list):
            raise self.fail(key, "a list", value)
        for index, item in enumerate(value):
            self.mapping(item, f"{key}[{index}]")
        return [dict(item) for item in value]


_MISSING: Any = object()


@dataclass(frozen=True)
class FileRecord:
    """What a sidecar stores about a file so that its validity is cheap to re-check."""

    file: str
    size: int
    mtime_ns: int
    sha256: str

    @classmethod
    def from_dict(cls, data: Any, reader: _Reader, field: str) -> FileRecord:
        fields = reader.mapping(data, field)
        prefix = f"{field}."
        return cls(
            file=reader.text(fields, "file", prefix),
            size=reader.integer(fields, "size", prefix),
            mtime_ns=reader.integer(fields, "mtime_ns", prefix),
            sha256=reader.text(fields, "sha256", prefix),
        )

    def to_dict(self) -> dict[str, Any]:
        return {"file": self.file, "size": self.size, "mtime_ns": self.mtime_ns, "sha256": self.sha256}


@dataclass(frozen=True)
class OutputRecord:
    """One output of the program: its name, shape, dtype and kind (outputs.py: logits or values).

    Sidecars written before kinds were recorded lack `kind`: `kind` is then guessed from the shape and
    `kind_recorded` is False, and `to_dict()` writes the record back without it.
    """

    name: str
    shape: tuple[int, ...]
    dtype: str
    kind: str
    kind_recorded: bool = True

    @classmethod
    def from_dict(cls, data: Any, reader: _Reader, field: str) -> OutputRecord:
        fields = reader.mapping(data, field)
        prefix = f"{field}."
        shape = fields.get("shape", _MISSING)
        if not isinstance(shape, list) or not all(isinstance(n, int) and not isinstance(n, bool) for n in shape):
            raise reader.fail(prefix + "shape", "a list of integers", shape)
        dtype = reader.text(fields, "dtype", prefix)
        kind = fields.get("kind", _MISSING)
        if kind is not _MISSING and kind not in OUTPUT_KINDS:
            raise ArtifactError(
                f"{reader.where}: sidecar field {prefix}kind must be one of {', '.join(OUTPUT_KINDS)}, got {kind!r}"
            )
        return cls(
            name=reader.text(fields, "name", prefix),
            shape=tuple(shape),
            dtype=dtype,
            kind=kind_from_shape(shape, dtype) if kind is _MISSING else kind,
            kind_recorded=kind is not _MISSING,
        )

    def to_dict(self) -> dict[str, Any]:
        kind = {"kind": self.kind} if self.kind_recorded else {}
        return {"name": self.name, **kind, "shape": list(self.shape), "dtype": self.dtype}


@dataclass(frozen=True)
class Delegation:
    """Counts from the lowered graph and the serialized execution plan of `forward` (lowering/delegation.py)."""

    delegate_call_sites: int
    delegate_backends: dict[str, int]
    fallback_ops: int
    fallback_histogram: dict[str, int]  # most common first, as written
    instructions: dict[str, int]  # KernelCall, DelegateCall, other

    @classmethod
    def from_dict(cls, data: Any, reader: _Reader) -> Delegation:
        fields = reader.mapping(data, "delegation")
        instructions = reader.counts(fields, "instructions", "delegation.")
        for kind in ("KernelCall", "DelegateCall"):
            reader.integer(instructions, kind, "delegation.instructions.")
        return cls(
            delegate_call_sites=reader.integer(fields, "delegate_call_sites", "delegation."),
            delegate_backends=reader.counts(fields, "delegate_backends", "delegation."),
            fallback_ops=reader.integer(fields, "fallback_ops", "delegation."),
            fallback_histogram=reader.counts(fields, "fallback_histogram", "delegation."),
            instructions=instructions,
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "delegate_call_sites": self.delegate_call_sites,
            "delegate_backends": dict(self.delegate_backends),
            "fallback_ops": self.fallback_ops,
            "fallback_histogram": dict(self.fallback_histogram),
            "instructions": dict(self.instructions),
        }


@dataclass(frozen=True)
class Memory:
    """The plan's memory read from the written .pte (programs/memory.py `ProgramMemory.to_sidecar`)."""

    method: str
    planned_arenas: tuple[int, ...]
    planned_bytes: int
    constants_bytes: int
    delegate_data_bytes: int
    pte_bytes: int
    peak_live_bytes: int
    live_bytes: dict[str, int]  # per instruction node, e.g. forward_0_3

    @classmethod
    def from_dict(cls, data: Any, reader: _Reader) -> Memory:
        fields = reader.mapping(data, "memory")
        arenas = fields.get("planned_arenas", _MISSING)
        if not isinstance(arenas, list):
            raise reader.fail("memory.planned_arenas", "a list", arenas)
        for index, arena in enumerate(arenas):
            if not isinstance(arena, int) or isinstance(arena, bool):
                raise reader.fail(f"memory.planned_arenas[{index}]", "an integer", arena)
        numbers = {
            name: reader.integer(fields, name, "memory.")
            for name in ("planned_bytes", "constants_bytes", "delegate_data_bytes", "pte_bytes", "peak_live_bytes")
        }
        return cls(
            method=reader.text(fields, "method", "memory."),
            planned_arenas=tuple(arenas),
            live_bytes=reader.counts(fields, "live_bytes", "memory."),
            **numbers,
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "method": self.method,
            "planned_arenas": list(self.planned_arenas),
            "planned_bytes": self.planned_bytes,
            "constants_bytes": self.constants_bytes,
            "delegate_data_bytes": self.delegate_data_bytes,
            "pte_bytes": self.pte_bytes,
            "peak_live_bytes": self.peak_live_bytes,
            "live_bytes": dict(self.live_bytes),
        }


@dataclass(frozen=True)
class OutsideDelegates:
    """What stays outside the delegates (lowering/delegation.py `outside_delegates`); absent in older sidecars.

    `kernels` are the plan's real kernel calls by operator; `bookkeeping` the graph's nodes that emit none (memory
    planning, tuple access, views), which `delegation.fallback_ops` counts too; `stored_twice_bytes` the constants
    held both outside the XNNPACK delegates and inside one (a tied embedding)."""

    kernel_calls: int
    kernels: dict[str, int]  # operator → kernel calls, most common first
    bookkeeping: dict[str, int]  # memory_planning, tuple_access, views
    stored_twice_bytes: int
    stored_twice: tuple[dict[str, Any], ...]  # {"shape": [...], "bytes": n}, largest first

    @classmethod
    def from_dict(cls, data: Any, reader: _Reader) -> OutsideDelegates | None:
        if data is _MISSING:
            return None
        fields = reader.mapping(data, "outside_delegates")
        prefix = "outside_delegates."
        twice = reader.mapping(fields.get("stored_twice", _MISSING), prefix + "stored_twice")
        tensors = twice.get("tensors", _MISSING)
        if not isinstance(tensors, list):
            raise reader.fail(f"{prefix}stored_twice.tensors", "a list", tensors)
        for index, tensor in enumerate(tensors):
            reader.mapping(tensor, f"{prefix}stored_twice.tensors[{index}]")
            reader.integer(tensor, "bytes", f"{prefix}stored_twice.tensors[{index}].")
            shape = tensor.get("shape", _MISSING)
            if not isinstance(shape, list) or not all(isinstance(n, int) and not isinstance(n, bool) for n in shape):
                raise reader.fail(f"{prefix}stored_twice.tensors[{index}].shape", "a list of integers", shape)
        return cls(
            kernel_calls=reader.integer(fields, "kernel_calls", prefix),
            kernels=reader.counts(fields, "kernels", prefix),
            bookkeeping=reader.counts(fields, "bookkeeping", prefix),
            stored_twice_bytes=reader.integer(twice, "bytes", prefix + "stored_twice."),
            stored_twice=tuple(tensors),
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "kernel_calls": self.kernel_calls,
            "kernels": dict(self.kernels),
            "bookkeeping": dict(self.bookkeeping),
            "stored_twice": {"bytes": self.stored_twice_bytes, "tensors": [dict(t) for t in self.stored_twice]},
        }


@dataclass(frozen=True)
class Quantization:
    """A quantized variant's report (lowering/quantize/): the fields read are typed, `report` keeps it whole."""

    scheme: str
    linear_layers: int
    quantized_linears: int
    float_linears: tuple[str, ...]
    fully_connected: dict[str, int]  # FullyConnected datatypes in the serialized XNNPACK graphs → node count
    convolution: dict[str, int]  # the same for Convolution nodes (Conv2d, DepthwiseConv2d); {} in older sidecars
    calibration_source: str | None  # calibrated schemes only
    calibration_samples: int | None
    report: dict[str, Any]  # the section as written, for to_dict()
    # The graph's convolutions, as the linears above; 0 and () in sidecars written before they were counted.
    convolutions: int = 0
    quantized_convolutions: int = 0
    float_convolutions: tuple[str, ...] = ()
    # 8-bit embeddings (a language model's recipe); 0 and () when the scheme left every embedding alone.
    embeddings: int = 0
    quantized_embeddings: int = 0
    float_embeddings: tuple[str, ...] = ()

    @classmethod
    def from_dict(cls, data: Any, reader: _Reader) -> Quantization | None:
        if data is None:
            return None
        fields = reader.mapping(data, "quantization")
        floats = _names(fields, "float_linears", reader)
        float_convolutions = _names(fields, "float_convolutions", reader, optional=True)
        nodes = reader.mapping(fields.get("nodes", {}), "quantization.nodes")
        calibration = fields.get("calibration")
        source, samples = None, None
        if calibration is not None:
            calibration = reader.mapping(calibration, "quantization.calibration")
            source = reader.text(calibration, "source", "quantization.calibration.")
            samples = reader.integer(calibration, "samples", "quantization.calibration.")
        return cls(
            scheme=reader.text(fields, "scheme", "quantization."),
            linear_layers=reader.integer(fields, "linear_layers", "quantization."),
            quantized_linears=reader.integer(fields, "quantized_linears", "quantization."),
            float_linears=tuple(floats),
            fully_connected=reader.counts(nodes, "fully_connected", "quantization.nodes.") if nodes else {},
            convolution=reader.counts(nodes, "convolution", "quantization.nodes.") if "convolution" in nodes else {},
            calibration_source=source,
            calibration_samples=samples,
            report=dict(fields),
            convolutions=reader.integer(fields, "convolutions", "quantization.") if "convolutions" in fields else 0,
            quantized_convolutions=(
                reader.integer(fields, "quantized_convolutions", "quantization.")
                if "quantized_convolutions" in fields
                else 0
            ),
            float_convolutions=tuple(float_convolutions),
            embeddings=reader.integer(fields, "embeddings", "quantization.") if "embeddings" in fields else 0,
            quantized_embeddings=(
                reader.integer(fields, "quantized_embeddings", "quantization.")
                if "quantized_embeddings" in fields
                else 0
            ),
            float_embeddings=tuple(_names(fields, "float_embeddings", reader, optional=True)),
        )

    def to_dict(self) -> dict[str, Any]:
        return dict(self.report)

    def float_notes(self) -> list[str]:
        """`3 of 8 linears stay in float: a, b, c`, and the same for convolutions: what a report warns about."""
        notes = []
        for names, total, kind in (
            (self.float_linears, self.linear_layers, "linears"),
            (self.float_convolutions, self.convolutions, "convolutions"),
            (self.float_embeddings, self.embeddings, "embeddings"),
        ):
            if names:
                shown = ", ".join(names[:8]) + (f" … ({len(names) - 8} more)" if len(names) > 8 else "")
                notes.append(f"{total - self._quantized(kind)} of {total} {kind} stay in float: {shown}")
        return notes

    def _quantized(self, kind: str) -> int:
        counts = {"linears": self.quantized_linears, "embeddings": self.quantized_embeddings}
        return counts.get(kind, self.quantized_convolutions)


def _names(fields: dict[str, Any], key: str, reader: _Reader, *, optional: bool = False) -> list[str]:
    """A list of layer names; absent is [] where `optional` (a field older sidecars lack)."""
    value = fields.get(key, [] if optional else _MISSING)
    if not isinstance(value, list) or not all(isinstance(name, str) for name in value):
        raise reader.fail(f"quantization.{key}", "a list of names", value)
    return value


@dataclass(frozen=True)
class LoweringCost:
    """What the lowering of this variant cost; parallel lowering budgets memory from it next time."""

    seconds: float
    peak_rss_bytes: int

    @classmethod
    def from_dict(cls, data: Any, reader: _Reader) -> LoweringCost:
        fields = reader.mapping(data, "lowering")
        return cls(reader.number(fields, "seconds", "lowering."), reader.integer(fields, "peak_rss_bytes", "lowering."))

    def to_dict(self) -> dict[str, Any]:
        return {"seconds": self.seconds, "peak_rss_bytes": self.peak_rss_bytes}


@dataclass(frozen=True)
class Generation:
    """A text-generation program's KV cache and the run defaults it was lowered with (generation.py)."""

    context: int  # the cache's positions: a prompt and its new tokens share them
    max_prompt_len: int  # the program's upper bound on the sequence length
    prompt_len: int  # the reference prompt's length (the spec's seq_len)
    new_tokens: int  # the reference generation's length
    kv_cache_bytes: int
    prompt_source: str | None = None  # tokenized text, or deterministic ids (and why)
    prompt_text: str | None = None  # with a cached tokenizer: the prompt and eager greedy generation, decoded
    reference_text: str | None = None

    @classmethod
    def from_dict(cls, data: Any, reader: _Reader) -> Generation | None:
        if data is _MISSING or data is None:
            return None
        fields = reader.mapping(data, "generation")
        counts = ("context", "max_prompt_len", "prompt_len", "new_tokens", "kv_cache_bytes")
        values = {name: reader.integer(fields, name, "generation.") for name in counts}
        for name, value in values.items():
            if value < (2 if name == "context" else 0):
                raise reader.fail(f"generation.{name}", "a positive integer", value)
        texts = {
            name: reader.text(fields, name, "generation.", optional=True) if name in fields else None
            for name in ("prompt_source", "prompt_text", "reference_text")
        }
        return cls(
            context=values["context"],
            max_prompt_len=values["max_prompt_len"],
            prompt_len=values["prompt_len"],
            new_tokens=values["new_tokens"],
            kv_cache_bytes=values["kv_cache_bytes"],
            prompt_source=texts["prompt_source"],
            prompt_text=texts["prompt_text"],
            reference_text=texts["reference_text"],
        )

    def to_dict(self) -> dict[str, Any]:
        data = {name: getattr(self, name) for name in self.__dataclass_fields__}
        return {key: value for key, value in data.items() if value is not None}


@dataclass(frozen=True)
class Sidecar:
    """One lowered variant's sidecar; the field order is the file's key order (`variant` is written `backend`)."""

    model: str
    model_id: str | None
    task: str
    variant: Variant
    method: str
    exported_program: str
    pte: str
    pte_size_mb: float
    seq_len: int | None  # the token models' sequence length; null for an image model
    weights: str
    weights_note: str
    parameters: int
    sha256: str
    versions: dict[str, str]  # torch, executorch, transformers
    inputs: list[dict[str, Any]]  # name, shape, dtype per input
    outputs: tuple[OutputRecord, ...]
    reference_inputs: str
    reference_outputs: str
    etrecord: str | None
    delegation: Delegation
    memory: Memory
    quantization: Quantization | None
    lowering: LoweringCost
    spec: dict[str, Any]  # the spec as lowered (ModelSpec.to_dict)
    cache_key: str
    files: dict[str, FileRecord]  # role (pte, exported_program, reference_inputs, ...) → record
    created: str
    schema: int = SIDECAR_SCHEMA
    outside_delegates: OutsideDelegates | None = None  # written after `memory`; absent in older sidecars
    # The rewrites applied before export (rewrites/), written after `spec`; None: an older sidecar, which had none
    rewrites: tuple[str, ...] | None = None
    generation: Generation | None = None  # text-generation only, written after `rewrites`

    @property
    def applied_rewrites(self) -> tuple[str, ...]:
        """The rewrites applied to the model before export; none for a sidecar older than them."""
        return self.rewrites or ()

    @classmethod
    def from_dict(cls, data: Any, where: str | Path = "sidecar") -> Sidecar:
        """The sidecar in `data` (read from `where`), or an ArtifactError naming `where` and the bad field."""
        reader = _Reader(str(where))
        fields = reader.mapping(data, "(top level)")
        schema = fields.get("schema", _MISSING)
        if schema != SIDECAR_SCHEMA or not isinstance(schema, int) or isinstance(schema, bool):
            raise ArtifactError(f"{where}: sidecar field 'schema' must be {SIDECAR_SCHEMA}, got {schema!r}")
        versions = reader.mapping(fields.get("versions", _MISSING), "versions")
        for name, version in versions.items():
            if not isinstance(version, str):
                raise reader.fail(f"versions.{name}", "text", version)
        files = reader.mapping(fields.get("files", _MISSING), "files")
        for role in ("pte", "reference_inputs"):  # what every reader relies on: the program and its inputs
            if role not in files:
                raise reader.fail(f"files.{role}", "a file record", _MISSING)
        sidecar = cls(
            model=reader.text(fields, "model"),
            model_id=reader.text(fields, "model_id", optional=True),
            task=reader.text(fields, "task"),
            variant=reader.variant(fields, "backend"),
            method=reader.text(fields, "method"),
            exported_program=reader.text(fields, "exported_program"),
            pte=reader.text(fields, "pte"),
            pte_size_mb=reader.number(fields, "pte_size_mb"),
            seq_len=reader.integer(fields, "seq_len", optional=True),
            weights=reader.text(fields, "weights"),
            weights_note=reader.text(fields, "weights_note"),
            parameters=reader.integer(fields, "parameters"),
            sha256=reader.text(fields, "sha256"),
            versions=dict(versions),
            inputs=reader.records(fields, "inputs"),
            outputs=tuple(
                OutputRecord.from_dict(item, reader, f"outputs[{index}]")
                for index, item in enumerate(reader.records(fields, "outputs"))
            ),
            reference_inputs=reader.text(fields, "reference_inputs"),
            reference_outputs=reader.text(fields, "reference_outputs"),
            etrecord=reader.text(fields, "etrecord", optional=True),
            delegation=Delegation.from_dict(fields.get("delegation", _MISSING), reader),
            memory=Memory.from_dict(fields.get("memory", _MISSING), reader),
            quantization=Quantization.from_dict(fields.get("quantization", _MISSING), reader),
            lowering=LoweringCost.from_dict(fields.get("lowering", _MISSING), reader),
            spec=dict(reader.mapping(fields.get("spec", _MISSING), "spec")),
            cache_key=reader.text(fields, "cache_key"),
            files={role: FileRecord.from_dict(record, reader, f"files.{role}") for role, record in files.items()},
            created=reader.text(fields, "created"),
            schema=schema,
            outside_delegates=OutsideDelegates.from_dict(fields.get("outside_delegates", _MISSING), reader),
            rewrites=_rewrites(fields, reader),
            generation=Generation.from_dict(fields.get("generation", _MISSING), reader),
        )
        recorded = sidecar.quantization.scheme if sidecar.quantization is not None else None
        if recorded != (sidecar.variant.scheme.name if sidecar.variant.quantized else None):
            raise ArtifactError(
                f"{where}: sidecar field 'quantization' ({recorded or 'none'}) does not match "
                f"'backend' ({sidecar.variant})"
            )
        return sidecar

    def to_dict(self) -> dict[str, Any]:
        data = {
            "schema": self.schema,
            "model": self.model,
            "model_id": self.model_id,
            "task": self.task,
            "backend": self.variant.name,
            "method": self.method,
            "exported_program": self.exported_program,
            "pte": self.pte,
            "pte_size_mb": self.pte_size_mb,
            "seq_len": self.seq_len,
            "weights": self.weights,
            "weights_note": self.weights_note,
            "parameters": self.parameters,
            "sha256": self.sha256,
            "versions": dict(self.versions),
            "inputs": [dict(item) for item in self.inputs],
            "outputs": [item.to_dict() for item in self.outputs],
            "reference_inputs": self.reference_inputs,
            "reference_outputs": self.reference_outputs,
            "etrecord": self.etrecord,
            "delegation": self.delegation.to_dict(),
            "memory": self.memory.to_dict(),
            "quantization": self.quantization.to_dict() if self.quantization else None,
            "lowering": self.lowering.to_dict(),
            "spec": dict(self.spec),
            "cache_key": self.cache_key,
            "files": {role: record.to_dict() for role, record in self.files.items()},
            "created": self.created,
        }
        ordered = {}  # an older sidecar gets back exactly what it held
        for key, value in data.items():
            ordered[key] = value
            if key == "memory" and self.outside_delegates is not None:
                ordered["outside_delegates"] = self.outside_delegates.to_dict()
            if key == "spec" and self.rewrites is not None:
                ordered["rewrites"] = list(self.rewrites)
            if key == "spec" and self.generation is not None:
                ordered["generation"] = self.generation.to_dict()
        return ordered

    @property
    def reference_inputs_sha256(self) -> str:
        """The reference inputs' hash, as the board's content-addressed inputs/ names them."""
        return self.files["reference_inputs"].sha256  # from_dict refuses a sidecar without the record


def _rewrites(fields: dict[str, Any], reader: _Reader) -> tuple[str, ...] | None:
    value = fields.get("rewrites", _MISSING)
    if value is _MISSING:
        return None
    if not isinstance(value, list) or not all(isinstance(name, str) for name in value):
        raise reader.fail("rewrites", "a list of rewrite names", value)
    return tuple(value)


def read_sidecar(path: Path) -> Sidecar:
    """The sidecar at `path`; an unreadable file or a wrong shape is an ArtifactError naming it."""
    try:
        data = read_json(path)
    except (OSError, ValueError) as exc:
        raise ArtifactError(f"sidecar {unreadable(path, exc)}") from None
    return Sidecar.from_dict(data, path)


def write_sidecar(path: Path, sidecar: Sidecar) -> None:
    atomic_write_json(path, sidecar.to_dict())
