"""The mixed-precision proposal (advice/sensitivity.py) on numerics rows: the layers that added most of the error,
only linears and convolutions (a softmax cannot be kept in float), as the user's model names them, and the SQNR
the proportional model predicts; none when the loss is spread evenly. The end-to-end check, a layer made to break
int8 named, kept and its accuracy measured back, is tests/e2e/test_numerics_e2e.py."""

from __future__ import annotations

import math

import pytest

from orchestrator.advice.sensitivity import MAX_KEPT, MIN_LAYER_SHARE, is_weighted, propose
from orchestrator.results.numerics import EXACT_DB, OperatorRecord


def row(
    index: int, op: str, module: str | None, introduced_db: float, *, fused: tuple[str, ...] = ()
) -> OperatorRecord:
    return OperatorRecord(node=f"n{index}", op=op, module=module, introduced_db=introduced_db, index=index, fused=fused)


def db(error: float) -> float:
    return -10.0 * math.log10(error)


def test_the_layer_that_added_most_is_kept_and_its_share_comes_back() -> None:
    rows = [
        row(1, "aten.linear", "model.encoder.fc1", db(1e-4)),
        row(2, "aten.relu", "model.encoder.fc2", db(8e-4), fused=("linear",)),  # measured with its activation
        row(3, "aten.softmax", "model.encoder", db(1e-4)),  # not a layer --keep-float can name
        row(4, "aten.linear", "model.head", EXACT_DB),
    ]
    proposal = propose(rows, [20.0, 25.0])
    assert proposal is not None and proposal.names == ("encoder.fc2",)  # the wrapper's `model.` taken off
    assert proposal.layers[0].share == pytest.approx(0.8)
    assert proposal.sqnr_db == 20.0  # the worst output
    assert proposal.predicted_sqnr_db == pytest.approx(20.0 - 10 * math.log10(0.2), abs=0.01)


def test_layers_are_added_until_they_hold_half_the_error_at_most_max_kept() -> None:
    rows = [row(i, "aten.conv2d", f"block{i}", db(share)) for i, share in enumerate((0.3, 0.25, 0.2, 0.15, 0.1))]
    proposal = propose(rows, [15.0])
    assert proposal is not None and proposal.names == ("block0", "block1")
    assert proposal.share == pytest.approx(0.55)
    many = [row(i, "aten.linear", f"l{i}", db(0.5 if i == 0 else 0.001)) for i in range(40)]
    assert len(propose(many, [10.0]).layers) <= MAX_KEPT  # type: ignore[union-attr]


def test_an_error_spread_evenly_is_no_few_layers_fault() -> None:
    even = [row(i, "aten.linear", f"l{i}", db(0.01)) for i in range(int(1 / MIN_LAYER_SHARE) + 2)]
    assert propose(even, [20.0]) is None
    exact = [row(0, "aten.linear", "l0", EXACT_DB)]
    assert propose(exact, [140.0]) is None  # nothing added: nothing to win back
    assert propose([], [20.0]) is None


def test_only_linears_and_convolutions_can_be_kept() -> None:
    assert is_weighted(row(0, "aten.linear", "a", 1.0)) and is_weighted(row(0, "aten.convolution.default", "a", 1.0))
    assert is_weighted(row(0, "aten.hardtanh", "a", 1.0, fused=("conv2d",)))
    assert not is_weighted(row(0, "aten.bmm", "a", 1.0)) and not is_weighted(row(0, "aten.add", "a", 1.0))
    softmax_only = [row(0, "aten.softmax", "attention", db(0.5)), row(1, "aten.linear", "l", db(0.01))]
    assert propose(softmax_only, [5.0]) is None  # the loss is the softmax's: no layer to keep
