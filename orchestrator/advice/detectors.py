"""The advisor's detectors (DETECTORS, run in this order): each reads a run's measured profile and its program's
sidecar and returns findings. Savings are predicted from the measured per-operator times only (their medians: one
slow iteration moves a mean, not a median), and shares are of the run's median (OpsRecord.share, the baseline of
ops.json's `pct`):

- a rewrite's saving is the time of the portable kernels it removes (rewrites/registry.py names them; the work
  it moves into XNNPACK then costs what it costs there, which the bench compares with the measured gain);
- the attention switch's saving is the time of the static cache's bookkeeping operators (repeat_kv's expand_copy
  of the cache, index_put and copy_ writes, the causal mask over the whole cache) that etlab's attend and
  update_cache replace (they then cost what they cost, which the trial measures);
- the head's saving is (1 - 1/S) of the head's measured FullyConnected time: it then runs on 1 row of S;
- more threads save on the delegated time only (Amdahl: portable kernels run on one thread);
- conv1d-as-2d's saving is a measured share (CONV1D_INT8_SAVING) of the fp32 convolutions an int8-dynamic program
  left: what their int8 form saved on wav2vec 2.0 base;
- quantization's saving is measured: the same model's int8 run on the same board, FullyConnected against
  FullyConnected; without one, predicted from this board's int8/fp32 time ratio of each node type (of its output
  size, where those runs had one that size) on the other models it ran both ways (int8 is not faster on every
  board: an AVX2 machine without VNNI ran DistilBERT's int8-dynamic slower than fp32); without those either, not
  predicted (and still shown, with its share);
- a program with no delegate at all (`--backend portable`) gets one finding, `--backend xnnpack`, its kernels'
  time a bound: what XNNPACK makes of them is measured by running it.
- the roofline's findings (roofline_advice.py) are bounds: a matmul at the memory bandwidth saves at most the fp32
  weights' 3/4 of its bytes' share of its time; matmuls far below both limits at most their time beyond the roofline.

Add a detector: a `Detector` in DETECTORS (`tests/advice/` ties each to a recorded profile).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from orchestrator.advice.findings import (
    CONVOLUTION_TYPES,
    GEMM_TYPES,
    BoardRatios,
    Finding,
    RunFacts,
    delegate_node_fields,
    shape_key,
)
from orchestrator.advice.roofline_advice import find_roofline
from orchestrator.advice.sensitivity import find_sensitive_layers
from orchestrator.lowering.attention.choice import ETLAB, SDPA
from orchestrator.lowering.rewrites.registry import REWRITES
from orchestrator.lowering.variants import UnknownVariant, Variant
from orchestrator.results.ops_record import DelegateNodeTiming, InstructionTiming

PORTABLE_MIN_SHARE = 0.02  # an operator type under 2% of the run is not worth a finding of its own
GEMM_MIN_SHARE = 0.3  # quantization is proposed when FullyConnected and convolutions take this much of the run
# What conv1d-as-2d saves of the fp32 convolutions an int8-dynamic program left: the share measured on wav2vec 2.0
# base (bench/README.md "AMX is the int8 edge"): 7 of its 8 convolutions quantized, the program 16 ms faster of
# their 23.3 ms.
CONV1D_INT8_SAVING = 0.6

# The per-layer boolean-mask operations transformers' SDPA path leaves in portable kernels (measured on GPT-2,
# DistilBERT, BERT): eager attention builds one float mask instead, keeping one `where` to do it.
SDPA_MASK_OPERATORS = ("aten::eq", "aten::full_like", "aten::logical_not", "aten::any", "aten::where")
# What transformers' static-cache attention (`attention: sdpa`) runs outside the delegates and etlab's attention does
# not (measured on smollm2-gen-tiny with XNNPACK: none of these is left in the etlab program): repeat_kv's copy of
# the cache, the cache writes and their write-back, and the causal mask built over the whole cache.
STATIC_CACHE_OPERATORS = ("aten::expand_copy", "aten::index_put", "aten::copy_")
STATIC_CACHE_MASK_OPERATORS = ("aten::eq", "aten::full_like", "aten::logical_not", "aten::any", "aten::where",
                               "aten::le", "aten::arange")  # fmt: skip
# What a portable operator's finding says: its cause, and the fix with its kind. Where the model's code can avoid the
# operator, the fix is there ("code"); where it is ExecuTorch's XNNPACK partitioner that leaves the operator out,
# nothing in the model is to blame ("lowering").
PORTABLE_HINTS = {
    "aten::native_layer_norm": (
        "this ExecuTorch's XNNPACK partitioner leaves layer_norm out",
        "lowering",
        "nothing to change in the model: ExecuTorch's XNNPACK partitioner does not take layer_norm (a later "
        "ExecuTorch may)",
    ),
    "aten::expand_copy": (
        "a broadcast copy between delegates",
        "code",
        "in the model's code: broadcast inside the computation instead of materialising it (expand + copy)",
    ),
    "aten::pow": (
        "XNNPACK takes mul and square, not pow with a scalar exponent",
        "code",
        "in the model's code: write x * x * x",
    ),
    "aten::where": ("a masked select XNNPACK does not take", "code", "in the model's code: add a float mask instead"),
}
OTHER_PORTABLE = ("an operator XNNPACK did not take", "code", "in the model's code: operators XNNPACK takes")
# etlab's own operators (board/runner/src/kernels/: attend, update_cache, rope, shared_head) run outside the delegates
# by design, as native kernels of their own (threaded, vectorized): never "portable kernels" to write away.
OWN_OPERATORS = "etlab::"
# A "stored twice" finding below both is not worth saying (a 256-byte bias is not a size problem).
STORED_TWICE_MIN_MB = 0.1
STORED_TWICE_MIN_SHARE = 0.01  # of the .pte


@dataclass(frozen=True)
class Detector:
    name: str
    description: str
    find: Callable[[RunFacts, frozenset[str]], list[Finding]]  # (facts, node ids explained already) → findings


def _share(facts: RunFacts, ms: float) -> float:
    return facts.ops.share(ms)


def _ms(calls: Iterable[InstructionTiming]) -> float:
    """The calls' measured time per run: the sum of their medians."""
    return sum(call.median_ms for call in calls)


