"""Named graph rewrites: what etlab may change in a model before exporting it, and only when asked (`--rewrites`).

By default the program is the model as its user would export it: the profile shows what they would deploy. Each
rewrite here computes the same function, written so more of it runs inside XNNPACK (on full-size GPT-2 the three
took fp32 from 301.6 to 167.2 ms). The advisor (orchestrator/advice/) proposes them from a profile and measures them.

This module is torch-free (the command line and the nightly matrix check names with it): whether a rewrite applies
to a spec is decided from its source, family and task; whether its pattern is really in the loaded module
(`present`) and the rewrite itself (`apply`) are `module:function` paths, imported when a lowering uses them.

Add a rewrite: a `Rewrite` in REWRITES and its two functions (`tests/lowering/test_rewrites*.py` tie them).
"""

from __future__ import annotations

import importlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from orchestrator.config import did_you_mean
from orchestrator.errors import UsageError
from orchestrator.lowering.sources.huggingface import HuggingFaceOptions
from orchestrator.lowering.spec import GENERATION_TASK, OUTPUT_WORDS, TASKS, WRAPPED_TASKS, ModelSpec

_FUNCTIONS = "orchestrator.lowering.rewrites.huggingface"
_LAYERS = "orchestrator.lowering.rewrites.layers"
_ROPE = "orchestrator.lowering.rewrites.rope"
# Families whose default config uses `gelu_new` (transformers' configs; tests/lowering/test_rewrites.py checks it).
GELU_NEW_FAMILIES = ("albert", "big_bird", "codegen", "fnet", "funnel", "gpt2", "gpt_neo", "gptj", "mt5",
                     "nystromformer", "phi")  # fmt: skip
# Families whose positional convolution is weight-normalized (tests/lowering/test_layer_rewrites.py checks them).
WEIGHT_NORM_FAMILIES = ("wav2vec2", "hubert", "wavlm", "sew", "sew-d", "unispeech", "unispeech-sat",
                        "wav2vec2-conformer")  # fmt: skip
# Families whose convolutions are 1-D (`nn.Conv1d`: an audio feature encoder; the same test checks them).
CONV1D_FAMILIES = ("wav2vec2", "hubert", "wavlm", "sew", "sew-d", "unispeech", "unispeech-sat", "wav2vec2-conformer",
                   "data2vec-audio", "whisper")  # fmt: skip
# Families whose attention calls Llama's apply_rotary_pos_emb (tests/lowering/test_rope_rewrite.py checks them).
LLAMA_ROPE_FAMILIES = ("llama", "mistral", "mixtral", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe", "smollm3",
                       "granite")  # fmt: skip
# Families whose RMSNorm is LlamaRMSNorm's code (the same test checks them).
LLAMA_RMS_NORM_FAMILIES = ("llama", "mistral", "mixtral", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe", "phi3",
                           "smollm3", "granite")  # fmt: skip


@dataclass(frozen=True)
class Rewrite:
    name: str
    description: str  # one sentence: what changes and why it is worth it
    sources: tuple[str, ...]  # the model sources it knows how to rewrite
    tasks: tuple[str, ...] | None  # None: every task of those sources
    families: tuple[str, ...] | None  # None: every family; else those, or a spec whose config asks for `config_value`
    present: str  # "module:function": (module) -> bool, the pattern is in the loaded module
    apply: str  # "module:function": (module, spec) -> the rewritten module
    config_value: str | None = None
    # The programs' outputs (spec.py OUTPUTS) it rewrites; None: whatever the program returns.
    outputs: tuple[str, ...] | None = None
    # For the advisor: the operators (without overload) whose portable kernel calls the rewrite takes out of the
    # program, and what that looks like in a profile. A rewrite without them has a detector of its own.
    portable_operators: tuple[str, ...] = ()
    # Where such an operator is common: the model's functions its calls come from (the run's source map: "... in
    # rotate_half"); a call from elsewhere is not the rewrite's, one without a source is counted.
    portable_sources: tuple[str, ...] = ()
    finding: str = ""
    saving_note: str = ""  # how the finding's saving relates to those calls' time, where not "all of it"
    # Rewrites whose change this one makes too: `auto` and the advisor's trial of all together leave them out.
    supersedes: tuple[str, ...] = ()
    # False: a trade-off, not a plain gain (conv1d-as-2d speeds the int8 program, slows the fp32 one): never in
    # `auto`; asked for by name, or proposed by the advisor where it gains.
    in_auto: bool = True

    def applies(self, spec: ModelSpec) -> bool:
        """Whether the rewrite can apply to the spec's model, without loading it."""
        if spec.model_source not in self.sources or (self.tasks is not None and spec.task not in self.tasks):
            return False
        if self.outputs is not None and spec.output not in self.outputs:
            return False
        if self.families is None or spec.model_type in self.families:
            return True
        config = spec.options.config if isinstance(spec.options, HuggingFaceOptions) else {}
        return self.config_value is not None and self.config_value in config.values()


