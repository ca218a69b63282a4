"""Emulated Raspberry Pis: an arm64 Debian rootfs whose own sshd runs under qemu-user, as a fake board.

A board is the rootfs's `/usr/sbin/sshd`, run as PID 1 of private PID and mount namespaces, chrooted into an
overlayfs whose lower dir is the cached rootfs (shared, never written) and whose upper dir is the board's own.
binfmt_misc hands every aarch64 binary to qemu-aarch64 (the `F` flag: nothing is copied into the chroot). The
board gets a static fake `/sys` (CPU list, MIDR per core, a cpufreq policy, a `cpu-thermal` zone, the
device-tree model) because XNNPACK's cpuinfo and the agent read those paths, and a fake `vcgencmd` whose answers
a test sets with `set_throttled()` / `set_temperature()`.

Under emulation `uname -r` and `/proc/cpuinfo` are the host's and `perf_event_open` fails: nothing relies on them.

The rootfs is built once with mmdebstrap and cached outside the repository, under a key made of the recipe's
hash and the month (`~/.cache/etlab/pi-rootfs/<hash>-<YYYY-MM>.tar.zst`, unpacked beside it), so security
updates arrive monthly and a recipe change rebuilds it (ETLAB_PI_CACHE moves the cache, ETLAB_DEBIAN_MIRROR
picks the mirror). `bootstrap.sh --test` prepares it; a missing one is built on first use, with a log line.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import fcntl
import hashlib
import json
import os
import shlex
import shutil
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from orchestrator.testing.sshd import LabSetupError, SshdBoard, SshdLab

# What the rootfs holds: Raspberry Pi OS bookworm's g++ 12 and glibc 2.36, and nothing a Pi would not have.
ROOTFS_RECIPE: dict[str, Any] = {
    "suite": "bookworm",
    "architecture": "arm64",
    "variant": "minbase",
    "packages": ["openssh-server", "python3", "g++", "make", "procps", "iproute2"],
    "exclude": ["/usr/share/man/*", "/usr/share/doc/*", "/usr/share/locale/*", "/usr/share/info/*"],
}
DEBIAN_MIRROR = os.environ.get("ETLAB_DEBIAN_MIRROR", "http://deb.debian.org/debian")
QEMU_BINFMT = Path("/proc/sys/fs/binfmt_misc/qemu-aarch64")
# What a board without a compiler lacks: overlayfs whiteouts hide these from the shared rootfs.
COMPILER_PATHS = (
    "usr/bin/g++",
    "usr/bin/c++",
    "usr/bin/g++-12",
    "usr/bin/aarch64-linux-gnu-g++",
    "usr/bin/aarch64-linux-gnu-g++-12",
    "usr/bin/clang++",
)
_CHROOT_CONFIG = "/etc/ssh/etlab_sshd_config"
_CHROOT_HOST_KEY = "/etc/ssh/etlab_host_ed25519_key"
_CHROOT_AUTHORIZED = "/etc/ssh/etlab_authorized_keys"
_CHROOT_CONTROL = "/etc/etlab-fake"


@dataclass(frozen=True)
class PiFlavour:
    """What a Raspberry Pi model looks like through /sys and vcgencmd."""

    name: str
    model: str
    midr: str  # MIDR_EL1 of every core
    core: str
    cores: int
    max_khz: int
    min_khz: int
    # qemu's CPU model (QEMU_CPU): the instruction set and HWCAP the programs see, so XNNPACK picks the kernels
    # this core has (qemu's default "max" has SVE2 and more that no Pi has). qemu's A72 model has the crypto
    # extension, which a Pi 4's BCM2711 lacks: an emulated Pi 4 reports AES (use bulk_cipher to test chacha).
    qemu_cpu: str


PI5 = PiFlavour(
    "pi5", "Raspberry Pi 5 Model B Rev 1.0", "0x00000000414fd0b1", "Cortex-A76", 4, 2400000, 1500000, "cortex-a76"
)
PI4 = PiFlavour(
    "pi4", "Raspberry Pi 4 Model B Rev 1.5", "0x00000000410fd083", "Cortex-A72", 4, 1800000, 600000, "cortex-a72"
)
FLAVOURS = {flavour.name: flavour for flavour in (PI5, PI4)}


# ---------------------------------------------------------------- the rootfs cache


def recipe_hash() -> str:
    text = json.dumps({"recipe": ROOTFS_RECIPE, "mirror": DEBIAN_MIRROR}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def cache_root() -> Path:
    configured = os.environ.get("ETLAB_PI_CACHE")
    return Path(configured).expanduser() if configured else Path.home() / ".cache" / "etlab" / "pi-rootfs"


def rootfs_key(today: dt.date | None = None) -> str:
    """The recipe's hash and the month: a rootfs is rebuilt monthly (security updates) and on recipe changes."""
    return f"{recipe_hash()}-{(today or dt.date.today()).strftime('%Y-%m')}"


