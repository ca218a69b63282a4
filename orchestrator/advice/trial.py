"""The trial behind `fab advise --try`: lower the model with the change the advice proposes (one ProgramChoice: its
rewrites, and for a text-generation program etlab's attention), check it computes what the model as exported
computes, and measure the gain on a board with the interleaved A/B re-test (deploy/abtest.py); a text-generation
program's runs are its generate loop on the reference prompt, as a profile's are.

Each variant lives under its own name (lowering/program.py), beside the model as exported: both stay
cached. The outputs check compares the variant's eager reference outputs with the original's (the rewrite changes
the model, not the lowering: the lowering is checked on the board by every run); `head-at-position` turns
[B, S, V] logits into [B, V], compared with the original's row at the position the rewrite keeps.
"""

from __future__ import annotations

import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from orchestrator import console
from orchestrator.advice.findings import QUANTIZE
from orchestrator.boards import labgrid
from orchestrator.boards.inventory import Board
from orchestrator.deploy.abtest import (
    DEFAULT_RETEST_SECONDS,
    DEFAULT_ROUNDS,
    ABProgram,
    Interleaved,
    Retest,
    interleave,
)
from orchestrator.deploy.agent_client import GenerateArgs
from orchestrator.deploy.provision import quick_check, setup_board
from orchestrator.deploy.runs import RunParams
from orchestrator.errors import EtlabError, ExitCode
from orchestrator.lowering.export import lower as lowering
from orchestrator.lowering.export.lower import LoweredVariant
from orchestrator.lowering.program import ATTENTION, KEEP_FLOAT, Program, ProgramChoice, programs
from orchestrator.lowering.rewrites.registry import REWRITES, RewriteRequest, without_superseded
from orchestrator.lowering.sidecar import Sidecar
from orchestrator.lowering.sources.huggingface import HuggingFaceOptions
from orchestrator.lowering.spec import ModelSpec
from orchestrator.lowering.variants import QUANTIZED_ON, Variant
from orchestrator.results.validity import MIN_SQNR_DB, OUTPUT_RTOL, accuracy_figures, compare_output
from orchestrator.tensorfile import NamedTensor, read_tensors
from orchestrator.transport import connect

HEAD_AT_POSITION = "head-at-position"


class TrialRefused(EtlabError):
    """A variant whose outputs are not the original's: it is not measured (exit 65, the data is wrong)."""

    exit_code = ExitCode.DATA


@dataclass(frozen=True)
class OutputsCheck:
    """A variant's eager outputs against the original's: the worst output's figures."""

    sqnr_db: float
    max_abs_error: float
    max_rel_error: float
    problems: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        return not self.problems


@dataclass
class VariantTrial:
    """One variant's trial: what was predicted, what the board measured, and whether its outputs match."""

    name: str  # the variant's program name (artifacts/<name>/)
    rewrites: tuple[str, ...]  # the rewrites applied, in order
    predicted_ms: float  # the sum of the given predictions for its rewrites, at the profiled run's pace
    outputs: OutputsCheck
    retest: Interleaved = field(default_factory=Interleaved)
    profiled_ms: float | None = None  # the profiled run's method time the prediction is a part of
    attention: str | None = None  # the attention the variant was lowered with instead of the original's
    keep_float: tuple[str, ...] = ()  # the layers it keeps in float (a quantized program's mixed precision)
    variant: Variant | None = None  # the variant it was lowered to where not the original's (the fp32 point)
    sqnr_db: float | None = None  # its outputs on the board against fp32 eager (None: not measured)

    @property
    def change(self) -> str:
        """What the variant changes, as the command line says it."""
        parts = [*self.rewrites, *([f"--attention {self.attention}"] if self.attention else [])]
        parts += [f"--keep-float {','.join(self.keep_float)}"] if self.keep_float else []
        if self.variant is not None:  # a point of its own variant: fp32 beside a quantized original, or quantized
            parts += [
                f"--quantize {self.variant.scheme.name}" if self.variant.quantized else f"fp32 ({self.variant.name})"
            ]
        return ", ".join(parts) or "—"

    @property
    def predicted_share(self) -> float | None:
        """The predicted saving as a share of the profiled run."""
        return self.predicted_ms / self.profiled_ms if self.profiled_ms else None

    @property
    def predicted_at_retest_ms(self) -> float:
        """The prediction at the re-test's pace: its share of the original's median in the A/B. The board's pace
        drifts between the profiled run and the re-test (load, clocks); a share does not."""
        share, original = self.predicted_share, self.retest.median_a_ms
        return share * original if share is not None and original else self.predicted_ms

    @property
    def measured_ms(self) -> float | None:
        """Median of the original minus median of the variant: positive is a saving."""
        a, b = self.retest.median_a_ms, self.retest.median_b_ms
        return a - b if a is not None and b is not None else None

    @property
    def measured_percent(self) -> float | None:
        a, saved = self.retest.median_a_ms, self.measured_ms
        return 100.0 * saved / a if a and saved is not None else None

    @property
    def ratio(self) -> float | None:
        """Median of the variant over median of the original (below 1: faster)."""
        return self.retest.ratio

    @property
    def confirmed(self) -> bool:
        return self.retest.confirmed

    @property
    def prediction_error(self) -> float | None:
        """(predicted - measured) / measured, the prediction at the re-test's pace: how far the advisor was from
        the board's answer."""
        measured = self.measured_ms
        return (self.predicted_at_retest_ms - measured) / measured if measured else None

    @property
    def why(self) -> str:
        return self.retest.reason


