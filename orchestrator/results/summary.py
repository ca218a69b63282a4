"""`analysis/summary.json` as types: the analysis writes a RunSummary, and every reader gets one back.

The file keeps its documented layout (docs/DESIGN.md); `to_dict()` writes it and `from_dict()` reads it, refusing
a document whose shape is wrong instead of letting `.get` chains turn it into silent `None`s: every field present
must have the type and range an analysis writes (summary_checks.py: a time is a finite number >= 0, a count or a byte
count an integer >= 0, never a bool), else SummaryError (exit 65) names the file and the field, so no reader crashes
on it later. Absent and null mean unknown. The sections whose content is a report in its own right (board
conditions, profile) stay mappings. The outputs' checks (correctness, accuracy) are summary_outputs.py's.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from orchestrator.results import summary_checks as check
from orchestrator.results.summary_checks import SummaryError
from orchestrator.results.summary_outputs import Accuracy, Correctness

SUMMARY_SCHEMA = 1
VALIDITY_LEVELS = ("valid", "degraded", "invalid")


@dataclass(frozen=True)
class WarmLatency:
    """The measured (warm) iterations."""

    min_ms: float
    median_ms: float
    mean_ms: float
    p90_ms: float
    max_ms: float
    cv: float

    @classmethod
    def from_dict(cls, data: Any) -> WarmLatency | None:
        if data is None:
            return None
        fields = check.mapping(data, "latency.warm")
        names = ("min_ms", "median_ms", "mean_ms", "p90_ms", "max_ms", "cv")
        values = {name: check.number(fields.get(name), f"latency.warm.{name}") for name in names}
        missing = [name for name, value in values.items() if value is None]
        if missing:
            raise SummaryError("latency.warm", f"lacks a number for {', '.join(missing)}")
        return cls(**values)  # type: ignore[arg-type]


@dataclass(frozen=True)
class Latency:
    load_ms: float | None = None
    method_init_ms: float | None = None
    first_run_ms: float | None = None
    warmup_runs: int = 0
    iterations: int = 0
    iterations_requested: int | None = None
    stopped_early: bool | None = None
    threads: int | None = None
    warm: WarmLatency | None = None
    hashing_ms: dict[str, float | None] | None = None  # the agent hashing the model and inputs before the run

    @classmethod
    def from_dict(cls, data: Any) -> Latency:
        fields = check.mapping(data, "latency")
        hashing = fields.get("hashing_ms")
        if hashing is not None:  # the agent hashing the model and the inputs
            times = check.mapping(hashing, "latency.hashing_ms")
            hashing = {key: check.number(times.get(key), f"latency.hashing_ms.{key}") for key in ("model", "inputs")}
        return cls(
            load_ms=check.number(fields.get("load_ms"), "latency.load_ms"),
            method_init_ms=check.number(fields.get("method_init_ms"), "latency.method_init_ms"),
            first_run_ms=check.number(fields.get("first_run_ms"), "latency.first_run_ms"),
            warmup_runs=check.count(fields.get("warmup_runs"), "latency.warmup_runs") or 0,
            iterations=check.count(fields.get("iterations"), "latency.iterations") or 0,
            iterations_requested=check.count(fields.get("iterations_requested"), "latency.iterations_requested"),
            stopped_early=check.flag(fields.get("stopped_early"), "latency.stopped_early"),
            threads=check.count(fields.get("threads"), "latency.threads"),
            warm=WarmLatency.from_dict(fields.get("warm")),
            hashing_ms=hashing,
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "load_ms": self.load_ms,
            "method_init_ms": self.method_init_ms,
            "first_run_ms": self.first_run_ms,
            "warmup_runs": self.warmup_runs,
            "iterations": self.iterations,
            "iterations_requested": self.iterations_requested,
            "stopped_early": self.stopped_early,
            "threads": self.threads,
            "warm": dict(vars(self.warm)) if self.warm else None,
            "hashing_ms": self.hashing_ms,
        }

    @property
    def median_ms(self) -> float | None:
        return self.warm.median_ms if self.warm else None


@dataclass(frozen=True)
class Reason:
    level: str  # "degraded" or "invalid"
    reason: str


@dataclass(frozen=True)
class Validity:
    status: str  # valid, degraded or invalid
    reasons: tuple[Reason, ...] = ()

    @classmethod
    def from_dict(cls, data: Any) -> Validity:
        fields = check.mapping(data, "validity")
        status = fields.get("status")
        if status not in VALIDITY_LEVELS:
            raise SummaryError("validity.status", f"must be one of {', '.join(VALIDITY_LEVELS)}")
        reasons = []
        for index, item in enumerate(check.listing(fields.get("reasons"), "validity.reasons")):
            where = f"validity.reasons[{index}]"
            reason = check.mapping(item, where)
            level, text = (
                check.text(reason.get("level"), f"{where}.level"),
                check.text(reason.get("reason"), f"{where}.reason"),
            )
            reasons.append(Reason(str(level), str(text)))
        return cls(status, tuple(reasons))

    def to_dict(self) -> dict[str, Any]:
        return {"status": self.status, "reasons": [{"level": r.level, "reason": r.reason} for r in self.reasons]}


@dataclass(frozen=True)
class ProgramInfo:
    """The program the run profiled."""

    name: str | None = None
    backend: str | None = None
    pte: str | None = None
    sha256: str | None = None
    weights: str | None = None
    size_bytes: int | None = None  # the .pte's size (from its sidecar)

    @classmethod
    def from_dict(cls, data: Any) -> ProgramInfo:
        fields = check.mapping(data, "model")
        texts = {
            name: check.text(fields.get(name), f"model.{name}")
            for name in ("name", "backend", "pte", "sha256", "weights")
        }
        return cls(
            name=texts["name"],
            backend=texts["backend"],
            pte=texts["pte"],
            sha256=texts["sha256"],
            weights=texts["weights"],
            size_bytes=check.count(fields.get("size_bytes"), "model.size_bytes"),
        )


# The accuracy gate of quantized runs against fp32 eager (README "Quantized variants"). 8da4w measured 11-20 dB
# and 3/5 top-5 overlap on full-size models, int8 28-42 dB: the defaults pass both and catch a broken program.
# Top-1 agreement is over the rows of a logits output (batch x positions): 0.9 still asks one row of one, and lets a
# few of a fill-mask model's 128 positions flip (padding's among them).


@dataclass(frozen=True)
class Memory:
    """Peak memory per phase (the runner's RSS) and what the program accounts for.

    `other_bytes` is the peak minus the process's RSS before loading, the planned arenas and the constants: memory
    that belongs to delegates (XNNPACK's packed weights and workspace) and everything else the runtime allocates.
    """

    peak_rss_bytes: int | None = None
    phases: dict[str, dict[str, int | None]] = field(default_factory=dict)
    peak_reset: bool = False  # True: each phase's peak covers that phase alone (clear_refs worked)
    baseline_rss_bytes: int | None = None
    planned_arenas: tuple[int, ...] = ()
    planned_bytes: int | None = None
    constants_bytes: int | None = None
    delegate_data_bytes: int | None = None
    pte_bytes: int | None = None
    peak_live_bytes: int | None = None
    other_bytes: int | None = None

    @classmethod
    def from_dict(cls, data: Any) -> Memory | None:
        if data is None:
            return None
        fields = check.mapping(data, "memory")
        phases = check.mapping(fields.get("phases"), "memory.phases")
        arenas = check.listing(fields.get("planned_arenas"), "memory.planned_arenas")

        def count(name: str) -> int | None:
            return check.count(fields.get(name), f"memory.{name}")

        return cls(
            peak_rss_bytes=count("peak_rss_bytes"),
            phases={
                str(name): {
                    str(k): check.count(v, f"memory.phases.{name}.{k}")
                    for k, v in check.mapping(values, f"memory.phases.{name}").items()
                }
                for name, values in phases.items()
            },
            peak_reset=check.flag(fields.get("peak_reset"), "memory.peak_reset") is True,
            baseline_rss_bytes=count("baseline_rss_bytes"),
            planned_arenas=tuple(int(check.count(a, f"memory.planned_arenas[{i}]") or 0) for i, a in enumerate(arenas)),
            planned_bytes=count("planned_bytes"),
            constants_bytes=count("constants_bytes"),
            delegate_data_bytes=count("delegate_data_bytes"),
            pte_bytes=count("pte_bytes"),
            peak_live_bytes=count("peak_live_bytes"),
            other_bytes=count("other_bytes"),
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "peak_rss_bytes": self.peak_rss_bytes,
            "phases": self.phases,
            "peak_reset": self.peak_reset,
            "baseline_rss_bytes": self.baseline_rss_bytes,
            "planned_arenas": list(self.planned_arenas),
            "planned_bytes": self.planned_bytes,
            "constants_bytes": self.constants_bytes,
            "delegate_data_bytes": self.delegate_data_bytes,
            "pte_bytes": self.pte_bytes,
            "peak_live_bytes": self.peak_live_bytes,
            "other_bytes": self.other_bytes,
        }


@dataclass(frozen=True)
class Counters:
    """The counters pass: what was captured, what was not and why, and the whole-method figures."""

    status: str  # ok, failed
    error: str | None = None
    requested: tuple[str, ...] = ()
    captured: tuple[str, ...] = ()
    derived: tuple[str, ...] = ()
    missing: tuple[dict[str, str], ...] = ()  # {"name", "error", "reason"}
    threads: int | None = None
    scope: str = ""
    multiplexed: bool = False
    scaling: str = ""
    executions: int = 0
    totals: dict[str, float] = field(default_factory=dict)  # per execution, whole method
    consistency: dict[str, Any] = field(default_factory=dict)  # the hottest instruction vs the timing pass

    @classmethod
    def from_dict(cls, data: Any) -> Counters | None:
        if data is None:
            return None
        fields = check.mapping(data, "counters")

        def at(name: str) -> tuple[Any, str]:
            return fields.get(name), f"counters.{name}"

        missing = check.listing(*at("missing"))
        return cls(
            status=check.text(*at("status")) or "failed",
            error=check.text(*at("error")),
            requested=check.texts(*at("requested")),
            captured=check.texts(*at("captured")),
            derived=check.texts(*at("derived")),
            missing=tuple(check.mapping(m, f"counters.missing[{index}]") for index, m in enumerate(missing)),
            threads=check.count(*at("threads")),
            scope=check.text(*at("scope")) or "",
            multiplexed=check.flag(*at("multiplexed")) is True,
            scaling=check.text(*at("scaling")) or "",
            executions=check.count(*at("executions")) or 0,
            totals=check.numbers(*at("totals")),
            consistency=check.mapping(*at("consistency")),
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "status": self.status,
            "error": self.error,
            "requested": list(self.requested),
            "captured": list(self.captured),
            "derived": list(self.derived),
            "missing": [dict(m) for m in self.missing],
            "threads": self.threads,
            "scope": self.scope,
            "multiplexed": self.multiplexed,
            "scaling": self.scaling,
            "executions": self.executions,
            "totals": self.totals,
            "consistency": self.consistency,
        }


@dataclass(frozen=True)
class Generation:
    """summary.json's `generation`: the figures a user of a language model asks for."""

    prompt_len: int
    new_tokens: int
    context: int | None
    generations: int  # timed generations the figures come from
    ttft_ms: float | None  # time to first token: the prefill (median over the timed generations)
    prefill_tokens_per_s: float | None
    decode_tokens_per_s: float | None  # (N-1) decode steps over their time, median over the generations
    token_ms: dict[str, float | None] = field(default_factory=dict)  # decode step latency: median, p90, max
    load_ms: float | None = None  # loading the program and initialising the method
    kv_cache_bytes: int | None = None
    memory: dict[str, int | None] = field(default_factory=dict)  # peak RSS: prefill, decode
    tokens: dict[str, Any] | None = None  # TokenCheck.to_dict(), or None when no reference was given
    # Where the prompt came from; with a cached tokenizer and ids equal to eager's, the prompt and what followed
    prompt_source: str | None = None
    text: dict[str, str] | None = None

    @classmethod
    def from_dict(cls, data: Any) -> Generation | None:
        if data is None:
            return None
        fields = check.mapping(data, "generation")

        def at(name: str) -> tuple[Any, str]:
            return fields.get(name), f"generation.{name}"

        tokens, text = fields.get("tokens"), fields.get("text")
        if tokens is not None:
            check.share(check.mapping(*at("tokens")).get("agreement"), "generation.tokens.agreement")
        return cls(
            prompt_len=check.count(*at("prompt_len")) or 0,
            new_tokens=check.count(*at("new_tokens")) or 0,
            context=check.count(*at("context")),
            generations=check.count(*at("generations")) or 0,
            ttft_ms=check.number(*at("ttft_ms")),
            prefill_tokens_per_s=check.number(*at("prefill_tokens_per_s")),
            decode_tokens_per_s=check.number(*at("decode_tokens_per_s")),
            token_ms={
                str(k): check.number(v, f"generation.token_ms.{k}") for k, v in check.mapping(*at("token_ms")).items()
            },
            load_ms=check.number(*at("load_ms")),
            kv_cache_bytes=check.count(*at("kv_cache_bytes")),
            memory={str(k): check.count(v, f"generation.memory.{k}") for k, v in check.mapping(*at("memory")).items()},
            tokens=dict(tokens) if tokens is not None else None,
            prompt_source=check.text(*at("prompt_source")),
            text=check.text_map(text, "generation.text") if text is not None else None,
        )

    @property
    def token_agreement(self) -> float | None:
        """Generated ids equal to eager greedy's, as a share of those compared (None: not checked)."""
        value = (self.tokens or {}).get("agreement")
        return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None

    @property
    def ids_text(self) -> str:
        """The ids against eager greedy in a few words, for tables and pages: "= eager (8)", "75%, parts at 6"."""
        tokens = self.tokens or {}
        agreement = self.token_agreement
        if agreement is None:
            return "not checked"
        if tokens.get("first_divergence") is None:
            return f"= eager ({tokens.get('compared')})"
        return f"{agreement * 100:.0f}%, parts at {tokens.get('first_divergence')}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "prompt_len": self.prompt_len,
            "new_tokens": self.new_tokens,
            "context": self.context,
            "generations": self.generations,
            "ttft_ms": self.ttft_ms,
            "prefill_tokens_per_s": self.prefill_tokens_per_s,
            "decode_tokens_per_s": self.decode_tokens_per_s,
            "token_ms": dict(self.token_ms),
            "load_ms": self.load_ms,
            "kv_cache_bytes": self.kv_cache_bytes,
            "memory": dict(self.memory),
            "tokens": self.tokens,
            "prompt_source": self.prompt_source,
            "text": self.text,
        }


@dataclass(frozen=True)
class RunSummary:
    run_id: str
    model: ProgramInfo
    latency: Latency
    validity: Validity
    status: str | None = None  # the run's status on the board: ok, failed or timeout
    error: str | None = None
    labels: dict[str, Any] = field(default_factory=dict)
    board: str | None = None
    versions: dict[str, Any] = field(default_factory=dict)
    board_conditions: dict[str, Any] = field(default_factory=dict)
    correctness: Correctness = field(default_factory=Correctness)
    profile: dict[str, Any] | None = None  # top layers, delegation split, operator types, overlay coverage
    memory: Memory | None = None
    counters: Counters | None = None
    accuracy: Accuracy | None = None  # quantized programs only
    generation: Generation | None = None  # text-generation programs only

    @classmethod
    def from_dict(cls, data: Any, where: str = "summary.json") -> RunSummary:
        """The summary in a summary.json document (`where` names it in errors), every field checked."""
        try:
            return cls._from_dict(data)
        except SummaryError as exc:
            raise SummaryError(exc.field, exc.problem, where) from None

    @classmethod
    def _from_dict(cls, data: Any) -> RunSummary:
        if not isinstance(data, dict):
            raise SummaryError("the document", f"must be a mapping, got {type(data).__name__}")
        fields = data
        if fields.get("schema") != SUMMARY_SCHEMA:
            raise SummaryError("schema", f"{check.shown(fields.get('schema'))} is not {SUMMARY_SCHEMA}")
        run_id = check.text(fields.get("run_id"), "run_id")
        if not run_id:
            raise SummaryError("run_id", "is missing")
        profile = fields.get("profile")
        conditions = check.mapping(fields.get("board_conditions"), "board_conditions")
        check.texts(conditions.get("throttling_during_run"), "board_conditions.throttling_during_run")  # the advisor's
        return cls(
            run_id=run_id,
            model=ProgramInfo.from_dict(fields.get("model")),
            latency=Latency.from_dict(fields.get("latency")),
            validity=Validity.from_dict(fields.get("validity")),
            status=check.text(fields.get("status"), "status"),
            error=check.text(fields.get("error"), "error"),
            labels=check.mapping(fields.get("labels"), "labels"),
            board=check.text(fields.get("board"), "board"),
            versions=check.mapping(fields.get("versions"), "versions"),
            board_conditions=conditions,
            correctness=Correctness.from_dict(fields.get("correctness")),
            profile=check.mapping(profile, "profile") if profile is not None else None,
            memory=Memory.from_dict(fields.get("memory")),
            counters=Counters.from_dict(fields.get("counters")),
            accuracy=Accuracy.from_dict(fields.get("accuracy")),
            generation=Generation.from_dict(fields.get("generation")),
        )

    def to_dict(self) -> dict[str, Any]:
        """The summary.json document, in its documented key order."""
        data: dict[str, Any] = {
            "schema": SUMMARY_SCHEMA,
            "run_id": self.run_id,
            "status": self.status,
            "error": self.error,
            "labels": self.labels,
            "model": dict(vars(self.model)),
            "board": self.board,
            "versions": self.versions,
            "latency": self.latency.to_dict(),
            "board_conditions": self.board_conditions,
            "correctness": self.correctness.to_dict(),
        }
        if self.profile is not None:
            data["profile"] = self.profile
        if self.memory is not None:
            data["memory"] = self.memory.to_dict()
        if self.counters is not None:
            data["counters"] = self.counters.to_dict()
        if self.accuracy is not None:
            data["accuracy"] = self.accuracy.to_dict()
        if self.generation is not None:
            data["generation"] = self.generation.to_dict()
        data["validity"] = self.validity.to_dict()
        return data
