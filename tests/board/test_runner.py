"""The native runner, built for real and run on real tiny DistilBERT programs (portable and XNNPACK)."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import struct
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from orchestrator.fsutil import TMP_PREFIX
from orchestrator.lowering.variants import VARIANTS
from orchestrator.tensorfile import NamedTensor, read_tensors, write_tensors
from orchestrator.versions import executorch_version
from tests.plugins.processes import reaped
from tests.plugins.runner import RUNNER_SOURCE_DIR, RunnerModels, build_runner, executorch_sdk_dir

pytestmark = pytest.mark.slow

ERROR_PREFIX = "etlab_runner: error: "
TIMINGS_KEYS = {
    "runner_version": str,
    "executorch_version": str,
    "model": str,
    "method": str,
    "threads": int,
    "load_ms": float,
    "method_init_ms": float,
    "warmup_ms": list,
    "iterations_ms": list,
    "iterations_requested": int,
    "stopped_early": bool,
    "max_seconds": float,
    "etdump": bool,
    "inputs_source": str,
}
# XNNPACK operator names differ per CPU (x86 says F32, aarch64 PF32).
XNN_GEMM = re.compile(r"^Fully Connected \(NC, P?F32\) GEMM #\d+$")


def run_runner(binary: Path, *args: str | Path | int, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(binary), *map(str, args)], capture_output=True, text=True, errors="replace", timeout=timeout, check=False
    )


def error_line(completed: subprocess.CompletedProcess[str]) -> str:
    """The runner's own error: exactly one line, and the last one on stderr."""
    lines = completed.stderr.strip().splitlines()
    ours = [line for line in lines if line.startswith(ERROR_PREFIX)]
    assert len(ours) == 1, completed.stderr
    assert lines[-1] == ours[0], completed.stderr
    return ours[0]


def profile_names(etdump_path: Path) -> tuple[list[str], list[Counter[str]]]:
    """Run-data block names, and per block a count of profile event names."""
    from executorch.devtools.etdump.serialize import deserialize_from_etdump_flatcc

    etdump = deserialize_from_etdump_flatcc(etdump_path.read_bytes())
    blocks = [run.name for run in etdump.run_data]
    counts = []
    for run in etdump.run_data:
        names = Counter(
            event.profile_event.name or event.profile_event.delegate_debug_id_str
            for event in run.events or []
            if event.profile_event is not None
        )
        counts.append(names)
    return blocks, counts


def test_version_reports_the_wheels_executorch(runner_binary: Path) -> None:
    completed = run_runner(runner_binary, "--version")
    assert completed.returncode == 0, completed.stderr
    version = json.loads(completed.stdout)
    assert version["executorch_version"] == executorch_version()
    assert version["runner_version"]


def test_binary_needs_no_libtorch_or_python(runner_binary: Path) -> None:
    completed = subprocess.run(["ldd", str(runner_binary)], capture_output=True, text=True, check=True)
    libraries = completed.stdout
    assert "not found" not in libraries
    assert "libexecutorch.so" in libraries and "libexecutorch_backend_xnnpack.so" in libraries
    for forbidden in ("libtorch", "libc10", "libpython"):
        assert forbidden not in libraries, libraries


def test_build_is_reused_when_nothing_changed(runner_binary: Path) -> None:
    before = runner_binary.stat().st_mtime_ns
    assert build_runner() == runner_binary
    assert runner_binary.stat().st_mtime_ns == before


