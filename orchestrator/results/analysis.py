"""Bundle analysis: read and verify a pulled bundle, profile its ETDump, judge it, and write the documents.

Inputs are a pulled result bundle (layout in docs/DESIGN.md) and, optionally, the lowered .pte, its sidecar and
the eager reference outputs. Outputs go to `<bundle>/analysis/` and `<bundle>/model_explorer/`; the raw bundle
files are only read, never modified, also when the analysis fails.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from orchestrator.errors import AnalysisError
from orchestrator.fsutil import sha256_file
from orchestrator.lowering.artifacts import SOURCES_ROLE
from orchestrator.lowering.quantize.schemes import FP32
from orchestrator.lowering.sidecar import Sidecar, sidecar_data
from orchestrator.programs.memory import ProgramMemory, program_memory_from_sidecar, read_program_memory
from orchestrator.programs.plan import ProgramPlan, read_program_plan
from orchestrator.results.bundle_reader import BundleFiles, bundle_model_sha, read_bundle
from orchestrator.results.counters_profile import CounterProfile, counters_summary, read_counter_profile
from orchestrator.results.documents import Summary, summary_document, write_outputs
from orchestrator.results.energy import energy_summary
from orchestrator.results.etdump import Etdump, RunBlock, read_etdump
from orchestrator.results.etdump_profile import _method_totals, inferred_ns_per_tick, profile_etdump
from orchestrator.results.generation import (
    DECODE,
    PHASES,
    PREFILL,
    GenerationTimings,
    generation_summary,
    judge_tokens,
    phase_etdump,
    token_check,
)
from orchestrator.results.memory import memory_summary
from orchestrator.results.modules import module_tree
from orchestrator.results.numerics import numerics_document, numerics_row, run_numerics
from orchestrator.results.op_roofline import SequenceRows, run_rooflines
from orchestrator.results.profile import Profile
from orchestrator.results.roofline import decode_roofline, prefill_roofline, program_gathers, prompt_calls
from orchestrator.results.source_map import attribute, load_source_map
from orchestrator.results.summary import TokenCheck
from orchestrator.results.summary_checks import hashing_times
from orchestrator.results.summary_outputs import ACCURACY_DEFAULTS, Correctness
from orchestrator.results.trace import (
    BROKEN_RULES,
    MEDIAN,
    NO_TIMESTAMPS,
    Execution,
    Step,
    generation_steps,
    iteration_steps,
    trace_document,
)
from orchestrator.results.trace_rules import timeline_problems
from orchestrator.results.validity import (
    TIMING_AGREEMENT,
    board_conditions,
    check_outputs,
    judge_accuracy,
    judge_validity,
    latency_summary,
    number_list,
    output_kinds,
)
from orchestrator.tensorfile import TensorFileError, read_tensors


def _pte_sha(pte: Path, sidecar: Sidecar | None) -> str:
    """The sidecar's hash when its record of the .pte still matches the file (size and mtime), else hashed."""
    record = sidecar.files.get("pte") if sidecar is not None else None
    if sidecar is not None and record is not None:
        stat = pte.stat()
        if record.size == stat.st_size and record.mtime_ns == stat.st_mtime_ns:
            return sidecar.sha256.lower()
    return sha256_file(pte)


def _verify_program(bundle: BundleFiles, pte: Path, sidecar: Sidecar | None) -> None:
    if not pte.is_file():
        raise AnalysisError(f"program {pte} does not exist")
    expected = bundle_model_sha(bundle.run, bundle.manifest)
    if expected is None:
        bundle.notes.append(("degraded", "the bundle does not name its model's sha256; the .pte is unverified"))
    elif _pte_sha(pte, sidecar) != expected:
        raise AnalysisError(
            f"{pte.name} is not the model this bundle ran (bundle model sha256 {expected[:12]}…)",
            hint="pass the .pte that was profiled, or re-lower and re-run",
        )


def _program_memory(bundle: BundleFiles, pte: Path | None, sidecar: Sidecar | None) -> ProgramMemory | None:
    """The plan's memory: the lowering read this very .pte into its sidecar, so a warm run need not re-read it."""
    # programs/ sits below lowering/ and reads the sidecar's JSON layout, not the Sidecar type.
    recorded = program_memory_from_sidecar(sidecar_data(sidecar) if sidecar is not None else None)
    if pte is None:
        return recorded
    same_program = sidecar is not None and sidecar.sha256 == bundle_model_sha(bundle.run, bundle.manifest)
    if recorded is not None and same_program and recorded.method == bundle.method:
        return recorded
    return read_program_memory(pte, bundle.method)


