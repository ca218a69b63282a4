"""The order the two xdist workers take the test files in: the longest first, so the run ends on short ones.

With `--dist loadfile` a worker takes one file at a time from a queue, in the queue's order. pytest-xdist orders
that queue by test count (its `--loadscope-reorder`), which puts a few files of one or two long tests last: one
worker ran them while the other had finished (tests/e2e/test_quiet_terminal.py and
tests/lab/test_lab_night_trouble.py, ~2 minutes together, ended a run). Here the queue goes by each file's time
instead (longest processing time first): the long files start early, and whichever worker is ahead picks up the many
short ones at the end, so both finish within seconds of each other.

The times are rough (`FILE_SECONDS`, from a run's `--durations`; every file not named counts `SECONDS_PER_TEST` a
test): a stale figure costs balance, never a test. The files that start an emulated Raspberry Pi (`NEEDS_PI_ROOTFS`)
are not taken in the first `PI_NOT_BEFORE` seconds of work: bootstrap.sh --test builds the Pi's rootfs in the
background while the suite starts (tests/plugins/pi.py waits for it).

Only the order changes, and only on xdist workers (`-n 0` runs files as collected). Refresh the table from a full
run's `--durations=0` when a file grows or shrinks a lot.
"""

from __future__ import annotations

from collections import defaultdict

import pytest

# Seconds a file takes on a quiet 2-core machine, roughly (setup, calls and teardown of all its tests).
FILE_SECONDS = {
    "tests/testing/test_pi.py": 470,  # a fresh CI machine: with the wait for the emulated Pi's rootfs
    "tests/e2e/test_generation_e2e.py": 305,
    "tests/lowering/test_quantize.py": 300,
    "tests/lab/test_nightly_verdicts.py": 200,
    "tests/lowering/test_quantize_families.py": 195,
    "tests/lowering/test_generation.py": 160,
    "tests/lowering/test_huggingface_lowering.py": 150,
    "tests/commands/test_advise_cli.py": 125,
    "tests/lab/test_lab_night.py": 125,
    "tests/lowering/test_lowering.py": 100,
    "tests/lowering/test_quantize_parallel.py": 100,
    "tests/lowering/test_layer_rewrites.py": 95,
    "tests/boards/test_labgrid.py": 95,
    "tests/e2e/test_numerics_e2e.py": 90,
    "tests/results/test_compare.py": 80,
    "tests/servers/test_explorer.py": 80,
    "tests/lowering/test_generation_shared_head.py": 75,
    "tests/e2e/test_e2e.py": 75,
    "tests/lowering/test_torchvision.py": 65,
    "tests/lab/test_migration.py": 65,
    "tests/lab/test_nightly.py": 65,
    "tests/lab/test_lab_night_trouble.py": 60,
    "tests/lowering/test_generation_quantize.py": 60,
    "tests/lowering/test_generation_attention.py": 55,
    "tests/commands/test_option_values.py": 55,
    "tests/board/test_agent_provisioning.py": 50,
    "tests/lowering/test_fused_rms_norm.py": 50,
    "tests/deploy/test_provision.py": 45,
    "tests/commands/test_attention_option.py": 45,
    "tests/e2e/test_quiet_terminal.py": 45,
    "tests/lowering/test_warmstart.py": 45,
    "tests/transport/test_transfer.py": 40,
    "tests/lowering/test_factory.py": 40,
    "tests/lowering/test_spec_safety.py": 40,
    "tests/lab/test_board_health.py": 35,
    "tests/shared/test_interrupts.py": 35,
    "tests/lowering/test_rope_rewrite.py": 35,
    "tests/commands/test_cli.py": 35,
    "tests/lowering/test_numerics_program.py": 30,
    "tests/board/test_runner_generate.py": 30,
    "tests/board/test_agent_profile.py": 30,
    "tests/lab/test_nightly_inputs.py": 30,
    "tests/lab/test_pending.py": 30,
    "tests/servers/test_dashboard_browser.py": 25,
    "tests/lab/test_nightly_guard.py": 25,
    "tests/board/test_runner.py": 25,
}
SECONDS_PER_TEST = 0.5  # a file not in the table
NEEDS_PI_ROOTFS = ("tests/testing/test_pi.py", "tests/lab/test_lab_night.py")
PI_NOT_BEFORE = 1200  # seconds of work (both workers together) queued ahead of the first emulated Pi


def file_of(item: pytest.Item) -> str:
    return item.nodeid.split("::", 1)[0]


def file_order(counts: dict[str, int]) -> list[str]:
    """The files (with their test counts, in collection order) longest first, the emulated Pis' held back."""
    seconds = {name: FILE_SECONDS.get(name, SECONDS_PER_TEST * count) for name, count in counts.items()}
    longest = sorted(counts, key=lambda name: -seconds[name])  # stable: ties keep the collection order
    order = [name for name in longest if name not in NEEDS_PI_ROOTFS]
    queued, at = 0.0, len(order)
    for index, name in enumerate(order):
        if queued >= PI_NOT_BEFORE:
            at = index
            break
        queued += seconds[name]
    pis = [name for name in longest if name in NEEDS_PI_ROOTFS]
    return order[:at] + pis + order[at:]


def pytest_configure(config: pytest.Config) -> None:
    # The controller builds the queue from the workers' collection order, unless it sorts it by test count itself.
    if hasattr(config.option, "loadscopereorder"):
        config.option.loadscopereorder = False


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not hasattr(config, "workerinput"):  # not an xdist worker: keep the collection order
        return
    counts: dict[str, int] = defaultdict(int)
    for item in items:
        counts[file_of(item)] += 1
    rank = {name: index for index, name in enumerate(file_order(dict(counts)))}
    items.sort(key=lambda item: rank[file_of(item)])  # stable: a file's tests keep their order
