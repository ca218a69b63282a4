"""Lowered tiny models, shared by every test that needs a real .pte.

They are lowered with the real pipeline into a cache folder that survives test sessions; the lowering
cache makes later sessions reuse them until the lowering code or versions change.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from orchestrator.lowering.builtins import BUILTIN_SPECS
from orchestrator.lowering.export import lower as lowering
from orchestrator.lowering.export.lower import LoweringResult
from orchestrator.lowering.variants import VARIANTS
from orchestrator.paths import PROJECT_ROOT

TEST_CACHE = PROJECT_ROOT / ".etlab" / "test-cache"
ARTIFACT_CACHE = TEST_CACHE / "artifacts"
TINY_MODELS = ("distilbert-tiny", "gpt2-tiny")


@pytest.fixture(scope="session", autouse=True)
def torchvision_importable() -> None:
    """Where torchvision is installed, transformers imports it: tests that import transformers' models directly (not
    through a model source's builder, which does this when it loads) need its operators declared first when its C++
    library does not load with this torch (torchvision.declare_torchvision_ops)."""
    if importlib.util.find_spec("torchvision") is not None:
        # imports torch: only with torchvision
        from orchestrator.lowering.sources.builders.torchvision import declare_torchvision_ops

        declare_torchvision_ops()


def lower_tiny(name: str, root: Path = ARTIFACT_CACHE) -> LoweringResult:
    return lowering.lower(
        BUILTIN_SPECS[name], variants=[VARIANTS["portable"], VARIANTS["xnnpack"]], weights="random", root=root
    )


@pytest.fixture(scope="session")
def tiny_artifacts() -> dict[str, LoweringResult]:
    """Both tiny models, both backends: {"distilbert-tiny": LoweringResult, "gpt2-tiny": ...}."""
    return {name: lower_tiny(name) for name in TINY_MODELS}


@pytest.fixture(scope="session")
def artifact_root(tiny_artifacts: dict[str, LoweringResult]) -> Path:
    """The artifacts root holding the tiny models (pass it as `root=` or ETLAB_ARTIFACTS)."""
    return ARTIFACT_CACHE