def analyze_bundle(
    bundle_dir: Path,
    *,
    pte: Path | None = None,
    sidecar: Sidecar | None = None,
    reference_outputs: Path | None = None,
    accuracy_thresholds: dict[str, float] | None = None,
    execution: Execution = MEDIAN,
) -> Summary:
    """Analyse a pulled bundle; write analysis/summary.json, ops.csv, ops.json, the Model Explorer overlays and the
    timeline of one execution (`execution`: by default the one nearest the median, results/trace.py).

    Raises AnalysisError (and leaves the raw bundle untouched) when the bundle, its ETDump or the .pte is unusable.
    """
    bundle = read_bundle(Path(bundle_dir))
    if pte is not None:
        pte = Path(pte)
        _verify_program(bundle, pte, sidecar)

    profile = None
    phases: dict[str, Profile] = {}
    steps: list[Step] = []
    generated = GenerationTimings.from_timings(bundle.timings)
    etdump_path = bundle.path / "etdump.etdp"
    if bundle.ran_ok and bundle.etdump_requested and not etdump_path.is_file():
        raise AnalysisError(f"bundle {bundle.path} is missing etdump.etdp")
    if etdump_path.is_file():
        plan = read_program_plan(pte, bundle.method) if pte is not None else None
        etdump = read_etdump(etdump_path)
        if generated is not None:
            blocks = generated.phase_blocks(etdump.execute_blocks)
            phases = _profile_phases(etdump, blocks, plan, bundle.method, generated, bundle.notes)
            profile = phases.get(DECODE) or next(iter(phases.values()), None)
            steps = generation_steps(blocks, phases, generated.timed, execution)
        else:
            profile, profile_notes = _profile_bundle(etdump, plan, bundle.method, bundle.timings)
            bundle.notes.extend(profile_notes)
            times = number_list(bundle.timings.get("iterations_ms"))
            steps = iteration_steps(etdump.execute_blocks, profile, times, execution)
    elif bundle.ran_ok:
        bundle.notes.append(("degraded", "run without ETDump: no per-operator profile"))

    source_notes = _attribute_sources(pte, sidecar, [p for p in (profile, *phases.values()) if p is not None])

    correctness = Correctness()
    kinds, kind_note = output_kinds(sidecar)
    outputs_path = bundle.path / "outputs.etlt"
    if bundle.ran_ok and not outputs_path.is_file():
        raise AnalysisError(f"bundle {bundle.path} is missing outputs.etlt")
    tokens = None
    if reference_outputs is not None and outputs_path.is_file():
        if not Path(reference_outputs).is_file():
            raise AnalysisError(f"reference outputs {reference_outputs} do not exist")
        if generated is not None:
            correctness, tokens = _check_tokens(outputs_path, Path(reference_outputs))
        else:
            correctness = check_outputs(outputs_path, Path(reference_outputs), kinds, kind_note)

    program = _program_memory(bundle, pte, sidecar)
    memory, memory_notes = memory_summary(bundle.timings, program)
    bundle.notes.extend(("degraded", note) for note in memory_notes)
    counter_profile = _counter_profile(bundle)

    latency = dataclasses.replace(
        latency_summary(bundle.timings), hashing_ms=hashing_times(bundle.run.get("hashing_ms"))
    )
    board = board_conditions(bundle.board_before, bundle.board_after)
    scheme = sidecar.variant.scheme if sidecar is not None else FP32
    validity = judge_validity(bundle.manifest, latency, board, correctness, bundle.notes, quantized=scheme.quantized)
    run = summary_document(bundle, sidecar, pte, latency, board, correctness, profile, validity)
    top_layers = (run.profile or {}).get("top_layers") or []
    counters = counters_summary(counter_profile, bundle.run.get("counters_pass"), top_layers, latency.threads)
    numerics_summary, numerics = run_numerics(bundle.path, bundle.run.get("numerics_pass"), pte, run.model.sha256)
    run = dataclasses.replace(run, memory=memory, counters=counters, numerics=numerics_summary)
    if generated is not None:
        recorded = sidecar.generation if sidecar is not None else None
        figures = generation_summary(generated, bundle.timings, recorded=recorded, tokens=tokens, memory=memory)
        before = f"{bundle.path}/board_info_before.json"
        gathers = program_gathers(pte, bundle.method)
        roofline = decode_roofline(figures, sidecar, bundle.board_before, before, gathers, phases.get(DECODE))
        prefill = prefill_roofline(figures, sidecar, pte, bundle.board_before, before, latency.threads,
                                   bundle.method, phases.get(PREFILL))  # fmt: skip
        run = dataclasses.replace(run, generation=dataclasses.replace(figures, roofline=roofline,
                                                                      prefill_roofline=prefill))  # fmt: skip
    decode_rate = run.generation.decode_tokens_per_s if run.generation is not None else None
    run = dataclasses.replace(run, energy=energy_summary(bundle.path, bundle.run, latency.median_ms, decode_rate))
    if scheme.quantized:
        thresholds = {**ACCURACY_DEFAULTS, **(accuracy_thresholds or {})}
        weights = sidecar.weights if sidecar is not None else None
        if generated is not None:  # a language model: the share of ids equal to eager greedy generation's
            accuracy = judge_tokens(tokens, scheme.name, thresholds, weights)
        else:
            ran = outputs_path if bundle.ran_ok and outputs_path.is_file() else None
            reference = Path(reference_outputs) if reference_outputs is not None else None
            accuracy = judge_accuracy(ran, reference, scheme.name, thresholds, weights, kinds)
        run = dataclasses.replace(run, accuracy=accuracy)
    if profile is not None:  # an ordinary run's modules add up to its median iteration; a generation's, its step's
        iterations = number_list(bundle.timings.get("iterations_ms")) if generated is None else []
        run = dataclasses.replace(run, modules=module_tree(profile, iterations))
    before = f"{bundle.path}/board_info_before.json"
    sequence = _profiled_rows(profile, phases, generated, sidecar)
    rooflines = run_rooflines(profile, pte, bundle.board_before, before, latency.threads, sequence)
    if rooflines is not None:
        run = dataclasses.replace(run, operator_roofline=rooflines.top())
    trace = trace_document(steps, run_id=run.run_id, model=run.model.name) if steps else None
    if steps and trace is None:
        source_notes.append(NO_TIMESTAMPS)
    broken = timeline_problems(trace) if trace is not None else []
    if broken:  # calls across each other: Perfetto would drop or move slices without a word; said, not drawn
        trace = None
        source_notes.append(BROKEN_RULES.format(count=len(broken), first=broken[0]))
    summary = Summary(bundle_dir=bundle.path, run=run, profile=profile, notes=source_notes,
                      timeline=[step.title for step in steps] if trace is not None else [])  # fmt: skip
    summary.written = write_outputs(
        bundle.path, run, profile, program=program, counters=counter_profile, phases=phases, trace=trace,
        numerics=numerics_document(numerics) if numerics is not None else None,
        numerics_rows=[numerics_row(row) for row in numerics.operators] if numerics is not None else (),
        exported_program=sidecar.exported_program if sidecar is not None else None, rooflines=rooflines,
    )  # fmt: skip
    return summary


