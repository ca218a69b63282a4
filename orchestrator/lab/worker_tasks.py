"""What a lab worker runs for a night (lab/lab_night.py submits these): a lowering, or one board's share.

Both return plain data (str, numbers, lists, dicts) and never raise: the workstation's client deserializes msgpack
only, so an exception would arrive as an unreadable error. Everything they return is checked there again.
"""

from __future__ import annotations

import tempfile
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from orchestrator import paths
from orchestrator.boards.fanout import fan_out
from orchestrator.deploy.cells import is_link_trouble
from orchestrator.errors import EtlabError, ExitCode, first_line
from orchestrator.lab import cluster
from orchestrator.lab.artifact_store import ArtifactStore, StoreError, StoreUnreachable
from orchestrator.lab.board_night import NightContext, PlannedCell, Recorder, run_board
from orchestrator.lab.history import History
from orchestrator.lab.matrix import NightlyConfig
from orchestrator.lab.run_record import host_name
from orchestrator.lowering import programs
from orchestrator.lowering.artifacts import Artifact, MissingArtifact, load_artifact
from orchestrator.lowering.export import lower as lowering
from orchestrator.lowering.export.cache import cache_key
from orchestrator.lowering.program import Program
from orchestrator.lowering.variants import Variant
from orchestrator.lowering.weights import resolve_weights
from orchestrator.records import to_data


def lower_program(program: Program, variants: list[Variant], weights: str, store_url: str) -> dict[str, Any]:
    """Lower `program` once for the lab: what the store holds already is fetched, the rest lowered here and published.
    Returns {"keys": {variant: cache key}, "versions": {...}, "lowered": [variant...], "error": None or why}."""
    host = host_name()
    started = time.monotonic()
    spec, rewrites = program.spec, program.rewrites
    try:
        store = ArtifactStore(store_url)
        asked = list(variants)
        mode = resolve_weights(spec, weights).mode
        fetched, repaired = [], []
        for variant in asked:
            key = cache_key(spec, variant, mode, False, None, rewrites)
            try:
                if store.has(key):
                    store.get(key, spec.name, variant, paths.artifacts_dir())
                    fetched.append(variant.name)
            except StoreUnreachable:
                raise
            except StoreError as exc:  # bad data in the store: lowered here instead, and the entry published again
                repaired.append(f"{variant}: refused the lab's store's entry ({exc}); lowered here and published again")
        result = lowering.lower(spec, variants=asked, weights=weights, root=paths.artifacts_dir(), rewrites=rewrites)
        keys = {}
        for variant in result.variants:
            keys[variant.name] = store.put(load_artifact(spec.name, variant, paths.artifacts_dir()))
        versions = dict(next(iter(result.variants.values())).sidecar.versions)
        lowered = [v.name for v, r in result.variants.items() if not r.cached and v.name not in fetched]
        seconds = round(time.monotonic() - started, 3)
        return {"host": host, "keys": keys, "versions": versions, "lowered": lowered, "repaired": repaired,
                "error": None, "seconds": seconds}  # fmt: skip
    except EtlabError as exc:  # the model's own failure, or the lab's (its store unreachable: 69)
        return {"host": host, "error": first_line(exc), "infrastructure": exc.exit_code == ExitCode.UNAVAILABLE}
    except Exception as exc:  # a bug: said, with where, rather than raised into the client's msgpack-only reader
        return {"host": host, "error": f"internal error on {host}: {exc!r}", "detail": traceback.format_exc(limit=-4)}


@dataclass(frozen=True)
class BoardJob:
    """One board's share of a night, as the workstation hands it to a worker."""

    night: str
    config: NightlyConfig
    history_url: str
    board: str
    planned: list[PlannedCell]
    store: str
    keys: dict[tuple[str, str], str] = field(default_factory=dict)  # (model, variant name) -> the lab store's key
    versions: dict[str, dict[str, str]] = field(default_factory=dict)
    lowering_errors: dict[str, str] = field(default_factory=dict)


def night_on_board(job: BoardJob) -> dict[str, Any]:
    """Run a board's cells here, recording each into the night's history as it finishes (a cell recorded meanwhile,
    e.g. by a worker that died after recording it, is skipped). Returns what the workstation reports and checks."""
    host = host_name()
    started = time.monotonic()
    reply: dict[str, Any] = {"board": job.board, "host": host, "ok": False, "error": None, "skipped": [],
                             "pending": [], "ran": 0, "infrastructure": False}  # fmt: skip
    try:
        board = cluster.worker_inventory().boards.get(job.board)
        if board is None:
            reply["error"] = f"{host} has no board {job.board!r} in its inventory"
            return reply
        history = History(job.history_url, busy_seconds=job.config.history_wait_seconds)
        try:
            store = ArtifactStore(job.store)

            def artifact(model: str, variant: Variant) -> Artifact:
                key = job.keys.get((model, variant.name))
                if key is None:
                    raise MissingArtifact(model, variant, f"{model}/{variant} was not lowered for the lab tonight")
                return store.get(key, model, variant, paths.artifacts_dir())

            def find_program(sha: str | None) -> Path | None:
                """A baseline's program: kept here, else the one another host kept (verified), kept here too."""
                found = programs.find(sha)
                if found is not None or sha is None:
                    return found
                with tempfile.TemporaryDirectory(dir=paths.state_dir()) as folder:
                    fetched = store.get_program(sha, Path(folder) / f"{sha}.pte")
                    return None if fetched is None else programs.keep(fetched, sha, programs.holder_id(history.url))

            recorder = Recorder(history, paths.state_dir() / "lab-pending", job.night)
            ctx = NightContext(job.night, job.config, history, recorder, artifact, job.versions,
                               job.lowering_errors, paths.results_dir(), host=host,
                               share_program=store.put_program, find_program=find_program)  # fmt: skip
            (outcome,) = fan_out([board], lambda resolved: run_board(ctx, resolved, job.planned))
            reply["ok"] = outcome.ok
            reply["ran"] = len(outcome.value or [])
            if not outcome.ok:
                reply["error"] = outcome.error
                reply["stage"] = outcome.stage
                reply["infrastructure"] = is_link_trouble(outcome.exception)
            reply["skipped"] = [list(cell) for cell in ctx.skipped]
            reply["pending"] = [to_data(record) for record in recorder.pending.values()]
        finally:
            history.close()
    except EtlabError as exc:
        reply["error"] = first_line(exc)
        reply["infrastructure"] = exc.exit_code == ExitCode.UNAVAILABLE
    except Exception as exc:  # a bug: said, with where
        reply["error"] = f"internal error on {host}: {exc!r}"
        reply["detail"] = traceback.format_exc(limit=-4)
    reply["seconds"] = round(time.monotonic() - started, 3)
    return reply
