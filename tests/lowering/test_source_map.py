"""The source map written beside each lowered program (orchestrator/lowering/export/source_map.py): DistilBERT's
kernel calls and XNNPACK nodes traced to its own modules and to lines of modeling_distilbert.py, the same bytes when
lowered again. Reading it back and laying it on a run is tests/results/test_source_map.py."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from orchestrator.lowering.artifacts import SOURCES_ROLE, load_artifact
from orchestrator.lowering.builtins import BUILTIN_SPECS
from orchestrator.lowering.export import lower as lowering
from orchestrator.lowering.export.source_map import source_map_path
from orchestrator.lowering.variants import VARIANTS
from tests.plugins.artifacts import ARTIFACT_CACHE


def distilbert_modules() -> dict[str, Any]:
    """The model's own modules, by the names its attributes give them (etlab's wrapper left out)."""
    import torch

    from orchestrator.lowering.sources.builders.models import load_model

    wrapper = load_model(BUILTIN_SPECS["distilbert-tiny"], "random").module
    assert isinstance(wrapper.model, torch.nn.Module)
    return dict(wrapper.model.named_modules())


def traced(row: dict[str, Any], sources: list[dict[str, Any]], names: dict[str, Any]) -> bool:
    return any(sources[index]["module"] and sources[index]["module"] in names for index in row["sources"])


def test_distilbert_xnnpack_map_names_its_modules_and_lines(tiny_artifacts: dict[str, Any]) -> None:
    artifact = load_artifact("distilbert-tiny", VARIANTS["xnnpack"], ARTIFACT_CACHE)
    path = source_map_path(artifact.pte)
    assert path.name == "distilbert-tiny_xnnpack.sources.json"
    assert artifact.sidecar.files[SOURCES_ROLE].file == path.name
    data = json.loads(path.read_text())
    sources, names = data["sources"], distilbert_modules()
    nodes = [node for delegate in data["delegates"] for node in delegate["nodes"]]
    kernels = data["instructions"]
    assert len(data["delegates"]) >= 5 and len(nodes) >= 30 and kernels
    assert sum(traced(node, sources, names) for node in nodes) >= 0.9 * len(nodes)
    assert sum(traced(row, sources, names) for row in kernels) >= 0.9 * len(kernels)
    # the query projection of each layer: a delegated fully connected node, at its line in the model's code
    q_lin = [sources[i] for node in nodes for i in node["sources"] if sources[i]["module"].endswith("attention.q_lin")]
    layers = {f"distilbert.transformer.layer.{n}.attention.q_lin" for n in (0, 1)}
    assert {source["module"] for source in q_lin} == layers
    assert all(source["module_type"] == "torch.nn.modules.linear.Linear" for source in q_lin)
    assert all(source["file"] == "modeling_distilbert.py" and source["function"] == "forward" for source in q_lin)
    assert all(source["path"].endswith("transformers/models/distilbert/modeling_distilbert.py") for source in q_lin)
    assert sum(source["file"] == "modeling_distilbert.py" for source in sources) >= 0.8 * len(sources)
    # every module a source sits in, its ancestors too, by class: a feed-forward block holds only its children's rows
    assert data["modules"]["distilbert.transformer.layer.0.ffn"].endswith("modeling_distilbert.FFN")
    assert {source["module"] for source in sources} - {""} <= set(data["modules"]) <= set(names)
    # instruction ids are the program's: delegates and kernel calls never share one
    assert not {row["instruction"] for row in kernels} & {delegate["instruction"] for delegate in data["delegates"]}


def test_portable_map_traces_every_kernel_call(tiny_artifacts: dict[str, Any]) -> None:
    artifact = load_artifact("distilbert-tiny", VARIANTS["portable"], ARTIFACT_CACHE)
    data = json.loads(source_map_path(artifact.pte).read_text())
    names = distilbert_modules()
    assert data["delegates"] == [] and len(data["instructions"]) >= 100
    assert sum(traced(row, data["sources"], names) for row in data["instructions"]) >= 0.9 * len(data["instructions"])


@pytest.mark.slow
def test_lowering_again_writes_the_same_map(tiny_artifacts: dict[str, Any], tmp_path: Path) -> None:
    """The artifact cache is content-addressed: the same model gives the same bytes."""
    lowering.lower(BUILTIN_SPECS["distilbert-tiny"], variants=[VARIANTS["xnnpack"]], weights="random", root=tmp_path)
    again = tmp_path / "distilbert-tiny" / "distilbert-tiny_xnnpack.sources.json"
    first = ARTIFACT_CACHE / "distilbert-tiny" / "distilbert-tiny_xnnpack.sources.json"
    assert again.read_bytes() == first.read_bytes()


def plan_agrees(pte: Path) -> tuple[dict[str, Any], list[str]]:
    """The map beside `pte` and every way it disagrees with the program's own plan: a kernel-call row naming an
    instruction that is not a kernel call of its operator, a delegate row naming one that is not a delegate call."""
    from orchestrator.programs.plan import read_program_plan

    data = json.loads(source_map_path(pte).read_text())
    plan = {i.index: i for i in read_program_plan(pte).instructions if i.chain == 0}
    wrong = []
    for row in data["instructions"]:
        planned = plan.get(row["instruction"])
        if planned is None or planned.kind != "KernelCall" or planned.op != row.get("op"):
            wrong.append(f"{row['instruction']}: {row.get('op')} is {planned}")
    for delegate in data["delegates"]:
        planned = plan.get(delegate["instruction"])
        if planned is None or planned.kind != "DelegateCall":
            wrong.append(f"delegate {delegate['instruction']} is {planned}")
    return data, wrong


def operator_instructions(pte: Path) -> set[int]:
    from orchestrator.programs.plan import read_program_plan

    plan = read_program_plan(pte).instructions
    return {i.index for i in plan if i.chain == 0 and i.kind in ("KernelCall", "DelegateCall")}


@pytest.mark.parametrize(
    ("name", "variant"),
    [
        ("smollm2-gen-tiny", "xnnpack"),
        ("smollm2-gen-tiny", "portable"),
        ("distilbert-tiny", "portable"),
        ("distilbert-tiny", "xnnpack"),
    ],
)
def test_map_names_only_instructions_the_plan_agrees_with(
    name: str, variant: str, tiny_artifacts: dict[str, Any]
) -> None:
    """The emitted graph's operator nodes are the plan's instructions in order (issue 37: a node the emitter did not
    emit kept a handle equal to a delegate call's id, and the map named that delegate call as a kernel call): every
    row names a kernel call of its own operator or a delegate call, and every kernel and delegate call has its row,
    etlab::update_cache, etlab::attend and et_view included."""
    result = lowering.lower(BUILTIN_SPECS[name], variants=[VARIANTS[variant]], weights="random", root=ARTIFACT_CACHE)
    pte = result.variants[VARIANTS[variant]].pte
    data, wrong = plan_agrees(pte)
    assert wrong == []
    assert data["unmatched"] == 0
    mapped = {row["instruction"] for row in data["instructions"]} | {d["instruction"] for d in data["delegates"]}
    assert mapped == operator_instructions(pte)
    ops = {row["op"] for row in data["instructions"]}
    if name.startswith("smollm2"):
        assert {"etlab::update_cache", "etlab::attend"} <= {op.split(".")[0] for op in ops}
        attend = [row for row in data["instructions"] if row["op"].startswith("etlab::attend")]
        assert all(data["sources"][i]["module"].endswith("self_attn") for row in attend for i in row["sources"])
        assert all(row["sources"] for row in attend)
