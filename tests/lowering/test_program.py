"""A program's identity in one module (orchestrator/lowering/program.py): one rule names a program, one parse
reads a name back, and nothing else in etlab builds or splits a program's name. The names users already have
(artifacts folders, histories, nightly files) are the names the rule makes."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from orchestrator.lowering.attention.choice import ATTENTIONS, DEFAULT_ATTENTION, SDPA, attention_of
from orchestrator.lowering.builtins import BUILTIN_SPECS
from orchestrator.lowering.program import (
    Program,
    ProgramChoice,
    ProgramName,
    ProgramRefused,
    program_name,
    programs,
    refusals,
    with_,
)
from orchestrator.lowering.rewrites.registry import REWRITES, parse_rewrites
from orchestrator.names import NAME_PATTERN, is_valid_name
from orchestrator.paths import PROJECT_ROOT

# Names etlab made before this module, as they sit in users' artifacts/ and histories: read back the same.
EXISTING = {
    "smollm2-135m-gen.ctx1024": ProgramName("smollm2-135m-gen", context=1024),
    "smollm2-gen-tiny.sdpa": ProgramName("smollm2-gen-tiny", attention=SDPA),
    "smollm2-gen-tiny.sdpa.ctx512": ProgramName("smollm2-gen-tiny", attention=SDPA, context=512),
    "gpt2-tiny.tanh-gelu.bmm-attention.head-at-position": ProgramName(
        "gpt2-tiny", rewrites=("tanh-gelu", "bmm-attention", "head-at-position")
    ),
    "a-gpt2-whose-name-is-long-enough-to-go-past-the.rw-0123abcd": ProgramName(
        "a-gpt2-whose-name-is-long-enough-to-go-past-the", rewrites_digest="0123abcd"
    ),
    "my.model.v2": ProgramName("my.model.v2"),  # a user's name with dots of its own: kept whole
    "distilbert": ProgramName("distilbert"),
}


def test_names_users_have_read_back_and_are_made_again() -> None:
    for name, parts in EXISTING.items():
        assert ProgramName.parse(name) == parts, name
        assert str(parts) == name


def test_every_choice_is_another_program_under_the_name_it_always_had() -> None:
    gen = BUILTIN_SPECS["smollm2-gen-tiny"]
    sdpa = with_(gen, attention=SDPA)
    assert sdpa.name == "smollm2-gen-tiny.sdpa" and attention_of(sdpa) == SDPA
    assert with_(sdpa, attention=DEFAULT_ATTENTION) == gen  # the default, implicit again: the built-in program
    both = with_(sdpa, context=gen.cache_capacity * 2)
    assert both.name == f"smollm2-gen-tiny.sdpa.ctx{gen.cache_capacity * 2}"
    assert both.cache_capacity == gen.cache_capacity * 2
    assert with_(gen, context=gen.cache_capacity) is gen  # its own context: the same program
    gpt2 = BUILTIN_SPECS["gpt2-tiny"]
    assert program_name(gpt2, parse_rewrites("head-at-position,tanh-gelu")) == "gpt2-tiny.tanh-gelu.head-at-position"
    rewritten = with_(gpt2, rewrites=parse_rewrites("auto"))
    assert ProgramName.parse(rewritten.name).base == "gpt2-tiny" and not ProgramName.parse(rewritten.name).as_exported


def plain_base(name: str) -> bool:
    """A base whose own dotted parts are none of the suffixes (else the parse, peeling from the right, takes them)."""
    parts = name.split(".")[1:]
    return not any(
        p in REWRITES or p in ATTENTIONS or re.fullmatch(r"ctx\d+|rw-[0-9a-f]{8}|kf-[0-9a-f]{8}", p) for p in parts
    )


names = st.from_regex(NAME_PATTERN, fullmatch=True).filter(plain_base)


@given(
    base=names,
    attention=st.none() | st.sampled_from(ATTENTIONS),
    context=st.none() | st.integers(2, 1 << 20),
    rewrites=st.lists(st.sampled_from(list(REWRITES)), unique=True, max_size=3).map(
        lambda chosen: tuple(name for name in REWRITES if name in chosen)
    ),
)
def test_the_rule_and_the_parse_are_one(
    base: str, attention: str | None, context: int | None, rewrites: tuple[str, ...]
) -> None:
    program = ProgramName(base, attention, context, rewrites)
    name = str(program)
    parsed = ProgramName.parse(name)
    assert str(parsed) == name
    if is_valid_name(f"{base}.{'.'.join(rewrites)}" if rewrites else base) and is_valid_name(name):
        assert parsed == program or parsed.rewrites_digest is not None


# What building or splitting a program's name looks like in code. Splits of other dotted names (an operator's
# overload, a module path, a file name) are allowed where listed.
SUFFIX_RULES = re.compile(r"\.ctx\{|\"\.ctx|\.rw-|with_context\(|with_attention\(|program_spec\(|\.program_name\(")
NAME_SPLIT = re.compile(r"\b(?:spec\.name|model|name)\.(?:r?split|r?partition)\(\"\.\"")
ALLOWED_SPLITS = {
    "orchestrator/lowering/quantize/methods.py",  # a module's dotted path
    "orchestrator/lowering/export/source_map.py",  # an operator's overload
    "orchestrator/commands/render_lowering.py",  # an operator's `.out` overload
    "orchestrator/lowering/export/generation.py",  # a buffer's dotted path (its KV cache's)
}


def test_nothing_else_builds_or_splits_a_programs_name() -> None:
    found = []
    for path in sorted((PROJECT_ROOT / "orchestrator").rglob("*.py")):
        relative = path.relative_to(PROJECT_ROOT).as_posix()
        if relative == "orchestrator/lowering/program.py":
            continue
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            code = line.split("#", 1)[0]
            if SUFFIX_RULES.search(code) or (NAME_SPLIT.search(code) and relative not in ALLOWED_SPLITS):
                found.append(f"{relative}:{number}: {line.strip()}")
    assert not found, "a program's name built or split outside lowering/program.py:\n" + "\n".join(found)


def test_the_scan_finds_what_it_looks_for(tmp_path: Path) -> None:
    for line in ('name = f"{spec.name}.ctx{context}"', 'base = spec.name.split(".", 1)[0]', "request.program_spec(s)"):
        code = line.split("#", 1)[0]
        assert SUFFIX_RULES.search(code) or NAME_SPLIT.search(code), line
    assert dataclasses.is_dataclass(ProgramName)


def test_a_choice_is_combined_with_the_model_in_one_place() -> None:
    gen, gpt2, bert = BUILTIN_SPECS["smollm2-gen-tiny"], BUILTIN_SPECS["gpt2-tiny"], BUILTIN_SPECS["distilbert-tiny"]
    both = ProgramChoice(attention=SDPA, contexts=(128, 256, 128))
    made = programs(gen, both)
    assert [p.name for p in made] == ["smollm2-gen-tiny.sdpa.ctx128", "smollm2-gen-tiny.sdpa.ctx256"]
    assert [(attention_of(p.spec), p.spec.cache_capacity) for p in made] == [(SDPA, 128), (SDPA, 256)]
    assert [p.parts for p in made] == [ProgramName("smollm2-gen-tiny", SDPA, c) for c in (128, 256)]
    assert programs(gen) == [Program(gen)]  # as its spec has it: the built-in program itself
    rewritten = programs(gpt2, ProgramChoice(rewrites=parse_rewrites("auto")))
    assert rewritten[0].name == program_name(gpt2, parse_rewrites("auto")) and rewritten[0].rewrites.auto

    # Every choice that cannot apply, each with the choice it is and the value, if one
    found = refusals(bert, ProgramChoice(attention=SDPA, contexts=(64,), rewrites=parse_rewrites("tanh-gelu")))
    assert [(r.choice, r.value) for r in found] == [("attention", None), ("context", None), ("rewrites", None)]
    assert "distilbert-tiny is not a text-generation model" in str(found[0])
    assert "tanh-gelu does not apply to distilbert-tiny" in str(found[2])
    short = gen.positions() - 1
    (small,) = refusals(gen, ProgramChoice(contexts=(short, gen.positions())))
    assert small.choice == "context" and small.value == short and str(small).startswith(f"{short}: ")
    assert refusals(gen, ProgramChoice(contexts=(gen.positions(),)), new_tokens=gen.new_tokens + 1)
    assert refusals(gen, ProgramChoice(attention="flash"))[0].value == "flash"
    with pytest.raises(ProgramRefused, match="is not a text-generation model") as refused:
        programs(gpt2, ProgramChoice(contexts=(128,)))
    assert refused.value.exit_code == 64
