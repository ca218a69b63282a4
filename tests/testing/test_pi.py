"""A Raspberry Pi in the suite: emulated aarch64 boards (tests/plugins/pi.py) beside x86 ones, through `fab`.

Emulation is 15-50x slower than native: one end-to-end chain runs on an emulated board, and nothing here
asserts `valid` or a timing for it.
"""

from __future__ import annotations

import datetime as dt
import json
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from orchestrator.boards.inventory import Board
from orchestrator.boards.limits import limits_cell, recorded_bandwidth, recorded_compute
from orchestrator.deploy.health import check_health
from orchestrator.lowering.export.lower import LoweringResult
from orchestrator.lowering.variants import VARIANTS
from orchestrator.paths import PROJECT_ROOT
from orchestrator.testing import pi as emulated
from orchestrator.testing.pi import PiBoard
from orchestrator.testing.sshd import SshdBoard
from orchestrator.transport import connect
from orchestrator.transport.hostkeys import KnownHosts, host_id
from orchestrator.transport.ssh import SshConnection, bulk_ciphers, parse_cpu_probe
from orchestrator.transport.transfer import push_file
from tests.deploy.test_crossbuild import elf_machine
from tests.e2e.test_e2e import bundles, fab
from tests.e2e.test_energy_e2e import PMIC, WATTS
from tests.plugins.agent import BOARD_SAMPLES, AgentCli
from tests.plugins.analysis import adapter_graphs
from tests.plugins.artifacts import ARTIFACT_CACHE
from tests.plugins.boards import SHARED_BUILD, write_inventory

AES_GCM, CHACHA = "aes128-gcm@openssh.com", "chacha20-poly1305@openssh.com"


def _lab(path: Path, boards: list[Board]) -> dict[str, Any]:
    names = [board.name for board in boards]
    path.mkdir(parents=True, exist_ok=True)
    return {"inventory": write_inventory(path / "inventory.yaml", boards, groups={"default": names})}


# ---------------------------------------------------------------- the emulated board itself


def test_rootfs_cache_key_follows_the_recipe_and_the_month(monkeypatch: pytest.MonkeyPatch) -> None:
    november, december = dt.date(2026, 11, 30), dt.date(2026, 12, 1)
    key = emulated.rootfs_key(november)
    assert key.endswith("-2026-11") and emulated.rootfs_key(december).endswith("-2026-12")
    assert emulated.rootfs_key(december).split("-")[0] == key.split("-")[0]
    assert emulated.rootfs_archive(november).parent == emulated.cache_root()
    assert not emulated.cache_root().is_relative_to(PROJECT_ROOT)  # outside the repository
    monkeypatch.setitem(emulated.ROOTFS_RECIPE, "packages", [*emulated.ROOTFS_RECIPE["packages"], "strace"])
    assert emulated.rootfs_key(november) != key  # a recipe change builds a new rootfs
    assert "--include=openssh-server,python3,g++,make,procps,iproute2,strace" in emulated.mmdebstrap_argv(Path("x"))