def _top_nodes(facts: RunFacts, calls: Iterable[InstructionTiming]) -> dict[str, tuple[str, ...]]:
    nodes = tuple(call.node_id for call in calls)
    return {facts.ops.method: nodes} if nodes else {}


def _rewrite_offered(facts: RunFacts, name: str) -> bool:
    """The rewrite can apply to this model (its spec) and was not applied to this program already."""
    return facts.spec is not None and REWRITES[name].applies(facts.spec) and name not in facts.applied_rewrites


def _operator_calls(facts: RunFacts, operators: Sequence[str], explained: frozenset[str]) -> list[InstructionTiming]:
    return [c for c in facts.ops.kernel_calls() if c.operator in operators and c.node_id not in explained]


def _from_functions(call: InstructionTiming, functions: Sequence[str]) -> bool:
    """The call came from one of the model's `functions` ("modeling_llama.py:121 in rotate_half"), or the run has
    no source for it."""
    return call.source is None or call.source.rpartition(" in ")[2] in functions


def _rewrite_finding(
    facts: RunFacts, rewrite: str, calls: list[InstructionTiming], title: str, cause: str, note: str
) -> Finding:
    measured = _ms(calls)
    return Finding(
        kind=rewrite,
        title=title,
        operators=tuple(sorted({call.operator for call in calls})),
        nodes=_top_nodes(facts, calls),
        calls=len(calls),
        measured_ms=measured,
        share=_share(facts, measured),
        cause=cause,
        saving_ms=measured,
        fix_kind="rewrite",
        fix=f"--rewrites {rewrite}",
        rewrite=rewrite,
        saving_note=note,
    )


def _backend(facts: RunFacts) -> str | None:
    """The run's backend (portable, xnnpack), from its program's sidecar, else the summary's name for it."""
    if facts.sidecar is not None:
        return facts.sidecar.variant.backend
    try:
        return Variant.parse(facts.summary.model.backend or "").backend
    except UnknownVariant:
        return None


