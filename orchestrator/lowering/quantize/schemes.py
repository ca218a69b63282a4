"""The quantization schemes: `SCHEMES`, the one registry of `--quantize` choices (int8 dynamic, int8 static
(calibrated), 8da4w and its LLM group), each with its method, its expected XNNPACK datatypes, its relative cost, how
it quantizes (methods.py), its recipe for a text-generation program and its quantized peers.

The CLI's `--quantize`, the nightly matrix, the lowering, the sidecar's claims, the advisor's peers and the reports
all derive from it, so adding a scheme is a `Scheme` here (its apply function beside it or in methods.py) and its
tests. Backend names (`xnnpack-<scheme>`) are built and read back in variants.py. Nothing here imports torch at
module level: the registry is read without it.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from orchestrator.lowering.quantize.methods import (
    GROUP_SIZE,
    LLM_GROUP_SIZE,
    int8_dynamic,
    int8_static,
    llm_8da4w,
    llm_8da8w,
    quantize_8da4w,
)

# How a scheme turns a (deep-copied, Conv1D-swapped) eager model into an exported program: (model, example_args,
# calibration samples, PT2E quantizer override[, layers kept in float]) -> program. What it quantized is read from
# that program's graph.
Apply = Callable[..., Any]


@dataclass(frozen=True)
class LlmRecipe:
    """How a scheme quantizes a text-generation program, as ExecuTorch's LLM recipe does: torchao `quantize_` on the
    eager HuggingFace model, in place, before generation.py exports it with its KV cache."""

    method: str  # what it does, as the sidecar records it
    apply: Callable[[Any], None]  # (model) -> None; module-level (or a partial of one): workers unpickle it


def recipe_8da4w(group: int, embedding_bits: int = 8, share_head: bool = False) -> LlmRecipe:
    """ExecuTorch's LLM recipe for 4-bit linears: embeddings in `embedding_bits` (8: one scale a row; 4: one a group
    of 32), then the linears in int4 groups of `group`, each linear the group does not divide padded with zero
    columns to a multiple of it (the sidecar's `padded_linears`). `share_head`: a tied head reads the embedding's
    table (etlab::shared_head, the sidecar's `shared_heads`) instead of being quantized a second time."""
    tables = "int8, PerAxis(0)" if embedding_bits == 8 else f"int4, PerGroup({GROUP_SIZE})"
    shared = (
        f"; a tied lm_head stored once: etlab::shared_head reads the embedding's own {embedding_bits}-bit table "
        "(int8 dynamic activations per row), no second copy"
        if share_head
        else ""
    )
    return LlmRecipe(
        f"torchao quantize_ (ExecuTorch's LLM recipe): IntxWeightOnlyConfig({tables}) embeddings, then "
        f"Int8DynamicActivationIntxWeightConfig(int4 weights, PerGroup({group})) linears, padded to the group{shared}",
        functools.partial(llm_8da4w, group=group, embedding_bits=embedding_bits, share_head=share_head),
    )


@dataclass(frozen=True)
class Scheme:
    """One `--quantize` choice. `none` is fp32: no `apply`, and its programs keep their plain backend names.

    A scheme without `llm` is refused for a text-generation program (exit 64), never given another scheme's recipe.
    `peers` are the schemes whose runs (same model, same board) measure what quantizing this scheme's program would
    save, in the advisor's order of preference."""

    name: str
    method: str  # how it quantizes, as the sidecar records it
    fully_connected: str  # what its XNNPACK FullyConnected nodes must be (input x weight): the sidecar's check
    convolution: str  # the same for XNNPACK Convolution nodes
    relative_cost: float  # lowering seconds relative to fp32 XNNPACK, until a lowering of the variant measured them
    apply: Apply | None = None
    calibrated: bool = False  # fitted on calibration samples (`--calibration FILE`, else generated ones)
    group_size: int | None = None  # grouped int4 weights: the group along the input features
    llm: LlmRecipe | None = None  # its recipe for a text-generation program; None: refused for one
    peers: tuple[str, ...] = ()  # names of schemes in SCHEMES
    text_generation_only: bool = False  # a recipe for language models alone: refused for any other program

    @property
    def quantized(self) -> bool:
        return self.apply is not None

    @property
    def label(self) -> str:
        """How reports name it: `fp32` for none."""
        return self.name if self.quantized else "fp32"


# --------------------------------------------------------------------------------------------------------------
# The registry: every scheme, in the order the CLI lists them. Its costs are full-size DistilBERT's lowering
# seconds (bench/README.md: fp32 XNNPACK 23 s, int8-dynamic 37 s, int8-static 53 s, 8da4w 44 s).

_QUANTIZED_SCHEMES = (
    Scheme(
        "int8-dynamic",
        "PT2E: XNNPACKQuantizer (symmetric, per-channel int8 weights, dynamic int8 activations), "
        "prepare_pt2e/convert_pt2e",
        fully_connected="qdint8 x qcint8",
        convolution="qdint8 x qcint8",  # some Conv2d only: depthwise and 1-D ones stay fp32 (README)
        relative_cost=1.6,
        apply=int8_dynamic,
        llm=LlmRecipe(
            "torchao quantize_: Int8DynamicActivationIntxWeightConfig(int8 weights, PerAxis(0)) linears (8da8w)",
            llm_8da8w,
        ),
    ),
    Scheme(
        "int8-static",
        "PT2E: XNNPACKQuantizer (symmetric, per-channel int8 weights, static int8 activations), "
        "prepare_pt2e + calibration + convert_pt2e",
        fully_connected="qint8 x qcint8",
        convolution="qint8 x qcint8",
        relative_cost=2.3,
        apply=int8_static,
        calibrated=True,
    ),
    *(
        Scheme(
            name,
            f"torchao quantize_: Int8DynamicActivationIntxWeightConfig(int4 weights, PerGroup({group}))",
            fully_connected="qdint8 x qbint4",
            convolution="fp32 x fp32",  # quantize_ here takes linears only
            relative_cost=1.9,
            apply=functools.partial(quantize_8da4w, group=group),  # a module-level function: workers unpickle it
            group_size=group,
            llm=recipe_8da4w(group),
        )
        for name, group in (("8da4w", GROUP_SIZE), ("8da4w-g128", LLM_GROUP_SIZE))
    ),
    # ExecuTorch's recipe with 4-bit embedding tables (export_llama's `--embedding-quantize 4,32`): a language
    # model's table is its largest tensor after the head. For language models only: the rows above quantize no
    # other program's embeddings either, so this one would be 8da4w under another name.
    Scheme(
        "8da4w-e4",
        f"torchao quantize_: Int8DynamicActivationIntxWeightConfig(int4 weights, PerGroup({GROUP_SIZE})), "
        "text generation only",
        fully_connected="qdint8 x qbint4",
        convolution="fp32 x fp32",
        relative_cost=1.9,
        apply=functools.partial(quantize_8da4w, group=GROUP_SIZE),
        group_size=GROUP_SIZE,
        llm=recipe_8da4w(GROUP_SIZE, embedding_bits=4),
        text_generation_only=True,
    ),
    # The tied head stored once (issue 36 item 3): 8da4w-e4 whose tied head reads the embedding's 4-bit table through
    # etlab::shared_head instead of a 4-bit copy in XNNPACK. A row of its own, not 8da4w-e4's default: it decoded
    # 11% slower on SmolLM2-135M (bench/README.md), for a program 17% smaller. (An 8-bit table shared lost 20%.)
    Scheme(
        "8da4w-e4-shared",
        f"torchao quantize_: Int8DynamicActivationIntxWeightConfig(int4 weights, PerGroup({GROUP_SIZE})), "
        "the tied head on the 4-bit embedding table (etlab::shared_head), text generation only",
        fully_connected="qdint8 x qbint4",
        convolution="fp32 x fp32",
        relative_cost=1.9,
        apply=functools.partial(quantize_8da4w, group=GROUP_SIZE),
        group_size=GROUP_SIZE,
        llm=recipe_8da4w(GROUP_SIZE, embedding_bits=4, share_head=True),
        text_generation_only=True,
    ),
)
# fp32's peers: every quantized scheme, int8-dynamic first (the registry's order); a peer counts only where its run
# exists, so a scheme for language models only is looked for on theirs alone.
FP32 = Scheme(
    "none", "none (fp32)", fully_connected="fp32 x fp32", convolution="fp32 x fp32", relative_cost=1.0,
    peers=tuple(scheme.name for scheme in _QUANTIZED_SCHEMES),
)  # fmt: skip
SCHEMES: dict[str, Scheme] = {scheme.name: scheme for scheme in (FP32, *_QUANTIZED_SCHEMES)}
QUANTIZED = tuple(scheme for scheme in SCHEMES.values() if scheme.quantized)
LLM_SCHEMES = tuple(scheme for scheme in QUANTIZED if scheme.llm is not None)  # those a text-generation program takes