def rootfs_archive(today: dt.date | None = None) -> Path:
    return cache_root() / f"{rootfs_key(today)}.tar.zst"


def mmdebstrap_argv(output: Path) -> list[str]:
    recipe = ROOTFS_RECIPE
    argv = [
        "mmdebstrap",
        "--mode=root",
        f"--variant={recipe['variant']}",
        f"--architectures={recipe['architecture']}",
        "--include=" + ",".join(recipe["packages"]),
        "--aptopt=APT::Install-Recommends false",
    ]
    argv += [f"--dpkgopt=path-exclude={pattern}" for pattern in recipe["exclude"]]
    return [*argv, recipe["suite"], str(output), DEBIAN_MIRROR]


def emulation_problem() -> str | None:
    """Why aarch64 binaries cannot run here (None: they can). Tries to enable binfmt_misc first, as root."""
    if not Path("/usr/libexec/qemu-binfmt/aarch64-binfmt-P").exists() and shutil.which("qemu-aarch64-static") is None:
        return "qemu-user-static is not installed (apt-get install qemu-user-static binfmt-support)"
    if os.geteuid() != 0:
        return "emulated boards need root (mount and PID namespaces, overlayfs, chroot)"
    if not Path("/proc/sys/fs/binfmt_misc/status").exists():
        subprocess.run(["mount", "-t", "binfmt_misc", "binfmt_misc", "/proc/sys/fs/binfmt_misc"], capture_output=True)
    if shutil.which("update-binfmts"):
        subprocess.run(["update-binfmts", "--enable", "qemu-aarch64"], capture_output=True)
    try:
        registration = QEMU_BINFMT.read_text()
    except OSError:
        return f"binfmt_misc has no qemu-aarch64 entry ({QEMU_BINFMT}): run `update-binfmts --enable qemu-aarch64`"
    if "enabled" not in registration.splitlines()[0]:
        return "binfmt_misc's qemu-aarch64 entry is disabled: run `update-binfmts --enable qemu-aarch64`"
    flags = next((line.split(":", 1)[1].strip() for line in registration.splitlines() if line.startswith("flags")), "")
    if "F" not in flags:
        return f"binfmt_misc's qemu-aarch64 entry lacks the F flag (flags: {flags!r}): reinstall qemu-user-static"
    if shutil.which("unshare") is None or shutil.which("chroot") is None:
        return "unshare or chroot is missing (util-linux, coreutils)"
    return None


def require_emulation() -> None:
    problem = emulation_problem()
    if problem:
        raise LabSetupError(problem)


BACKGROUND_LOG = ".etlab/pi-rootfs.log"  # bootstrap.sh --test writes its background build's output here


def _log(message: str) -> None:
    print(f"etlab emulated Pi: {message}", file=sys.stderr, flush=True)


@contextlib.contextmanager
def _cache_lock() -> Iterator[None]:
    root = cache_root()
    root.mkdir(parents=True, exist_ok=True)
    with open(root / ".lock", "a") as handle:
        # Two processes never build or unpack the same rootfs at once (bootstrap.sh --test builds it in the background).
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            _log(f"waiting for another process preparing the rootfs (bootstrap's log: {BACKGROUND_LOG})")
            fcntl.flock(handle, fcntl.LOCK_EX)
        yield


