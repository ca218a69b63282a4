"""Quantized variants of the tiny models, lowered with the real pipeline into the shared test cache.

Every scheme that fits both tiny models: `xnnpack-int8-dynamic`, `xnnpack-int8-static` (calibrated on generated
samples) and `xnnpack-8da4w` (`TINY_SCHEMES`; `8da4w-g128`'s groups of 128 do not divide their 64 features, so it is
tested on a language model of 128 features, tests/lowering/test_generation.py; `8da4w-e4` is for language models only,
tests/lowering/test_generation_quantize.py). Cached across sessions like the fp32
ones (tests/plugins/artifacts.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from orchestrator.lowering.artifacts import VARIANTS
from orchestrator.lowering.builtins import BUILTIN_SPECS
from orchestrator.lowering.export import lower as lowering
from orchestrator.lowering.export.lower import LoweringResult
from orchestrator.lowering.quantize.schemes import QUANTIZED
from tests.plugins.artifacts import ARTIFACT_CACHE, TINY_MODELS

TINY_WIDTH = 64  # the tiny models' hidden size: the input features of most of their linears
TINY_SCHEMES = tuple(
    scheme for scheme in QUANTIZED if (scheme.group_size or 1) <= TINY_WIDTH and not scheme.text_generation_only
)


def lower_quantized(name: str, root: Path = ARTIFACT_CACHE) -> LoweringResult:
    """Both fp32 backends and each quantized scheme that fits the tiny models (TINY_SCHEMES)."""
    wanted = [v for v in VARIANTS.values() if not v.quantized or v.scheme in TINY_SCHEMES]
    return lowering.lower(BUILTIN_SPECS[name], variants=wanted, weights="random", root=root)


@pytest.fixture(scope="session")
def quantized_artifacts(tiny_artifacts: dict[str, Any]) -> dict[str, LoweringResult]:
    """Both tiny models, fp32 and every quantized scheme: {"distilbert-tiny": LoweringResult, ...}."""
    return {name: lower_quantized(name) for name in TINY_MODELS}


def break_weight_scales(program: Any, seed: int = 7) -> int:
    """Multiply every per-channel weight scale of a PT2E-quantized ExportedProgram by a random factor (0.05-20).

    The program then computes with wrong weights, as a mis-calibrated or corrupted quantization would. Returns how
    many scale tensors were changed.
    """
    import torch

    generator = torch.Generator().manual_seed(seed)
    signature = program.graph_signature
    lifted = {**signature.inputs_to_buffers, **signature.inputs_to_lifted_tensor_constants}
    changed = 0
    for node in program.graph.nodes:
        if node.op != "call_function" or "dequantize_per_channel" not in str(node.target):
            continue
        scale = node.args[1]
        key = lifted.get(getattr(scale, "name", ""))
        if key is None:
            continue
        tensor = program.constants[key] if key in program.constants else program.state_dict[key]
        factors = torch.exp(torch.empty(tensor.shape).uniform_(-3.0, 3.0, generator=generator))
        with torch.no_grad():
            tensor.mul_(factors.to(tensor.dtype))
        changed += 1
    return changed
