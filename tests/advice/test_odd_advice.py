"""Advice that reads right (issue 38 item 5): a portable program gets `--backend xnnpack`, an operator the partitioner
leaves out is not blamed on the model's code, a size finding too small to matter is not made, and `--try` ends with
the command that adopts what it confirmed, naming no source file."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Any

import pytest

from orchestrator.advice.advisor import advise
from orchestrator.advice.findings import RunFacts
from orchestrator.advice.trial import OutputsCheck, TrialReport, VariantTrial
from orchestrator.commands.render_advice import advice_lines, render_advice, render_trial
from orchestrator.deploy.abtest import Interleaved
from orchestrator.lowering.lowered import spec_from_record
from orchestrator.lowering.variants import VARIANTS
from orchestrator.results.documents import load_summary
from orchestrator.results.ops_record import load_ops
from tests.advice.advice_helpers import facts_of, recorded
from tests.plugins.analysis import BundleCase, analyze, copy_bundle


def test_layer_norm_left_out_by_the_partitioner_is_not_the_models_code() -> None:
    advice = advise(facts_of(recorded("distilbert-tiny")))
    (norm,) = [f for f in advice.findings if f.operators == ("aten::native_layer_norm",)]
    assert "partitioner leaves layer_norm out" in norm.cause
    assert norm.fix_kind == "lowering" and "model's code" not in norm.fix and "nothing to change" in norm.fix
    line = next(line for line in advice_lines(advice, limit=10) if "native_layer_norm" in line)
    assert "model's code" not in line and " at " not in line.split("→")[1]  # no line of the model's to point at
    # an operator the model's code can avoid still points there
    (where,) = [f for f in advice.findings if f.operators == ("aten::where",)]
    assert where.fix_kind == "code" and where.fix.startswith("in the model's code")


def test_no_stored_twice_finding_below_a_meaningful_size() -> None:
    """wav2vec2-tiny holds 256 bytes twice (a bias): once "0.0 MB of constants stored twice"; distilbert-tiny's tied
    embedding (0.26 MB, a quarter of its program) is still said."""
    raw = recorded("wav2vec2-tiny")
    assert 0 < raw["sidecar"]["outside_delegates"]["stored_twice"]["bytes"] < 100_000
    assert not [f for f in advise(facts_of(raw)).findings if f.kind == "stored-twice"]
    tied = [f for f in advise(facts_of(recorded("distilbert-tiny"))).findings if f.kind == "stored-twice"]
    assert len(tied) == 1 and tied[0].saving_mb is not None and tied[0].saving_mb >= 0.1
    assert not any(f.title.startswith("0.0 MB") for f in tied)


def test_a_stored_twice_finding_under_one_percent_of_the_program_is_not_made() -> None:
    raw = recorded("distilbert-tiny")
    facts = facts_of(raw)
    stored = raw["sidecar"]["outside_delegates"]["stored_twice"]["bytes"]
    assert facts.sidecar is not None and facts.sidecar.memory is not None
    memory = dataclasses.replace(facts.sidecar.memory, pte_bytes=stored * 200)  # 0.5% of a large program
    big = dataclasses.replace(facts, sidecar=dataclasses.replace(facts.sidecar, memory=memory))
    assert not [f for f in advise(big).findings if f.kind == "stored-twice"]


@pytest.mark.slow
def test_a_portable_run_gets_one_finding_lower_it_for_xnnpack(
    analysis_bundles: dict[str, BundleCase], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A real run of DistilBERT's portable program: every kernel is a portable one; the advice is the backend (one
    finding, with the command), never "aten::addmm … → operators XNNPACK takes" per operator."""
    case = copy_bundle(analysis_bundles["distilbert_portable"], tmp_path / "run-portable")
    analyze(case)
    sidecar = case.model.sidecar
    facts = RunFacts(load_ops(case.path), load_summary(case.path), sidecar, spec_from_record(sidecar.spec, "sidecar"))
    advice = advise(facts)
    kernels = list(facts.ops.kernel_calls())
    backend = [f for f in advice.findings if f.kind == "backend"]
    assert len(backend) == 1 and backend[0].calls == len(kernels) and not list(facts.ops.delegate_calls())
    (finding,) = backend
    assert (
        finding.fix.startswith("--backend xnnpack") and "fab deploy-and-profile --model distilbert-tiny" in finding.fix
    )
    assert finding.fix_kind == "option" and finding.saving_is_bound
    assert finding.measured_ms == pytest.approx(sum(call.median_ms for call in kernels))
    assert not [f for f in advice.findings if f.kind in ("portable-operator", "eager-attention", "threads")]
    render_advice(advice, [])
    out = " ".join(capsys.readouterr().out.split())
    assert "XNNPACK takes" not in out and "--backend xnnpack" in out


