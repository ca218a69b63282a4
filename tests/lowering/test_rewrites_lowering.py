"""Lowering with and without rewrites (lowering/rewrites/): the default program is the model as exported, `auto`
records what it applied, another set of rewrites is a cache miss, `--rewrites` is checked at the edge (exit 64).

The rewrites themselves (registry, patterns, equivalence) are in test_rewrites.py.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import numpy as np
import torch

from orchestrator.lowering.builtins import BUILTIN_SPECS
from orchestrator.lowering.export import cache
from orchestrator.lowering.export import lower as lowering
from orchestrator.lowering.export.lower import LoweringResult
from orchestrator.lowering.program import program_name, with_
from orchestrator.lowering.rewrites.registry import NO_REWRITES, parse_rewrites
from orchestrator.lowering.sidecar import sidecar_data, sidecar_from_data
from orchestrator.lowering.variants import VARIANTS
from orchestrator.names import is_valid_name
from orchestrator.tensorfile import read_tensors
from tests.lowering.test_lowering import run_fab


def test_the_default_program_is_the_model_as_exported(tiny_artifacts: dict[str, LoweringResult]) -> None:
    for name in ("distilbert-tiny", "gpt2-tiny"):
        sidecar = tiny_artifacts[name].variants[VARIANTS["xnnpack"]].sidecar
        assert [(o.name, o.kind, o.shape, o.dtype) for o in sidecar.outputs] == [
            ("output_0", "logits", (1, 128, 1000), "float32")  # every position
        ]
        assert sidecar.applied_rewrites == () and sidecar.rewrites == () and "rewrites" in sidecar_data(sidecar)


def test_auto_rewrites_are_applied_recorded_and_keyed(tmp_path: Path) -> None:
    from executorch.runtime import Runtime

    spec, xnnpack = BUILTIN_SPECS["distilbert-tiny"], VARIANTS["xnnpack"]
    auto = parse_rewrites("auto")
    result = lowering.lower(spec, variants=[xnnpack], weights="random", root=tmp_path, jobs=1, rewrites=auto)
    sidecar = result.variants[xnnpack].sidecar
    assert sidecar.applied_rewrites == ("bmm-attention", "head-at-position")
    assert [list(output.shape) for output in sidecar.outputs] == [[1, 1000]]
    inputs = [torch.from_numpy(t.array) for t in read_tensors(result.paths.reference_inputs)]
    (reference,) = read_tensors(result.paths.reference_outputs)
    (output,) = Runtime.get().load_program(result.paths.pte(xnnpack)).load_method("forward").execute(inputs)
    np.testing.assert_allclose(output.numpy(), reference.array, atol=1e-4, rtol=1e-4)

    again = lowering.lower(spec, variants=[xnnpack], weights="random", root=tmp_path, jobs=1, rewrites=auto)
    assert again.cached
    # The model as exported, or another set of rewrites, is another program: its key misses this sidecar.
    for other in (NO_REWRITES, parse_rewrites("head-at-position")):
        key = cache.cache_key(spec, xnnpack, "random", False, rewrites=other)
        assert key != sidecar.cache_key
        assert cache.cached_sidecar(result.paths, xnnpack, key, "random") is None
    assert cache.cache_key(spec, xnnpack, "random", False, rewrites=parse_rewrites(
        "bmm-attention,head-at-position")) == sidecar.cache_key  # fmt: skip


def test_an_older_sidecar_had_no_rewrites(tiny_artifacts: dict[str, LoweringResult]) -> None:
    data = sidecar_data(tiny_artifacts["gpt2-tiny"].variants[VARIANTS["portable"]].sidecar)
    del data["rewrites"]
    older = sidecar_from_data(data)
    assert older.applied_rewrites == () and "rewrites" not in sidecar_data(older) and sidecar_data(older) == data


def test_rewrites_option_is_checked_at_the_edge() -> None:
    typo = run_fab("lower", "--model", "distilbert-tiny", "--rewrites", "tanh-gleu")
    assert typo.returncode == 64, typo.stderr
    assert (
        "--rewrites tanh-gleu: unknown rewrite 'tanh-gleu'" in typo.stderr and "did you mean 'tanh-gelu'" in typo.stderr
    )
    wrong = run_fab("lower", "--model", "distilbert-tiny", "--rewrites", "tanh-gelu")
    assert wrong.returncode == 64, wrong.stderr
    assert "--rewrites tanh-gelu: tanh-gelu does not apply to distilbert-tiny" in wrong.stderr
    assert "Traceback" not in typo.stderr + wrong.stderr


def test_a_rewritten_program_has_its_own_name() -> None:
    gpt2, distilbert = BUILTIN_SPECS["gpt2-tiny"], BUILTIN_SPECS["distilbert-tiny"]
    auto = parse_rewrites("auto")
    assert program_name(gpt2, auto) == "gpt2-tiny.tanh-gelu.bmm-attention.head-at-position"
    assert program_name(distilbert, auto) == "distilbert-tiny.bmm-attention.head-at-position"
    # In REWRITES order whatever the order asked; none, or nothing that resolves, keeps the model's own name.
    assert program_name(gpt2, parse_rewrites("head-at-position,tanh-gelu")) == "gpt2-tiny.tanh-gelu.head-at-position"
    assert program_name(gpt2, NO_REWRITES) == "gpt2-tiny" and with_(gpt2, rewrites=NO_REWRITES) is gpt2
    assert with_(gpt2, rewrites=auto) == dataclasses.replace(gpt2, name=program_name(gpt2, auto))
    assert with_(with_(gpt2, rewrites=auto), rewrites=auto) == with_(gpt2, rewrites=auto)  # never renamed twice
    # Past the name rule's 64 characters: a short form, stable, and distinct per set of rewrites.
    long = dataclasses.replace(gpt2, name="a-gpt2-whose-name-is-long-enough-to-go-past-the-rule")
    short = program_name(long, auto)
    assert is_valid_name(short) and short == program_name(long, auto)
    assert re.fullmatch(re.escape(long.name[:48]) + r"\.rw-[0-9a-f]{8}", short)
    assert program_name(long, parse_rewrites("tanh-gelu,eager-attention")) not in (short, long.name)
    assert program_name(with_(long, rewrites=auto), auto) == short