@pytest.mark.parametrize("backend", ["portable", "xnnpack"])
def test_outputs_match_eager_and_timings_follow_the_schema(
    runner_binary: Path, runner_models: RunnerModels, backend: str, tmp_path: Path
) -> None:
    outputs, timings_path = tmp_path / "outputs.etlt", tmp_path / "timings.json"
    completed = run_runner(
        runner_binary,
        "--model", runner_models.pte(backend),
        "--inputs", runner_models.inputs_etlt,
        "--warmup", "1", "--iterations", "2", "--threads", "1",
        "--outputs", outputs, "--timings", timings_path,
    )  # fmt: skip
    assert completed.returncode == 0, completed.stderr

    [logits] = read_tensors(outputs)
    assert logits.name == "output_0"
    assert logits.dtype == "float32" and logits.shape == list(runner_models.reference.shape)
    np.testing.assert_allclose(logits.array, runner_models.reference, atol=1e-4, rtol=0)

    timings = json.loads(timings_path.read_text())
    for key, kind in TIMINGS_KEYS.items():
        assert isinstance(timings[key], kind), (key, timings[key])
    assert timings["model"] == str(runner_models.pte(backend))
    assert timings["method"] == "forward"
    assert timings["threads"] == 1
    assert timings["inputs_source"] == "file"
    assert timings["etdump"] is False and timings["stopped_early"] is False
    assert timings["iterations_requested"] == 2 and timings["max_seconds"] == 0
    assert len(timings["warmup_ms"]) == 1 and len(timings["iterations_ms"]) == 2
    assert all(isinstance(ms, float) and ms > 0 for ms in timings["warmup_ms"] + timings["iterations_ms"])
    assert timings["load_ms"] > 0 and timings["method_init_ms"] > 0
    assert not [path.name for path in tmp_path.iterdir() if path.name.startswith(TMP_PREFIX)]


def test_generated_inputs_are_the_documented_ones(
    runner_binary: Path, runner_models: RunnerModels, tmp_path: Path
) -> None:
    outputs, timings_path = tmp_path / "outputs.etlt", tmp_path / "timings.json"
    completed = run_runner(
        runner_binary, "--model", runner_models.xnnpack_pte, "--iterations", "1", "--outputs", outputs,
        "--timings", timings_path,
    )  # fmt: skip
    assert completed.returncode == 0, completed.stderr
    np.testing.assert_allclose(read_tensors(outputs)[0].array, runner_models.generated_reference, atol=1e-4, rtol=0)
    timings = json.loads(timings_path.read_text())
    assert timings["inputs_source"] == "generated"
    assert timings["threads"] == os.sysconf("SC_NPROCESSORS_ONLN")


@pytest.mark.parametrize("backend", ["portable", "xnnpack"])
def test_etdump_has_one_execute_block_per_run(
    runner_binary: Path, runner_models: RunnerModels, backend: str, tmp_path: Path
) -> None:
    etdump_path, timings_path = tmp_path / "etdump.etdp", tmp_path / "timings.json"
    completed = run_runner(
        runner_binary, "--model", runner_models.pte(backend), "--inputs", runner_models.inputs_etlt,
        "--warmup", "2", "--iterations", "3", "--etdump", etdump_path, "--timings", timings_path,
    )  # fmt: skip
    assert completed.returncode == 0, completed.stderr
    assert json.loads(timings_path.read_text())["etdump"] is True

    blocks, counts = profile_names(etdump_path)
    assert blocks == ["Default"] + ["Execute"] * 5
    for names in counts[1:]:
        assert names["OPERATOR_CALL"] > 0
        xnn_gemms = [name for name in names if name and XNN_GEMM.match(name)]
        if backend == "xnnpack":
            assert names["DELEGATE_CALL"] > 0 and xnn_gemms, names
        else:
            assert names["DELEGATE_CALL"] == 0 and not xnn_gemms, names
    assert counts[1] == counts[-1]  # every run records the same events

    from executorch.devtools import Inspector

    inspector = Inspector(etdump_path=str(etdump_path))
    assert [block.name for block in inspector.event_blocks] == ["Default", "Execute"]
    frame = inspector.to_dataframe()
    assert (frame["event_name"] == "OPERATOR_CALL").any()
    assert frame["p50 (ms)"].notna().all()


def test_max_seconds_stops_early(runner_binary: Path, runner_models: RunnerModels, tmp_path: Path) -> None:
    timings_path = tmp_path / "timings.json"
    completed = run_runner(
        runner_binary, "--model", runner_models.portable_pte, "--warmup", "0", "--iterations", "1000000",
        "--max-seconds", "0.2", "--timings", timings_path,
    )  # fmt: skip
    assert completed.returncode == 0, completed.stderr
    timings = json.loads(timings_path.read_text())
    assert timings["stopped_early"] is True
    assert 1 <= len(timings["iterations_ms"]) < 1000000
    assert timings["iterations_requested"] == 1000000 and timings["max_seconds"] == 0.2


