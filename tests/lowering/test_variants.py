"""The scheme registry and the typed variants: every place that accepts a scheme accepts exactly the registry's,
and every variant's on-disk name reads back as the same variant. No torch, no lowering: fast."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from orchestrator.boards.inventory import Board, load_inventory
from orchestrator.commands.common import lower_options, variants
from orchestrator.errors import InventoryError, UsageError
from orchestrator.lab.matrix import load_config
from orchestrator.lowering.artifacts import BACKENDS, QUANTIZED_BACKENDS
from orchestrator.lowering.quantize.quantized import quantize
from orchestrator.lowering.quantize.schemes import FP32, LLM_SCHEMES, QUANTIZED, SCHEMES
from orchestrator.lowering.quantize.xnn_types import XNN_DATATYPES
from orchestrator.lowering.variants import QUANTIZED_ON, VARIANTS, UnknownVariant, Variant, combine, parse_schemes
from orchestrator.paths import PROJECT_ROOT
from tests.plugins.boards import write_inventory

# Names a scheme registry could plausibly be asked for that it does not hold: old spellings, backends, typos.
NOT_SCHEMES = ("fp32", "int8", "int4", "xnnpack", "xnnpack-int8-dynamic", "INT8-DYNAMIC", "8da4w4", "")


def _candidates() -> list[str]:
    return [*SCHEMES, *NOT_SCHEMES]


def _cli_accepts(name: str) -> bool:
    try:
        variants("xnnpack", name)
    except UsageError:
        return False
    return name.strip() != ""  # an empty list is the default (fp32), not a scheme named ""


def _matrix_accepts(name: str, tmp_path: Path) -> bool:
    board = Board(name="local", transport="local", workdir=str(tmp_path / "wd"))
    section = {"matrix": [{"models": ["distilbert-tiny"], "backends": ["xnnpack"], "quantize": [name]}]}
    inventory = write_inventory(tmp_path / f"inventory-{abs(hash(name))}.yaml", [board], nightly=section)
    try:
        load_config(load_inventory(inventory))
    except InventoryError:
        return False
    return True


def test_every_place_accepts_exactly_the_registry_schemes(tmp_path: Path) -> None:
    """The CLI's `--quantize`, the nightly matrix's `quantize:` and the lowering's variants: the registry's names."""
    registry = set(SCHEMES)
    assert {name for name in _candidates() if _cli_accepts(name)} == registry
    assert {name for name in _candidates() if name and _matrix_accepts(name, tmp_path)} == registry
    # The lowering: every artifact backend's scheme is one of the registry, and every scheme has its backend.
    assert {Variant.parse(backend).scheme.name for backend in BACKENDS} == registry
    assert set(QUANTIZED_BACKENDS) == {f"xnnpack-{scheme.name}" for scheme in QUANTIZED}
    # The fab help lists them all.
    import tasks

    assert all(name in tasks.QUANTIZE_HELP for name in registry)


def test_every_scheme_is_complete() -> None:
    """What the lowering, the sidecar check and the scheduler read from a scheme: present for every one."""
    assert FP32 is SCHEMES["none"] and not FP32.quantized and FP32.label == "fp32"
    for scheme in SCHEMES.values():
        assert scheme.method and scheme.relative_cost > 0
        for expected in (scheme.fully_connected, scheme.convolution):
            kinds = expected.split(" x ")
            assert len(kinds) == 2 and set(kinds) <= set(XNN_DATATYPES.values()), (scheme.name, expected)
        assert scheme.quantized == (scheme.name != "none") and scheme.label == (
            scheme.name if scheme.quantized else "fp32"
        )
    assert [scheme.name for scheme in SCHEMES.values() if scheme.calibrated] == ["int8-static"]
    # Its LLM recipe (or none: refused for text-generation) and its peers, all in the row.
    assert [scheme.name for scheme in QUANTIZED if scheme.llm is None] == ["int8-static"]
    assert all(scheme.llm is not None and scheme.llm.method for scheme in LLM_SCHEMES)
    assert FP32.peers == tuple(scheme.name for scheme in QUANTIZED)  # any quantized run measures fp32's saving
    assert all(not scheme.peers for scheme in QUANTIZED)


def _string_literals(tree: ast.AST) -> list[ast.Constant]:
    """Every string constant of a module but its docstrings (which may show a name as an example)."""
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    return [
        node
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings
    ]


def test_no_code_spells_a_quantized_backend_name() -> None:
    """`xnnpack-<scheme>` is built by Variant.name and read back by Variant.parse only: a literal elsewhere (a
    hand-kept list of schemes, a prefix stripped by hand) is a place a new scheme would be forgotten."""
    prefix = f"{QUANTIZED_ON}-"
    spelled = []
    for path in sorted((PROJECT_ROOT / "orchestrator").rglob("*.py")):
        for node in _string_literals(ast.parse(path.read_text(encoding="utf-8"))):
            assert isinstance(node.value, str)  # as _string_literals keeps them
            if node.value == prefix or any(name in node.value for name in QUANTIZED_BACKENDS):
                spelled.append(f"{path.relative_to(PROJECT_ROOT)}:{node.lineno}: {node.value[:60]!r}")
    assert not spelled, "quantized backend names spelled out:\n" + "\n".join(spelled)


def test_quantize_refuses_fp32() -> None:
    with pytest.raises(ValueError, match="not a quantization scheme: 'none'"):
        quantize(object(), (), FP32)


@pytest.mark.parametrize("name", list(VARIANTS))
def test_a_variant_round_trips_through_its_name(name: str) -> None:
    variant = VARIANTS[name]
    assert variant.name == name and str(variant) == name
    assert Variant.parse(variant.name) == variant
    assert Variant(variant.backend, variant.scheme) == variant  # value semantics: built again, the same
    assert Variant.parse(name).scheme is variant.scheme


def test_every_registry_scheme_round_trips_through_a_name() -> None:
    for scheme in SCHEMES.values():
        variant = Variant("xnnpack", scheme)
        assert Variant.parse(variant.name) == variant
        assert variant.name == ("xnnpack" if scheme is FP32 else f"xnnpack-{scheme.name}")  # the names on disk
    assert Variant.parse("portable") == Variant("portable") and Variant("portable").scheme is FP32


@pytest.mark.parametrize("text", ["xnnpack-int4", "XNNPACK", "coreml", "portable-int8-dynamic", "", "xnnpack-"])
def test_an_unknown_name_is_a_clear_error(text: str) -> None:
    with pytest.raises(UnknownVariant, match=rf"unknown backend {text!r}; backends: portable, xnnpack, xnnpack-"):
        Variant.parse(text)


def test_a_variant_cannot_be_built_wrong() -> None:
    with pytest.raises(UnknownVariant, match="int8-dynamic programs are xnnpack programs, not portable"):
        Variant("portable", SCHEMES["int8-dynamic"])
    with pytest.raises(UnknownVariant, match="unknown backend 'coreml'"):
        Variant("coreml")


def test_names_costs_and_fab_lower_options() -> None:
    assert lower_options("gpt2", VARIANTS["xnnpack-8da4w"]) == "--model gpt2 --quantize 8da4w"
    assert lower_options("gpt2", VARIANTS["portable"]) == "--model gpt2 --backend portable"
    # a program made by choices: the options that make it again, not its name (which --model does not know)
    assert (
        lower_options("smollm2-gen-tiny.sdpa.ctx128", VARIANTS["xnnpack"])
        == "--model smollm2-gen-tiny --attention sdpa --context 128 --backend xnnpack"
    )
    assert lower_options("gpt2-tiny.tanh-gelu", VARIANTS["portable"]) == (
        "--model gpt2-tiny --rewrites tanh-gelu --backend portable"
    )
    # The order of a parallel lowering (bench/README.md): portable cheapest, int8-static the longest.
    costs = {name: variant.relative_cost for name, variant in VARIANTS.items()}
    assert costs["portable"] < costs["xnnpack"] < costs["xnnpack-int8-dynamic"] < costs["xnnpack-int8-static"]


def test_one_rule_combines_backends_and_schemes() -> None:
    xnnpack, portable = Variant("xnnpack"), Variant("portable")
    dynamic = Variant("xnnpack", SCHEMES["int8-dynamic"])
    assert combine([portable, xnnpack], parse_schemes(["none", "int8-dynamic"])) == (portable, xnnpack, dynamic)
    assert combine([portable, xnnpack], parse_schemes(["int8-dynamic"])) == (dynamic,)  # no fp32 asked for
    assert combine([dynamic], parse_schemes(["int8-dynamic"])) == (dynamic,)  # named twice, once
    assert parse_schemes([]) == (FP32,)
    with pytest.raises(UnknownVariant, match="unknown scheme int4; choose from: none, int8-dynamic"):
        parse_schemes(["int4"])


def test_the_matrix_names_cells_as_the_cli_does(tmp_path: Path) -> None:
    board = Board(name="local", transport="local", workdir=str(tmp_path / "wd"))
    entry = {"models": ["distilbert-tiny"], "backends": ["portable", "xnnpack-8da4w"], "quantize": ["int8-static"]}
    inventory = write_inventory(tmp_path / "inventory.yaml", [board], nightly={"matrix": [entry]})
    (matrix,) = load_config(load_inventory(inventory)).entries
    cli = variants("portable,xnnpack-8da4w", "int8-static")
    assert list(matrix.variants) == cli
    assert [variant.name for variant in cli] == ["xnnpack-8da4w", "xnnpack-int8-static"]


# Where a variant or scheme name becomes a typed value: the command line, the nightly matrix, and a name read back
# from disk (a sidecar, a run's label). Everywhere else a Variant travels as it is.
PARSED_AT_THE_EDGES = {
    "orchestrator/commands/common.py",  # --backend, --quantize; a run's backend label, to find its artifact
    "orchestrator/lab/matrix.py",  # the nightly matrix's backends and quantize
    "orchestrator/lowering/sidecar.py",  # a sidecar's backend
    "orchestrator/results/compare.py",  # a run's summary, to name its scheme
    "orchestrator/advice/detectors.py",  # a run read back: whether its program is portable
}


def test_variant_names_are_parsed_only_at_the_edges() -> None:
    parsing = set()
    for path in (PROJECT_ROOT / "orchestrator").rglob("*.py"):
        relative = str(path.relative_to(PROJECT_ROOT))
        text = path.read_text(encoding="utf-8")
        if relative != "orchestrator/lowering/variants.py" and ("Variant.parse(" in text or "parse_schemes(" in text):
            parsing.add(relative)
        # Names are built in one place: Variant.name.
        if relative not in ("orchestrator/lowering/variants.py", "orchestrator/lowering/quantize/schemes.py"):
            assert not re.search(r"""f["']xnnpack-\{""", text), f"{relative} builds a variant name"
    assert parsing == PARSED_AT_THE_EDGES