def build_rootfs(archive: Path) -> float:
    """Build the rootfs archive with mmdebstrap (minutes); returns the seconds it took."""
    if shutil.which("mmdebstrap") is None:
        raise LabSetupError("mmdebstrap is missing: run `apt-get install mmdebstrap zstd` (or ./bootstrap.sh --test)")
    started = time.monotonic()
    archive.parent.mkdir(parents=True, exist_ok=True)
    partial = archive.with_name(archive.name + ".partial.tar.zst")
    partial.unlink(missing_ok=True)
    log = archive.with_name(archive.name + ".log")
    _log(f"building the arm64 rootfs {archive.name} with mmdebstrap (3-7 minutes; log: {log})")
    with open(log, "wb") as handle:
        done = subprocess.run(mmdebstrap_argv(partial), stdout=handle, stderr=subprocess.STDOUT)
    if done.returncode != 0:
        partial.unlink(missing_ok=True)
        tail = log.read_text(errors="replace")[-1500:]
        raise LabSetupError(f"mmdebstrap failed (exit {done.returncode}); end of {log}:\n{tail}")
    partial.rename(archive)
    for stale in archive.parent.glob("*.tar.zst"):  # other months and recipes
        if stale != archive:
            stale.unlink(missing_ok=True)
            shutil.rmtree(stale.with_name(stale.name.removesuffix(".tar.zst")), ignore_errors=True)
    seconds = time.monotonic() - started
    _log(f"rootfs built in {seconds:.0f} s ({archive.stat().st_size / 2**20:.0f} MiB)")
    return seconds


def unpack_rootfs(archive: Path, target: Path) -> float:
    """Unpack the archive into `target` (the shared overlay lower dir); returns the seconds it took."""
    started = time.monotonic()
    partial = target.with_name(target.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    done = subprocess.run(
        ["tar", "--zstd", "-xf", str(archive), "-C", str(partial), "--numeric-owner"], capture_output=True, text=True
    )
    if done.returncode != 0:
        shutil.rmtree(partial, ignore_errors=True)
        raise LabSetupError(f"cannot unpack {archive}: {done.stderr.strip()[-500:]}")
    partial.rename(target)
    return time.monotonic() - started


def ensure_rootfs() -> Path:
    """The unpacked rootfs of this month's recipe, built and unpacked when missing."""
    archive = rootfs_archive()
    target = archive.with_name(archive.name.removesuffix(".tar.zst"))
    with _cache_lock():
        if target.is_dir():
            return target
        if not archive.is_file():
            build_rootfs(archive)
        unpack_rootfs(archive, target)
    return target


# ---------------------------------------------------------------- the fake /sys and vcgencmd


def write_fake_sys(root: Path, flavour: PiFlavour, *, governor: str = "ondemand", temp_c: float = 48.3) -> None:
    """A static /sys tree: enough for XNNPACK's cpuinfo (CPU lists, MIDR) and the agent's board facts."""
    cpu = root / "devices/system/cpu"
    last = flavour.cores - 1
    files = {cpu / name: f"0-{last}" for name in ("possible", "present", "online", "kernel_max")}
    files[cpu / "kernel_max"] = str(last)
    policy = cpu / "cpufreq/policy0"
    for index in range(flavour.cores):
        files[cpu / f"cpu{index}/regs/identification/midr_el1"] = flavour.midr
        files[cpu / f"cpu{index}/regs/identification/revidr_el1"] = "0x0000000000000000"
        files[cpu / f"cpu{index}/topology/physical_package_id"] = "0"
        files[cpu / f"cpu{index}/topology/core_id"] = str(index)
        files[cpu / f"cpu{index}/topology/core_siblings_list"] = f"0-{last}"
        files[cpu / f"cpu{index}/topology/thread_siblings_list"] = str(index)
        files[cpu / f"cpu{index}/cpufreq/cpuinfo_max_freq"] = str(flavour.max_khz)
        files[cpu / f"cpu{index}/cpufreq/cpuinfo_min_freq"] = str(flavour.min_khz)
    files.update(
        {
            policy / "related_cpus": " ".join(str(i) for i in range(flavour.cores)),
            policy / "affected_cpus": " ".join(str(i) for i in range(flavour.cores)),
            policy / "scaling_cur_freq": str(flavour.max_khz),
            policy / "scaling_min_freq": str(flavour.min_khz),
            policy / "scaling_max_freq": str(flavour.max_khz),
            policy / "cpuinfo_max_freq": str(flavour.max_khz),
            policy / "cpuinfo_min_freq": str(flavour.min_khz),
            policy / "scaling_governor": governor,
            root / "class/thermal/thermal_zone0/type": "cpu-thermal",
            root / "class/thermal/thermal_zone0/temp": str(round(temp_c * 1000)),
            root / "firmware/devicetree/base/model": flavour.model + "\0",
            root / "firmware/devicetree/base/compatible": f"raspberrypi,{flavour.name[-1]}-model-b\0brcm\0",
        }
    )
    for path, text in files.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text + ("" if text.endswith("\0") else "\n"))