def find_undelegated_program(facts: RunFacts, explained: frozenset[str]) -> list[Finding]:
    """A portable program (no delegate call at all): every kernel is a portable one, and the fix is the backend, not
    any one operator. One finding, explaining every kernel call so no later detector speaks of them one by one."""
    if any(True for _ in facts.ops.delegate_calls()) or _backend(facts) not in ("portable", None):
        return []
    calls = [call for call in facts.ops.kernel_calls() if call.node_id not in explained]
    if not calls:
        return []
    measured = _ms(calls)
    model = facts.spec.name if facts.spec is not None else facts.summary.model.name
    command = f"fab deploy-and-profile --model {model} --backend xnnpack" if model else "--backend xnnpack"
    return [
        Finding(
            kind="backend",
            title="the whole program in portable kernels",
            operators=tuple(sorted({call.operator for call in calls})),
            nodes=_top_nodes(facts, calls),
            calls=len(calls),
            measured_ms=measured,
            share=_share(facts, measured),
            cause=f"the program was lowered without a delegate (portable): its {len(calls)} kernel calls run "
            "single-threaded, unvectorised reference kernels",
            saving_ms=measured,
            saving_is_bound=True,
            saving_note="at most the portable kernels' time: what XNNPACK makes of them is measured by running it",
            fix_kind="option",
            fix=f"--backend xnnpack ({command})" if model else "--backend xnnpack",
        )
    ]


def find_rewritable_operators(facts: RunFacts, explained: frozenset[str]) -> list[Finding]:
    """Per rewrite that names the portable operators it takes out: their calls in this run, when it applies."""
    findings: list[Finding] = []
    for rewrite in REWRITES.values():
        if not rewrite.portable_operators or not _rewrite_offered(facts, rewrite.name):
            continue
        taken = explained.union(node for f in findings for nodes in f.nodes.values() for node in nodes)
        calls = _operator_calls(facts, rewrite.portable_operators, frozenset(taken))
        if rewrite.portable_sources:
            calls = [call for call in calls if _from_functions(call, rewrite.portable_sources)]
        if calls:
            operators = ", ".join(sorted({call.operator for call in calls}))
            findings.append(_rewrite_finding(
                facts, rewrite.name, calls, rewrite.finding or f"{operators} in portable kernels",
                f"{len(calls)} portable kernel call(s) of {operators}; the {rewrite.name} rewrite: "
                f"{rewrite.description}",
                rewrite.saving_note
                or "the measured time of the portable kernels it takes out (what replaces them runs inside XNNPACK)",
            ))  # fmt: skip
    return findings


def find_float_convolutions(facts: RunFacts, explained: frozenset[str]) -> list[Finding]:
    """An int8-dynamic program whose 1-D convolutions stayed fp32 (the quantizer takes 2-D ones only): conv1d-as-2d."""
    quantization = facts.sidecar.quantization if facts.sidecar is not None else None
    if quantization is None or quantization.scheme != "int8-dynamic" or not quantization.float_convolutions:
        return []
    if not _rewrite_offered(facts, "conv1d-as-2d"):
        return []
    all_float = quantization.quantized_convolutions == 0

    def stayed_float(module: str | None) -> bool:  # the sidecar names modules from the wrapper ("model.…")
        return all_float or (module is not None and any(
            name == module or name.endswith(f".{module}") for name in quantization.float_convolutions))  # fmt: skip

    convolutions = [
        (delegate.graph_id, node)
        for delegate in facts.ops.delegates
        if delegate.node_id not in explained
        for node in delegate.nodes
        if node.type in CONVOLUTION_TYPES and stayed_float(node.module)
    ]
    measured = sum(node.ms for _, node in convolutions)
    if not convolutions or _share(facts, measured) < PORTABLE_MIN_SHARE:
        return []
    count = len(quantization.float_convolutions)
    return [
        Finding(
            kind="conv1d-as-2d",
            title="1-D convolutions left fp32 in an int8-dynamic program",
            **delegate_node_fields(facts, convolutions),
            cause=f"{count} of {quantization.convolutions} convolutions stayed fp32: ExecuTorch's XNNPACK quantizer "
            "quantizes a convolution dynamically only in 2-D",
            saving_ms=measured * CONV1D_INT8_SAVING,
            fix_kind="rewrite",
            fix="--rewrites conv1d-as-2d",
            rewrite="conv1d-as-2d",
            saving_note=f"{CONV1D_INT8_SAVING:.0%} of the fp32 convolutions' measured time (measured on wav2vec 2.0 "
            "base); the same model's fp32 program gets slower with it (wav2vec 2.0 base: 7%)",
        )
    ]


