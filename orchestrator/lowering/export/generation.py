"""A decoder LM as it is used (`task: text-generation`): one program for prefill and decode, the KV cache inside.

The program takes `input_ids` [1, S] and `cache_position` [S] (S dynamic up to the spec's max_prompt_len: a prompt
of P tokens, then one token at position P, P+1, ...) and returns the logits the spec's `output` names: the last
position's [1, 1, vocab] (the default, as ExecuTorch's LLM export: the head runs on one row) or every position's
[1, S, vocab]. The KV cache is mutable state of the program, written at `cache_position` on every call. Activations
are planned at max_prompt_len rows and the cache at the context, so a longer context grows the cache alone.
How it attends is a lowering choice (attention/choice.py):

- `etlab` (the default): etlab's cache (attention/kv_cache.py) writes the new rows in place through
  `etlab::update_cache`, and transformers calls etlab's attention (attention/interface.py), `etlab::attend`, which
  reads only the filled rows by position and shares KV heads by index: no copy of the cache, no mask tensor. The
  native runner has both operators' kernels.
- `sdpa`: transformers' own ExecuTorch recipe (`TorchExportableModuleWithStaticCache`), standard operators only
  (repeat_kv's copy of the whole cache, index_put, a causal mask over all of it). Measured with transformers 5.24
  and ExecuTorch 1.5.1: `strict=False` export fails later in to_edge ("expected compiled_fn to be GraphModule"),
  `strict=True` lowers, and the runner's greedy ids equal `model.generate`'s for Llama and GPT-2 configs.

Both take any family transformers knows whose attention goes through its attention interface (ExecuTorch's LLM
export builds its own Llama from a checkpoint). The reference a run is checked against is eager HuggingFace greedy
generation from the same prompt (fp32, the model's own attention), so the generated ids must be equal, not close.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from orchestrator.lowering.attention.choice import ETLAB, SDPA
from orchestrator.lowering.export.program import deterministic_metadata
from orchestrator.lowering.quantize.schemes import Scheme
from orchestrator.lowering.sources.huggingface import HuggingFaceOptions
from orchestrator.lowering.spec import ModelSpec
from orchestrator.lowering.spec_errors import spec_failure
from orchestrator.lowering.weights import RANDOM_SEED
from orchestrator.tensorfile import NamedTensor

if TYPE_CHECKING:
    from transformers import PreTrainedModel

PROMPT_INPUT = "input_ids"
POSITION_INPUT = "cache_position"


class GenerationModule(torch.nn.Module):
    """`model` with a KV cache of `context` positions: forward(input_ids [1, S], cache_position [S]) -> logits
    [1, 1, vocab] (`last_only`) or [1, S, vocab]. `model` stays the HuggingFace model (eager generation,
    vocab_size_of, rewrites' checks).

    `attention` is how the program attends (attention/choice.py): "sdpa" is transformers' static-cache recipe with
    standard operators; "etlab" writes the new rows through `etlab::update_cache` and attends by position through
    `etlab::attend` (attention/kv_cache.py, attention/interface.py): no copy of the cache, no mask over it."""

    def __init__(self, model: PreTrainedModel, context: int, attention: str = SDPA, last_only: bool = False) -> None:
        super().__init__()
        self.model = model
        self.context = context
        self.attention = attention
        self.last_only = last_only
        # what eager generation attends with: the model's own implementation, never etlab's
        self.eager_attention = str(model.config._attn_implementation)
        if attention == ETLAB:
            self._etlab_cache(model, context)
        else:
            self._static_cache(model, context)

    def _static_cache(self, model: PreTrainedModel, context: int) -> None:
        from transformers import GenerationConfig
        from transformers.integrations.executorch import TorchExportableModuleWithStaticCache

        model.generation_config = GenerationConfig(
            use_cache=True, cache_implementation="static", cache_config={"batch_size": 1, "max_cache_len": context}
        )
        self.cached = TorchExportableModuleWithStaticCache(model, 1, context)

    def _etlab_cache(self, model: PreTrainedModel, context: int) -> None:
        from orchestrator.lowering.attention import interface
        from orchestrator.lowering.attention.kv_cache import EtlabCache

        model.set_attn_implementation(interface.register())
        self.kv_cache = EtlabCache(model.config, context, model.dtype)
        for name, buffer in self.kv_cache.buffers():  # the program's mutable state, held once
            self.register_buffer(name, buffer, persistent=False)

    def forward(self, input_ids: torch.Tensor, cache_position: torch.Tensor) -> torch.Tensor:
        if self.attention != ETLAB:  # transformers' recipe computes every position's logits: the last one kept
            logits = self.cached(input_ids=input_ids, cache_position=cache_position)
            return logits[:, -1:] if self.last_only else logits
        self.kv_cache.positions = cache_position  # where this call's rows go, and what each one attends to
        out = self.model(
            input_ids=input_ids,
            position_ids=cache_position.unsqueeze(0),
            cache=self.kv_cache,
            use_cache=True,
            logits_to_keep=1 if self.last_only else 0,  # the head on the last row only
        )
        return out.logits


@contextmanager
def eager_attention(module: GenerationModule) -> Iterator[None]:
    """The HuggingFace model attending with its own implementation for eager generation (etlab's reads the program's
    cache by position; eager generation keeps a cache of its own). An sdpa program's model is left as it is."""
    if module.attention != ETLAB:
        yield
        return
    config = module.model.config
    program_attention = config._attn_implementation
    config._attn_implementation = module.eager_attention
    try:
        yield
    finally:
        config._attn_implementation = program_attention


def prompt_ids(length: int, vocab_size: int, seed: int = RANDOM_SEED) -> np.ndarray:
    """A deterministic prompt [1, length]: ids drawn from the upper half of the vocabulary (no special tokens)."""
    low = min(1000, vocab_size // 2)
    return np.random.default_rng(seed).integers(low, vocab_size, size=(1, length)).astype(np.int64)


def cached_tokenizer(spec: ModelSpec) -> Any:
    """The model's tokenizer when it is on this machine (the HF cache, or a model_id folder): never downloaded, never
    its folder's code (`trust_remote_code` only from the command line). None otherwise."""
    options = spec.options_of(HuggingFaceOptions)
    if not options.model_id:
        return None
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(
            options.model_id, local_files_only=True, trust_remote_code=options.trust_remote_code
        )
    except Exception:  # not cached, or not a tokenizer transformers can read: deterministic ids instead
        return None


@dataclass(frozen=True)
class Prompt:
    """The prompt's ids [1, P], where they come from, and the cached tokenizer (None without one)."""

    ids: np.ndarray
    source: str
    tokenizer: Any = None

    @property
    def inputs(self) -> list[NamedTensor]:
        """The prefill's inputs: the ids and their positions 0..P-1."""
        positions = np.arange(self.ids.shape[1], dtype=np.int64)
        return [NamedTensor(PROMPT_INPUT, self.ids), NamedTensor(POSITION_INPUT, positions)]


def prompt_for(spec: ModelSpec, vocab_size: int) -> Prompt:
    """The spec's text through the cached tokenizer, else deterministic ids of seq_len tokens (saying why)."""
    tokenizer = cached_tokenizer(spec)
    model_id = spec.options_of(HuggingFaceOptions).model_id
    if tokenizer is not None and spec.prompt:
        ids = np.asarray([tokenizer(spec.prompt)["input_ids"]], dtype=np.int64)
        if ids.size and int(ids.max()) < vocab_size:
            return Prompt(ids, f"the spec's prompt, tokenized by {model_id}'s tokenizer", tokenizer)
    why = "no prompt in the spec" if not spec.prompt else f"{model_id or 'the model'}'s tokenizer is not cached"
    return Prompt(prompt_ids(spec.seq_len, vocab_size), f"deterministic ids ({why})", tokenizer)


def example_inputs(module: GenerationModule, spec: ModelSpec) -> list[NamedTensor]:
    """The prefill's inputs for the spec's prompt: the ids and their positions 0..P-1."""
    return prompt_for(spec, int(module.model.config.vocab_size)).inputs


def greedy_ids(module: GenerationModule, prompt: np.ndarray, new_tokens: int) -> np.ndarray:
    """Eager HuggingFace greedy generation from `prompt` [1, P]: the `new_tokens` ids after it, [1, N], int64.

    Its own dynamic cache, never the program's static one; no end-of-sequence stop (the runner generates N tokens).
    """
    from transformers import GenerationConfig, GenerationMixin

    model = module.model
    assert isinstance(model, GenerationMixin)  # a causal LM's head: the spec check allows no other for generation
    ids = torch.from_numpy(prompt)
    config = GenerationConfig(
        do_sample=False, max_new_tokens=new_tokens, min_new_tokens=new_tokens, eos_token_id=None, pad_token_id=0
    )
    with torch.no_grad(), eager_attention(module):
        out = model.generate(ids, attention_mask=torch.ones_like(ids), generation_config=config)
    return out[:, prompt.shape[1] :].contiguous().numpy().astype(np.int64)


@dataclass(frozen=True)
class Reference:
    """What a lowering keeps of a text-generation model: the program's example inputs (the prefill's), what the board
    runs (the prompt), what it must produce (eager greedy ids) and the sidecar's `generation` record."""

    inputs: list[NamedTensor]
    board_inputs: list[NamedTensor]
    outputs: list[NamedTensor]
    record: dict[str, Any]


def reference(module: GenerationModule, spec: ModelSpec) -> Reference:
    """The prompt resolved once (its tokenizer read once), eager greedy generation from it, and the record.

    A tokenized prompt and its new tokens must fit the cache: a SpecError naming `prompt` otherwise. A prompt longer
    than one call takes (max_prompt_len) is fine: the runner prefills it in chunks; the program's example is its
    first chunk."""
    prompt = prompt_for(spec, int(module.model.config.vocab_size))
    needed = prompt.ids.shape[1] + spec.new_tokens
    if needed > spec.cache_capacity:
        where = "prompt" if spec.prompt else "seq_len"
        problem = (
            f"the prompt's {prompt.ids.shape[1]} tokens and {spec.new_tokens} new ones need {needed} positions; "
            f"the KV cache holds {spec.cache_capacity}"
        )
        raise spec_failure([(where, problem)], spec)
    generated = greedy_ids(module, prompt.ids, spec.new_tokens)
    rows = min(int(prompt.ids.shape[1]), spec.prompt_capacity)
    # contiguous: a view's stride (the whole prompt's) would be exported as a shape symbol of its own
    example = [NamedTensor(tensor.name, tensor.array[..., :rows].copy()) for tensor in prompt.inputs]
    board = prompt.inputs[:1]  # the whole prompt: the runner binds its positions itself
    return Reference(example, board, [NamedTensor("output_0", generated)], _record(module, spec, prompt, generated))


def export(module: torch.nn.Module, example_args: tuple, prompt_rows: int) -> Any:
    """The program with a dynamic sequence length 1..prompt_rows (a prompt, then one token at a time). Every
    activation is planned at `prompt_rows` rows, so it is the spec's prompt capacity, not the context: a longer
    context grows the cache alone."""
    seq = torch.export.Dim("seq", min=1, max=prompt_rows)
    with torch.no_grad():
        program = torch.export.export(module, example_args, dynamic_shapes=({1: seq}, {0: seq}), strict=True)
    deterministic_metadata(program)
    return program


def quantizer(scheme: Scheme, prompt_rows: int) -> Any:
    """How a text-generation program is quantized: the scheme's own LLM recipe (quantize.LlmRecipe) on the
    HuggingFace model, then the export above. The eager module is quantized once (the wrapper holds the model twice:
    through the cache too). A scheme without a recipe never gets here: the lowering refuses it first (exit 64)."""
    recipe = scheme.llm
    if recipe is None:
        raise ValueError(f"{scheme.name} has no text-generation recipe")

    def apply(module: GenerationModule, example_args: tuple, _calibration: Any, _quantizer: Any) -> Any:
        recipe.apply(module.model)
        return export(module, example_args, prompt_rows)

    return apply


def kv_cache_bytes(module: GenerationModule) -> int:
    """The KV cache's bytes: every layer's key and value buffers, as the program holds them."""
    return sum(
        buffer.numel() * buffer.element_size()
        for name, buffer in module.named_buffers()
        if name.rpartition(".")[2].startswith(("key_cache_", "value_cache_"))
    )


def _record(module: GenerationModule, spec: ModelSpec, prompt: Prompt, generated: np.ndarray) -> dict[str, Any]:
    """The sidecar's `generation`: the cache's size, the defaults a run starts from, the prompt's source, and the
    texts of the prompt and of eager greedy generation when a tokenizer is cached."""
    texts = {}
    if prompt.tokenizer is not None:
        texts = {
            "prompt_text": prompt.tokenizer.decode(prompt.ids.reshape(-1).tolist()),
            "reference_text": prompt.tokenizer.decode(generated.reshape(-1).tolist()),
        }
    return {
        "context": spec.cache_capacity,
        "max_prompt_len": spec.prompt_capacity,
        "prompt_len": int(prompt.ids.shape[1]),
        "new_tokens": spec.new_tokens,
        "kv_cache_bytes": kv_cache_bytes(module),
        "attention": module.attention,
        "prompt_source": prompt.source,
        **texts,
    }