REWRITES: dict[str, Rewrite] = {
    rewrite.name: rewrite
    for rewrite in (
        Rewrite(
            "tanh-gelu",
            "gelu_new becomes gelu_pytorch_tanh, the same tanh approximation: XNNPACK takes GELU but not the "
            "pow(x, 3) of gelu_new, left in portable kernels once per block",
            ("huggingface",),
            None,
            GELU_NEW_FAMILIES,
            f"{_FUNCTIONS}:has_gelu_new",
            f"{_FUNCTIONS}:tanh_gelu",
            config_value="gelu_new",
            portable_operators=("aten::pow",),
            finding="gelu_new's pow(x, 3) in portable kernels",
        ),
        Rewrite(
            "eager-attention",
            "eager attention instead of SDPA: the SDPA decomposition leaves per-layer boolean-mask ops (where, eq, "
            "any, logical_not) in portable kernels; eager attention adds one float mask inside the delegate",
            ("huggingface",),
            None,
            None,
            f"{_FUNCTIONS}:has_sdpa_attention",
            f"{_FUNCTIONS}:eager_attention",
        ),
        Rewrite(
            "bmm-attention",
            "attention's two products as batched matmuls over batch x heads: a 4-D torch.matmul exports as "
            "expand_copy + bmm, and each expand_copy (a full copy of the scores, [B, H, T, T]) ran in portable "
            "kernels and split the delegate twice per layer",
            ("huggingface",),
            # a text-generation program attends over its KV cache: etlab's attention (`--attention etlab`) is its fix
            tuple(task for task in TASKS if task != GENERATION_TASK),
            None,
            f"{_FUNCTIONS}:has_matmul_attention",
            f"{_FUNCTIONS}:bmm_attention",
            portable_operators=("aten::expand_copy",),
            finding="attention's 4-D matmuls broadcast (expand_copy) in portable kernels",
            supersedes=("eager-attention",),  # it replaces SDPA as eager-attention does, with eager's mask
        ),
        Rewrite(
            "fold-weight-norm",
            "a weight-normalized convolution's weight is computed once instead of on every run: XNNPACK takes a "
            "convolution only with a constant weight, so wav2vec 2.0's positional convolution ran in portable kernels",
            ("huggingface",),
            None,
            WEIGHT_NORM_FAMILIES,
            f"{_LAYERS}:has_weight_norm",
            f"{_LAYERS}:fold_weight_norm",
            # the convolution, and the weight norm computed on every run (measured on wav2vec2: convolution, sum)
            portable_operators=(
                "aten::convolution",
                "aten::_weight_norm_interface",
                "aten::sum",
                "aten::pow",
                "aten::sqrt",
                "aten::div",
            ),
            finding="a weight-normalized convolution in portable kernels",
        ),
        Rewrite(
            "conv1d-as-2d",
            "a 1-D convolution as a 2-D one over a height of 1, the same weights: ExecuTorch's XNNPACK quantizer "
            "quantizes convolutions dynamically only in 2-D, so int8-dynamic left an audio model's convolutions fp32 "
            "(the fp32 program gets slower: not in auto)",
            ("huggingface",),
            None,
            CONV1D_FAMILIES,
            f"{_LAYERS}:has_conv1d",
            f"{_LAYERS}:conv1d_as_2d",
            in_auto=False,
        ),
        Rewrite(
            "fused-rms-norm",
            "Llama's RMSNorm as one etlab operator: where etlab's attention and RoPE split the delegates at every "
            "layer anyway, each norm cost a portable mean and 5 small XNNPACK operators",
            ("huggingface",),
            # a program over a whole sequence keeps its norms inside XNNPACK with rms-norm; here the split is paid
            (GENERATION_TASK,),
            LLAMA_RMS_NORM_FAMILIES,
            f"{_LAYERS}:has_llama_rms_norm",
            f"{_LAYERS}:fused_rms_norm",
            portable_operators=("aten::mean",),
            finding="RMSNorm's mean over the last dimension in portable kernels",
            saving_note="the means' measured time, a lower bound: the rewrite also takes out 5 XNNPACK operators a "
            "norm (on SmolLM2-135M at 4-bit, bench/README.md)",
            supersedes=("rms-norm",),  # it takes the mean out of portable kernels too
        ),
        Rewrite(
            "rms-norm",
            "Llama's RMSNorm takes its mean as a fully connected layer: XNNPACK takes a mean over the last "
            "dimension of a 3-D tensor nowhere, so it ran in portable kernels and split the delegates at every norm",
            ("huggingface",),
            None,
            LLAMA_RMS_NORM_FAMILIES,
            f"{_LAYERS}:has_llama_rms_norm",
            f"{_LAYERS}:mean_rms_norm",
            portable_operators=("aten::mean",),
            finding="RMSNorm's mean over the last dimension in portable kernels",
        ),
        Rewrite(
            "rope",
            "Llama's rotary position embedding as one etlab operator per tensor, reading q and k as the projections "
            "write them: transformers' slices, negation, concatenation, products and sum cost every layer 4 slices "
            "and 2 unsqueezes in portable kernels, about 12 XNNPACK operators and a delegate call",
            ("huggingface",),
            # a program over a whole sequence has static shapes, and XNNPACK takes its slices: measured where not
            (GENERATION_TASK,),
            LLAMA_ROPE_FAMILIES,
            f"{_ROPE}:has_llama_rope",
            f"{_ROPE}:fuse_rope",
            portable_operators=("aten::slice_copy",),
            portable_sources=("rotate_half", "apply_rotary_pos_emb"),
            finding="RoPE's rotate_half slices in portable kernels",
            saving_note="the slices' measured time, a lower bound: the rewrite also takes out a delegate call and "
            "about 12 XNNPACK operators a layer (on SmolLM2-135M at 4-bit, bench/README.md)",
        ),
        Rewrite(
            "head-at-position",
            "the LM head runs at one position only (the [MASK], or the last real token), so the output is "
            "[B, vocab] instead of [B, seq_len, vocab]; a program that selects its position after the head (output: "
            "mask or last) selects it before instead, its outputs unchanged: the head is the largest matmul (a "
            "fifth of GPT-2's time, a third of DistilBERT's)",
            ("huggingface",),
            WRAPPED_TASKS,
            None,
            f"{_FUNCTIONS}:has_all_positions_head",
            f"{_FUNCTIONS}:head_at_position",
        ),
    )
}


