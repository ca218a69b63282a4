"""A text-generation program attending through etlab's operators (lowering/attention/): for every decoder family
etlab lowers, the exported program's greedy ids equal eager HuggingFace greedy generation and its logits stay within
60 dB SQNR of eager's at every step (fp32); the graph writes the cache through `etlab::update_cache`, attends
through `etlab::attend`, and has no copy of the whole cache (expand_copy), no index_put and no mask over it.
`attention: sdpa` keeps transformers' static-cache program.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from orchestrator.errors import SpecError
from orchestrator.lowering.attention.choice import ETLAB, SDPA, attention_of
from orchestrator.lowering.builtins import BUILTIN_SPECS
from orchestrator.lowering.export import generation
from orchestrator.lowering.program import with_
from orchestrator.lowering.rewrites.huggingface import has_sdpa_attention
from orchestrator.lowering.sources.builders.models import load_model
from orchestrator.lowering.spec import GENERATION_TASK, load_spec_file
from tests.lowering.test_huggingface_specs import write

PROMPT, NEW_TOKENS, CONTEXT = 8, 8, 32
_DECODER = {"vocab_size": 256, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
            "num_attention_heads": 4, "max_position_embeddings": 64, "initializer_range": 0.2}  # fmt: skip
# Tiny random decoders of each family (initializer_range 0.2: ids that vary, as smollm2-gen-tiny's).
FAMILIES: dict[str, dict[str, Any]] = {
    "llama": {**_DECODER, "num_key_value_heads": 2, "tie_word_embeddings": True},  # SmolLM2's shape: GQA, tied
    "qwen2": {**_DECODER, "num_key_value_heads": 2},
    "phi3": {**_DECODER, "num_key_value_heads": 2, "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2},
    "gpt_neox": dict(_DECODER),
    "gpt2": {"vocab_size": 256, "n_embd": 64, "n_layer": 2, "n_head": 4, "n_positions": 64, "initializer_range": 0.2},
}
# What transformers' static-cache program does over the whole cache, which etlab's must not.
WHOLE_CACHE_OPS = ("expand_copy", "index_put", "index_copy", "repeat_interleave", "aten.copy_", "aten.where")


def family_spec(tmp_path: Path, family: str, **changes: Any) -> Any:
    data = {"name": f"{family}-gen", "model_type": family, "task": GENERATION_TASK, "config": FAMILIES[family],
            "seq_len": PROMPT, "new_tokens": NEW_TOKENS, "context": CONTEXT, **changes}  # fmt: skip
    return load_spec_file(write(tmp_path, data))


def sqnr_db(reference: torch.Tensor, other: torch.Tensor) -> float:
    signal, noise = float((reference**2).sum()), float(((other - reference) ** 2).sum())
    return math.inf if noise == 0.0 else 10.0 * math.log10(signal / noise)


def eager_greedy(module: generation.GenerationModule, prompt: torch.Tensor) -> tuple[list[int], list[torch.Tensor]]:
    """HuggingFace eager greedy generation with the model's own attention: the ids and each step's logits."""
    from transformers import GenerationConfig

    config = GenerationConfig(do_sample=False, max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, eos_token_id=None,
                              pad_token_id=0, output_logits=True, return_dict_in_generate=True)  # fmt: skip
    # a causal LM: its generate() is transformers' GenerationMixin's, which PreTrainedModel does not declare
    model: Any = module.model
    with torch.no_grad(), generation.eager_attention(module):
        out = model.generate(prompt, attention_mask=torch.ones_like(prompt), generation_config=config)
    return out.sequences[0, prompt.shape[1] :].tolist(), [step[0] for step in out.logits]


def program_greedy(program: Any, prompt: torch.Tensor) -> tuple[list[int], list[torch.Tensor]]:
    """The exported program's generate loop, as the runner's: the prompt at 0..P-1, then one token at P, P+1, ..."""
    run = program.module()
    ids: list[int] = []
    steps: list[torch.Tensor] = []
    with torch.no_grad():
        logits = run(prompt, torch.arange(prompt.shape[1]))
        for step in range(NEW_TOKENS):
            steps.append(logits[0, -1])
            ids.append(int(logits[0, -1].argmax()))
            if step + 1 < NEW_TOKENS:
                logits = run(torch.tensor([[ids[-1]]]), torch.tensor([prompt.shape[1] + step]))
    return ids, steps


def lowered_targets(program: Any) -> list[str]:
    """The operators of the program ExecuTorch emits (to_edge, to_executorch; no delegate: every node is seen)."""
    from executorch.exir import EdgeCompileConfig, to_edge

    edge = to_edge(program, compile_config=EdgeCompileConfig(_check_ir_validity=False))
    emitted = edge.to_executorch().exported_program()
    return [str(node.target) for node in emitted.graph.nodes if node.op == "call_function"]


@pytest.mark.parametrize("family", list(FAMILIES))
def test_each_family_attends_through_etlab_and_generates_what_eager_does(tmp_path: Path, family: str) -> None:
    spec = family_spec(tmp_path, family)
    module = load_model(spec, "random").module
    assert isinstance(module, generation.GenerationModule) and module.attention == ETLAB
    prompt = torch.from_numpy(generation.prompt_for(spec, 256).ids)
    eager_ids, eager_logits = eager_greedy(module, prompt)
    assert len(set(eager_ids)) > 1  # a model repeating one id proves little

    program = generation.export(module, (prompt, torch.arange(PROMPT)), CONTEXT - 1)
    vocab = int(module.model.config.vocab_size)
    with torch.no_grad():  # the spec's default output: the head on the last position only, after a whole prompt
        assert tuple(program.module()(prompt, torch.arange(PROMPT)).shape) == (1, 1, vocab)
    ids, logits = program_greedy(program, prompt)
    assert ids == eager_ids
    worst = min(sqnr_db(eager, ours) for eager, ours in zip(eager_logits, logits, strict=True))
    assert worst >= 60.0, f"{family}: logits SQNR {worst:.1f} dB"

    targets = lowered_targets(program)
    layers = 2
    assert targets.count("etlab.update_cache.out") == 2 * layers  # keys and values, once per layer
    assert targets.count("etlab.attend.out") == layers
    assert not [t for t in targets if any(op in t for op in WHOLE_CACHE_OPS)], targets


def test_the_cache_buffers_are_the_program_s_mutable_state_once(tmp_path: Path) -> None:
    """The key and value buffers are the module's, written in place: the program mutates exactly them."""
    spec = family_spec(tmp_path, "llama")
    module = load_model(spec, "random").module
    assert isinstance(module, generation.GenerationModule)
    assert not has_sdpa_attention(module)  # the eager-attention rewrite leaves etlab's attention alone
    names = {name for name, _ in module.named_buffers() if "_cache_" in name}
    assert names == {f"{kind}_cache_{i}" for kind in ("key", "value") for i in range(2)}
    assert generation.kv_cache_bytes(module) == 2 * 2 * (1 * 2 * CONTEXT * 16) * 4  # 2 layers, K and V, fp32
    program = generation.export(module, (torch.zeros(1, 3, dtype=torch.long), torch.arange(3)), CONTEXT - 1)
    from executorch.exir import EdgeCompileConfig, to_edge

    edge = to_edge(program, compile_config=EdgeCompileConfig(_check_ir_validity=False))
    mutated = set(edge.exported_program().graph_signature.buffers_to_mutate.values())
    assert mutated == names