@dataclass
class TrialReport:
    """The trial of one model's rewrites on one board: the original (A) against each variant (B)."""

    model: str  # the model as exported
    board: str
    variant: Variant  # the backend and scheme both sides were lowered to
    original_ms: float | None = None  # the original's median over the first variant's re-test
    variants: list[VariantTrial] = field(default_factory=list)
    original_sqnr_db: float | None = None  # the original's outputs on the board against fp32 eager

    def points(self) -> list[ParetoPoint]:
        """Speed against accuracy: the original and every variant measured, by their medians in the A/B (the
        original's from the first) and their outputs' SQNR on the board."""
        found = []
        if self.original_ms is not None and self.original_sqnr_db is not None:
            found.append(ParetoPoint(self.model, self.variant, self.original_ms, self.original_sqnr_db, None))
        for trial in self.variants:
            if trial.retest.median_b_ms is not None and trial.sqnr_db is not None:
                variant = trial.variant or self.variant
                found.append(ParetoPoint(trial.name, variant, trial.retest.median_b_ms, trial.sqnr_db, trial))
        return found

    @property
    def outcome(self) -> TrialOutcome:
        """What advice_trial.json keeps (`to_data` writes it): per variant its prediction, the board's answer and
        the re-test's figures."""
        return TrialOutcome(
            self.model,
            self.board,
            self.variant.name,
            self.original_ms,
            tuple(
                VariantOutcome(
                    trial.name,
                    trial.rewrites,
                    trial.predicted_ms,
                    trial.profiled_ms,
                    trial.predicted_share,
                    trial.predicted_at_retest_ms,
                    trial.measured_ms,
                    trial.measured_percent,
                    trial.prediction_error,
                    trial.ratio,
                    trial.confirmed,
                    trial.why,
                    OutputFigures(trial.outputs.sqnr_db, trial.outputs.max_abs_error, trial.outputs.max_rel_error),
                    trial.retest.outcome,
                    trial.attention,
                    trial.keep_float,
                    trial.variant.name if trial.variant is not None else None,
                    trial.sqnr_db,
                )
                for trial in self.variants
            ),
            self.original_sqnr_db,
            tuple(PointOutcome(p.name, p.variant.name, p.median_ms, p.sqnr_db) for p in pareto_front(self.points())),
        )


@dataclass(frozen=True)
class OutputFigures:
    sqnr_db: float
    max_abs_error: float
    max_rel_error: float


@dataclass(frozen=True)
class VariantOutcome:
    """One variant's line of advice_trial.json."""

    name: str
    rewrites: tuple[str, ...]
    predicted_ms: float
    profiled_ms: float | None
    predicted_share: float | None
    predicted_at_retest_ms: float
    measured_ms: float | None
    measured_percent: float | None
    prediction_error: float | None
    ratio: float | None
    confirmed: bool
    why: str
    outputs: OutputFigures
    retest: Retest
    attention: str | None = None  # the attention the variant was lowered with (no rewrites then)
    keep_float: tuple[str, ...] = ()
    backend: str | None = None  # its own variant (the fp32 point of a quantized program's trial)
    sqnr_db: float | None = None  # its outputs on the board against fp32 eager