@dataclass(frozen=True)
class RewriteRequest:
    """What the command line or the matrix asked for: `auto` (those that apply, where the module has the pattern),
    or these names (none: the model as exported)."""

    auto: bool = False
    names: tuple[str, ...] = ()

    def __str__(self) -> str:
        return "auto" if self.auto else ",".join(self.names) or "none"

    def resolve(self, spec: ModelSpec) -> tuple[str, ...]:
        """The rewrites to try on the spec's model, in REWRITES order (the head last: it wraps the model)."""
        if self.auto:
            return without_superseded(
                name for name, rewrite in REWRITES.items() if rewrite.in_auto and rewrite.applies(spec)
            )
        return tuple(name for name in REWRITES if name in self.names)


NO_REWRITES = RewriteRequest()


def without_superseded(names: Iterable[str]) -> tuple[str, ...]:
    """`names` less those another of them supersedes (bmm-attention makes eager-attention's change too)."""
    kept = tuple(dict.fromkeys(names))
    superseded = {old for name in kept for old in REWRITES[name].supersedes}
    return tuple(name for name in kept if name not in superseded)


class UnknownRewrite(UsageError):
    """A rewrite name not in REWRITES, or one that does not apply to the model (exit 64)."""


def parse_rewrites(value: str | Sequence[str]) -> RewriteRequest:
    """`auto`, `none`, or names (comma-separated, or a list); an unknown name is UnknownRewrite with a did-you-mean."""
    items = value.split(",") if isinstance(value, str) else list(value)
    names = [item.strip() for item in items if item.strip()]
    if names == ["auto"]:
        return RewriteRequest(auto=True)
    if names in ([], ["none"]):
        return NO_REWRITES
    for name in names:
        if name not in REWRITES:
            special = " ('auto' and 'none' stand alone)" if name in ("auto", "none") else ""
            raise UnknownRewrite(
                f"unknown rewrite {name!r}{special}{did_you_mean(name, REWRITES)}; choose auto, none, or from "
                f"{', '.join(REWRITES)}"
            )
    return RewriteRequest(names=tuple(dict.fromkeys(names)))


