"""The terminal's results table and the lines under it (commands/render.py `print_cells`): one line per board and
cause, not per variant and counter, and accuracy cells that stay on one line."""

from __future__ import annotations

from typing import Any

import pytest

from orchestrator.commands.render import print_cells
from orchestrator.deploy.cells import CellOutcome
from orchestrator.lowering.variants import Variant
from orchestrator.results.summary import (
    Counters,
    Latency,
    ProgramInfo,
    Reason,
    RunSummary,
    Validity,
    WarmLatency,
)
from orchestrator.results.summary_outputs import Accuracy

NO_PMU = "no hardware PMU exposes this event (no PMU node, or the event is not implemented)"
HARDWARE = ("cycles", "instructions", "l1d_refills", "l2_refills", "branch_misses")


def cell(board: str, backend: str, *, accuracy: Accuracy | None = None) -> CellOutcome:
    counters = Counters(
        status="ok",
        requested=("task_clock", *HARDWARE),
        captured=("task_clock",),
        missing=tuple({"name": name, "error": "ENOENT", "reason": NO_PMU} for name in HARDWARE),
        threads=1,
        executions=4,
    )
    summary = RunSummary(
        run_id=f"run-{backend}",
        model=ProgramInfo(name="distilbert-tiny", backend=backend, size_bytes=1_000_000),
        latency=Latency(iterations=4, warm=WarmLatency(1.0, 1.1, 1.1, 1.3, 1.4, 0.02)),
        validity=Validity("valid"),
        counters=counters,
        accuracy=accuracy,
    )
    run_id = f"20261204T060000Z-{board[-1]}{len(backend):02d}"
    return CellOutcome(board, "distilbert-tiny", Variant.parse(backend), ok=True, summary=summary, run_id=run_id)


def test_a_board_without_a_pmu_says_once_which_counters_it_cannot_give(capsys: pytest.CaptureFixture[str]) -> None:
    quantized = Accuracy(
        scheme="int8-dynamic", verdict="pass", meaningful=False, sqnr_db=31.24, top1_agreement=0.9,
        top1_within_noise=1.0, top5_overlap=0.8,
    )  # fmt: skip
    cells = [cell("pi-nopmu", "xnnpack"), cell("pi-nopmu", "xnnpack-int8-dynamic", accuracy=quantized)]
    cells.append(cell("pi-nopmu", "xnnpack-8da4w", accuracy=quantized))
    print_cells(cells)
    output = capsys.readouterr()
    text = output.out + output.err
    missing = [line for line in text.splitlines() if "not captured" in line]
    assert len(missing) == 1, text  # 15 lines (3 variants x 5 counters) before
    assert all(name in missing[0] for name in HARDWARE) and "ENOENT" in missing[0] and "all 3 runs" in missing[0]
    assert NO_PMU[:40] in text.replace("\n", " ")
    unchecked = [line for line in text.splitlines() if "correctness not checked" in line]
    assert len(unchecked) == 1 and "xnnpack-8da4w" in unchecked[0], text
    captured = [line for line in text.splitlines() if "counters pass:" in line]
    assert len(captured) == 1 and "in each of 3 runs" in captured[0], text
    # The accuracy cell stays on one line of its row; its markers are explained once, under the table.
    assert sum("│ pass 31.2dB t1 90%~ t5 80% † │" in line for line in text.splitlines()) == 2, text
    assert sum("t5 80%" in line for line in text.splitlines()) == 2, text
    assert "† random weights" in text.replace("\n", " ").replace("│", "")


def test_several_causes_are_one_line_each(capsys: pytest.CaptureFixture[str]) -> None:
    forbidden = cell("pi-locked", "xnnpack")
    assert forbidden.summary is not None and forbidden.summary.counters is not None
    paranoid = "not permitted: perf_event_paranoid is 3 (user-space counting needs <= 2, or CAP_PERFMON)"
    changed: dict[str, Any] = {
        "missing": ({"name": "cycles", "error": "EACCES", "reason": paranoid}, *forbidden.summary.counters.missing[1:])
    }
    counters = Counters(**{**vars(forbidden.summary.counters), **changed})
    forbidden.summary = RunSummary(**{**vars(forbidden.summary), "counters": counters})
    print_cells([forbidden, cell("pi-nopmu", "xnnpack")])
    text = capsys.readouterr()
    lines = [line for line in (text.out + text.err).splitlines() if "not captured" in line]
    assert len(lines) == 3, lines  # pi-locked: EACCES (cycles), ENOENT (the rest); pi-nopmu: ENOENT
    assert any("pi-locked" in line and "counter cycles not captured: EACCES" in line for line in lines)