def test_sdpa_keeps_transformers_static_cache_program(tmp_path: Path) -> None:
    spec = family_spec(tmp_path, "llama", attention="sdpa")
    assert attention_of(spec) == SDPA and spec.name == "llama-gen"  # the spec's own choice keeps its name
    module = load_model(spec, "random").module
    assert isinstance(module, generation.GenerationModule)
    assert module.attention == SDPA and module.model.config._attn_implementation != ETLAB
    assert has_sdpa_attention(module)  # the eager-attention rewrite still applies to it
    program = generation.export(module, (torch.zeros(1, 3, dtype=torch.long), torch.arange(3)), CONTEXT - 1)
    targets = lowered_targets(program)
    assert not [t for t in targets if t.startswith("etlab.")]
    assert any("index_put" in t for t in targets)  # today's program, unchanged


def test_the_default_is_etlab_and_the_other_choice_is_another_program() -> None:
    spec = BUILTIN_SPECS["smollm2-gen-tiny"]
    assert attention_of(spec) == ETLAB
    other = with_(spec, attention=SDPA)
    assert other.name == "smollm2-gen-tiny.sdpa" and attention_of(other) == SDPA
    assert other.identity() != spec.identity()
    assert with_(spec, attention=ETLAB) is spec
    assert with_(other, attention=ETLAB) == spec  # its twin with the default: the built-in program itself
    assert attention_of(BUILTIN_SPECS["smollm2-tiny"]) is None  # a causal LM without a cache: no choice
    # A spec without the field records as before: no source_options appear for it.
    assert "source_options" not in spec.to_dict() and other.to_dict()["source_options"] == {"attention": SDPA}