def not_applying(request: RewriteRequest, spec: ModelSpec) -> list[str]:
    """The requested names that cannot apply to the spec's model, each with the reason."""
    problems = []
    for name in request.names:
        rewrite = REWRITES[name]
        if (
            rewrite.outputs is not None
            and spec.output not in rewrite.outputs
            and rewrite.applies(replace(spec, output=rewrite.outputs[0]))
        ):
            wanted = " or ".join(f"{OUTPUT_WORDS[output]} (output: {output})" for output in rewrite.outputs)
            problems.append(
                f"{name} does not apply to {spec.name}: it rewrites programs that return {wanted}, and "
                f"{spec.name} returns {OUTPUT_WORDS[spec.output]} (output: {spec.output})"
            )
            continue
        if not rewrite.applies(spec):
            where = f"tasks {', '.join(rewrite.tasks)}" if rewrite.tasks and spec.task not in rewrite.tasks else None
            where = where or (f"families {', '.join(rewrite.families)}" if rewrite.families else None)
            sources = ", ".join(rewrite.sources)
            what = f"{spec.model_source} {spec.model_type} ({spec.task})"
            problems.append(f"{name} does not apply to {spec.name}, a {what} model: it rewrites {sources} models"
                            + (f" of the {where}" if where else ""))  # fmt: skip
    return problems


def check_request(request: RewriteRequest, spec: ModelSpec) -> None:
    problems = not_applying(request, spec)
    if problems:
        raise UnknownRewrite("; ".join(problems))


def _function(path: str) -> Any:
    module, _, name = path.partition(":")
    return getattr(importlib.import_module(module), name)


class RewriteNotFound(UsageError):
    """A rewrite asked for by name whose pattern the loaded model does not have (exit 64)."""


def apply_rewrites(module: Any, spec: ModelSpec, request: RewriteRequest) -> tuple[Any, tuple[str, ...]]:
    """`module` with the requested rewrites applied, and the names applied, in order.

    `auto` skips a rewrite whose pattern the module lacks (a GPT-2 configured with another activation); a rewrite
    asked for by name that finds nothing to rewrite is RewriteNotFound.
    """
    applied = []
    for name in request.resolve(spec):
        rewrite = REWRITES[name]
        if not _function(rewrite.present)(module):
            if request.auto:
                continue
            raise RewriteNotFound(f"rewrite {name}: {spec.name} has nothing to rewrite ({rewrite.description})")
        module = _function(rewrite.apply)(module, spec)
        applied.append(name)
    return module, tuple(applied)
