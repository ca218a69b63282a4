"""What we do with a provisioned board: push an artifact, profile it through the agent, pull the bundle.

Each function is one step for one board and one artifact; deploy/cells.py chains them, and boards/fanout.py
runs boards in parallel.
"""

from __future__ import annotations

import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from rich.progress import Progress

from orchestrator import __version__
from orchestrator.deploy.agent_client import BoardAgent, GenerateArgs, NumericsArgs
from orchestrator.errors import BoardError
from orchestrator.lowering.artifacts import Artifact
from orchestrator.lowering.export.numerics import NumericsProgram
from orchestrator.results.store import bundle_dest
from orchestrator.transport import BoardConnection
from orchestrator.transport.pull import pull_bundle
from orchestrator.transport.transfer import PushResult, push_file


@dataclass(frozen=True)
class RunParams:
    """How a run goes; built from checked values only (commands/options.py, the matrix's checker)."""

    warmup: int = 3
    iterations: int = 20
    threads: int | None = None  # None: the board's inventory setting, else the runner's default (all cores)
    max_seconds: float | None = 120.0  # the time budget; a portable GPT-2 iteration alone takes ~19 s
    timeout: float | None = None  # hard runner timeout; derived from the budget when None
    lock_timeout: float = 3600.0
    etdump: bool = True
    counters: tuple[str, ...] | None = None  # a single-threaded counters pass after the timing pass
    numerics: Literal["stats", "full"] | None = None  # a numerics pass after it: statistics, or the tensors too
    new_tokens: int | None = None  # text-generation: tokens per generation; None: the program's default

    def runner_timeout(self) -> float:
        if self.timeout:
            return self.timeout
        # Generous: the budget bounds the timed loop, not loading or a slow first run.
        return max(600.0, 4 * (self.max_seconds or 0) + 300.0)


# `--numerics full` keeps the tapped tensors themselves up to this many bytes (the statistics cover every tap).
NUMERICS_FULL_CAP_BYTES = 256 * 1024 * 1024


@dataclass(frozen=True)
class PushedArtifact:
    model: PushResult
    inputs: PushResult


@dataclass(frozen=True)
class PushedNumerics:
    """A numerics program, its fp32 reference values and its own inputs (when it has them) on the board
    (content-addressed)."""

    model: PushResult
    reference: PushResult
    inputs: PushResult | None = None


@dataclass(frozen=True)
class RemoteRun:
    board: str
    run_id: str
    bundle: str  # path on the board
    status: str  # ok | failed | timeout
    error: str | None


def push_artifact(conn: BoardConnection, artifact: Artifact, progress: Progress | None = None) -> PushedArtifact:
    """The .pte and its reference inputs, content-addressed on the board."""
    model = push_file(conn, artifact.pte, kind="models", suffix=".pte", sha256=artifact.sha256, progress=progress)
    inputs_path = artifact.paths.reference_inputs
    inputs = push_file(
        conn,
        inputs_path,
        kind="inputs",
        suffix=".etlt",
        sha256=artifact.sidecar.reference_inputs_sha256,
        progress=progress,
    )
    return PushedArtifact(model, inputs)


def push_numerics(conn: BoardConnection, numerics: NumericsProgram, progress: Progress | None = None) -> PushedNumerics:
    """The numerics program, its reference values and its own inputs, content-addressed on the board beside the
    timed programs."""
    record = numerics.record
    model = push_file(conn, numerics.pte, kind="models", suffix=".pte", sha256=record.sha256, progress=progress)
    reference = push_file(
        conn, numerics.reference, kind="inputs", suffix=".etlt", sha256=record.reference_sha256, progress=progress
    )
    inputs = None
    if numerics.inputs is not None and record.inputs_sha256 is not None:
        inputs = push_file(
            conn, numerics.inputs, kind="inputs", suffix=".etlt", sha256=record.inputs_sha256, progress=progress
        )
    return PushedNumerics(model, reference, inputs)


def run_labels(conn: BoardConnection, artifact: Artifact) -> dict[str, str]:
    """Recorded in the bundle's run.json, so a bundle says what it is without the workstation's state."""
    return {
        "board": conn.board.name,
        "model": artifact.model,
        "backend": artifact.variant.name,
        "pte_sha256": artifact.sha256,
        "weights": artifact.sidecar.weights,
        "torch": artifact.sidecar.versions.get("torch", ""),
        "executorch": artifact.sidecar.versions.get("executorch", ""),
        "transformers": artifact.sidecar.versions.get("transformers", ""),
        "workstation": socket.gethostname(),
        "etlab": __version__,
    }


def profile(
    conn: BoardConnection,
    artifact: Artifact,
    pushed: PushedArtifact,
    params: RunParams,
    run_id: str,
    numerics: PushedNumerics | None = None,
) -> RemoteRun:
    """One profiling run under the board lock, with `numerics` a numerics pass after it (`params.numerics` says
    how much it keeps). A failed run still leaves its bundle on the board."""
    threads = params.threads or conn.board.threads
    document, _ = BoardAgent(conn, conn.workdir).profile(
        model=pushed.model.remote_path,
        run_id=run_id,
        inputs=pushed.inputs.remote_path,
        labels=run_labels(conn, artifact) | {"run_id": run_id},
        warmup=params.warmup,
        iterations=params.iterations,
        threads=threads,
        max_seconds=params.max_seconds,
        timeout=params.runner_timeout(),
        lock_timeout=params.lock_timeout,
        etdump=params.etdump,
        counters=",".join(params.counters) if params.counters else None,
        numerics=(
            NumericsArgs(
                numerics.model.remote_path,
                numerics.reference.remote_path,
                NUMERICS_FULL_CAP_BYTES if params.numerics == "full" else None,
                numerics.inputs.remote_path if numerics.inputs is not None else None,
            )
            if numerics is not None
            else None
        ),
        generate=generate_args(artifact, params),
    )
    if "bundle" not in document:
        raise BoardError(f"{conn.board.name}: profile produced no bundle: {document.get('error', document)}")
    return RemoteRun(conn.board.name, run_id, document["bundle"], document["status"], document.get("error"))


def generate_args(artifact: Artifact, params: RunParams) -> GenerateArgs | None:
    """A text-generation program runs its generate loop on the reference prompt; any other program, once per run."""
    generation = artifact.sidecar.generation
    if generation is None:
        return None
    return GenerateArgs(generation.prompt_len, params.new_tokens or generation.new_tokens, generation.context)


def pull(conn: BoardConnection, run: RemoteRun, artifact: Artifact, root: Path | None = None) -> Path:
    dest = bundle_dest(conn.board.name, artifact.model, artifact.variant.name, run.run_id, root)
    return pull_bundle(conn, run.bundle, dest)
