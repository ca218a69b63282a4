"""The sidecar's `outside_delegates` section (lowering/sidecar.py `OutsideDelegates`): written after `memory` by
every lowering, typed when read, refused naming the field when malformed, and absent from (and not added to) older
sidecars. The counts themselves are checked against the programs in tests/programs/test_outside.py."""

from __future__ import annotations

import copy
import json
import re
from typing import Any

import pytest

from orchestrator.errors import ArtifactError
from orchestrator.lowering.export.lower import LoweringResult
from orchestrator.lowering.sidecar import sidecar_data, sidecar_from_data
from orchestrator.lowering.variants import VARIANTS


@pytest.fixture(scope="module")
def real(tiny_artifacts: dict[str, LoweringResult]) -> dict[str, Any]:
    """One real lowered sidecar (gpt2-tiny, xnnpack), as its JSON."""
    return json.loads(tiny_artifacts["gpt2-tiny"].paths.sidecar(VARIANTS["xnnpack"]).read_text())


def test_the_section_follows_memory_and_round_trips(real: dict[str, Any]) -> None:
    keys = list(real)
    assert keys.index("outside_delegates") == keys.index("memory") + 1
    sidecar = sidecar_from_data(real, "gpt2-tiny_xnnpack.json")
    assert sidecar.outside_delegates is not None
    assert sidecar.outside_delegates.kernel_calls == sum(sidecar.outside_delegates.kernels.values())
    assert json.dumps(sidecar_data(sidecar)) == json.dumps(real)


def test_an_older_sidecar_without_the_section_reads_and_writes_back_unchanged(real: dict[str, Any]) -> None:
    older = {key: value for key, value in real.items() if key != "outside_delegates"}
    sidecar = sidecar_from_data(older, "old.json")
    assert sidecar.outside_delegates is None
    assert json.dumps(sidecar_data(sidecar)) == json.dumps(older)


@pytest.mark.parametrize(
    ("path", "value", "field"),
    [
        (("kernel_calls",), "53", "outside_delegates.kernel_calls"),
        (("kernels",), ["aten::add.out"], "outside_delegates.kernels"),
        (("bookkeeping", "memory_planning"), 1.5, "outside_delegates.bookkeeping"),
        (("stored_twice", "bytes"), None, "outside_delegates.stored_twice.bytes"),
        (("stored_twice", "tensors"), {}, "outside_delegates.stored_twice.tensors"),
        (("stored_twice", "tensors", 0, "shape"), [1000, "64"], "outside_delegates.stored_twice.tensors[0].shape"),
    ],
)
def test_a_malformed_section_is_refused_naming_the_field(
    real: dict[str, Any], path: tuple[Any, ...], value: Any, field: str
) -> None:
    broken = copy.deepcopy(real)
    target = broken["outside_delegates"]
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    with pytest.raises(ArtifactError, match=re.escape(f"bad.json: {field}")) as caught:
        sidecar_from_data(broken, "bad.json")
    assert caught.value.exit_code == 65