FAKE_VCGENCMD = f"""#!/bin/sh
# etlab's fake vcgencmd: answers from {_CHROOT_CONTROL}/, which the test controls.
case "$1" in
  get_throttled) echo "throttled=$(cat {_CHROOT_CONTROL}/throttled)" ;;
  measure_temp) echo "temp=$(cat {_CHROOT_CONTROL}/temp)'C" ;;
  pmic_read_adc) cat {_CHROOT_CONTROL}/pmic 2>/dev/null || {{ echo "Command not registered" >&2; exit 1; }} ;;
  *) echo "vcgencmd: unsupported command $1" >&2; exit 1 ;;
esac
"""


# ---------------------------------------------------------------- the board


class PiBoard(SshdBoard):
    """One emulated Raspberry Pi: the rootfs's sshd under qemu-aarch64 in a chroot over a private overlay."""

    start_timeout = 90.0  # emulated, on a loaded 2-core machine, with a cold page cache

    def __init__(
        self,
        lab: SshdLab,
        name: str,
        address: str,
        root: Path,
        *,
        lower: Path,
        flavour: PiFlavour = PI5,
        compiler: bool = True,
        **board_overrides: Any,
    ) -> None:
        self.lower = lower
        self.flavour = flavour
        self.upper = root / "upper"
        self.overlay_work = root / "overlay-work"
        self.merged = root / "merged"
        self.fake_sys = root / "sys"
        self.control = root / "control"
        defaults: dict[str, Any] = {
            "tags": (flavour.name, "aarch64"),
            "connect_timeout": 30.0,
            "keepalive": 5.0,
            "tcp_user_timeout": 60.0,
        }
        session_env = {"QEMU_CPU": flavour.qemu_cpu}  # sessions' programs run on the same emulated core
        super().__init__(lab, name, address, root, session_env=session_env, **{**defaults, **board_overrides})
        self.home = self.upper / "root"
        self.config = self.upper / _CHROOT_CONFIG.lstrip("/")
        for folder in (self.upper, self.overlay_work, self.merged, self.control, self.home):
            folder.mkdir(parents=True, exist_ok=True)
        write_fake_sys(self.fake_sys, flavour)
        self.set_throttled(0)
        self.set_temperature(48.3)
        self._prepare_upper(compiler)

    def _prepare_upper(self, compiler: bool) -> None:
        for folder in ("run/sshd", "etc/ssh", _CHROOT_CONTROL.lstrip("/"), "usr/bin", "tmp", "proc", "sys", "dev"):
            (self.upper / folder).mkdir(parents=True, exist_ok=True)
        (self.upper / "tmp").chmod(0o1777)
        (self.upper / "etc/hostname").write_text(self.name.replace(" ", "-") + "\n")
        vcgencmd = self.upper / "usr/bin/vcgencmd"
        vcgencmd.write_text(FAKE_VCGENCMD)
        vcgencmd.chmod(0o755)
        if not compiler:
            for relative in COMPILER_PATHS:
                whiteout = self.upper / relative
                whiteout.unlink(missing_ok=True)
                os.mknod(whiteout, 0o600 | stat.S_IFCHR, os.makedev(0, 0))  # overlayfs whiteout: hides it

    def set_throttled(self, value: int) -> None:
        """What the fake `vcgencmd get_throttled` answers from now on (e.g. 0x50005: under-voltage, throttled)."""
        (self.control / "throttled").write_text(f"{value:#x}\n")

    def set_pmic(self, text: str) -> None:
        """What the fake `vcgencmd pmic_read_adc` prints from now on (a Pi 5's PMIC: rail currents and voltages, one
        a line); before this, the command is not registered, as on a Pi 4."""
        (self.control / "pmic").write_text(text)

    def set_temperature(self, celsius: float) -> None:
        (self.control / "temp").write_text(f"{celsius:.1f}\n")
        (self.fake_sys / "class/thermal/thermal_zone0/temp").write_text(f"{round(celsius * 1000)}\n")

    def _server_files(self) -> dict[str, str]:
        # The server sees the chroot: copy what it reads into the upper dir and name it by its path there.
        shutil.copyfile(self.host_key, self.upper / _CHROOT_HOST_KEY.lstrip("/"))
        (self.upper / _CHROOT_HOST_KEY.lstrip("/")).chmod(0o600)
        shutil.copyfile(self.lab.authorized_keys, self.upper / _CHROOT_AUTHORIZED.lstrip("/"))
        return {"host_key": _CHROOT_HOST_KEY, "authorized_keys": _CHROOT_AUTHORIZED, "home": "/root"}

    def _command(self) -> list[str]:
        merged = shlex.quote(str(self.merged))
        options = f"lowerdir={self.lower},upperdir={self.upper},workdir={self.overlay_work}"
        script = "; ".join(
            [
                "set -e",
                f"mount -t overlay overlay -o {shlex.quote(options)} {merged}",
                f"mount -t proc proc {merged}/proc",
                f"mount --rbind /dev {merged}/dev",
                f"mount --bind {shlex.quote(str(self.fake_sys))} {merged}/sys",
                f"mount --bind {shlex.quote(str(self.control))} {merged}{_CHROOT_CONTROL}",
                f"export QEMU_CPU={shlex.quote(self.flavour.qemu_cpu)}",
                f"exec chroot {merged} /usr/sbin/sshd -D -e -f {_CHROOT_CONFIG}",
            ]
        )
        # `unshare` stays outside as the reaper; the shell execs into sshd, which becomes the namespace's PID 1.
        return ["unshare", "--pid", "--fork", "--kill-child", "--mount", "--propagation", "private", "sh", "-c", script]

    def local_path(self, remote: str) -> Path:
        """Where a file the board wrote lives on this machine (its upper dir)."""
        if remote == "~" or remote.startswith("~/"):
            return self.home / remote[2:]
        return self.upper / remote.lstrip("/")

    def processes(self) -> list[int]:
        """PIDs of every process running inside this board's chroot (empty once it is stopped)."""
        found = []
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                with contextlib.suppress(OSError):
                    if os.readlink(f"/proc/{entry}/root") == str(self.merged):
                        found.append(int(entry))
        return found


def start_pi_board(
    lab: SshdLab,
    name: str | None = None,
    *,
    flavour: str | PiFlavour = PI5,
    compiler: bool = True,
    **overrides: Any,
) -> PiBoard:
    """Start an emulated Pi in `lab` (sharing its client key and known_hosts with the x86 sshd boards).

    `flavour` is pi5 or pi4; `compiler=False` hides g++ from its rootfs; `overrides` are Board fields."""
    require_emulation()
    lower = ensure_rootfs()
    chosen = FLAVOURS[flavour] if isinstance(flavour, str) else flavour
    name, address, root = lab.allocate(name, prefix=chosen.name)
    fake = PiBoard(lab, name, address, root, lower=lower, flavour=chosen, compiler=compiler, **overrides)
    lab.boards.append(fake)
    try:
        fake.start()
    except BaseException:
        lab.discard(fake)
        raise
    return fake
