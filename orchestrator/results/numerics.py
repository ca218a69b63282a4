"""Where accuracy goes: the numerics pass's statistics (the bundle's numerics.json) read against the numerics
program's record, as the error of every operator against fp32 eager and the error it introduced itself.

The board's file is untrusted: capped in size, strict JSON, every field typed (records.py), its counts and shapes
checked against the record; a file that fails is refused (AnalysisError, 65) by field, and the raw bundle is kept.
NaN and Inf on the board are findings, not failures.

- SQNR (dB) = 10 log10(sum r^2 / sum (x - r)^2) over the pairs where both are finite; an error below fp32 rounding
  (above `EXACT_DB`) counts as exact.
- Introduced (dB): the error this operator added itself, as an SQNR: the output's relative error power less the
  worst of its inputs' (tapped upstream values; the program's inputs are exact), 10 log10(1 / (e_out - e_in)) with
  e = 10^(-SQNR/10). Lower is worse; an operator that only rounds as fp32 does (above `ROUNDING_DB`) adds nothing
  (`EXACT_DB`). A quantized linear that crushes its input shows here; the softmax after it, reading an already
  degraded value, does not. `introduced_share` is the part of the output's error that is this operator's own.
- Collapse: the first operator whose output is all zeros where fp32's is not (a calibration whose scales floored).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from orchestrator import strictjson
from orchestrator.errors import AnalysisError
from orchestrator.fsutil import read_json
from orchestrator.lowering.export.numerics import NumericsProgram, Tap, read_numerics_record
from orchestrator.records import Count, Dimension, RecordError, from_data, to_data
from orchestrator.results.summary import NumericsRow, NumericsSummary
from orchestrator.strictjson import JsonDataError

NUMERICS_FILE = "numerics.json"
MAX_NUMERICS_BYTES = 64 * 1024 * 1024  # a few hundred bytes per tap: far above any real program
EXACT_DB = 150.0  # no error at all
ROUNDING_DB = 100.0  # above this, an error is fp32's own rounding (1e-7 relative, 140 dB; sums of many: less)


@dataclass(frozen=True)
class ReferenceStats:
    min: float | None
    max: float | None
    sum_squares: float
    noise: float
    dot: float
    max_abs_error: float | None
    pairs: Count


@dataclass(frozen=True)
class TensorStats:
    index: Count
    dtype: str | None  # null: an output that is not a tensor
    dims: tuple[Dimension, ...] | None
    numel: Count
    nan: Count
    inf: Count
    zeros: Count
    min: float | None
    max: float | None
    sum_squares: float
    kept: bool | None = None
    reference: ReferenceStats | None = None


@dataclass(frozen=True)
class NumericsFile:
    schema: int
    outputs: Count
    tensors: tuple[TensorStats, ...]


@dataclass(frozen=True)
class OperatorNumerics:
    """One operator's values against fp32 eager."""

    tap: Tap
    sqnr_db: float
    introduced_db: float
    introduced_share: float  # of the output's error power, 0..1
    max_abs_error: float | None
    cosine: float | None
    nan: int
    inf: int
    collapsed: bool  # all zeros where fp32's is not


@dataclass(frozen=True)
class Numerics:
    """A run's numerics: every operator in program order, the model's outputs, and what stands out."""

    operators: tuple[OperatorNumerics, ...]
    output_sqnr_db: tuple[float, ...]  # the numerics program's own outputs against fp32 eager
    collapse: OperatorNumerics | None
    nonfinite: OperatorNumerics | None  # the first with NaN or Inf where fp32 has none

    def losing_most(self, count: int = 10) -> list[OperatorNumerics]:
        return sorted(self.operators, key=lambda row: (row.introduced_db, row.tap.index))[:count]


class NoNumerics(AnalysisError):
    """A run without a numerics pass where one is needed (exit 65)."""


