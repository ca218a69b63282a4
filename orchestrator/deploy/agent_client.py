"""The workstation's side of the board agent: build its command lines, run them, parse its JSON.

Every board (SSH or local) is driven through this one interface, over whatever connection it has.
"""

from __future__ import annotations

import json
import posixpath
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from orchestrator import strictjson
from orchestrator.boards.workdir import BoardWorkdir
from orchestrator.errors import BoardDataError, BoardError
from orchestrator.transport import OUTPUT_LIMIT, BoardConnection, OutputTooLarge

# Agent exit codes (board/agent/README.md).
AGENT_OK = 0
AGENT_FAILED = 1
AGENT_LOCK_TIMEOUT = 3
AGENT_NOT_PROVISIONED = 4


class AgentError(BoardError):
    """The agent answered with an error document."""

    def __init__(self, board: str, command: str, document: dict[str, Any], exit_code: int, stderr: str) -> None:
        reason = document.get("error") or _last_line(stderr) or f"exit code {exit_code}"
        super().__init__(f"{board}: agent {command} failed: {reason}")
        self.document = document
        self.agent_exit_code = exit_code


def _last_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1] if lines else ""


GC_CATEGORIES = ("bundles", "temporaries", "models", "inputs")  # `gc`'s `removed` keys (board/agent/README.md)


@dataclass(frozen=True)
class NumericsArgs:
    """The agent's numerics pass: the numerics program and its reference on the board, the tensors' byte cap."""

    model: str
    reference: str
    full_cap: int | None  # None: statistics only
    inputs: str | None = None  # the program's own inputs (a text-generation program's prefill); None: the run's


@dataclass(frozen=True)
class GenerateArgs:
    """The runner's generate loop: a prompt of `prompt_len` ids, `new_tokens` after it, a KV cache of `context`."""

    prompt_len: int
    new_tokens: int
    context: int


@dataclass(frozen=True)
class GcResult:
    """What `gc` removed on one board (or would remove, with --dry-run), checked against the documented shape."""

    removed: dict[str, list[str]]  # every category of GC_CATEGORIES, each a list of names
    bytes_freed: int
    dry_run: bool

    @property
    def removed_count(self) -> int:
        return sum(len(names) for names in self.removed.values())