def test_each_row_shows_its_run_id_whole_and_the_next_commands_use_them(capsys: pytest.CaptureFixture[str]) -> None:
    """The ids compare, advise and explore take, in the table; model, backend and id never cut (once `distilbe…`,
    `xnnpack-…` and a cut bundle path, and no run id), the other columns narrowing for them."""
    cells = [cell("pi4-a", "xnnpack-int8-dynamic"), cell("pi5-b", "xnnpack-int8-dynamic"), cell("pi4-a", "xnnpack")]
    print_cells(cells)
    out = "".join(capsys.readouterr())
    rows = [line for line in out.splitlines() if line.startswith("│ pi")]
    assert [row.split("│")[-2].strip() for row in rows] == [c.run_id for c in cells], out
    assert all("│ distilbert-tiny │" in row for row in rows) and "│ xnnpack-int8-dynamic │" in rows[0], out
    (next_line,) = [line for line in out.splitlines() if line.startswith("next: ")]
    a, b = cells[0].run_id, cells[1].run_id
    assert f"fab explore --run {a}" in next_line and f"fab advise --run {a}" in next_line
    assert f"fab compare {a} {b}" in next_line  # the same program on two boards: the pair compare takes


def test_next_names_the_xnnpack_run_of_a_portable_and_xnnpack_deploy(capsys: pytest.CaptureFixture[str]) -> None:
    """`--backend portable,xnnpack` runs portable first: the run to explore and advise is the XNNPACK one, and its
    twin on another board is the pair to compare."""
    cells = [cell("pi4-a", "portable"), cell("pi4-a", "xnnpack"), cell("pi5-b", "portable"), cell("pi5-b", "xnnpack")]
    print_cells(cells)
    (next_line,) = [line for line in "".join(capsys.readouterr()).splitlines() if line.startswith("next: ")]
    xnnpack, twin, portable = cells[1].run_id, cells[3].run_id, cells[0].run_id
    assert xnnpack and twin and portable
    assert f"fab explore --run {xnnpack}" in next_line and f"fab advise --run {xnnpack}" in next_line, next_line
    assert f"fab compare {xnnpack} {twin}" in next_line and portable not in next_line, next_line


def degraded(board: str, backend: str, cv: float, **conditions: Any) -> CellOutcome:
    """A run the board measured unsteadily: its CV over the limit (and what the board said around it)."""
    reasons = [Reason("degraded", f"unstable timings: CV {cv * 100:.1f}% > 5%")]
    if conditions.get("governor_before"):
        reasons.insert(0, Reason("degraded", f"cpufreq governor {conditions['governor_before']!r} before the run"))
    summary = RunSummary(
        run_id=f"run-{board}-{backend}",
        model=ProgramInfo(name="distilbert-tiny", backend=backend),
        latency=Latency(iterations=6, threads=4, warm=WarmLatency(1.0, 1.2, 1.3, 1.9, 2.4, cv)),
        validity=Validity("degraded", tuple(reasons)),
        board_conditions={"cores_online": 4, **conditions},
    )
    return CellOutcome(board, "distilbert-tiny", Variant.parse(backend), ok=True, summary=summary,
                       run_id=f"20261204T060000Z-{board[-1]}{len(backend):02d}")  # fmt: skip


def test_degraded_runs_say_once_what_to_change_with_the_figures(capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 38 item 4: every run on a busy machine was "degraded", with no way out. Now one note after the table:
    the CVs and the iterations, then more iterations (the option), fewer threads (the option, the threads run on
    the cores), a quieter board (the load seen before the runs) and the governor of the board that reported one."""
    cells = [
        degraded("pi-a", "portable", 0.19, load_1m_before=3.5),
        degraded("pi-a", "xnnpack", 0.8, load_1m_before=3.5),
        degraded("pi-b", "xnnpack", 0.07, governor_before="ondemand", load_1m_before=0.1),
        cell("pi-b", "portable"),
    ]
    print_cells(cells)
    output = capsys.readouterr()
    text = output.out + output.err
    assert "unstable timings" not in text, "the per-run warnings are folded into the one note"
    notes = [line for line in output.err.splitlines() if line.startswith("degraded:")]
    assert notes == [
        "degraded: 3 of 4 runs (pi-a, pi-b): timings varied: CV 7–80% (limit 5%) over 6 iterations; "
        "CPU governor 'ondemand' on pi-b"
    ], output.err
    fixes = output.err.split(notes[0], 1)[1].strip()
    assert fixes.startswith("to steady them: more iterations (--iterations 50; these ran 6)"), fixes
    assert "fewer threads (--threads 2" in fixes and "pi-a: 4 on 4 cores" in fixes
    assert "a quieter board (before the runs, pi-a: load 3.5 on 4 cores" in fixes and "pi-b: load" not in fixes
    assert "the CPU governor 'performance' (echo performance | sudo tee" in fixes
    assert output.err.count("to steady them") == 1


def test_steady_runs_say_nothing_about_steadiness(capsys: pytest.CaptureFixture[str]) -> None:
    print_cells([cell("pi-a", "portable"), cell("pi-a", "xnnpack")])
    output = capsys.readouterr()
    assert "degraded" not in output.err and "to steady them" not in output.err
