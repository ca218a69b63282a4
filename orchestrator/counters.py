"""The counters a counters pass can read, as the runner's table names them (board/runner/src/perf_counters.cpp).

Hardware counters need a PMU; on Arm, `l2_refills` is the raw Armv8 event L2D_CACHE_REFILL (0x17) because the
kernel has no generic L2 event, elsewhere it is the generic last-level-cache read miss. The software counters work
on every Linux kernel that implements perf_event_open. Derived metrics are computed from captured counters only.
"""

from __future__ import annotations

from dataclasses import dataclass

from orchestrator.errors import UsageError

ARM_ARCHES = ("aarch64", "arm64", "armv7l", "armv8l")


@dataclass(frozen=True)
class Counter:
    name: str
    hardware: bool
    generic: str | None  # the kernel's generic event (perf list's name), if any
    armv8_event: int | None  # the Armv8 PMU common event number (Arm ARM D7.10)
    what: str


COUNTERS: dict[str, Counter] = {
    c.name: c
    for c in (
        Counter("cycles", True, "cpu-cycles", 0x11, "CPU cycles (CPU_CYCLES)"),
        Counter("instructions", True, "instructions", 0x08, "instructions retired (INST_RETIRED)"),
        Counter("l1d_refills", True, "L1-dcache-load-misses", 0x03, "L1 data cache refills (L1D_CACHE_REFILL)"),
        Counter("l2_refills", True, None, 0x17, "L2 data cache refills (L2D_CACHE_REFILL; LLC misses off Arm)"),
        Counter("branch_misses", True, "branch-misses", 0x10, "mispredicted branches (BR_MIS_PRED)"),
        Counter("task_clock", False, "task-clock", None, "time on CPU, ns"),
        Counter("page_faults", False, "page-faults", None, "page faults"),
        Counter("context_switches", False, "context-switches", None, "context switches"),
    )
}
DEFAULT_COUNTERS = tuple(COUNTERS)
SOFTWARE_COUNTERS = tuple(name for name, c in COUNTERS.items() if not c.hardware)
# Derived metrics: name -> (numerator, denominator, scale).
DERIVED = {
    "ipc": ("instructions", "cycles", 1.0),
    "l1d_mpki": ("l1d_refills", "instructions", 1000.0),
    "l2_mpki": ("l2_refills", "instructions", 1000.0),
    "branch_mpki": ("branch_misses", "instructions", 1000.0),
}


def perf_event(name: str, arch: str) -> tuple[str, int | str]:
    """How the runner opens `name` on `arch`: ("generic", event name) or ("raw", Armv8 event number)."""
    counter = COUNTERS[name]
    if counter.generic is not None or not counter.hardware:
        return "generic", counter.generic or name
    if arch in ARM_ARCHES and counter.armv8_event is not None:
        return "raw", counter.armv8_event
    return "generic", "LLC-load-misses"


def parse_counters(value: str | None) -> tuple[str, ...]:
    """A counter list (`--counters`): "" or "default" is the default set; otherwise known names, comma-separated."""
    text = (value or "").strip()
    if text in ("", "default", "true"):
        return DEFAULT_COUNTERS
    names: list[str] = []
    for name in (part.strip() for part in text.split(",")):
        if name not in COUNTERS:
            raise UsageError(f"unknown counter {name!r} (known: {', '.join(COUNTERS)}, or 'default')")
        if name not in names:
            names.append(name)
    return tuple(names)


def derived_metrics(captured: list[str] | tuple[str, ...]) -> list[str]:
    """The derived metrics whose inputs were all captured."""
    return [name for name, (num, den, _) in DERIVED.items() if num in captured and den in captured]