def find_static_cache_attention(facts: RunFacts, explained: frozenset[str]) -> list[Finding]:
    """A text-generation program lowered with `attention: sdpa` (an old sidecar's None is sdpa): etlab's attention
    takes out the static cache's bookkeeping, predicted at its measured time."""
    generation = facts.sidecar.generation if facts.sidecar is not None else None
    spec = facts.spec
    if generation is None or (generation.attention or SDPA) != SDPA:
        return []
    if spec is None or not spec.generates or not hasattr(spec.options, "attention"):
        return []  # no spec to lower again with another attention
    calls = _operator_calls(facts, STATIC_CACHE_OPERATORS + STATIC_CACHE_MASK_OPERATORS, explained)
    if not calls:
        return []
    measured = _ms(calls)
    return [
        Finding(
            kind="attention",
            title="the static cache's bookkeeping in portable kernels",
            operators=tuple(sorted({call.operator for call in calls})),
            nodes=_top_nodes(facts, calls),
            calls=len(calls),
            measured_ms=measured,
            share=_share(facts, measured),
            cause=f"the program attends with transformers' static-cache recipe (attention: sdpa): repeat_kv's copy "
            f"of the cache, index_put and copy_ writes and a causal mask over the whole cache, {len(calls)} "
            "portable kernel calls between the delegates per step",
            saving_ms=measured,
            fix_kind="option",
            fix=f"--attention {ETLAB}",
            attention=ETLAB,
            saving_note="the measured time of the static cache's bookkeeping operators (etlab's attend and "
            "update_cache, which replace them, cost what they cost: --try measures it)",
        )
    ]


def find_sdpa_masks(facts: RunFacts, explained: frozenset[str]) -> list[Finding]:
    if not _rewrite_offered(facts, "eager-attention"):
        return []
    calls = _operator_calls(facts, SDPA_MASK_OPERATORS, explained)
    if not any(call.operator == "aten::any" for call in calls):  # the SDPA path's signature: any(mask) per layer
        return []
    wheres = [call for call in calls if call.operator == "aten::where"]
    kept = min(wheres, key=lambda call: call.index) if wheres else None  # eager attention still builds its mask
    removed = [call for call in calls if call is not kept]
    return [_rewrite_finding(
        facts, "eager-attention", removed, "SDPA's boolean-mask operators in portable kernels",
        f"transformers' SDPA attention turns the mask into boolean operations per layer (where, eq, any, "
        f"logical_not): {len(removed)} portable kernel calls between the delegates",
        "the mask operators' measured time, less the one where eager attention keeps to build its float mask",
    )]  # fmt: skip


def find_all_positions_head(facts: RunFacts, explained: frozenset[str]) -> list[Finding]:
    if not _rewrite_offered(facts, "head-at-position") or facts.sidecar is None or not facts.sidecar.outputs:
        return []
    shape = facts.sidecar.outputs[0].shape
    vocab = shape[-1] if shape else 0
    last_call = max(facts.ops.delegate_calls(), key=lambda call: call.index, default=None)
    delegate = next((d for d in facts.ops.delegates if last_call and d.node_id == last_call.node_id), None)
    heads = [node for node in delegate.nodes if node.type == "XNNFullyConnected"] if delegate else []
    if delegate is None or not heads or last_call is None or last_call.node_id in explained:
        return []
    head = heads[-1]
    if len(shape) == 3:  # every position's logits, [B, seq_len, vocab]
        positions = shape[1]
    else:  # one position's logits selected after the head: the head's own output says how many it projected
        projected = head.shape or ()
        if len(projected) != 3 or projected[-1] != vocab:
            return []
        positions = projected[1]
    if positions <= 1:
        return []
    saving = head.ms * (1 - 1 / positions)
    return [
        Finding(
            kind="head-at-position",
            title=f"the LM head computed at all {positions} positions",
            operators=("XNNFullyConnected",),
            nodes={facts.ops.method: (last_call.node_id,), delegate.graph_id: (head.node,)},
            calls=1,
            measured_ms=head.ms,
            share=_share(facts, head.ms),
            cause=f"the head (hidden x {vocab}, the largest matmul) runs on all {positions} positions, while a "
            f"{facts.spec.task if facts.spec else 'LM'} prediction reads one"
            + ("" if len(shape) == 3 else ", which the program selects after the head"),
            saving_ms=saving,
            fix_kind="rewrite",
            fix="--rewrites head-at-position",
            rewrite="head-at-position",
            saving_note=f"(1 - 1/{positions}) of the head's measured FullyConnected time",
        )
    ]