@dataclass(frozen=True)
class TrialOutcome:
    """advice_trial.json: the trial of one model's rewrites on one board."""

    model: str
    board: str
    backend: str  # the variant both sides were lowered to
    original_ms: float | None
    variants: tuple[VariantOutcome, ...]
    original_sqnr_db: float | None = None
    pareto_front: tuple[PointOutcome, ...] = ()  # speed against accuracy: no point both slower and less accurate


@dataclass(frozen=True)
class PointOutcome:
    name: str
    backend: str
    median_ms: float
    sqnr_db: float


@dataclass(frozen=True)
class ParetoPoint:
    """One program measured in the trial: its median in the A/B and its outputs' SQNR on the board."""

    name: str  # the program (artifacts/<name>/)
    variant: Variant
    median_ms: float
    sqnr_db: float
    trial: VariantTrial | None  # None: the original

    def dominated_by(self, other: ParetoPoint) -> bool:
        better = other.median_ms < self.median_ms or other.sqnr_db > self.sqnr_db
        return better and other.median_ms <= self.median_ms and other.sqnr_db >= self.sqnr_db


def pareto_front(points: Sequence[ParetoPoint]) -> list[ParetoPoint]:
    """The points no other point beats on both speed and accuracy, fastest first."""
    front = [point for point in points if not any(point.dominated_by(other) for other in points)]
    return sorted(front, key=lambda point: (point.median_ms, -point.sqnr_db))


def _logits_rows(original: np.ndarray, inputs: Sequence[NamedTensor], spec: ModelSpec) -> np.ndarray:
    """The original's [B, S, V] logits at the position `head-at-position` keeps per row: [B, V].

    fill-mask: the first mask token in input_ids (the first position when a row has none, as the rewrite does);
    causal-lm: the last position whose attention_mask is 1.
    """
    by_name = {tensor.name: tensor.array for tensor in inputs}
    if spec.task == "fill-mask":
        options = spec.options
        mask_token_id = options.mask_token_id if isinstance(options, HuggingFaceOptions) else None
        if mask_token_id is None or "input_ids" not in by_name:
            raise TrialRefused(f"{spec.name}: fill-mask without mask_token_id or input_ids: no position to compare")
        positions = np.argmax(by_name["input_ids"] == mask_token_id, axis=1)
    elif spec.task == "causal-lm":
        if "attention_mask" not in by_name:
            raise TrialRefused(f"{spec.name}: causal-lm inputs without attention_mask: no position to compare")
        mask = np.asarray(by_name["attention_mask"]) == 1
        positions = mask.shape[1] - 1 - np.argmax(mask[:, ::-1], axis=1)
    else:
        raise TrialRefused(f"{spec.name}: {HEAD_AT_POSITION} is for fill-mask and causal-lm, not {spec.task}")
    if original.ndim != 3 or len(positions) != original.shape[0]:
        raise TrialRefused(f"{spec.name}: logits of shape {list(original.shape)} are not [B, seq_len, vocab]")
    return original[np.arange(original.shape[0]), positions]


def check_outputs(
    spec: ModelSpec,
    rewrites: Sequence[str],
    inputs: Sequence[NamedTensor],
    original: Sequence[NamedTensor],
    rewritten: Sequence[NamedTensor],
) -> OutputsCheck:
    """The rewritten model's outputs against the original's, at the fp32 check's thresholds (results/validity.py)."""
    if len(original) != len(rewritten):
        return OutputsCheck(0.0, float("inf"), float("inf"), (f"{len(rewritten)} outputs, {len(original)} expected",))
    problems, sqnr, abs_error, rel_error = [], [], [], []
    for expected, got in zip(original, rewritten, strict=True):
        want = expected.array
        if HEAD_AT_POSITION in rewrites and want.ndim == got.array.ndim + 1:
            want = _logits_rows(want, inputs, spec)
        check = compare_output(expected.name, got.array, want)
        if check.reference_shape is not None:
            problems.append(f"{expected.name}: shape {list(got.array.shape)}, expected {list(want.shape)}")
            continue
        if check.non_finite:
            problems.append(f"{expected.name}: {check.non_finite} non-finite value(s) where the original's are finite")
            continue
        sqnr.append(check.sqnr_db if check.sqnr_db is not None else -999.0)
        abs_error.append(check.max_abs_error or 0.0)
        relative = check.max_rel_error if check.max_rel_error is not None else float("inf")
        rel_error.append(relative)
        if sqnr[-1] < MIN_SQNR_DB:
            problems.append(f"{expected.name}: SQNR {sqnr[-1]:.1f} dB < {MIN_SQNR_DB:g} dB")
        if relative > OUTPUT_RTOL:
            problems.append(f"{expected.name}: max abs error {abs_error[-1]:.3g} is {relative:.3g} of the largest "
                            f"magnitude (limit {OUTPUT_RTOL:g})")  # fmt: skip
    return OutputsCheck(
        min(sqnr, default=0.0), max(abs_error, default=float("inf")), max(rel_error, default=float("inf")),
        tuple(problems),
    )  # fmt: skip