def _attribute_sources(pte: Path | None, sidecar: Sidecar | None, profiles: list[Profile]) -> list[str]:
    """Each profile's rows given their module and source line from the program's source map; a damaged map is an
    AnalysisError naming it (exit 65), a program without one analysed without them (and said once)."""
    if not profiles:
        return []
    record = sidecar.files.get(SOURCES_ROLE) if sidecar is not None else None
    recorded = pte.parent / record.file if pte is not None and record is not None else None
    if recorded is not None and record is not None and recorded.is_file() and sha256_file(recorded) != record.sha256:
        raise AnalysisError(
            f"{recorded}: the source map changed since the program was lowered (not the sidecar's sha256)",
            hint="lower the model again to write its map afresh",
        )
    source_map, path = load_source_map(pte, recorded)
    if source_map is None or path is None:
        return ["no source map for this program: operators are not traced to the model's modules"]
    for profile in profiles:
        attribute(profile, source_map, str(path))
    return []


def _profiled_rows(profile: Profile | None, phases: dict[str, Profile], generated: GenerationTimings | None,
                   sidecar: Sidecar | None) -> SequenceRows | None:  # fmt: skip
    """The rows the profiled execution of a generation program took: one in a decode step, the prompt's first
    call in a prefill (the profile shown when there is no decode step)."""
    recorded = sidecar.generation if sidecar is not None else None
    if generated is None or recorded is None or profile is None:
        return None
    if profile is phases.get(DECODE):
        return SequenceRows(bound=recorded.max_prompt_len, taken=1)
    calls = prompt_calls(generated.prompt_len, recorded.max_prompt_len)
    return SequenceRows(bound=recorded.max_prompt_len, taken=calls[0]) if calls else None