def find_portable_operators(facts: RunFacts, explained: frozenset[str]) -> list[Finding]:
    by_operator: dict[str, list[InstructionTiming]] = defaultdict(list)
    for call in facts.ops.kernel_calls():
        if call.node_id not in explained and not call.operator.startswith(OWN_OPERATORS):
            by_operator[call.operator].append(call)
    findings = []
    for operator, calls in by_operator.items():
        measured = _ms(calls)
        if _share(facts, measured) < PORTABLE_MIN_SHARE:
            continue
        hint, fix_kind, fix = PORTABLE_HINTS.get(operator, OTHER_PORTABLE)
        findings.append(
            Finding(
                kind="portable-operator",
                title=f"{operator} in portable kernels",
                operators=(operator,),
                nodes=_top_nodes(facts, calls),
                calls=len(calls),
                measured_ms=measured,
                share=_share(facts, measured),
                cause=f"{len(calls)} call(s) of {operator} run in single-threaded portable kernels, outside "
                f"XNNPACK: {hint}",
                saving_ms=measured,
                fix_kind=fix_kind,
                fix=fix,
                saving_is_bound=True,
                saving_note="at most the operator's measured time",
            )
        )
    return findings


def find_idle_cores(facts: RunFacts, _explained: frozenset[str]) -> list[Finding]:
    threads, cores = facts.summary.latency.threads, facts.summary.board_conditions.get("cores_online")
    if not isinstance(threads, int) or not isinstance(cores, int) or isinstance(cores, bool) or threads >= cores:
        return []
    delegated = facts.ops.delegated_median_ms
    if not delegated:
        return []  # nothing runs on more than one thread: more threads save nothing
    saving = delegated * (1 - threads / cores)
    return [
        Finding(
            kind="threads",
            title=f"{threads} of {cores} cores used",
            operators=(),
            nodes={},
            calls=0,
            measured_ms=delegated,
            share=_share(facts, delegated),
            cause=f"the run used {threads} thread(s) on a board with {cores} cores online",
            saving_ms=saving,
            fix_kind="option",
            fix=f"--threads {cores} (or `threads: {cores}` for the board in the inventory)",
            saving_note=f"the delegated time scaled to {cores} threads (portable kernels stay single-threaded)",
        )
    ]


def _gemm_ms(nodes_of: Iterable[tuple[str, float]]) -> float:
    return sum(ms for node_type, ms in nodes_of if node_type in GEMM_TYPES)


def _saving_from_ratios(board: BoardRatios, nodes: Sequence[DelegateNodeTiming]) -> tuple[float | None, str]:
    """This run's GEMM time at the board's int8/fp32 ratio of each node's type and output size (BoardRatios.ratio).
    On a board where int8 runs slower the saving is 0 and the note says why."""
    quantized = sum(node.ms * board.ratio(node.type, node.shape) for node in nodes)
    saving = max(0.0, sum(node.ms for node in nodes) - quantized)
    ratios = board.ratios
    said = ", ".join(f"{node_type.removeprefix('XNN')} ×{ratio:.2f}" for node_type, ratio in sorted(ratios.items()))
    sized = sum(1 for node in nodes if shape_key(node.type, node.shape) in board.by_shape)
    said += f"; {sized} of {len(nodes)} nodes at the ratio of their own size" if board.by_shape else ""
    slower = "; int8 is not faster here: quantize for size or memory only" if saving == 0 else ""
    return saving, (
        f"predicted from this board's int8/fp32 time ratios ({board.scheme.scheme.name}: {said}), measured on "
        f"{'; '.join(board.sources)}{slower}"
    )


def find_float_gemms(facts: RunFacts, _explained: frozenset[str]) -> list[Finding]:
    if facts.sidecar is None or not facts.sidecar.variant.peers:  # a quantized program: nothing to quantize
        return []
    gemms = [(d.graph_id, node) for d in facts.ops.delegates for node in d.nodes if node.type in GEMM_TYPES]
    measured = sum(node.ms for _, node in gemms)
    if _share(facts, measured) < GEMM_MIN_SHARE:
        return []
    saving, note = None, "not predicted: no int8 run on this board yet (fab advise --try measures one)"
    peer_variant = facts.quantized_peer_variant
    if facts.quantized_peer is not None:
        quantized = _gemm_ms((n.type, n.ms) for d in facts.quantized_peer.delegates for n in d.nodes)
        saving = max(0.0, measured - quantized)
        note = f"measured: the same layers in run {facts.quantized_peer.run_id} ({facts.quantized_peer_variant})"
    elif facts.board_ratios is not None:
        saving, note = _saving_from_ratios(facts.board_ratios, [node for _, node in gemms])
        peer_variant = facts.board_ratios.scheme
    # The measured peer's scheme, else the first the program's scheme names.
    scheme = (peer_variant or facts.sidecar.variant.peers[0]).scheme.name
    return [
        Finding(
            kind="quantize",
            title="fp32 matmuls and convolutions dominate",
            **delegate_node_fields(facts, gemms),
            cause=f"{len(gemms)} fp32 FullyConnected/convolution nodes take {_share(facts, measured):.0%} of the run",
            saving_ms=saving,
            fix_kind="option",
            fix=f"--quantize {scheme} (check the accuracy verdict)",
            saving_note=note,
            quantize=scheme,
        )
    ]