def _lower(
    program: Program, variant: Variant, weights: str, root: Path | None, jobs: int | None
) -> tuple[LoweredVariant, Path, Path]:
    """`program` lowered to `variant` (cached), and its reference inputs and outputs files."""
    result = lowering.lower(
        program.spec, variants=[variant], weights=weights, root=root, jobs=jobs, rewrites=program.rewrites
    )
    return result.variants[variant], result.paths.reference_inputs, result.paths.reference_outputs


def _generate(sidecar: Sidecar, params: RunParams) -> GenerateArgs | None:
    """A text-generation program runs its generate loop in each A/B run, as in a profile (deploy/runs.py)."""
    generation = sidecar.generation
    if generation is None:
        return None
    return GenerateArgs(generation.prompt_len, params.new_tokens or generation.new_tokens, generation.context)


def change_sets(change: ProgramChoice, each: bool) -> list[ProgramChoice]:
    """The whole change (its rewrites less those another of them supersedes), then (with `each`, when it has several
    parts) one per part: each rewrite alone, the attention alone."""
    names = tuple(dict.fromkeys(change.rewrites.names))
    together = ProgramChoice(attention=change.attention, rewrites=RewriteRequest(names=without_superseded(names)),
                             keep_float=change.keep_float)  # fmt: skip
    parts = [ProgramChoice(rewrites=RewriteRequest(names=(name,))) for name in names]
    parts += [ProgramChoice(attention=change.attention)] if change.attention is not None else []
    parts += [ProgramChoice(keep_float=change.keep_float)] if change.keep_float else []
    if together == ProgramChoice(rewrites=RewriteRequest()):  # nothing to change in the program (a quantize trial)
        return []
    return list(dict.fromkeys([together, *(parts if each and len(parts) > 1 else [])]))