class BoardAgent:
    """Calls `python3 -m etlab_agent --workdir <wd> ...` on a board."""

    def __init__(self, conn: BoardConnection, workdir: str) -> None:
        self.conn = conn
        self.workdir = workdir.rstrip("/")

    @property
    def board_name(self) -> str:
        return self.conn.board.name

    def argv(self, *args: str) -> list[str]:
        wd = self.workdir
        return [
            "env",
            f"PYTHONPATH={wd}/pylib:{wd}/board/agent",
            "PYTHONDONTWRITEBYTECODE=1",
            "python3",
            "-m",
            "etlab_agent",
            "--workdir",
            wd,
            *args,
        ]

    def call(
        self, *args: str, timeout: float | None = None, accept: Sequence[int] = (AGENT_OK,)
    ) -> tuple[dict[str, Any], int]:
        """Run one agent command; return (document, exit code) when the exit code is accepted."""
        try:
            result = self.conn.run(self.argv(*args), timeout=timeout, check=False)
        except OutputTooLarge as exc:  # named by the agent command: the argv is too long to show it
            limit = f"more than {OUTPUT_LIMIT >> 20} MiB on {exc.stream}"
            raise self.malformed(args[0], f"{limit}; the command was stopped") from exc
        try:
            document = strictjson.loads(result.stdout, where=args[0]) if result.stdout.strip() else {}
        except strictjson.JsonDataError as exc:
            document = {"error": f"unparseable agent output ({exc.problem}): {_last_line(result.stdout)[:200]}"}
        # The board is untrusted: its answer must have the documented shape before anything reads it.
        if not isinstance(document, dict):
            raise self.malformed(args[0], f"expected a JSON object, got {type(document).__name__}")
        if not isinstance(document.get("error"), str | None):
            raise self.malformed(args[0], f"'error' is {json.dumps(document['error'])[:200]}")
        if result.exit_code not in accept:
            raise AgentError(self.board_name, args[0], document, result.exit_code, result.stderr)
        return document, result.exit_code

    def info(self) -> dict[str, Any]:
        return self.call("info", timeout=60)[0]

    def set_state(self, values: dict[str, str]) -> dict[str, Any]:
        return self.call("set-state", *(f"{k}={v}" for k, v in values.items()), timeout=60)[0]

    def unpack(self, wheel: str, dest: str, *, prefixes: Sequence[str] = (), strip: str | None = None) -> dict:
        args = ["unpack", "--wheel", wheel, "--dest", dest]
        for prefix in prefixes:
            args += ["--member-prefix", prefix]
        if strip:
            args += ["--strip-prefix", strip]
        return self.call(*args, timeout=600)[0]

    def probe_bandwidth(self, threads: int | None, rounds: int, timeout: float, lock_timeout: float) -> dict[str, Any]:
        """The runner's --probe-bandwidth under the board lock: {"exit_code", "answer" (text), "error"}."""
        args = ["probe-bandwidth", "--rounds", str(rounds), "--timeout", str(timeout), "--lock-timeout",
                str(lock_timeout)]  # fmt: skip
        args += ["--threads", str(threads)] if threads else []
        return self.call(*args, timeout=timeout + lock_timeout + 60)[0]

    def health(self, model: str, inputs: str, reference: str, timeout: float, lock_timeout: float) -> dict[str, Any]:
        """The health job's facts and verification run (deploy/health.py judges them)."""
        args = ["health", "--model", model, "--inputs", inputs, "--reference", reference, "--timeout", str(timeout),
                "--lock-timeout", str(lock_timeout)]  # fmt: skip
        return self.call(*args, timeout=timeout + lock_timeout + 60)[0]

    def time_program(
        self, model: str, threads: int | None, iterations: int, warmup: int, timeout: float, lock_timeout: float
    ) -> dict[str, Any]:
        """The runner's timings of `model` under the board lock: {"exit_code", "timings" (text), "error"}."""
        args = ["time-program", "--model", model, "--iterations", str(iterations), "--warmup", str(warmup),
                "--timeout", str(timeout), "--lock-timeout", str(lock_timeout)]  # fmt: skip
        args += ["--threads", str(threads)] if threads else []
        return self.call(*args, timeout=timeout + lock_timeout + 60)[0]

    def build_runner(self, sdk: str, source: str, out: str, timeout: float = 3600) -> dict[str, Any]:
        return self.call("build-runner", "--sdk", sdk, "--source", source, "--out", out, timeout=timeout + 60)[0]

    def profile(
        self,
        *,
        model: str,
        run_id: str,
        inputs: str | None,
        labels: dict[str, str],
        warmup: int,
        iterations: int,
        threads: int | None,
        max_seconds: float | None,
        timeout: float,
        lock_timeout: float,
        etdump: bool = True,
        counters: str | None = None,
        numerics: NumericsArgs | None = None,
        generate: GenerateArgs | None = None,
    ) -> tuple[dict[str, Any], int]:
        """Profile under the board lock; a failed run still returns its bundle (exit 1 is accepted).

        `generate`: run the program as a language model's generate loop (the runner's `--generate`)."""
        args = [
            "profile",
            "--model",
            model,
            "--run-id",
            run_id,
            "--warmup",
            str(warmup),
            "--iterations",
            str(iterations),
        ]
        if inputs:
            args += ["--inputs", inputs]
        for key, value in labels.items():
            args += ["--label", f"{key}={value}"]
        if threads:
            args += ["--threads", str(threads)]
        if max_seconds:
            args += ["--max-seconds", str(max_seconds)]
        args += ["--timeout", str(timeout), "--lock-timeout", str(lock_timeout)]
        if not etdump:
            args.append("--no-etdump")
        if counters:
            args += ["--counters", counters]
        if numerics is not None:
            args += ["--numerics-model", numerics.model, "--numerics-reference", numerics.reference]
            if numerics.full_cap is not None:
                args += ["--numerics-full-cap", str(numerics.full_cap)]
            if numerics.inputs is not None:
                args += ["--numerics-inputs", numerics.inputs]
        if generate is not None:
            args += ["--generate", "--prompt-len", str(generate.prompt_len), "--new-tokens", str(generate.new_tokens)]
            args += ["--context", str(generate.context)]
        # The SSH command itself gets the runner timeout (twice with a counters pass) plus the lock wait plus slack
        # for info probes.
        runs = 1 + bool(counters) + (numerics is not None)
        document, code = self.call(*args, timeout=runs * timeout + lock_timeout + 120, accept=(AGENT_OK, AGENT_FAILED))
        if "bundle" in document:
            status, bundle = document.get("status"), document.get("bundle")
            if document.get("run_id") != run_id or status not in ("ok", "failed", "timeout"):
                raise self.malformed("profile", f"run_id {document.get('run_id')!r}, status {status!r}")
            # The bundle is where this run id puts it; the board does not get to point the pull elsewhere.
            ours = BoardWorkdir(self.workdir or "/").bundle(run_id)
            if not isinstance(bundle, str) or posixpath.normpath(bundle) != posixpath.normpath(ours):
                raise self.malformed("profile", f"bundle {str(bundle)[:200]!r} is not {ours}")
            document = {**document, "bundle": ours}
        return document, code

    def bundles(self) -> list[dict[str, Any]]:
        """The board's bundles, newest first; each has a string `run_id` and a `labels` mapping of strings.

        Names are checked against the name rule where they are used (a pull refuses a bad one by name)."""
        listed = self.call("bundles", timeout=60)[0].get("bundles", [])
        if not isinstance(listed, list):
            raise self.malformed("bundles", "'bundles' is not a list")
        entries = []
        for entry in listed:
            if not isinstance(entry, dict) or not isinstance(entry.get("run_id"), str):
                raise self.malformed("bundles", f"entry without a string run_id: {json.dumps(entry)[:200]}")
            labels = entry.get("labels") or {}
            if not isinstance(labels, dict) or not all(isinstance(v, str) for v in labels.values()):
                raise self.malformed("bundles", f"bundle {entry['run_id'][:80]!r} has labels that are not strings")
            entries.append({**entry, "labels": labels})
        return entries

    def malformed(self, command: str, what: str) -> BoardDataError:
        return BoardDataError(f"{self.board_name}: agent {command} sent malformed output: {what}")

    def gc(self, keep: int, *, dry_run: bool = False, protect: Sequence[str] = ()) -> GcResult:
        args = ["gc", "--keep", str(keep)] + (["--dry-run"] if dry_run else [])
        for sha in protect:
            args += ["--protect", sha]
        document = self.call(*args, timeout=600)[0]
        removed = document.get("removed")
        if not isinstance(removed, dict):
            raise self.malformed("gc", f"'removed' is {json.dumps(removed)[:200]}")
        for category in GC_CATEGORIES:
            names = removed.get(category)
            if not isinstance(names, list) or not all(isinstance(name, str) for name in names):
                raise self.malformed("gc", f"'removed.{category}' is not a list of names: {json.dumps(names)[:200]}")
        freed = document.get("bytes_freed")
        if not isinstance(freed, int) or isinstance(freed, bool) or freed < 0:
            raise self.malformed("gc", f"'bytes_freed' is {json.dumps(freed)[:200]}")
        removed_names = {category: list(removed[category]) for category in GC_CATEGORIES}
        return GcResult(removed_names, freed, bool(document.get("dry_run")))
