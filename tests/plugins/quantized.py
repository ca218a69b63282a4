"""Quantized variants of the tiny models, lowered with the real pipeline into the shared test cache.

Every scheme of both tiny models: `xnnpack-int8-dynamic`, `xnnpack-int8-static` (calibrated on generated samples)
and `xnnpack-8da4w`. Cached across sessions like the fp32 ones (tests/plugins/artifacts.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from orchestrator.lowering import lower as lowering
from orchestrator.lowering.artifacts import VARIANTS
from orchestrator.lowering.lower import LoweringResult
from orchestrator.lowering.spec import BUILTIN_SPECS
from tests.plugins.artifacts import ARTIFACT_CACHE, TINY_MODELS


def lower_quantized(name: str, root: Path = ARTIFACT_CACHE) -> LoweringResult:
    """Every variant of the registry: both fp32 backends and each quantized scheme."""
    return lowering.lower(BUILTIN_SPECS[name], variants=list(VARIANTS.values()), weights="random", root=root, jobs=2)


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
