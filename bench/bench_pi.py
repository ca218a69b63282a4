"""Emulated Raspberry Pi boards (orchestrator/testing/pi.py): what they cost on this machine.

Rootfs restore, board start, first connection and later commands, `setup-board` fresh (runner built on the
board) and up to date, the on-board build against the workstation cross build, and the tiny models' latency
emulated vs native (same .pte, same inputs, same runner sources, 1 thread). Needs root and what
`./bootstrap.sh --test` installs; the tiny models come from the test cache (`pytest tests/lowering/test_lowering.py`
or any test that uses them fills it).

    sudo .venv/bin/python bench/bench_pi.py [--iterations 10] [--flavour pi5]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

PROJECT_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(PROJECT_ROOT))

from orchestrator import console  # noqa: E402
from orchestrator.deploy import crossbuild  # noqa: E402
from orchestrator.deploy.agent_client import BoardAgent  # noqa: E402
from orchestrator.deploy.payload import fetch_wheel, tree_sha256  # noqa: E402
from orchestrator.deploy.provision import setup_board  # noqa: E402
from orchestrator.lowering.artifacts import load_artifact  # noqa: E402
from orchestrator.lowering.variants import Variant  # noqa: E402
from orchestrator.paths import BOARD_SOURCE_DIR, state_dir  # noqa: E402
from orchestrator.testing.pi import rootfs_archive, start_pi_board, unpack_rootfs  # noqa: E402
from orchestrator.testing.sshd import SshdLab  # noqa: E402
from orchestrator.transport import connect  # noqa: E402
from orchestrator.transport.transfer import push_file  # noqa: E402
from orchestrator.versions import executorch_version  # noqa: E402

T = TypeVar("T")
MODELS = ("distilbert-tiny", "gpt2-tiny")
BACKENDS = ("portable", "xnnpack")


def timed(fn: Callable[[], T]) -> tuple[float, T]:
    started = time.perf_counter()
    value = fn()
    return time.perf_counter() - started, value


def median_ms(timings: dict[str, Any]) -> float:
    return statistics.median(timings["iterations_ms"])


def native_runner() -> Path:
    from tests.plugins.runner import build_runner

    return build_runner()


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--iterations", type=int, default=10)
    parser.add_argument("--flavour", default="pi5")
    args = parser.parse_args()
    rows: list[list[object]] = []

    archive = rootfs_archive()
    with tempfile.TemporaryDirectory(prefix="etlab-bench-pi-") as scratch:
        seconds = unpack_rootfs(archive, Path(scratch) / "rootfs")
        rows.append(["rootfs restore (tar.zst -> dir)", f"{seconds:.1f} s", f"{archive.stat().st_size >> 20} MiB"])

    lab = SshdLab(Path(tempfile.mkdtemp(prefix="etlab-bench-pi-lab-")))
    try:
        seconds, fake = timed(lambda: start_pi_board(lab, "bench-pi", flavour=args.flavour))
        rows.append(["board start (sshd listening)", f"{seconds:.2f} s", "rootfs already unpacked"])
        started = time.perf_counter()
        with connect(fake.board) as conn:
            conn.run(["true"])
            rows.append(["first command (connect + exec)", f"{time.perf_counter() - started:.2f} s", ""])
            laps = []
            for _ in range(10):
                lap, _ = timed(lambda: conn.run(["true"]))
                laps.append(lap)
            rows.append(["later commands", f"{statistics.median(laps) * 1000:.0f} ms", "median of 10"])

            seconds, report = timed(lambda: setup_board(conn))
            rows.append(
                ["setup-board, fresh (runner built on the board)", f"{seconds:.0f} s", "; ".join(report.actions)]
            )
            seconds, _ = timed(lambda: setup_board(conn))
            rows.append(["setup-board, up to date", f"{seconds:.1f} s", ""])

            workdir = json.loads(conn.run(["sh", "-c", "cat ~/.etlab/state.json"]).stdout)
            runner = workdir["runner_path"]
            wd = runner.rsplit("/runner/", 1)[0]
            agent = BoardAgent(conn, wd)
            sdk = f"{wd}/runtime/{executorch_version()}"
            built = agent.build_runner(sdk, f"{wd}/board/runner", f"{wd}/bench-runner")
            rows.append(["runner build on the board (again)", f"{built['duration_s']:.0f} s", built["compiler"]])

            compiler = crossbuild.find_cross_compiler("aarch64")
            if compiler is not None:
                facts = {"arch": "aarch64", "glibc": "2.36", "python": "3.11.2"}
                wheel = fetch_wheel("executorch", f"executorch=={executorch_version()}", facts, any_python=True)
                source = BOARD_SOURCE_DIR / "runner"
                bench_key = f"{tree_sha256(source)}-bench-{time.time_ns()}"  # a key never built: a real build
                seconds, _ = timed(
                    lambda: crossbuild.cross_build_runner(compiler, wheel, source, bench_key, executorch_version())
                )
                rows.append(["runner cross build on the workstation", f"{seconds:.0f} s", compiler.cxx])

            native = native_runner()
            for model in MODELS:
                for backend in BACKENDS:
                    artifact = load_artifact(model, Variant(backend), state_dir() / "test-cache" / "artifacts")
                    inputs = artifact.paths.reference_inputs
                    remote_pte = push_file(conn, artifact.pte, kind="models", suffix=".pte").remote_path
                    remote_in = push_file(conn, inputs, kind="inputs", suffix=".etlt").remote_path
                    common = ["--warmup", "2", "--iterations", str(args.iterations), "--threads", "1"]
                    timings_remote = f"{wd}/bench-timings.json"
                    conn.run([runner, "--model", remote_pte, "--inputs", remote_in, *common,
                              "--timings", timings_remote], timeout=3600)  # fmt: skip
                    emulated = median_ms(json.loads(conn.run(["cat", timings_remote]).stdout))
                    with tempfile.TemporaryDirectory() as here:
                        local_timings = Path(here) / "t.json"
                        subprocess.run([str(native), "--model", str(artifact.pte), "--inputs", str(inputs), *common,
                                        "--timings", str(local_timings)], check=True, capture_output=True)  # fmt: skip
                        measured = median_ms(json.loads(local_timings.read_text()))
                    rows.append(
                        [f"{model} {backend}, 1 thread", f"{emulated / measured:.0f}×",
                         f"emulated {emulated:.1f} ms / native {measured:.2f} ms (median of {args.iterations})"]
                    )  # fmt: skip
    finally:
        lab.close()
    console.table("Emulated Raspberry Pi", ["what", "figure", "detail"], rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