@pytest.mark.parametrize(
    ("data", "field", "words"),
    [
        ({"task": "causal-lm", "context": None, "new_tokens": None}, "attention", "is for task 'text-generation'"),
        ({}, "attention", "'flash' is not supported; supported: etlab, sdpa"),
    ],
)
def test_a_bad_attention_field_is_refused_naming_its_line(
    tmp_path: Path, data: dict[str, Any], field: str, words: str
) -> None:
    path = write(tmp_path, {"name": "lm", "model_type": "llama", "task": GENERATION_TASK, "config": FAMILIES["llama"],
                            "seq_len": 8, "new_tokens": 8, "context": 32,
                            "attention": "flash" if not data else "etlab", **data})  # fmt: skip
    with pytest.raises(SpecError) as refused:
        load_spec_file(path)
    assert refused.value.exit_code == 64
    assert words in str(refused.value)
    line = next(i for i, text in enumerate(path.read_text().splitlines(), 1) if text.strip().startswith(f'"{field}"'))
    assert f"spec.json:{line}: field '{field}'" in str(refused.value)


def test_eager_generation_keeps_the_model_s_own_attention(tmp_path: Path) -> None:
    """The reference is HuggingFace's own attention, never etlab's: generation.greedy_ids switches it back."""
    from transformers.modeling_utils import AttentionInterface

    from orchestrator.lowering.attention import interface

    spec = family_spec(tmp_path, "llama")
    module = load_model(spec, "random").module
    assert isinstance(module, generation.GenerationModule)
    seen: list[str] = []

    def spy(*args: Any, **kwargs: Any) -> Any:
        seen.append(ETLAB)
        return interface.etlab_attention(*args, **kwargs)

    AttentionInterface.register(ETLAB, spy)
    try:
        generation.greedy_ids(module, np.zeros((1, 3), dtype=np.int64), 2)
    finally:
        interface.register()
    assert seen == []
    assert module.model.config._attn_implementation == ETLAB  # the program attends with etlab's again


def test_a_sliding_window_shorter_than_the_cache_is_refused_for_etlab_s_attention(tmp_path: Path) -> None:
    """etlab's attention reads every filled row: a window of 8 positions over a cache of 32 would attend to more than
    the model does. Refused before anything loads (exit 64), naming the way out; sdpa's program is lowered."""
    from tests.lowering.spec_helpers import checked

    config = {**FAMILIES["qwen2"], "use_sliding_window": True, "sliding_window": 8, "max_window_layers": 0}
    data = {"name": "windowed", "model_type": "qwen2", "task": GENERATION_TASK, "config": config, "seq_len": 8,
            "new_tokens": 8, "context": CONTEXT, "attention": ETLAB}  # fmt: skip
    path = write(tmp_path, data)
    with pytest.raises(SpecError) as refused:
        checked(path)
    assert refused.value.exit_code == 64
    assert "no sliding window, and the model's 8 positions are fewer than the KV cache's 32" in str(refused.value)
    assert "give attention: sdpa" in str(refused.value) and "field 'attention'" in str(refused.value)
    assert checked(write(tmp_path, {**data, "attention": SDPA})).parameters > 0
    assert checked(write(tmp_path, {**data, "context": 8, "seq_len": 4, "new_tokens": 4})).parameters > 0


def test_module_ids_in_the_saved_program_become_module_paths_whatever_transformers_writes() -> None:
    """transformers 5.25 keys a module called again `<id>@<call>` (5.24: `<id>`); left alone, every export of the
    same model saved a different .pt2, and lowering one more variant invalidated the variants lowered before it
    (a fresh clone's CI, which installed 5.25: four end-to-end generation tests failed)."""
    from types import SimpleNamespace

    from orchestrator.lowering.export.program import deterministic_metadata

    attention = ("model.layers.1.self_attn", "LlamaAttention")
    stack = {"L__self__": ("", "GenerationModule"), "139942304689744": attention, "139942304689744@1": attention}
    node = SimpleNamespace(meta={"nn_module_stack": dict(stack), "from_node": ["graph 140001"]})
    deterministic_metadata(SimpleNamespace(graph=SimpleNamespace(nodes=[node])))
    assert list(node.meta["nn_module_stack"]) == [
        "L__self__",
        "module:model.layers.1.self_attn",
        "module:model.layers.1.self_attn@1",
    ]
    assert "from_node" not in node.meta


def test_the_sidecar_reads_back_only_the_attentions_etlab_lowers() -> None:
    from typing import get_args

    from orchestrator.lowering.attention.choice import ATTENTIONS
    from orchestrator.lowering.sidecar import Attention

    assert get_args(Attention) == ATTENTIONS