def _write_inputs(path: Path, models: RunnerModels, change: str) -> Path:
    ids, mask = (tensor.array for tensor in models.inputs)
    tensors = {
        "shape": [NamedTensor("input_ids", ids[:, :64]), NamedTensor("attention_mask", mask[:, :64])],
        "dtype": [NamedTensor("input_ids", ids.astype(np.int32)), NamedTensor("attention_mask", mask)],
        "count": [NamedTensor("input_ids", ids)],
    }[change]
    write_tensors(path, tensors)
    return path


@pytest.mark.parametrize(
    ("case", "exit_code", "message"),
    [
        ("missing model", 3, "model file not found"),
        ("random bytes", 4, "is not a valid ExecuTorch program"),
        ("truncated model", 4, "is not a valid ExecuTorch program"),
        ("empty model", 4, "is not a valid ExecuTorch program"),
        ("unknown method", 5, "method 'backward' not found"),
        ("wrong shape", 6, "expected int64 [1, 128], got int64 [1, 64]"),
        ("wrong dtype", 6, "expected int64 [1, 128], got int32 [1, 128]"),
        ("wrong count", 6, "expects 2 inputs"),
        ("not a tensor file", 6, "not an ETLT file (bad magic)"),
        ("version mismatch", 8, "ExecuTorch version mismatch"),
        ("unwritable output", 9, "cannot write"),
        ("output is a directory", 9, "Is a directory"),
        ("bad usage", 2, "unknown argument '--iterationz'"),
        ("missing model option", 2, "--model is required"),
    ],
)
def test_errors_have_an_exit_code_and_one_line(
    runner_binary: Path, runner_models: RunnerModels, tmp_path: Path, case: str, exit_code: int, message: str
) -> None:
    model = runner_models.xnnpack_pte
    args: list[str | Path] = ["--model", model, "--warmup", "0", "--iterations", "1"]
    if case == "missing model":
        args[1] = tmp_path / "absent.pte"
    elif case == "random bytes":
        args[1] = broken = tmp_path / "random.pte"
        broken.write_bytes(np.random.default_rng(0).bytes(4096))
    elif case == "truncated model":
        args[1] = broken = tmp_path / "truncated.pte"
        broken.write_bytes(model.read_bytes()[: model.stat().st_size // 2])
    elif case == "empty model":
        args[1] = broken = tmp_path / "empty.pte"
        broken.write_bytes(b"")
    elif case == "unknown method":
        args += ["--method", "backward"]
    elif case.startswith("wrong "):
        args += ["--inputs", _write_inputs(tmp_path / "inputs.etlt", runner_models, case.removeprefix("wrong "))]
    elif case == "not a tensor file":
        (tmp_path / "inputs.etlt").write_bytes(b"NOTETLT!" + bytes(16))
        args += ["--inputs", tmp_path / "inputs.etlt"]
    elif case == "version mismatch":
        args += ["--expect-executorch-version", "0.0.1"]
    elif case == "unwritable output":
        args += ["--outputs", tmp_path / "no-such-folder" / "outputs.etlt"]
    elif case == "output is a directory":
        args += ["--timings", tmp_path]
    elif case == "bad usage":
        args += ["--iterationz", "3"]
    elif case == "missing model option":
        args = ["--iterations", "1"]

    completed = run_runner(runner_binary, *args)
    assert completed.returncode == exit_code, completed.stderr
    line = error_line(completed)
    assert message in line
    if case.startswith("wrong ") and case != "wrong count":
        assert line.startswith(ERROR_PREFIX + "input 0 ('input_ids' in ")


def test_matching_version_and_inputs_file_pass(runner_binary: Path, runner_models: RunnerModels) -> None:
    completed = run_runner(
        runner_binary, "--model", runner_models.xnnpack_pte, "--inputs", runner_models.inputs_etlt,
        "--expect-executorch-version", executorch_version(), "--warmup", "0", "--iterations", "1",
    )  # fmt: skip
    assert completed.returncode == 0, completed.stderr
    assert ERROR_PREFIX not in completed.stderr


def test_board_layout_build_survives_moving_the_workdir(runner_models: RunnerModels, tmp_path: Path) -> None:
    """build.sh into <wd>/runner/<v> against <wd>/runtime/<v>; the binary finds the SDK relative to itself."""
    version = executorch_version()
    workdir = tmp_path / "wd"
    sdk = workdir / "runtime" / version
    for part in ("include", "lib", "share"):
        shutil.copytree(executorch_sdk_dir() / part, sdk / part, ignore=shutil.ignore_patterns("__pycache__"))
    tools = str(Path(sys.executable).parent)
    completed = subprocess.run(
        [
            "sh",
            str(RUNNER_SOURCE_DIR / "build.sh"),
            str(sdk),
            str(workdir / "build"),
            str(workdir / "runner" / version),
        ],
        env={**os.environ, "PATH": tools + os.pathsep + os.environ["PATH"]},
        capture_output=True,
        text=True,
        check=False,
    )
    assert completed.returncode == 0, completed.stdout + completed.stderr
    moved = workdir.rename(tmp_path / "moved")  # the absolute SDK path in the RUNPATH is now stale
    binary = moved / "runner" / version / "etlab_runner"
    libraries = subprocess.run(["ldd", str(binary)], capture_output=True, text=True, check=True).stdout
    assert f"{moved}/runner/{version}/../../runtime/{version}/lib/libexecutorch.so" in libraries, libraries
    run = run_runner(binary, "--model", runner_models.xnnpack_pte, "--warmup", "0", "--iterations", "1")
    assert run.returncode == 0, run.stderr


def test_a_crash_becomes_an_error_line_and_exit_code(runner_binary: Path, runner_models: RunnerModels) -> None:
    process = subprocess.Popen(
        [str(runner_binary), "--model", str(runner_models.portable_pte), "--warmup", "0", "--iterations", "1000000"],
        stderr=subprocess.PIPE,
        text=True,
    )
    with reaped(process):
        time.sleep(1.5)  # loading a tiny program takes milliseconds; by now it is running iterations
        process.send_signal(signal.SIGSEGV)
        _, stderr = process.communicate(timeout=60)
    completed = subprocess.CompletedProcess(process.args, process.returncode, "", stderr)
    line = error_line(completed)
    # The runner alternates between setting inputs and executing; either phase has its own exit code.
    assert (completed.returncode, line) in {
        (7, ERROR_PREFIX + "crashed with SIGSEGV while executing the method"),
        (6, ERROR_PREFIX + "crashed with SIGSEGV while setting inputs"),
    }


# ---------------------------------------------------------------- constant data read from the .pte itself


def _probe_program(binary: Path, model: Path) -> dict:
    completed = run_runner(binary, "--probe-program", "--model", model)
    assert completed.returncode == 0, completed.stderr  # never a crash, whatever the file holds
    document = json.loads(completed.stdout)
    assert set(document) == {"constants_bytes", "pte_bytes"}
    return document


def test_runner_reads_the_constants_the_lowering_counted(
    runner_binary: Path, tiny_artifacts: dict, tmp_path: Path
) -> None:
    from orchestrator.lowering.artifacts import load_artifact
    from orchestrator.lowering.builtins import BUILTIN_SPECS
    from orchestrator.lowering.export import lower as lowering
    from orchestrator.programs.memory import read_program_memory
    from tests.plugins.artifacts import ARTIFACT_CACHE

    quantized = VARIANTS["xnnpack-int8-dynamic"]
    lowering.lower(BUILTIN_SPECS["distilbert-tiny"], variants=[quantized], weights="random", root=ARTIFACT_CACHE)
    cases = [(m, VARIANTS[b]) for m in ("distilbert-tiny", "gpt2-tiny") for b in ("portable", "xnnpack")]
    for model, variant in [*cases, ("distilbert-tiny", quantized)]:
        artifact = load_artifact(model, variant, ARTIFACT_CACHE)
        timings_path = tmp_path / f"{model}-{variant}.json"
        completed = run_runner(
            runner_binary, "--model", artifact.pte, "--warmup", "0", "--iterations", "1", "--timings", timings_path
        )
        assert completed.returncode == 0, completed.stderr
        reported = json.loads(timings_path.read_text())["program_memory"]
        expected = artifact.sidecar.memory.constants_bytes
        assert reported["constants_bytes"] == expected == read_program_memory(artifact.pte).constants_bytes > 0
        assert reported["pte_bytes"] == artifact.pte.stat().st_size
        assert _probe_program(runner_binary, artifact.pte) == {
            "constants_bytes": expected,
            "pte_bytes": artifact.pte.stat().st_size,
        }


def test_runner_reads_inline_constants_of_a_program_without_segments(
    runner_binary: Path, runner_models: RunnerModels, tmp_path: Path
) -> None:
    """The deprecated layout: constants in constant_buffer, no extended header. This ExecuTorch build refuses to
    run it, but the runner's reader takes that path, and must agree with memory.py."""
    from executorch.exir._serialize._program import _program_to_flatbuffer, deserialize_pte_binary

    from orchestrator.programs.memory import read_program_memory

    program = deserialize_pte_binary(runner_models.portable_pte.read_bytes()).program
    assert program.constant_buffer and not program.segments
    inline = tmp_path / "inline.pte"
    inline.write_bytes(_program_to_flatbuffer(program, constant_tensor_alignment=16).data)
    assert inline.read_bytes()[8:12] != b"eh00"
    expected = read_program_memory(inline).constants_bytes
    assert expected == read_program_memory(runner_models.portable_pte).constants_bytes > 0
    assert _probe_program(runner_binary, inline)["constants_bytes"] == expected


def test_a_garbled_program_gives_null_constants_and_no_crash(
    runner_binary: Path, runner_models: RunnerModels, tmp_path: Path
) -> None:
    model = runner_models.portable_pte
    data = model.read_bytes()
    assert data[8:12] == b"eh00"
    program_size, segment_base = struct.unpack_from("<QQ", data, 16)
    (root,) = struct.unpack_from("<I", data, 0)

    def patched(offset: int, fmt: str, value: int) -> bytes:
        copy = bytearray(data)
        struct.pack_into(fmt, copy, offset, value)
        return bytes(copy)

    cases = {
        "empty": b"",
        "truncated header": data[:20],
        "truncated flatbuffer": data[: program_size // 2],
        "truncated constant segment": data[: segment_base + 100],  # the flatbuffer is whole, its constants are not
        "not ET12": data[:4] + b"ET99" + data[8:],
        "root past the end": patched(0, "<I", 0xFFFFFFF0),
        "program size past the end": patched(16, "<Q", len(data) + 1),
        "header length too short": patched(12, "<I", 8),
        "vtable past the end": patched(root, "<i", -(2**31)),
    }
    for name, content in cases.items():
        path = tmp_path / f"{name.replace(' ', '-')}.pte"
        path.write_bytes(content)
        assert _probe_program(runner_binary, path) == {"constants_bytes": None, "pte_bytes": len(content)}, name
    # ExecuTorch's own loader still rejects them in a run, with the same exit code as before.
    run = run_runner(runner_binary, "--model", tmp_path / "truncated-flatbuffer.pte", "--iterations", "1")
    assert run.returncode == 4 and "is not a valid ExecuTorch program" in error_line(run)

    # Random bytes anywhere in the flatbuffer: a figure or null, never a crash or a hang.
    rng = np.random.default_rng(13)
    garbled = tmp_path / "garbled.pte"
    nulls = 0
    for _ in range(120):
        copy = bytearray(data)
        for position in rng.integers(0, program_size, size=16):
            copy[position] = int(rng.integers(0, 256))
        garbled.write_bytes(copy)
        value = _probe_program(runner_binary, garbled)["constants_bytes"]
        assert value is None or (isinstance(value, int) and value >= 0)
        nulls += value is None
    assert nulls > 0  # the garbling did reach what the reader checks


def test_probe_program_needs_a_readable_model(runner_binary: Path, tmp_path: Path) -> None:
    usage = run_runner(runner_binary, "--probe-program")
    assert usage.returncode == 2 and "--probe-program needs --model" in error_line(usage)
    missing = run_runner(runner_binary, "--probe-program", "--model", tmp_path / "absent.pte")
    assert missing.returncode == 3 and "model file not found" in error_line(missing)