def _trial(confirmed: bool, rewrites: tuple[str, ...] = ("eager-attention",), **changes: Any) -> VariantTrial:
    retest = Interleaved(rounds=5, iterations_per_run=10, seconds=12.0, a_ms=[10.0, 12.0], b_ms=[8.0, 9.0],
                         round_ratios=[0.8] * 5, change="faster" if confirmed else "no change", confirmed=confirmed,
                         reason="5 of 5 rounds")  # fmt: skip
    name = ".".join(("distilbert-tiny", *rewrites))
    return VariantTrial(name, rewrites, 1.5, OutputsCheck(60.0, 1e-4, 1e-3), retest, profiled_ms=12.5, **changes)


def _rendered(report: TrialReport, capsys: pytest.CaptureFixture[str]) -> tuple[str, str]:
    render_trial(report)
    captured = capsys.readouterr()
    return captured.out, captured.err


def test_try_ends_with_the_command_that_adopts_what_it_confirmed(capsys: pytest.CaptureFixture[str]) -> None:
    together = _trial(True, ("eager-attention", "head-at-position"))
    alone = _trial(True, ("eager-attention",))
    alone.retest.b_ms = [11.0, 11.5]  # a smaller saving: the pair is adopted
    report = TrialReport("distilbert-tiny", "local", VARIANTS["xnnpack"], 11.0, [together, alone])
    out, err = _rendered(report, capsys)
    lines = [line for line in out.splitlines() if line.strip()]
    assert lines[-2] == ("adopt it: fab deploy-and-profile --model distilbert-tiny --backend xnnpack --rewrites "
                         "eager-attention,head-at-position (fab lower takes the same options)")  # fmt: skip
    assert "`advised: true`" in lines[-1] and "`rewrites: [eager-attention, head-at-position]`" in lines[-1]
    # both baselines named, each a median: the A/B's and the profiled run's
    assert "11 ms median in this A/B" in out and "12.5 ms median in the profiled run" in out
    # no source file in anything the user reads
    assert not re.search(r"\b[\w/]+\.py\b", out + err), out + err

    quantized = TrialReport("distilbert-tiny", "local", VARIANTS["xnnpack-int8-dynamic"], 11.0, [_trial(True)])
    out, _ = _rendered(quantized, capsys)
    assert "--backend xnnpack --quantize int8-dynamic --rewrites eager-attention" in out

    attention = _trial(True, (), attention="etlab")
    attention.name = "smollm2-gen-tiny"
    switched = TrialReport("smollm2-gen-tiny.sdpa", "local", VARIANTS["xnnpack"], 11.0, [attention])
    out, _ = _rendered(switched, capsys)
    assert "adopt it: fab deploy-and-profile --model smollm2-gen-tiny --backend xnnpack" in out
    assert "`attention: etlab`" in out and "advised: true" not in out  # tracked by the matrix's attention key

    out, _ = _rendered(TrialReport("distilbert-tiny", "local", VARIANTS["xnnpack"], 11.0, [_trial(False)]), capsys)
    assert "nothing confirmed: no change to adopt" in out and "adopt it:" not in out