def try_change(
    spec: ModelSpec,
    variant: Variant,
    change: ProgramChoice,
    board: Board,
    params: RunParams,
    *,
    each: bool = False,
    predicted_ms: Mapping[str, float] | None = None,
    profiled_ms: float | None = None,
    weights: str = "auto",
    root: Path | None = None,
    jobs: int | None = None,
    rounds: int = DEFAULT_ROUNDS,
    budget_seconds: float = DEFAULT_RETEST_SECONDS,
    iterations_per_run: int | None = None,
    reference: Path | None = None,
    quantize_to: Variant | None = None,
) -> TrialReport:
    """Lower `spec` as exported and with `change` (all of it; with `each` also one variant per part), refuse a
    variant whose outputs differ from the original's (TrialRefused, exit 65), then A/B each variant against the
    original on `board` (A the original, B the variant, expecting faster; a variant keeping layers in float costs
    time, so no way is expected of it). A quantized original is also A/B'd against its fp32 program: the three
    (or more) points of speed against accuracy. Every side's outputs on the board are compared with fp32 eager.

    `change` applies to the spec (program.refusals: the caller checked it); `predicted_ms` the advisor's predicted
    saving per part (Advice.predicted_parts: a rewrite's name, ATTENTION or KEEP_FLOAT; missing: 0), a part of
    `profiled_ms`, the profiled run's time (the error is then judged on shares, at the re-test's pace).
    `reference`: the original's outputs file to check against, instead of its own (a test feeds a wrong one).
    `quantize_to`: an fp32 original is also A/B'd against that quantized program (the advisor's quantize finding,
    measured: its time and its outputs' SQNR on the board, predicted as QUANTIZE).
    """
    predicted = dict(predicted_ms or {})
    original, original_inputs, original_outputs = _lower(Program(spec), variant, weights, root, jobs)
    inputs = read_tensors(original_inputs)
    expected = read_tensors(reference or original_outputs)
    report = TrialReport(spec.name, board.name, variant)
    lowered: list[tuple[VariantTrial, LoweredVariant, Path]] = []
    for candidate in change_sets(change, each):
        (chosen,) = programs(spec, candidate)
        name = chosen.name
        program, _, outputs_file = _lower(chosen, variant, weights, root, jobs)
        applied = program.sidecar.applied_rewrites
        if program.sidecar.reference_inputs_sha256 != original.sidecar.reference_inputs_sha256:
            raise TrialRefused(f"{name}: its reference inputs are not the original's")
        check = check_outputs(spec, applied, inputs, expected, read_tensors(outputs_file))
        if not check.ok:
            raise TrialRefused(f"{name} does not compute what {spec.name} computes: {'; '.join(check.problems)}")
        # a rewrite makes the change of those it supersedes too: their predicted savings are its
        covered = {*applied, *(old for name in applied for old in REWRITES[name].supersedes)}
        covered |= {ATTENTION} if candidate.attention is not None else set()
        covered |= {KEEP_FLOAT} if candidate.keep_float else set()
        saving = sum(predicted.get(part, 0.0) for part in covered)
        trial = VariantTrial(name, applied, saving, check, profiled_ms=profiled_ms, attention=candidate.attention,
                             keep_float=chosen.spec.keep_float)  # fmt: skip
        lowered.append((trial, program, outputs_file))
    if variant.quantized:  # the fp32 point: what quantizing gains and loses, measured in the same minutes
        fp32 = Variant(QUANTIZED_ON)
        program, _, outputs_file = _lower(Program(spec), fp32, weights, root, jobs)
        check = OutputsCheck(float("inf"), 0.0, 0.0)  # the model itself: nothing changed to check
        trial = VariantTrial(spec.name, (), 0.0, check, profiled_ms=profiled_ms, variant=fp32)
        lowered.append((trial, program, outputs_file))
    elif quantize_to is not None:  # the quantized point: what quantizing gains and loses, measured
        program, _, outputs_file = _lower(Program(spec), quantize_to, weights, root, jobs)
        check = OutputsCheck(float("inf"), 0.0, 0.0)  # the model itself: its accuracy is the board SQNR below
        trial = VariantTrial(spec.name, (), predicted.get(QUANTIZE, 0.0), check, profiled_ms=profiled_ms,
                             variant=quantize_to)  # fmt: skip
        lowered.append((trial, program, outputs_file))
    with tempfile.TemporaryDirectory(prefix="etlab-trial-") as scratch:
        pulled = Path(scratch)
        a = ABProgram(spec.name, original.pte, original.sidecar.sha256, _generate(original.sidecar, params),
                      outputs_to=pulled / "original")  # fmt: skip
        with labgrid.job(board) as target, connect(target) as conn:
            if quick_check(conn) is None:  # not set up, or out of date
                setup_board(conn)
            for index, (trial, program, _) in enumerate(lowered):
                console.info(console.escape(f"[{board.name}] {spec.name} against {trial.name}: interleaved A/B"))
                b = ABProgram(trial.name, program.pte, program.sidecar.sha256, _generate(program.sidecar, params),
                              outputs_to=pulled / f"variant-{index}")  # fmt: skip
                costs = bool(trial.keep_float) or trial.variant is not None  # no way expected of it (int8 may lose)
                trial.retest = interleave(
                    conn, a, b, (original_inputs, original.sidecar.reference_inputs_sha256), params,
                    expect=None if costs else "faster", rounds=rounds, budget_seconds=budget_seconds,
                    iterations_per_run=iterations_per_run,
                )  # fmt: skip
                report.variants.append(trial)
        report.original_sqnr_db = board_sqnr(pulled / "original", original_outputs)
        for index, (trial, _, outputs_file) in enumerate(lowered):
            trial.sqnr_db = board_sqnr(pulled / f"variant-{index}", outputs_file)
    report.original_ms = report.variants[0].retest.median_a_ms if report.variants else None
    return report


def board_sqnr(bundle: Path, reference: Path) -> float | None:
    """The worst output's SQNR of a pulled bundle's outputs against its program's fp32 eager outputs; None when
    none was pulled (the re-test stopped) or they cannot be compared."""
    outputs = bundle / "outputs.etlt"
    if not outputs.is_file():
        return None
    figures = accuracy_figures(outputs, reference)
    if isinstance(figures, str):
        console.warn(f"{bundle.name}: outputs not compared: {figures}")
        return None
    sqnr = figures.get("sqnr_db")
    return round(float(sqnr), 2) if sqnr is not None else None