def read_numerics_file(path: Path) -> NumericsFile:
    """The board's numerics.json, capped and typed; AnalysisError (65) names the field."""
    try:
        data = strictjson.read(path, max_bytes=MAX_NUMERICS_BYTES, max_magnitude=1e300)
        read = from_data(data, NumericsFile, where=str(path))
    except (OSError, JsonDataError, RecordError) as exc:
        raise AnalysisError(f"numerics pass unusable: {exc}") from None
    if read.schema != 1:
        raise AnalysisError(f"{path}: schema: expected 1, got {read.schema}")
    return read


def numerics_text(text: str, where: str) -> NumericsFile:
    """A numerics.json the board answered as text (the health job's), typed; AnalysisError (65) names the field."""
    try:
        read = from_data(strictjson.loads(text, where=where, max_magnitude=1e300), NumericsFile, where=where)
    except (JsonDataError, RecordError) as exc:
        raise AnalysisError(f"numerics unusable: {exc}") from None
    if read.schema != 1:
        raise AnalysisError(f"{where}: schema: expected 1, got {read.schema}")
    return read


def sqnr_db(signal: float, noise: float) -> float:
    if noise <= 0 or not math.isfinite(noise):
        return EXACT_DB if noise == 0 else -EXACT_DB
    if signal <= 0:
        return -EXACT_DB
    return max(-EXACT_DB, min(EXACT_DB, 10.0 * math.log10(signal / noise)))


def numerics_of(stats: NumericsFile, program: NumericsProgram, where: str) -> Numerics:
    """The statistics checked against the record (counts, indices, shapes) and read as errors per operator."""
    record = program.record
    expected = record.outputs + len(record.taps)
    if stats.outputs != expected or len(stats.tensors) != expected:
        raise AnalysisError(
            f"{where}: {len(stats.tensors)} tensors for {stats.outputs} outputs; the numerics program has {expected}"
        )
    for position, tensor in enumerate(stats.tensors):
        if tensor.index != position:
            raise AnalysisError(f"{where}: tensors[{position}].index: expected {position}, got {tensor.index}")
    outputs = tuple(_sqnr(tensor) for tensor in stats.tensors[: record.outputs])
    rows: list[OperatorNumerics] = []
    by_index: dict[int, float] = {}
    for tap in record.taps:
        tensor = stats.tensors[tap.index]
        field = f"tensors[{tap.index}]"
        if tuple(tensor.dims or ()) != tuple(tap.shape) or tensor.numel != math.prod(tap.shape):
            raise AnalysisError(f"{where}: {field}.dims: {tensor.dims}, the program's {tap.node} is {list(tap.shape)}")
        if tensor.reference is None:
            raise AnalysisError(f"{where}: {field}.reference: missing (the pass compares every tap)")
        sqnr = _sqnr(tensor)
        upstream = min((by_index[i] for i in tap.reads if i in by_index), default=EXACT_DB)
        by_index[tap.index] = sqnr
        added, share = _introduced(upstream, sqnr)
        reference = tensor.reference
        nonzero_reference = (reference.max or 0.0) != 0.0 or (reference.min or 0.0) != 0.0
        rows.append(
            OperatorNumerics(
                tap=tap,
                sqnr_db=round(sqnr, 2),
                introduced_db=round(added, 2),
                introduced_share=round(share, 4),
                max_abs_error=reference.max_abs_error,
                cosine=_cosine(tensor),
                nan=tensor.nan,
                inf=tensor.inf,
                collapsed=tensor.numel > 0 and tensor.zeros == tensor.numel and nonzero_reference,
            )
        )
    collapse = next((row for row in rows if row.collapsed), None)
    nonfinite = next((row for row in rows if row.nan or row.inf), None)
    return Numerics(tuple(rows), tuple(round(value, 2) for value in outputs), collapse, nonfinite)


