"""The built-in DistilBERT's delegation table, pinned (issue 24, item 1; issue 35, item 1): what `fab lower --model
distilbert` prints and its sidecar records (lowering/delegation.py), for the course's program (the [MASK] position's
logits, found in the graph from input_ids after the head, SDPA attention, input_ids and attention_mask, no rewrite).

The counts follow the graph's structure (6 layers, 12 heads, 128 positions), not its widths: DistilBERT's full
structure with a 48-wide hidden state and a 500-word vocabulary gives the same table as the full-size model (both
measured with torch 2.13, executorch 1.5.1, transformers 5.24.0), and lowers in seconds instead of minutes.

The course's table is 27 / 354 (alloc 161, getitem 60, expand_copy 25, native_layer_norm 14), every number of it
(the full-size lowering measured the same). The same model returning every position's logits (`output: all`) gives
27 / 344 (alloc 156): the gap was the [MASK] selection (argmax, index), not the versions. A change here is a change
in what users deploy: look at it.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from orchestrator.lowering.builtins import BUILTIN_SPECS
from orchestrator.lowering.export import lower as lowering
from orchestrator.lowering.variants import VARIANTS

# DistilBertConfig's structure (6 layers, 12 heads) at a width of 48 (4 per head) and a 500-word vocabulary.
NARROW_DISTILBERT = dataclasses.replace(
    BUILTIN_SPECS["distilbert"].with_options(model_id=None, config={"dim": 48, "hidden_dim": 96, "vocab_size": 500}),
    name="distilbert-narrow",
)


@pytest.mark.slow
def test_distilbert_delegation_table_is_pinned(tmp_path: Path) -> None:
    xnnpack = VARIANTS["xnnpack"]
    result = lowering.lower(NARROW_DISTILBERT, variants=[xnnpack], weights="random", root=tmp_path, jobs=1)
    sidecar = result.variants[xnnpack].sidecar
    assert sidecar.seq_len == 128 and sidecar.applied_rewrites == ()
    assert [output.shape for output in sidecar.outputs] == [(1, 500)]  # the [MASK] position's logits
    delegation = sidecar.delegation
    assert delegation.delegate_call_sites == 27
    assert delegation.fallback_ops == 354
    top_four = list(delegation.fallback_histogram.items())[:4]
    assert top_four == [
        ("memory.alloc", 161),
        ("getitem", 60),
        ("aten.expand_copy.out", 25),
        ("aten.native_layer_norm.out", 14),
    ]
    # SDPA's boolean-mask ops, once or twice per layer: what eager attention removes (rewrites/)
    for op, count in {"aten.where.self_out": 12, "aten.logical_not.out": 12, "aten.any.out": 6}.items():
        assert delegation.fallback_histogram[op] == count, op
    assert delegation.instructions == {"KernelCall": 133, "DelegateCall": 27, "other": 0}