def find_board_conditions(facts: RunFacts, _explained: frozenset[str]) -> list[Finding]:
    conditions = facts.summary.board_conditions
    findings = []
    governor = conditions.get("governor_before") or conditions.get("governor_after")
    if isinstance(governor, str) and governor != "performance":
        findings.append(
            Finding(
                kind="governor",
                title=f"CPU governor {governor[:40]!r}",
                operators=(),
                nodes={},
                calls=0,
                measured_ms=0.0,
                share=0.0,
                cause=f"the CPU frequency governor was {governor[:40]!r}: the clock ramps up under load, so short "
                "runs are slower and noisier",
                saving_ms=None,
                fix_kind="board",
                fix="set the governor to performance on the board (cpufreq)",
                saving_note="not predicted: the profile cannot tell the clock's share",
            )
        )
    throttling = [str(flag)[:40] for flag in conditions.get("throttling_during_run") or ()]
    if throttling:
        findings.append(
            Finding(
                kind="throttling",
                title="throttled during the run",
                operators=(),
                nodes={},
                calls=0,
                measured_ms=0.0,
                share=0.0,
                cause=f"the board throttled during the run ({', '.join(throttling[:4])})",
                saving_ms=None,
                fix_kind="board",
                fix="cool the board or fix its power supply, then measure again",
                saving_note="not predicted: the measured times are the throttled ones",
            )
        )
    return findings


def find_constants_twice(facts: RunFacts, _explained: frozenset[str]) -> list[Finding]:
    outside = facts.sidecar.outside_delegates if facts.sidecar is not None else None
    if outside is None or facts.sidecar is None:
        return []
    megabytes = outside.stored_twice_bytes / 1e6
    program_mb = facts.sidecar.memory.pte_bytes / 1e6
    if megabytes < STORED_TWICE_MIN_MB or (program_mb and megabytes < STORED_TWICE_MIN_SHARE * program_mb):
        return []
    return [
        Finding(
            kind="stored-twice",
            title=f"{megabytes:.1f} MB of constants stored twice",
            operators=(),
            nodes={},
            calls=0,
            measured_ms=0.0,
            share=0.0,
            cause="a weight is used both outside a delegate and inside XNNPACK (a tied embedding and LM head), so "
            "the program carries two copies",
            saving_ms=None,
            fix_kind="code",
            fix="in the model's code: untie the head, if size matters more than the tie",
            saving_note="a size cost: no time to save",
            saving_mb=megabytes,
        )
    ]


DETECTORS: dict[str, Detector] = {
    detector.name: detector
    for detector in (
        Detector("backend", "a program with no delegate: lower it for XNNPACK", find_undelegated_program),
        Detector(
            "rewrites",
            "portable operators a rewrite takes out (rewrites/registry.py: tanh-gelu, rms-norm, rope, ...)",
            find_rewritable_operators,
        ),
        Detector("conv1d-as-2d", "1-D convolutions an int8-dynamic program left fp32", find_float_convolutions),
        Detector(
            "attention",
            "a generation program's static-cache attention (--attention etlab)",
            find_static_cache_attention,
        ),
        Detector("eager-attention", "SDPA's per-layer mask operators in portable kernels", find_sdpa_masks),
        Detector("head-at-position", "an LM head computed at every position", find_all_positions_head),
        Detector("portable-operator", "other operators in portable kernels, by type", find_portable_operators),
        Detector("threads", "cores the run left idle", find_idle_cores),
        Detector("quantize", "fp32 matmuls and convolutions that dominate", find_float_gemms),
        Detector("roofline", "matmuls at the memory bandwidth, or far below both limits", find_roofline),
        Detector("keep-float", "the layers that hold a quantized program's accuracy loss", find_sensitive_layers),
        Detector("board", "the governor and throttling", find_board_conditions),
        Detector("stored-twice", "constants held outside and inside a delegate", find_constants_twice),
    )
}