def test_a_rootfs_being_prepared_elsewhere_is_waited_for_and_said(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """bootstrap.sh --test builds the rootfs in the background: the suite's first emulated Pi waits for that build,
    saying so, rather than starting a second one."""
    import fcntl  # here, not at the top: only this test holds the lock by hand
    import threading

    monkeypatch.setenv("ETLAB_PI_CACHE", str(tmp_path))
    ready = tmp_path / emulated.rootfs_archive().name.removesuffix(".tar.zst")
    ready.mkdir()  # what the other process leaves behind once it is done
    entered = threading.Event()

    def first_emulated_pi() -> None:
        assert emulated.ensure_rootfs() == ready
        entered.set()

    with open(tmp_path / ".lock", "a") as other_process:
        fcntl.flock(other_process, fcntl.LOCK_EX)
        waiter = threading.Thread(target=first_emulated_pi)
        waiter.start()
        assert not entered.wait(1.0), "the lock was not honoured"
        fcntl.flock(other_process, fcntl.LOCK_UN)
    waiter.join(30)
    assert entered.is_set()
    assert "waiting for another process preparing the rootfs" in capfd.readouterr().err


def test_emulated_pis_look_like_raspberry_pis(pi_boards: Callable[..., PiBoard]) -> None:
    pi5, pi4 = pi_boards("pi5-emu"), pi_boards("pi4-emu", flavour="pi4")
    midr = "/sys/devices/system/cpu/cpu3/regs/identification/midr_el1"
    for fake, model, part in [(pi5, "Raspberry Pi 5", "414fd0b1"), (pi4, "Raspberry Pi 4", "410fd083")]:
        with connect(fake.board) as conn:
            assert conn.run(["uname", "-m"]).stdout.strip() == "aarch64"
            assert conn.run(["cat", "/sys/firmware/devicetree/base/model"]).stdout.startswith(model)
            assert conn.run(["cat", midr]).stdout.strip().endswith(part)
            assert conn.run(["vcgencmd", "get_throttled"]).stdout.strip() == "throttled=0x0"
            fake.set_throttled(0x50005)
            assert conn.run(["vcgencmd", "get_throttled"]).stdout.strip() == "throttled=0x50005"
            assert "12." in conn.run(["g++", "-dumpfullversion"]).stdout  # bookworm's g++ 12, as on the Pi
            # Programs run on qemu's model of the Pi's core (not qemu's default "max", which has SVE).
            auxv = conn.run(["sh", "-c", "od -An -v -tu8 -w16 /proc/self/auxv"]).stdout
            hwcap = next(int(v) for k, v in (line.split() for line in auxv.splitlines() if line.strip()) if k == "16")
            assert hwcap & (1 << 22) == 0, f"{hwcap:#x} has SVE"
            # What the board writes lands in its own upper dir, never in the shared rootfs.
            conn.run(["sh", "-c", "echo hello > ~/written"])
            assert fake.local_path("~/written").read_text() == "hello\n"
            assert not (fake.lower / "root" / "written").exists()
    # Each board has its own host key, pinned separately.
    pinned = KnownHosts(pi5.board.known_hosts)
    keys = {key.get_base64() for f in (pi5, pi4) for key in pinned.pinned(host_id(f.address, f.port)).values()}
    assert len(keys) == 2


def test_a_stopped_emulated_board_leaves_no_process_behind(pi_boards: Callable[..., PiBoard]) -> None:
    fake = pi_boards()
    with connect(fake.board) as conn:
        conn.run(["sh", "-c", "sleep 600 >/dev/null 2>&1 &"])  # a session's straggler, detached
        assert len(fake.processes()) >= 2
        fake.stop()
    assert fake.processes() == []  # sshd, sessions and stragglers went with the PID namespace (and its mounts)
    fake.start()
    with connect(fake.board) as conn:
        assert conn.run(["true"]).ok


# ---------------------------------------------------------------- cipher choice from the CPU


@pytest.mark.parametrize(
    ("sample", "core", "aes", "first"),
    [("rpi4", "Cortex-A72", False, CHACHA), ("rpi5", "Cortex-A76", True, AES_GCM)],
)
def test_cipher_follows_captured_board_facts(
    agent: AgentCli, board_sample_env: Callable, sample: str, core: str, aes: bool, first: str
) -> None:
    cpu = agent.run("info", env=board_sample_env(sample)).document["cpu"]
    assert (cpu["core"], cpu["aes"]) == (core, aes)
    assert bulk_ciphers("auto", cpu["aes"]).split(",")[0] == first
    # The transport's own probe reads the same AT_HWCAP from the board's auxv (here: the captured one).
    auxv = BOARD_SAMPLES / sample / "sysroot" / "proc" / "self" / "auxv"
    od = subprocess.run(["od", "-An", "-v", "-tu8", "-w16", str(auxv)], capture_output=True, text=True, check=True)
    assert parse_cpu_probe("aarch64\n" + od.stdout) is aes
    # /proc/cpuinfo flags count only on x86 (on an emulated Arm board they are the host's).
    assert parse_cpu_probe("aarch64\nflags\t: fpu aes avx\n") is None
    assert parse_cpu_probe("x86_64\nflags\t: fpu sse2 aes avx\n") is True
    # The inventory's bulk_cipher wins over the facts.
    assert bulk_ciphers("aes256-gcm@openssh.com", aes).split(",")[0] == "aes256-gcm@openssh.com"
    assert bulk_ciphers(CHACHA, True).split(",")[0] == CHACHA


def _negotiated_cipher(conn: SshConnection) -> str:
    argv = [a if a != "-oLogLevel=ERROR" else "-oLogLevel=DEBUG1" for a in conn.openssh_argv(["true"])]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    line = next(line for line in done.stderr.splitlines() if "kex: server->client cipher:" in line)
    return line.split("cipher:")[1].split()[0]


def test_bulk_cipher_on_an_emulated_pi(pi_boards: Callable[..., PiBoard], tmp_path: Path) -> None:
    fake = pi_boards("pi5-cipher")
    big = tmp_path / "big.bin"
    big.write_bytes(bytes(range(256)) * (36 << 10))  # 9 MiB: over BULK_FROM, so it travels through OpenSSH
    with connect(fake.board) as conn:
        assert isinstance(conn, SshConnection)
        pushed = push_file(conn, big, kind="cache", suffix=".bin")
        # qemu's emulated CPU has the Armv8 crypto extension, as a Pi 5's Cortex-A76 does: AES-GCM.
        assert conn.board_has_aes() is True
        assert _negotiated_cipher(conn) == AES_GCM
    assert fake.local_path(pushed.remote_path).read_bytes() == big.read_bytes()
    forced = fake.board.replace(bulk_cipher=CHACHA)  # the inventory override, as for a Pi 4
    with connect(forced) as conn:
        assert isinstance(conn, SshConnection)
        big.write_bytes(big.read_bytes()[::-1])
        pushed = push_file(conn, big, kind="cache", suffix=".bin")
        assert _negotiated_cipher(conn) == CHACHA
    assert fake.local_path(pushed.remote_path).read_bytes() == big.read_bytes()


# ---------------------------------------------------------------- a mixed-architecture lab, end to end


@pytest.mark.timeout(2400)
def test_mixed_architecture_lab_end_to_end(
    pi_boards: Callable[..., PiBoard],
    sshd_boards: Callable[..., list[SshdBoard]],
    local_board: Board,
    tiny_artifacts: dict[str, LoweringResult],
    tmp_path: Path,
) -> None:
    (x86,) = sshd_boards(1, names=["x86-sshd"])
    pi = pi_boards("pi5-emu")
    pi.set_throttled(0x50005)  # under-voltage and throttled now, as a weak supply does mid-run
    pi.set_pmic(PMIC)  # a Pi 5's PMIC: the agent samples it while the runner runs (issue 55)
    # Both take a runner built on the workstation: the x86 board its own (the on-board build is test_e2e.py's), the
    # Pi the cross-built one (cached, shared with the Pi tests below). A board build under qemu-user compiles the
    # same sources as the cross build at a tenth of the speed: minutes of CI for no path of its own.
    lab = _lab(tmp_path, [local_board, x86.board.replace(**SHARED_BUILD), pi.board.replace(**SHARED_BUILD)])
    results = tmp_path / "results"
    done = fab("deploy-and-profile", "--model", "distilbert-tiny", "--backend", "portable,xnnpack", "--iterations",
               "3", "--warmup", "1", "--no-explore", "--counters=task_clock,page_faults,cycles", "--numerics",
               lab=lab, results=results, timeout=2300)  # fmt: skip
    output = done.stdout + done.stderr
    assert done.returncode == 0, output

    # The workstation fetched the executorch wheel once per platform and keeps both.
    wheels = [w.name for w in (PROJECT_ROOT / ".etlab" / "wheels").glob("executorch-*.whl")]
    assert any(w.endswith("_x86_64.whl") for w in wheels) and any(w.endswith("_aarch64.whl") for w in wheels)
    # Each board runs a runner for its own architecture.
    for fake, arch, build in [(x86, "x86_64", "workstation"), (pi, "aarch64", "workstation")]:
        state = json.loads(fake.local_path("~/.etlab/state.json").read_text())
        assert state["runner_build"] == build
        assert elf_machine(fake.local_path(state["runner_path"])) == arch

    found = bundles(results)
    for board in ("local", "x86-sshd", "pi5-emu"):
        for backend in ("portable", "xnnpack"):
            (bundle,) = found[(board, "distilbert-tiny", backend)]
            summary = json.loads((bundle / "analysis" / "summary.json").read_text())
            assert summary["status"] == "ok" and summary["correctness"]["ok"], (board, summary["correctness"])

    (pi_xnn,) = found[("pi5-emu", "distilbert-tiny", "xnnpack")]
    facts = json.loads((pi_xnn / "board_info_before.json").read_text())
    assert facts["arch"] == "aarch64" and facts["model"].startswith("Raspberry Pi 5")
    assert facts["governor"] == "ondemand" and facts["temperature_c"] == pytest.approx(48.3)
    assert facts["cpu"]["core"] == "Cortex-A76"
    # The throttling makes the run untrustworthy, and says why (emulation never earns `valid` anyway).
    validity = json.loads((pi_xnn / "analysis" / "summary.json").read_text())["validity"]
    assert validity["status"] in ("invalid", "degraded")
    assert any(r["reason"].startswith("throttling: throttled_now") for r in validity["reasons"]), validity
    # XNNPACK's Arm kernels' events land on real nodes inside each delegate.
    index = json.loads((pi_xnn / "model_explorer" / "overlays.json").read_text())
    graphs = adapter_graphs(tiny_artifacts["distilbert-tiny"].paths.pte(VARIANTS["xnnpack"]))
    delegates = {g for g in graphs if "::" in g}
    assert delegates and set(index["delegate_graphs"]) == delegates, index["left_out"]
    painted = json.loads((pi_xnn / "model_explorer" / "me_overlay_mean_ms.json").read_text())
    for graph_id in delegates:
        assert painted[graph_id]["results"] and set(painted[graph_id]["results"]) <= graphs[graph_id]

    # Counters: under qemu-user every perf_event_open fails with ENOSYS. The pass says so by name and writes no
    # counter file or column, and the memory figures are still there. The x86 boards count in software.
    pi_summary = json.loads((pi_xnn / "analysis" / "summary.json").read_text())
    counters = pi_summary["counters"]
    assert counters["captured"] == [], counters
    missing = {m["name"]: f"{m['error']} {m['reason']}" for m in counters["missing"]}
    assert set(missing) >= {"task_clock", "page_faults", "cycles"} and all("ENOSYS" in v for v in missing.values())
    assert not list((pi_xnn / "model_explorer").glob("me_overlay_task_clock*.json"))
    assert pi_summary["memory"]["peak_rss_bytes"] > 0 and pi_summary["memory"]["planned_bytes"] > 0
    (x86_xnn,) = found[("x86-sshd", "distilbert-tiny", "xnnpack")]
    x86_counters = json.loads((x86_xnn / "analysis" / "summary.json").read_text())["counters"]
    assert "task_clock" in x86_counters["captured"], x86_counters
    assert (x86_xnn / "model_explorer" / "me_overlay_task_clock.json").is_file()

    # The numerics pass on Arm's kernels (issue 53): every operator measured on the emulated Pi as on x86, and where
    # the two boards' values part ways, if they do, named.
    (local_xnn,) = found[("local", "distilbert-tiny", "xnnpack")]
    on_pi = json.loads((pi_xnn / "analysis" / "numerics.json").read_text())["operators"]
    on_x86 = json.loads((local_xnn / "analysis" / "numerics.json").read_text())["operators"]
    assert [row["node"] for row in on_pi] == [row["node"] for row in on_x86] and len(on_pi) > 20
    assert min(row["sqnr_db"] for row in on_pi) > 60, on_pi  # fp32 on Arm: its own rounding, nothing lost
    compared = fab("compare", local_xnn.name, pi_xnn.name, "--numerics", lab=lab, results=results)
    said = compared.stdout + compared.stderr
    assert compared.returncode == 0 and "operators in both" in said, said
    assert ("the runs agree" in said) != ("first divergence" in said), said

    listing = fab("boards", lab=lab, results=results)
    assert listing.returncode == 0, listing.stdout + listing.stderr
    assert "aarch64" in listing.stdout and "x86_64" in listing.stdout
    # setup-board measured each board's read bandwidth with the runner it holds, the emulated Pi's the cross-built one
    # (issue 55), and `fab boards` shows each; the bundle keeps the figure it was judged against
    for fake in (x86, pi):
        state = json.loads(fake.local_path("~/.etlab/state.json").read_text())
        measured = recorded_bandwidth(state, fake.board.name)
        assert measured is not None and measured.threads >= 1 and measured.buffer_bytes >= 16 << 20
        # and its peak: XNNPACK's fp32 and int8 GEMMs, the Pi's Arm kernels under qemu
        peak = recorded_compute(state, fake.board.name)
        assert peak is not None and peak.int8_ops_per_s is not None, state
        words = limits_cell(measured, peak).replace(",", " ").split()  # the cell wraps in a narrow column
        assert all(word in listing.stdout for word in words), (words, listing.stdout)
    pi_state = json.loads((pi_xnn / "board_info_before.json").read_text())["state"]
    assert recorded_bandwidth(pi_state, "board_info_before.json") is not None
    # Energy: the Pi's PMIC, read through its vcgencmd during the run; the x86 boards have none and say so
    pi_energy = json.loads((pi_xnn / "analysis" / "summary.json").read_text())["energy"]
    assert pi_energy["status"] == "measured" and pi_energy["mean_watts"] == pytest.approx(WATTS)
    (x86_xnn,) = found[("x86-sshd", "distilbert-tiny", "xnnpack")]
    x86_energy = json.loads((x86_xnn / "analysis" / "summary.json").read_text())["energy"]
    assert x86_energy["status"] == "not measured" and x86_energy["mean_watts"] is None

    # The health job (issue 55) reads the Pi's fake vcgencmd: under-voltage and throttled now fail it, and nothing
    # else does (the verification program runs on Arm's kernels to eager PyTorch's outputs); the x86 board passes,
    # its throttling "not measured".
    for fake, failed in ((pi, {"throttling": "under-voltage, throttled now (get_throttled 0x50005)"}), (x86, {})):
        with connect(fake.board) as conn:
            health = check_health(conn)
        assert {c.name: c.detail for c in health.checks if not c.ok} == failed, health
        checks = {c.name: c.detail for c in health.checks}
        assert "outputs match eager PyTorch's" in checks["verification"], checks
    pi.set_throttled(0x50000)  # only "occurred" bits: not now
    with connect(pi.board) as conn:
        assert check_health(conn).ok


@pytest.mark.timeout(1800)
def test_a_pi_without_a_compiler_gets_a_cross_built_runner(
    pi_boards: Callable[..., PiBoard], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "400")  # the failure table keeps its reason on one line
    # A Pi 4: qemu's Cortex-A72 has no dot-product instructions, so a runner that used one would die of SIGILL here.
    pi = pi_boards("pi4-nocc", flavour="pi4", compiler=False)
    with connect(pi.board) as conn:
        assert conn.run(["sh", "-c", "command -v g++ c++ || echo none"]).stdout.strip() == "none"
    results = tmp_path / "results"
    refused = fab("setup-board", lab=_lab(tmp_path / "board", [pi.board.replace(build="board")]), results=results)
    assert refused.returncode == 1
    message = refused.stdout + refused.stderr
    assert "no C++ compiler on the board" in message and "apt-get install -y g++" in message, message

    lab = _lab(tmp_path, [pi.board])
    setup = fab("setup-board", lab=lab, results=results)
    assert setup.returncode == 0, setup.stdout + setup.stderr
    state = json.loads(pi.local_path("~/.etlab/state.json").read_text())
    assert state["runner_build"] == "workstation"
    runner = pi.local_path(state["runner_path"])
    assert elf_machine(runner) == "aarch64"
    with connect(pi.board) as conn:
        # The runner was pushed content-addressed, and answers with the stamp of an on-board build.
        hashes = conn.run(["sh", "-c", "ls ~/.etlab/cache/*.runner"]).stdout.split()
        assert len(hashes) == 1
        answer = json.loads(conn.run([state["runner_path"], "--version"]).stdout)
    cmake_lists = (PROJECT_ROOT / "board" / "runner" / "CMakeLists.txt").read_text()
    assert f"VERSION {answer['runner_version']} " in cmake_lists and answer["runner_version"] == state["runner_version"]
    again = fab("setup-board", lab=lab, results=results)
    assert again.returncode == 0 and "already up to date" in again.stdout, again.stdout + again.stderr

    # A language model as it is used, with etlab's attention kernels, on an emulated Pi 4 and Pi 5 at once (the same
    # cross-built runner on both cores): the generate loop's ids equal eager greedy generation's (as the x86 run's
    # do), and the prefill and decode overlays land on nodes Model Explorer draws.
    pi5 = pi_boards("pi5-nocc", compiler=False)
    both = _lab(tmp_path / "both", [pi.board, pi5.board])
    generated = fab("deploy-and-profile", "--model", "smollm2-gen-tiny", "--backend", "xnnpack", "--weights",
                    "random", "--iterations", "2", "--warmup", "1", "--no-explore", lab=both, results=results,
                    timeout=1500)  # fmt: skip
    assert generated.returncode == 0, generated.stdout + generated.stderr
    sidecar = json.loads((ARTIFACT_CACHE / "smollm2-gen-tiny" / "smollm2-gen-tiny_xnnpack.json").read_text())
    assert sidecar["generation"]["attention"] == "etlab"
    graphs = adapter_graphs(ARTIFACT_CACHE / "smollm2-gen-tiny" / "smollm2-gen-tiny_xnnpack.pte")
    for board, core in (("pi4-nocc", "Cortex-A72"), ("pi5-nocc", "Cortex-A76")):
        (run,) = bundles(results)[(board, "smollm2-gen-tiny", "xnnpack")]
        assert json.loads((run / "board_info_before.json").read_text())["cpu"]["core"] == core
        summary = json.loads((run / "analysis" / "summary.json").read_text())
        assert summary["generation"]["tokens"]["agreement"] == 1.0, (board, summary["generation"])
        assert summary["generation"]["decode_tokens_per_s"] > 0 and summary["correctness"]["ok"]
        for phase in ("prefill", "decode"):
            painted = json.loads((run / "model_explorer" / f"me_overlay_{phase}_mean_ms.json").read_text())
            assert any("::" in graph for graph in painted)
            for graph_id, data in painted.items():
                assert set(data["results"]) <= graphs[graph_id]
