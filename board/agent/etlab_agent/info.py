"""Board facts (`info`): every probe is best-effort, so a missing file gives null, never a crash.

The roots are injectable so the parsing runs against captured samples: ETLAB_AGENT_SYSROOT prefixes every
/proc, /sys and /etc path, and ETLAB_AGENT_VCGENCMD names the vcgencmd executable.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import re
import shutil
import socket
import struct
from pathlib import Path
from typing import Any

from .files import utc_now
from .lock import current_holder
from .process import run_probe
from .state import read_state
from .workdir import Workdir

INFO_SCHEMA = 1
PROBE_TIMEOUT_SECONDS = 10.0

# `vcgencmd get_throttled` bits, as documented by Raspberry Pi.
THROTTLED_BITS = {
    0: "under_voltage_now",
    1: "arm_frequency_capped_now",
    2: "throttled_now",
    3: "soft_temperature_limit_now",
    16: "under_voltage_occurred",
    17: "arm_frequency_capping_occurred",
    18: "throttling_occurred",
    19: "soft_temperature_limit_occurred",
}
# Zone types that measure the SoC/CPU, best first (Raspberry Pi: cpu-thermal; Rockchip: soc-thermal).
PREFERRED_ZONE_TYPES = ("cpu-thermal", "cpu_thermal", "soc-thermal", "soc_thermal", "x86_pkg_temp")
# MIDR_EL1 part numbers of Arm Ltd (implementer 0x41) cores found on Raspberry Pi class boards.
ARM_CORES = {
    0xD03: "Cortex-A53",
    0xD04: "Cortex-A35",
    0xD05: "Cortex-A55",
    0xD07: "Cortex-A57",
    0xD08: "Cortex-A72",
    0xD09: "Cortex-A73",
    0xD0A: "Cortex-A75",
    0xD0B: "Cortex-A76",
    0xD0C: "Neoverse-N1",
    0xD0D: "Cortex-A77",
    0xD41: "Cortex-A78",
    0xD44: "Cortex-X1",
    0xD46: "Cortex-A510",
    0xD47: "Cortex-A710",
    0xD80: "Cortex-A520",
    0xD81: "Cortex-A720",
}
AT_HWCAP = 16
HWCAP_AES = 1 << 3  # aarch64 (arch/arm64/include/uapi/asm/hwcap.h)


def sysroot() -> Path:
    return Path(os.environ.get("ETLAB_AGENT_SYSROOT") or "/")


def sys_path(absolute: str) -> Path:
    return sysroot() / absolute.lstrip("/")


def read_text(absolute: str) -> str | None:
    """A small proc/sys file with trailing whitespace and NULs stripped, or None."""
    try:
        data = sys_path(absolute).read_bytes()
    except OSError:
        return None
    return data.decode("utf-8", errors="replace").rstrip("\x00\n\r\t ")


def read_int(absolute: str) -> int | None:
    text = read_text(absolute)
    try:
        return int(text) if text is not None else None
    except ValueError:
        return None


def parse_cpu_list(text: str | None) -> list[int] | None:
    """'0-3,5' (sysfs cpulist) or '0 1 2 3' (affected_cpus) -> [0, 1, 2, 3, 5]."""
    if text is None:
        return None
    cpus: list[int] = []
    try:
        for part in re.split(r"[,\s]+", text.strip()):
            if not part:
                continue
            if "-" in part:
                low, high = part.split("-", 1)
                cpus.extend(range(int(low), int(high) + 1))
            else:
                cpus.append(int(part))
    except ValueError:
        return None
    return cpus


def board_model() -> str | None:
    model = read_text("/proc/device-tree/model") or read_text("/sys/firmware/devicetree/base/model")
    return model or None


def cores_online() -> int | None:
    cpus = parse_cpu_list(read_text("/sys/devices/system/cpu/online"))
    if cpus:
        return len(cpus)
    return None if os.environ.get("ETLAB_AGENT_SYSROOT") else os.cpu_count()


def load_1m() -> float | None:
    """The 1-minute load average (/proc/loadavg's first field): how busy the board was."""
    text = read_text("/proc/loadavg")
    try:
        return float(text.split()[0]) if text else None
    except ValueError:
        return None


def _policy_index(path: Path) -> int:
    digits = re.sub(r"\D", "", path.name)
    return int(digits) if digits else 0


def cpufreq_policies() -> list[dict[str, Any]]:
    base = sys_path("/sys/devices/system/cpu/cpufreq")
    try:
        policies = sorted((p for p in base.iterdir() if p.name.startswith("policy")), key=_policy_index)
    except OSError:
        return []
    found = []
    for policy in policies:
        prefix = f"/sys/devices/system/cpu/cpufreq/{policy.name}"
        found.append(
            {
                "policy": policy.name,
                "cpus": parse_cpu_list(read_text(f"{prefix}/related_cpus") or read_text(f"{prefix}/affected_cpus")),
                "cur_khz": read_int(f"{prefix}/scaling_cur_freq"),
                "min_khz": read_int(f"{prefix}/scaling_min_freq"),
                "max_khz": read_int(f"{prefix}/scaling_max_freq"),
                "hw_max_khz": read_int(f"{prefix}/cpuinfo_max_freq"),
                "governor": read_text(f"{prefix}/scaling_governor"),
            }
        )
    return found


def thermal_zones() -> list[dict[str, Any]]:
    base = sys_path("/sys/class/thermal")
    try:
        zones = sorted((p for p in base.iterdir() if p.name.startswith("thermal_zone")), key=_policy_index)
    except OSError:
        return []
    found = []
    for zone in zones:
        millidegrees = read_int(f"/sys/class/thermal/{zone.name}/temp")
        found.append(
            {
                "zone": zone.name,
                "type": read_text(f"/sys/class/thermal/{zone.name}/type"),
                "temp_c": round(millidegrees / 1000.0, 3) if millidegrees is not None else None,
            }
        )
    return found


def soc_temperature(zones: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The zone that measures the SoC: a preferred type, else any cpu/soc zone, else the first readable one."""
    readable = [zone for zone in zones if zone["temp_c"] is not None]
    for wanted in PREFERRED_ZONE_TYPES:
        for zone in readable:
            if zone["type"] == wanted:
                return zone
    for zone in readable:
        if zone["type"] and ("cpu" in zone["type"] or "soc" in zone["type"]):
            return zone
    return readable[0] if readable else None


def vcgencmd_path() -> str | None:
    configured = os.environ.get("ETLAB_AGENT_VCGENCMD")
    if configured:
        return configured if os.access(configured, os.X_OK) else None
    return shutil.which("vcgencmd") or ("/usr/bin/vcgencmd" if os.access("/usr/bin/vcgencmd", os.X_OK) else None)


def run_vcgencmd(*args: str) -> str | None:
    tool = vcgencmd_path()
    answer = run_probe([tool, *args], PROBE_TIMEOUT_SECONDS) if tool else None
    if answer is None or answer[0] != 0:
        return None
    return answer[1].decode("utf-8", errors="replace").strip()


def parse_throttled(text: str | None) -> dict[str, Any] | None:
    """'throttled=0x50005' -> raw value, every documented flag, and the list of flags that are set."""
    if not text:
        return None
    match = re.search(r"throttled=(0x[0-9a-fA-F]+|\d+)", text)
    if not match:
        return None
    value = int(match.group(1), 0)
    flags = {name: bool((value >> bit) & 1) for bit, name in THROTTLED_BITS.items()}
    return {"raw": match.group(1), "value": value, "flags": flags, "active": [n for n, on in flags.items() if on]}


def parse_measure_temp(text: str | None) -> float | None:
    """ "temp=48.3'C" -> 48.3."""
    match = re.search(r"temp=(-?[0-9.]+)", text or "")
    try:
        return float(match.group(1)) if match else None
    except ValueError:
        return None


def parse_midr(text: str | None) -> dict[str, Any] | None:
    """'0x00000000414fd0b1' -> the core's name (Cortex-A76) and MIDR fields, or None."""
    try:
        value = int(text or "", 16)
    except ValueError:
        return None
    implementer, part = (value >> 24) & 0xFF, (value >> 4) & 0xFFF
    known = ARM_CORES.get(part) if implementer == 0x41 else None
    return {
        "midr": f"{value:#010x}",
        "implementer": f"{implementer:#04x}",
        "part": f"{part:#05x}",
        "core": known or f"unknown ({implementer:#04x}:{part:#05x})",
    }


def parse_auxv(data: bytes) -> dict[int, int]:
    """The 64-bit auxiliary vector (type, value pairs up to AT_NULL) as a dict."""
    entries: dict[int, int] = {}
    for offset in range(0, len(data) - 15, 16):
        kind, value = struct.unpack_from("<QQ", data, offset)
        if kind == 0:
            break
        entries.setdefault(kind, value)
    return entries


def hwcap() -> int | None:
    """AT_HWCAP of this process, from /proc/self/auxv (under qemu-user: the emulated CPU's, not the host's)."""
    try:
        data = sys_path("/proc/self/auxv").read_bytes()
    except OSError:
        return None
    return parse_auxv(data).get(AT_HWCAP)


def cpu_facts(arch: str | None) -> dict[str, Any]:
    """The core type from MIDR and whether the CPU has AES instructions.

    /proc/cpuinfo is not used on Arm: under emulation it is the host's. AES comes from HWCAP on aarch64, from
    the CPU flags on x86_64 (where /proc/cpuinfo is the real CPU's)."""
    cores = []
    for cpu in parse_cpu_list(read_text("/sys/devices/system/cpu/possible")) or [0]:
        midr = parse_midr(read_text(f"/sys/devices/system/cpu/cpu{cpu}/regs/identification/midr_el1"))
        if midr:
            cores.append(midr)
    names = sorted({core["core"] for core in cores})
    caps = hwcap()
    arm = (arch or "") in ("aarch64", "arm64") or bool(cores)
    aes: bool | None = None
    if arm and caps is not None:
        aes = bool(caps & HWCAP_AES)
    elif (arch or "") in ("x86_64", "amd64"):
        flags = next((line for line in (read_text("/proc/cpuinfo") or "").splitlines() if line.startswith("flags")), "")
        aes = "aes" in flags.split(":", 1)[-1].split() if flags else None
    return {
        "core": names[0] if len(names) == 1 else (" + ".join(names) if names else None),
        "midr": cores[0]["midr"] if cores else None,
        "hwcap": f"{caps:#x}" if caps is not None else None,
        "aes": aes,
    }


def meminfo() -> dict[str, int | None]:
    fields: dict[str, int] = {}
    for line in (read_text("/proc/meminfo") or "").splitlines():
        match = re.match(r"(\w+):\s+(\d+)\s*kB", line)
        if match:
            fields[match.group(1)] = int(match.group(2))
    return {"total_kb": fields.get("MemTotal"), "available_kb": fields.get("MemAvailable")}


def os_release() -> str | None:
    for absolute in ("/etc/os-release", "/usr/lib/os-release"):
        text = read_text(absolute)
        if text is None:
            continue
        for line in text.splitlines():
            if line.startswith("PRETTY_NAME="):
                return line.split("=", 1)[1].strip().strip("\"'") or None
    return None


def kernel_release() -> str | None:
    return read_text("/proc/sys/kernel/osrelease") or (
        None if os.environ.get("ETLAB_AGENT_SYSROOT") else platform.release() or None
    )


CONFIG_TXT = ("/boot/firmware/config.txt", "/boot/config.txt")  # Raspberry Pi OS since bookworm, and before
CONFIG_TXT_CAP = 1 << 20


def config_txt() -> dict[str, str] | None:
    """The firmware's config.txt: its path and sha256 (a changed setting changes the results by 8-20%), or None."""
    for absolute in CONFIG_TXT:
        try:
            with open(sys_path(absolute), "rb") as handle:
                data = handle.read(CONFIG_TXT_CAP)
        except OSError:
            continue
        return {"path": absolute, "sha256": hashlib.sha256(data).hexdigest()}
    return None


def firmware_version(text: str | None) -> str | None:
    """`vcgencmd version`'s build date and version line, in one line: "Mar 17 2023 10:50:39; version 82f3750a...
    (clean) (release) (start)"; None without vcgencmd."""
    if not text:
        return None
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    kept = [lines[0], *(line for line in lines[1:] if line.startswith("version"))] if lines else []
    return "; ".join(kept)[:200] or None


def glibc_version() -> str | None:
    try:
        text = os.confstr("CS_GNU_LIBC_VERSION")  # "glibc 2.36"
    except (ValueError, OSError, AttributeError):
        text = None
    if text and text.startswith("glibc "):
        return text.split(" ", 1)[1]
    name, version = platform.libc_ver()
    return version if name == "glibc" and version else None


# The runner's answers by (path, inode, size, mtime, ctime, question): `profile` describes the board before and after
# its run with the same binary, which is then asked once per question instead of twice.
_RUNNER_ANSWERS: dict[tuple[Any, ...], tuple[int, bytes, bytes] | None] = {}


def ask_runner(runner: Path, flag: str, *context: Any) -> tuple[int, bytes, bytes] | None:
    """`runner flag` through run_probe, asked again only when the file or `context` changed."""
    try:
        found = runner.stat()
    except OSError:
        return None
    key = (str(runner), found.st_ino, found.st_size, found.st_mtime_ns, found.st_ctime_ns, flag, *context)
    if key not in _RUNNER_ANSWERS:
        _RUNNER_ANSWERS[key] = run_probe([str(runner), flag], PROBE_TIMEOUT_SECONDS)
    return _RUNNER_ANSWERS[key]


def runner_version(runner: Path | None) -> dict[str, Any] | None:
    """`etlab_runner --version` parsed, or None when there is no runner or it does not answer."""
    if runner is None or not runner.is_file():
        return None
    answer = ask_runner(runner, "--version")
    if answer is None or answer[0] != 0:
        return None
    try:
        version = json.loads(answer[1].decode("utf-8", errors="replace"))
    except ValueError:
        return None
    return version if isinstance(version, dict) else None


# Event sources that are not a CPU's hardware PMU.
SOFTWARE_EVENT_SOURCES = ("software", "tracepoint", "breakpoint", "kprobe", "uprobe", "msr", "power")
CPU_PMU_PREFIXES = ("armv8_", "armv7_", "arm_", "cpu")  # armv8_cortex_a72, armv8_pmuv3, cpu, cpu_core (x86)


def event_sources() -> list[dict[str, Any]]:
    """/sys/bus/event_source/devices: each PMU's perf type and the events it advertises in sysfs."""
    root = sys_path("/sys/bus/event_source/devices")
    try:
        names = sorted(entry.name for entry in root.iterdir())
    except OSError:
        return []
    sources = []
    for name in names:
        try:
            events = sorted(entry.name for entry in (root / name / "events").iterdir())
        except OSError:
            events = []
        sources.append({"name": name, "type": read_int(f"/sys/bus/event_source/devices/{name}/type"), "events": events})
    return sources


def hardware_pmu(sources: list[dict[str, Any]]) -> str | None:
    """The CPU's hardware PMU, or None: Raspberry Pi OS kernels have shipped without the PMU node."""
    for source in sources:
        name = str(source["name"])
        if name not in SOFTWARE_EVENT_SOURCES and name.startswith(CPU_PMU_PREFIXES):
            return name
    return None


def probe_counters(runner: Path | None) -> dict[str, str] | None:
    """`etlab_runner --probe-counters`: which counters this kernel opens for user space, by name (ok or errno)."""
    if runner is None or not runner.is_file():
        return None
    # What opens depends on the paranoid level: asked again when it changed.
    answer = ask_runner(runner, "--probe-counters", read_int("/proc/sys/kernel/perf_event_paranoid"))
    if answer is None or answer[0] != 0:
        return None
    try:
        counters = json.loads(answer[1].decode("utf-8", errors="replace")).get("counters")
    except (ValueError, AttributeError):
        return None
    return {str(k): str(v) for k, v in counters.items()} if isinstance(counters, dict) else None


def perf_facts(runner: Path | None) -> dict[str, Any]:
    """What a counters pass can count here: paranoid level, the hardware PMU (if any) and the openable counters."""
    sources = event_sources()
    return {
        "perf_event_paranoid": read_int("/proc/sys/kernel/perf_event_paranoid"),
        "hardware_pmu": hardware_pmu(sources),
        "event_sources": sources,
        "counters": probe_counters(runner),
    }


def _runner_from_state(workdir: Workdir, state: dict[str, Any] | None) -> Path | None:
    if not state:
        return None
    if state.get("runner_path"):
        path = Path(str(state["runner_path"])).expanduser()
        return path if path.is_absolute() else workdir.root / path
    if state.get("executorch_version"):
        return workdir.root / "runner" / str(state["executorch_version"]) / "etlab_runner"
    return None


def collect_info(workdir: Workdir, runner: Path | None = None) -> dict[str, Any]:
    """The `info` document (schema in board/agent/README.md)."""
    try:
        state = read_state(workdir)
    except Exception:  # an unreadable state.json is reported as null here; profile reports it properly
        state = None
    zones = thermal_zones()
    soc_zone = soc_temperature(zones)
    policies = cpufreq_policies()
    governors = sorted({p["governor"] for p in policies if p["governor"]})
    throttled_text = run_vcgencmd("get_throttled")
    runner = runner or _runner_from_state(workdir, state)
    arch = platform.machine() or None
    try:
        holder = current_holder(workdir)
    except OSError:
        holder = None
    return {
        "schema": INFO_SCHEMA,
        "collected_at": utc_now(),
        "hostname": socket.gethostname(),
        "model": board_model(),
        "arch": arch,
        "cpu": cpu_facts(arch),
        "cores_online": cores_online(),
        "load_1m": load_1m(),
        "cpufreq": policies,
        "governor": governors[0] if len(governors) == 1 else ("mixed" if governors else None),
        "temperature_c": soc_zone["temp_c"] if soc_zone else None,
        "temperature_zone": soc_zone["type"] if soc_zone else None,
        "thermal_zones": zones,
        "vcgencmd_temp_c": parse_measure_temp(run_vcgencmd("measure_temp")),
        "throttled": parse_throttled(throttled_text),
        "memory": meminfo(),
        "kernel": kernel_release(),
        "firmware": firmware_version(run_vcgencmd("version")),
        "config_txt": config_txt(),
        "os_release": os_release(),
        "python": platform.python_version(),
        "glibc": glibc_version(),
        "state": state,
        "runner": runner_version(runner),
        "perf": perf_facts(runner),
        "lock_holder": holder,
    }