def _introduced(upstream_db: float, output_db: float) -> tuple[float, float]:
    """The SQNR of the error an operator added (its output's relative error power less its inputs'), and that
    error's share of the output's; errors at fp32's rounding count as none."""
    if output_db >= ROUNDING_DB:
        return EXACT_DB, 0.0
    error_out = 10.0 ** (-output_db / 10.0)
    error_in = 0.0 if upstream_db >= ROUNDING_DB else 10.0 ** (-upstream_db / 10.0)
    added = error_out - error_in
    if added <= 0:
        return EXACT_DB, 0.0
    return max(-EXACT_DB, min(EXACT_DB, -10.0 * math.log10(added))), min(1.0, added / error_out)


def _sqnr(tensor: TensorStats) -> float:
    reference = tensor.reference
    if reference is None:
        return -EXACT_DB
    if tensor.nan or tensor.inf:  # non-finite values are the worst error there is, whatever the finite pairs say
        return -EXACT_DB
    return sqnr_db(reference.sum_squares, reference.noise)


def _cosine(tensor: TensorStats) -> float | None:
    reference = tensor.reference
    if reference is None or tensor.sum_squares <= 0 or reference.sum_squares <= 0:
        return None
    return round(reference.dot / math.sqrt(tensor.sum_squares * reference.sum_squares), 6)


def numerics_row(row: OperatorNumerics) -> NumericsRow:
    tap = row.tap
    return NumericsRow(
        node=tap.node,
        op=tap.op,
        module=tap.module,
        source=tap.source,
        sqnr_db=row.sqnr_db,
        introduced_db=row.introduced_db,
        introduced_share=row.introduced_share,
        max_abs_error=row.max_abs_error,
        cosine=row.cosine,
        nan=row.nan,
        inf=row.inf,
    )


def numerics_summary(numerics: Numerics, mode: str | None) -> NumericsSummary:
    return NumericsSummary(
        status="ok",
        mode=mode,
        taps=len(numerics.operators),
        output_sqnr_db=numerics.output_sqnr_db,
        losing_most=tuple(numerics_row(row) for row in numerics.losing_most()),
        collapse=numerics_row(numerics.collapse) if numerics.collapse else None,
        nonfinite=numerics_row(numerics.nonfinite) if numerics.nonfinite else None,
    )


def numerics_record_path(pte: Path) -> Path:
    """The numerics record beside a timed `.pte` (lowering/export/numerics.py names it)."""
    return pte.with_name(f"{pte.stem}.numerics.json")


def run_numerics(
    bundle_dir: Path, pass_record: object, pte: Path | None, pte_sha256: str | None
) -> tuple[NumericsSummary | None, Numerics | None]:
    """The bundle's numerics pass (run.json's `numerics_pass`) as a summary, and the rows for analysis/numerics.json.

    A pass that failed on the board is a summary saying why; a file that does not hold up is AnalysisError (65)."""
    if not isinstance(pass_record, dict):
        return None, None
    mode = pass_record.get("mode") if isinstance(pass_record.get("mode"), str) else None
    if pass_record.get("status") != "ok":
        error = str(pass_record.get("error") or "failed")[:500]
        return NumericsSummary(status="failed", error=error, mode=mode), None
    if pte is None:
        return NumericsSummary(status="failed", error="no lowered program to read the taps from", mode=mode), None
    record_path = numerics_record_path(pte)
    try:
        program = NumericsProgram(record_path.parent, read_numerics_record(read_json(record_path), str(record_path)))
    except (OSError, ValueError) as exc:
        return NumericsSummary(status="failed", error=f"numerics record unusable: {exc}", mode=mode), None
    if pte_sha256 is not None and program.record.timing_sha256 != pte_sha256:
        error = f"{record_path.name} describes another program than the one this run timed"
        return NumericsSummary(status="failed", error=error, mode=mode), None
    argv = pass_record.get("argv")
    model = Path(str(argv[argv.index("--model") + 1] if isinstance(argv, list) and "--model" in argv[:-1] else ""))
    if model.name != f"{program.record.sha256}.pte":  # pushed content-addressed: <sha256>.pte
        error = f"the pass ran {model.name or 'no program'}, not the numerics program {record_path.name} names"
        return NumericsSummary(status="failed", error=error, mode=mode), None
    stats = read_numerics_file(bundle_dir / NUMERICS_FILE)
    numerics = numerics_of(stats, program, str(bundle_dir / NUMERICS_FILE))
    return numerics_summary(numerics, mode), numerics