def _profile_phases(
    etdump: Etdump,
    blocks: dict[str, list[RunBlock]],
    plan: ProgramPlan | None,
    method: str,
    generated: GenerationTimings,
    notes: list[tuple[str, str]],
) -> dict[str, Profile]:
    """The timed generations' prefill and decode steps (`blocks`: each phase's Execute blocks), each profiled on its
    own blocks."""
    if not any(blocks.values()):
        notes.append((
            "degraded",
            f"the ETDump holds {len(etdump.execute_blocks)} Execute blocks but timings.json lists "
            f"{len(generated.executions)} executions: no per-phase profile",
        ))  # fmt: skip
        return {}
    profiles = {}
    for phase in PHASES:
        if not blocks[phase]:
            continue
        ns_per_tick, agreement = inferred_ns_per_tick(_method_totals(blocks[phase]), generated.phase_times(phase))
        if agreement is not None and abs(agreement - 1.0) > TIMING_AGREEMENT:
            notes.append((
                "degraded",
                f"{phase}: ETDump's method time is {agreement * 100:.0f}% of timings.json's; per-operator times "
                "may be off",
            ))  # fmt: skip
        phase_profile = profile_etdump(
            phase_etdump(etdump, blocks[phase]), plan, method=method, ns_per_tick=ns_per_tick
        )
        phase_profile.timing_agreement = agreement
        profiles[phase] = phase_profile
    return profiles


def _check_tokens(outputs: Path, reference: Path) -> tuple[Correctness, TokenCheck | None]:
    """The generated ids against eager greedy generation: equal, or where they part."""
    try:
        (ran,), (expected,) = read_tensors(outputs), read_tensors(reference)
    except (TensorFileError, ValueError) as exc:
        return Correctness(True, False, f"the generated ids cannot be compared: {exc}"), None
    check = token_check(ran.array, expected.array)
    reason = None
    if check.first_divergence is not None:
        reason = (
            f"the generated ids part from eager greedy generation at token {check.first_divergence} "
            f"({check.matching}/{check.compared} equal)"
        )
    correctness = Correctness(True, check.first_divergence is None, reason, top1_agreement=check.agreement)
    return correctness, check


def _counter_profile(bundle: BundleFiles) -> CounterProfile | None:
    """The counters pass, if the run had one; an unusable one costs the counters, never the analysis."""
    try:
        return read_counter_profile(bundle.path, bundle.method)
    except AnalysisError as exc:
        bundle.notes.append(("degraded", f"counters pass unusable: {exc}"))
        return None


def _profile_bundle(
    etdump: Etdump, plan: ProgramPlan | None, method: str, timings: dict[str, Any]
) -> tuple[Profile, list[tuple[str, str]]]:
    notes: list[tuple[str, str]] = []
    warmup = len(number_list(timings.get("warmup_ms")))
    iterations = number_list(timings.get("iterations_ms"))
    execute = etdump.execute_blocks
    if timings and len(execute) != warmup + len(iterations):
        notes.append((
            "degraded",
            f"the ETDump holds {len(execute)} Execute blocks but timings.json lists {warmup} warmup + "
            f"{len(iterations)} measured executions",
        ))  # fmt: skip
    skip = warmup if len(execute) > warmup else 0
    ns_per_tick, agreement = inferred_ns_per_tick(_method_totals(execute[skip:]), iterations)
    if agreement is not None and abs(agreement - 1.0) > TIMING_AGREEMENT:
        notes.append((
            "degraded",
            f"ETDump's method time is {agreement * 100:.0f}% of timings.json's; per-operator times may be off",
        ))  # fmt: skip
    profile = profile_etdump(etdump, plan, method=method, skip_executions=skip, ns_per_tick=ns_per_tick)
    profile.timing_agreement = agreement
    return profile, notes
