"""`profile`: run the native runner once under the board lock and leave a complete result bundle.

The bundle is assembled in `<wd>/bundles/.tmp-<run-id>` and renamed into place at the end, so a bundle folder
that exists is complete; `result_manifest.json` is written last and hashes every other file in it.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import shutil
import signal
import threading
import time
from pathlib import Path
from typing import Any

from . import AGENT_VERSION
from .counters import run_counters_pass
from .energy import EnergySampler
from .errors import AgentError, BadInput
from .files import atomic_write_json, fsync_path, log, sha256_file, utc_now
from .info import collect_info
from .lock import BoardLock, describe_holder
from .numerics import run_numerics_pass
from .process import RunOutcome, StartGate, StopRequest, run_in_own_group
from .state import read_state, runner_from_state
from .workdir import Workdir, validate_run_id

MANIFEST_SCHEMA = 1
RUN_SCHEMA = 1
MANIFEST_NAME = "result_manifest.json"
RUNNER_ERROR_PREFIX = "etlab_runner: error:"
SHA256_PATTERN = re.compile(r"[0-9a-f]{64}")
DEFAULT_TIMEOUT_SECONDS = 1800.0
DEFAULT_LOCK_TIMEOUT_SECONDS = 600.0
DEFAULT_KILL_GRACE_SECONDS = 5.0


class ProfileRequest:
    def __init__(
        self,
        model: Path,
        run_id: str,
        inputs: Path | None = None,
        labels: dict[str, str] | None = None,
        warmup: int | None = None,
        iterations: int | None = None,
        threads: int | None = None,
        max_seconds: float | None = None,
        method: str | None = None,
        timeout: float = DEFAULT_TIMEOUT_SECONDS,
        lock_timeout: float = DEFAULT_LOCK_TIMEOUT_SECONDS,
        etdump: bool = True,
        runner: Path | None = None,
        kill_grace: float = DEFAULT_KILL_GRACE_SECONDS,
        counters: str | None = None,
        numerics: tuple[Path, Path] | None = None,
        numerics_full_cap: int | None = None,
        numerics_inputs: Path | None = None,
        generate: bool = False,
        prompt_len: int | None = None,
        new_tokens: int | None = None,
        context: int | None = None,
    ) -> None:
        self.model = model
        self.run_id = run_id
        self.inputs = inputs
        self.labels = dict(labels or {})
        self.warmup = warmup
        self.iterations = iterations
        self.threads = threads
        self.max_seconds = max_seconds
        self.method = method
        self.timeout = timeout
        self.lock_timeout = lock_timeout
        self.etdump = etdump
        self.runner = runner
        self.kill_grace = kill_grace
        self.counters = counters  # a counters pass after the timing pass: "default" or "a,b,c"
        self.numerics = numerics  # a numerics pass after it: (numerics program, its reference values)
        self.numerics_full_cap = numerics_full_cap  # its tensors kept too, up to these bytes
        # its own inputs: a generate run's numerics pass is one prefill call (input ids and their positions)
        self.numerics_inputs = numerics_inputs
        # The runner's generate mode: each run is a prefill and new_tokens - 1 decode steps.
        self.generate = generate
        self.prompt_len = prompt_len
        self.new_tokens = new_tokens
        self.context = context

    def parameters(self) -> dict[str, Any]:
        return {
            "warmup": self.warmup,
            "iterations": self.iterations,
            "threads": self.threads,
            "max_seconds": self.max_seconds,
            "method": self.method,
            "timeout": self.timeout,
            "lock_timeout": self.lock_timeout,
            "etdump": self.etdump,
            "kill_grace": self.kill_grace,
            "counters": self.counters,
            "numerics": [str(path) for path in self.numerics] if self.numerics else None,
            "numerics_full_cap": self.numerics_full_cap,
            "numerics_inputs": str(self.numerics_inputs) if self.numerics_inputs else None,
            "generate": self.generate,
            "prompt_len": self.prompt_len,
            "new_tokens": self.new_tokens,
            "context": self.context,
        }


def _existing_file(path: Path, what: str) -> Path:
    path = Path(path).expanduser()
    if not path.is_file():
        raise BadInput(f"{what} {path} does not exist or is not a file")
    return path.absolute()


class CorruptContent(AgentError):
    """A model or inputs file on the board no longer has the content its name and sidecar promise."""


def _expected_sha256(path: Path) -> tuple[str | None, str | None]:
    """What the file should hash to, and why: its content-addressed name (`<sha256>.pte`), else its sidecar."""
    stem = path.name.split(".", 1)[0]
    if SHA256_PATTERN.fullmatch(stem):
        return stem, "name"
    try:
        words = Path(f"{path}.sha256").read_text(encoding="utf-8").split()
    except (OSError, UnicodeDecodeError):
        return None, None
    if words and SHA256_PATTERN.fullmatch(words[0].lower()):
        return words[0].lower(), "sidecar"
    return None, None


def verify_file(workdir: Workdir, path: Path, what: str) -> tuple[str, float]:
    """Hash the file that is about to run (never trust the sidecar: SD cards rot and boards are shared); returns
    its sha256 and the milliseconds it took. A content-addressed copy in the workdir that does not match is removed
    with its sidecar, so the next push sends it again, and the run fails."""
    started = time.monotonic()
    digest = sha256_file(path)
    elapsed_ms = (time.monotonic() - started) * 1000.0
    expected, source = _expected_sha256(path)
    if expected is None or digest == expected:
        return digest, elapsed_ms
    removed = []
    if _inside(workdir, path):
        for victim in (path, Path(f"{path}.sha256")):
            with contextlib.suppress(FileNotFoundError):
                victim.unlink()
                removed.append(str(victim))
    raise CorruptContent(
        f"{what} on board is corrupt: {path} has sha256 {digest} but its {source} says {expected}; "
        + ("removed it and its sidecar, push it again" if removed else "replace it"),
        path=str(path),
        expected_sha256=expected,
        found_sha256=digest,
        removed=removed,
    )


class Verification:
    """The model and inputs hashed in a thread, so the runner loads and initialises them meanwhile; the runner waits
    at `--start-fd` and executes nothing until both match (`StartGate`), and `result()` raises what `verify_file`
    raised (CorruptContent) before anything is reported."""

    def __init__(self, workdir: Workdir, request: ProfileRequest) -> None:
        self.workdir, self.request = workdir, request
        self.done = threading.Event()
        self._verified: dict[str, Any] | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="etlab-verify", daemon=True)

    def start(self) -> Verification:
        self._thread.start()
        return self

    def _run(self) -> None:
        try:
            model_sha256, model_ms = verify_file(self.workdir, self.request.model, "model")
            inputs_sha256, inputs_ms = (
                verify_file(self.workdir, self.request.inputs, "inputs file")
                if self.request.inputs is not None
                else (None, 0.0)
            )
            self._verified = {
                "model_sha256": model_sha256,
                "inputs_sha256": inputs_sha256,
                "hashing_ms": {"model": round(model_ms, 3), "inputs": round(inputs_ms, 3)},
            }
        except BaseException as exc:  # handed to the main thread by result()
            self._error = exc
        finally:
            self.done.set()

    def ok(self) -> bool:
        """Once done: whether both files are what their names say (the gate's verdict)."""
        return self._error is None

    def gate(self) -> StartGate:
        return StartGate(self.done, self.ok)

    def result(self) -> dict[str, Any]:
        """Wait for the hashes; their figures for run.json, or the error that refuses the run."""
        self._thread.join()
        if self._error is not None:
            raise self._error
        assert self._verified is not None
        return self._verified


def _inside(workdir: Workdir, path: Path) -> bool:
    try:
        path.resolve().relative_to(workdir.root.resolve())
    except (OSError, ValueError, RuntimeError):
        return False
    return True


def runner_error_line(log_path: Path) -> str | None:
    """The runner's last `etlab_runner: error: ...` line in its log, if any."""
    try:
        with open(str(log_path), "rb") as handle:
            handle.seek(0, os.SEEK_END)
            handle.seek(max(0, handle.tell() - 65536))
            tail = handle.read().decode("utf-8", errors="replace")
    except OSError:
        return None
    lines = [line.strip() for line in tail.splitlines() if line.strip().startswith(RUNNER_ERROR_PREFIX)]
    return lines[-1] if lines else None


def _numerics_pass(
    workdir: Workdir,
    request: ProfileRequest,
    files: tuple[Path, Path],
    argv: list[str],
    bundle: Path,
    lock: BoardLock,
    stop: StopRequest,
) -> dict[str, Any]:
    """The numerics pass, its files hashed against their names first (a mismatch fails the pass, not the run)."""
    try:
        verify_file(workdir, files[0], "numerics program")
        verify_file(workdir, files[1], "numerics reference")
        if request.numerics_inputs is not None:
            verify_file(workdir, request.numerics_inputs, "numerics inputs")
    except CorruptContent as exc:
        return {"status": "failed", "error": str(exc), "mode": None, "argv": None, "exit_code": None}
    assert lock.fd is not None
    return run_numerics_pass(
        argv,
        bundle,
        files,
        request.numerics_full_cap,
        request.timeout,
        request.kill_grace,
        (lock.fd,),
        stop,
        inputs=request.numerics_inputs,
    )


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def judge(outcome: RunOutcome, bundle: Path, request: ProfileRequest, timeout: float) -> tuple[str, str | None]:
    """The bundle's status (ok, failed, timeout) and one-line error."""
    error_line = runner_error_line(bundle / "runner.log")
    if outcome.timed_out:
        return "timeout", f"runner exceeded the {timeout:g} s timeout; its process group was killed"
    if outcome.spawn_error:
        return "failed", outcome.spawn_error
    if outcome.interrupted_by:
        return "failed", f"the agent received {outcome.interrupted_by}; the runner was stopped"
    code = outcome.exit_code
    if code is None or code < 0:
        return "failed", error_line or f"runner was killed by {_signal_name(-(code or 0))}"
    if code != 0:
        return "failed", error_line or f"runner exited with code {code}"
    expected = ["timings.json", "outputs.etlt"] + (["etdump.etdp"] if request.etdump else [])
    missing = [name for name in expected if not (bundle / name).is_file()]
    if missing:
        return "failed", f"runner exited 0 but did not write {', '.join(missing)}"
    return "ok", None


def runner_argv(
    runner: Path, request: ProfileRequest, bundle: Path, expect_version: str | None, start_fd: int | None = None
) -> list[str]:
    argv = [str(runner), "--model", str(request.model)]
    if request.inputs is not None:
        argv += ["--inputs", str(request.inputs)]
    optional: list[tuple[str, Any]] = [
        ("--method", request.method),
        ("--warmup", request.warmup),
        ("--iterations", request.iterations),
        ("--threads", request.threads),
        ("--max-seconds", request.max_seconds),
    ]
    if request.generate:
        argv.append("--generate")
        optional += [
            ("--prompt-len", request.prompt_len),
            ("--new-tokens", request.new_tokens),
            ("--context", request.context),
        ]
    for flag, value in optional:
        if value is not None:
            argv += [flag, f"{value:g}" if isinstance(value, float) else str(value)]
    if request.etdump:
        argv += ["--etdump", str(bundle / "etdump.etdp")]
    argv += ["--outputs", str(bundle / "outputs.etlt"), "--timings", str(bundle / "timings.json")]
    if expect_version:
        argv += ["--expect-executorch-version", expect_version]
    if start_fd is not None:
        argv += ["--start-fd", str(start_fd)]
    return argv


def write_manifest(bundle: Path, head: dict[str, Any]) -> dict[str, Any]:
    """Hash every file in the bundle (fsyncing it) and write result_manifest.json last."""
    files: dict[str, dict[str, Any]] = {}
    for path in sorted(bundle.iterdir()):
        if path.name == MANIFEST_NAME or not path.is_file():
            continue
        fsync_path(path)
        files[path.name] = {"sha256": sha256_file(path), "size": path.stat().st_size}
    manifest = dict(head, files=files, created_at=utc_now())
    atomic_write_json(bundle / MANIFEST_NAME, manifest)
    return manifest


def _touch_if_managed(workdir: Workdir, path: Path | None) -> None:
    """Mark a workdir model/input as used now, so gc keeps recently used ones (atime is unreliable)."""
    if path is None:
        return
    with contextlib.suppress(OSError, ValueError):
        path.resolve().relative_to(workdir.root.resolve())
        os.utime(str(path))


def profile(workdir: Workdir, request: ProfileRequest) -> dict[str, Any]:
    """Run one profile; returns {"run_id", "bundle", "status", "error"}. Raises AgentError before the run starts."""
    validate_run_id(request.run_id)
    request.model = _existing_file(request.model, "model")
    if request.inputs is not None:
        request.inputs = _existing_file(request.inputs, "inputs file")
    if request.numerics is not None:
        if request.generate and request.numerics_inputs is None:
            raise BadInput("a generate run's numerics pass is one forward call: it needs --numerics-inputs")
        request.numerics = (
            _existing_file(request.numerics[0], "numerics program"),
            _existing_file(request.numerics[1], "numerics reference"),
        )
    if request.numerics_inputs is not None:
        if request.numerics is None:
            raise BadInput("--numerics-inputs needs --numerics-model")
        request.numerics_inputs = _existing_file(request.numerics_inputs, "numerics inputs")
    state = read_state(workdir)
    if request.runner is not None:
        runner = Path(request.runner).expanduser().absolute()
        if not (runner.is_file() and os.access(str(runner), os.X_OK)):
            raise BadInput(f"runner {runner} does not exist or is not executable")
        expect_version = str(state["executorch_version"]) if state and state.get("executorch_version") else None
    else:
        runner, expect_version = runner_from_state(workdir)
    final = workdir.bundle(request.run_id)
    if final.exists():
        raise BadInput(f"bundle {final} already exists: choose a new run id")

    workdir.ensure()
    lock = BoardLock(workdir)
    waited = lock.acquire(describe_holder("profile", request.run_id), request.lock_timeout)
    try:
        # From here on a SIGTERM/SIGHUP stops the runner but the bundle is still finished and renamed into place.
        with StopRequest() as stop:
            return _profile_locked(workdir, request, runner, expect_version, lock, waited, stop)
    finally:
        lock.release()


def _profile_locked(
    workdir: Workdir,
    request: ProfileRequest,
    runner: Path,
    expect_version: str | None,
    lock: BoardLock,
    waited: float,
    stop: StopRequest,
) -> dict[str, Any]:
    final = workdir.bundle(request.run_id)
    if final.exists():  # created by another caller while we waited for the lock
        raise BadInput(f"bundle {final} already exists: choose a new run id")
    tmp = workdir.tmp_bundle(request.run_id)
    if tmp.exists():  # left by a killed agent; we hold the lock, so nobody is writing it
        shutil.rmtree(str(tmp))

    # Under the lock: gc cannot remove what we hash, and nobody replaces it before the runner opens it. The hashing
    # overlaps the board facts and the runner's load and init; the runner executes nothing before both files match,
    # and a mismatch fails the run (CorruptContent, no bundle) whatever the runner did meanwhile.
    verification = Verification(workdir, request).start()
    try:
        tmp.mkdir(parents=True)
        return _run_into(workdir, request, runner, expect_version, lock, waited, stop, tmp, verification)
    except BaseException as exc:
        # A run that cannot finish its bundle leaves nothing behind: no half bundle eating a full disk.
        shutil.rmtree(str(tmp), ignore_errors=True)
        verification.result()  # a file that does not match is the reason, whatever else went wrong meanwhile
        if isinstance(exc, OSError) and exc.errno == errno.ENOSPC:
            where = exc.filename or workdir.bundles
            raise AgentError(f"no space left on {where}", path=str(where)) from exc
        raise


def _run_into(
    workdir: Workdir,
    request: ProfileRequest,
    runner: Path,
    expect_version: str | None,
    lock: BoardLock,
    waited: float,
    stop: StopRequest,
    tmp: Path,
    verification: Verification,
) -> dict[str, Any]:
    """Run the runner with the bundle assembling in `tmp`; rename it into place when complete."""
    final = workdir.bundle(request.run_id)
    gate = verification.gate()
    argv = runner_argv(runner, request, tmp, expect_version, start_fd=gate.read_fd)
    log(f"run {request.run_id}: {' '.join(argv)}")
    assert lock.fd is not None

    def describe_board() -> None:  # while the runner loads and waits at the gate: before it executes anything
        atomic_write_json(tmp / "board_info_before.json", collect_info(workdir, runner))

    # The PMIC (a Pi 5's) read while the runner runs; nothing on a board without one (energy.py).
    energy = EnergySampler().start()
    # The runner inherits the lock, so if this agent is killed the board stays locked until the runner is gone.
    try:
        outcome = run_in_own_group(
            argv,
            tmp / "runner.log",
            request.timeout,
            request.kill_grace,
            pass_fds=(lock.fd,),
            stop=stop,
            gate=gate,
            while_held=describe_board,
        )
    finally:
        energy.stop()
    energy.executing(gate.opened_at)
    energy.write(tmp)
    if not (tmp / "board_info_before.json").exists():  # the runner never started (spawn error, stopped before)
        describe_board()
    verified = verification.result()  # CorruptContent here: the runner never ran, and nothing is reported
    model_sha256 = verified["model_sha256"]
    _touch_if_managed(workdir, request.model)
    _touch_if_managed(workdir, request.inputs)
    status, error = judge(outcome, tmp, request, request.timeout)
    counters_pass = None
    if request.counters and not request.etdump:
        counters_pass = {"requested": request.counters, "status": "failed", "error": "needs the ETDump it is keyed by"}
    elif request.counters and status == "ok" and not stop.signal_name:
        counters_pass = run_counters_pass(
            argv, tmp, request.counters, request.timeout, request.kill_grace, (lock.fd,), stop
        )
    numerics_pass = None
    if request.numerics is not None and status == "ok" and not stop.signal_name:
        numerics_pass = _numerics_pass(workdir, request, request.numerics, argv, tmp, lock, stop)
    atomic_write_json(tmp / "board_info_after.json", collect_info(workdir, runner))
    run = {
        "schema": RUN_SCHEMA,
        "run_id": request.run_id,
        "agent_version": AGENT_VERSION,
        "model": str(request.model),
        "model_sha256": model_sha256,
        "model_sha256_source": "computed",
        "model_size": request.model.stat().st_size,
        "inputs": str(request.inputs) if request.inputs is not None else None,
        "inputs_sha256": verified["inputs_sha256"],
        "hashing_ms": verified["hashing_ms"],
        "energy": energy.record(),
        "labels": request.labels,
        "parameters": request.parameters(),
        "runner": str(runner),
        "runner_argv": argv,
        "expect_executorch_version": expect_version,
        "lock_holder": lock.holder,
        "lock_waited_s": round(waited, 3),
        "lock_acquired_at": lock.holder["acquired_at"] if lock.holder else None,
        "started_at": outcome.started_at,
        "ended_at": outcome.ended_at,
        "duration_s": round(outcome.duration_s, 6),
        "runner_exit_code": outcome.exit_code,
        "timed_out": outcome.timed_out,
        "interrupted_by": outcome.interrupted_by,
        "spawn_error": outcome.spawn_error,
        "counters_pass": counters_pass,
        "numerics_pass": numerics_pass,
    }
    atomic_write_json(tmp / "run.json", run)
    write_manifest(
        tmp,
        {
            "schema": MANIFEST_SCHEMA,
            "run_id": request.run_id,
            "status": status,
            "error": error,
            "runner_exit_code": outcome.exit_code,
            "model_sha256": model_sha256,
            "inputs_sha256": verified["inputs_sha256"],
            "agent_version": AGENT_VERSION,
        },
    )
    os.rename(str(tmp), str(final))
    fsync_path(workdir.bundles)
    log(f"run {request.run_id}: {status}" + (f" ({error})" if error else ""))
    return {"run_id": request.run_id, "bundle": str(final), "status": status, "error": error}