@dataclass(frozen=True)
class OperatorRecord(NumericsRow):
    """One operator of analysis/numerics.json: its summary row, and where it sits in the numerics program."""

    index: Count = 0
    shape: tuple[Dimension, ...] = ()
    dtype: str = "float32"
    reads: tuple[Count, ...] = ()
    fused: tuple[str, ...] = ()
    collapsed: bool = False


@dataclass(frozen=True)
class NumericsDocument:
    """analysis/numerics.json: every operator in program order."""

    schema: int
    output_sqnr_db: tuple[float, ...]
    operators: tuple[OperatorRecord, ...]


def numerics_document(numerics: Numerics) -> dict[str, object]:
    """analysis/numerics.json's data."""
    operators = tuple(
        OperatorRecord(
            **vars(numerics_row(row)), index=row.tap.index, shape=row.tap.shape, dtype=row.tap.dtype,
            reads=row.tap.reads, fused=row.tap.fused, collapsed=row.collapsed,
        )
        for row in numerics.operators
    )  # fmt: skip
    return to_data(NumericsDocument(1, numerics.output_sqnr_db, operators))


def read_numerics_document(run_dir: Path) -> NumericsDocument:
    """A run's analysis/numerics.json; AnalysisError (65) when it is missing (no numerics pass) or malformed."""
    path = Path(run_dir) / "analysis" / NUMERICS_FILE
    if not path.is_file():
        raise NoNumerics(f"{run_dir}: no analysis/numerics.json (the run had no numerics pass, or is not analysed)")
    try:
        return from_data(strictjson.read(path, max_bytes=MAX_NUMERICS_BYTES), NumericsDocument, where=str(path))
    except (OSError, JsonDataError, RecordError) as exc:
        raise AnalysisError(f"numerics of {run_dir} unusable: {exc}") from None


DIVERGENCE_DB = 3.0  # an SQNR difference between two runs at one operator that is not rounding noise


@dataclass(frozen=True)
class NumericsPair:
    """One operator in both runs: the baseline's and the new run's figures."""

    a: OperatorRecord
    b: OperatorRecord

    @property
    def delta_db(self) -> float:
        return round(self.b.sqnr_db - self.a.sqnr_db, 2)

    @property
    def diverges(self) -> bool:
        noisy = min(self.a.sqnr_db, self.b.sqnr_db) < ROUNDING_DB
        return noisy and abs(self.delta_db) >= DIVERGENCE_DB


@dataclass(frozen=True)
class NumericsComparison:
    """Two runs' numerics joined by the .pt2 node each operator measures (the same program on two boards, or two
    variants of one model: a tap is named by its fp32 node in both)."""

    pairs: tuple[NumericsPair, ...]  # in the baseline's program order
    only_a: int
    only_b: int
    outputs_a: tuple[float, ...]
    outputs_b: tuple[float, ...]

    @property
    def first_divergence(self) -> NumericsPair | None:
        return next((pair for pair in self.pairs if pair.diverges), None)

    def largest(self, count: int = 10) -> list[NumericsPair]:
        return sorted(self.pairs, key=lambda pair: (-abs(pair.delta_db), pair.a.index))[:count]


def compare_numerics(a: NumericsDocument, b: NumericsDocument) -> NumericsComparison:
    by_node = {row.node: row for row in b.operators}
    pairs = tuple(NumericsPair(row, by_node[row.node]) for row in a.operators if row.node in by_node)
    return NumericsComparison(
        pairs, len(a.operators) - len(pairs), len(b.operators) - len(pairs), a.output_sqnr_db, b.output_sqnr_db
    )
