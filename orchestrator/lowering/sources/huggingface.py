"""The `huggingface` model source, spec side (no torch): transformers' head for a task, from a config or a
checkpoint (`model_id`: a HuggingFace id or a local folder).

Its fields, the checks across them (the task's inputs, a text-generation program's KV cache), and where its
pretrained weights can be had now. The build side is `builders/huggingface.py`'s `HUGGINGFACE`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from orchestrator.config import Check, did_you_mean, integer, text
from orchestrator.lowering.attention.choice import ATTENTIONS
from orchestrator.lowering.spec import (
    DEFAULT_CONTEXT,
    DEFAULT_NEW_TOKENS,
    GENERATION_OUTPUT,
    GENERATION_TASK,
    IMAGE_INPUT,
    IMAGE_TASK,
    INPUT_KINDS,
    INPUT_NAMES,
    MAX_CONTEXT,
    OUTPUT_TASKS,
    OUTPUTS,
    TASK_INPUTS,
    TASKS,
    TEXT_INPUTS,
    TEXT_TASKS,
    WRAPPED_TASKS,
    ImageOptions,
    InputSpec,
    ModelSource,
    ModelSpec,
    register_source,
)
from orchestrator.lowering.spec_fields import family_name, mapping, one_of, sequence
from orchestrator.lowering.weights import Availability, pretrained_available


@dataclass(frozen=True)
class HuggingFaceOptions(ImageOptions):
    """A huggingface spec's own fields: the checkpoint (`model_id`: a HuggingFace id or a local folder; None: random
    weights from `config`), the config's fields over the family's defaults, the [MASK] token id of fill-mask, and
    image-classification's image side (ImageOptions)."""

    model_id: str | None = None
    config: dict[str, Any] = field(default_factory=dict)
    mask_token_id: int | None = None
    # Only the command line sets this (`--trust-remote-code`), never a spec file: with it, `from_pretrained` runs
    # the Python files of the model folder. It is part of the identity: such a program is another program.
    trust_remote_code: bool = False
    # text-generation: how the program attends (attention/choice.py); None: the default, etlab's operators
    attention: str | None = None


_HUGGINGFACE_FIELDS: dict[str, Check] = {
    "model_type": family_name,
    "task": one_of(TASKS),
    "seq_len": integer(1, 4096),
    "model_id": text,
    "config": mapping,
    "mask_token_id": integer(0),
    "inputs": sequence,
    "batch_size": integer(1, 64),
    "image_size": integer(16, 1024),  # image-classification: the side of the square image (the config's image_size)
    "context": integer(2, MAX_CONTEXT),  # text-generation: the KV cache capacity
    "new_tokens": integer(1, 4096),  # text-generation: tokens a run generates by default
    "max_prompt_len": integer(1, MAX_CONTEXT),  # text-generation: the most tokens one call takes
    "prompt": text,  # text-generation: the prompt, tokenized when the model's tokenizer is cached
    "output": one_of(tuple(OUTPUTS)),  # fill-mask, causal-lm, text-generation: which logits the program returns
    "attention": one_of(ATTENTIONS),  # text-generation: etlab's operators or transformers' sdpa (attention/choice.py)
}


def _huggingface_problem(found: dict[str, Any], data: dict[str, Any]) -> tuple[str, str] | None:
    """The first (field, message) across the fields of a huggingface spec, once each field is valid on its own."""
    task = found["task"]
    if task == "fill-mask" and found.get("mask_token_id") is None:
        return "mask_token_id", "is required for task 'fill-mask' (the [MASK] token id, e.g. 103 for BERT)"
    if "output" in found and task not in OUTPUTS[found["output"]]:
        fits = ", ".join(repr(name) for name, tasks in OUTPUTS.items() if task in tasks)
        return "output", f"{found['output']!r} is not an output of task {task!r}; " + (
            f"its outputs: {fits}" if fits else f"only tasks {', '.join(OUTPUT_TASKS)} choose their output"
        )
    if "image_size" in found and task != IMAGE_TASK:
        return "image_size", f"is for task {IMAGE_TASK!r} only (task {task!r} takes no image)"
    if "seq_len" in found and task not in (*TEXT_TASKS, GENERATION_TASK, "feature-extraction"):
        return "seq_len", f"is for text tasks only (task {task!r} takes no token ids)"
    generation = _generation_problem(found, task)
    if generation is not None:
        return generation
    if "inputs" in found:
        problem = _inputs_problem(data["inputs"], task, found)
        if problem is not None:
            return problem
    elif task == IMAGE_TASK and "image_size" not in found:
        return "image_size", f"is required for task {IMAGE_TASK!r}: the side of the square input image"
    if not found.get("model_id") and not found.get("config"):
        return "model_id", "give a model_id (HuggingFace id or local folder) or a config for random weights"
    return None


def _fallback_prompt_len(context: int, new_tokens: int) -> int:
    """A text prompt's stand-in when no tokenizer is cached and the spec gives no seq_len: what fits the cache."""
    return max(1, min(ModelSpec.seq_len, context - new_tokens))


def _generation_problem(found: dict[str, Any], task: str) -> tuple[str, str] | None:
    """A text-generation spec's own rules: one sequence, a prompt and its new tokens within the KV cache."""
    for key in ("context", "new_tokens", "prompt", "attention", "max_prompt_len"):
        if key in found and task != GENERATION_TASK:
            return key, f"is for task {GENERATION_TASK!r} only (task {task!r} has no KV cache)"
    if task != GENERATION_TASK:
        return None
    if "inputs" in found:
        return "inputs", f"task {GENERATION_TASK!r} takes a prompt of seq_len token ids; give seq_len instead"
    if found.get("batch_size", 1) != 1:
        return "batch_size", f"task {GENERATION_TASK!r} generates one sequence: batch_size must be 1"
    new_tokens = found.get("new_tokens", DEFAULT_NEW_TOKENS)
    context = found.get("context", DEFAULT_CONTEXT)
    prompt = found.get("seq_len", _fallback_prompt_len(context, new_tokens) if "prompt" in found else ModelSpec.seq_len)
    if prompt + new_tokens > context:
        where = "context" if "context" in found else "seq_len" if "seq_len" in found else "new_tokens"
        return where, (
            f"a prompt of seq_len {prompt} and {new_tokens} new tokens need {prompt + new_tokens} positions, more "
            f"than the KV cache's context {context}"
        )
    capacity = found.get("max_prompt_len")  # a longer prompt is prefilled in chunks of it
    if capacity is not None and not capacity < context:
        return "max_prompt_len", f"{capacity} must leave room in the KV cache's context {context}"
    return None


def _inputs_problem(items: list[Any], task: str, found: dict[str, Any]) -> tuple[str, str] | None:
    """The first (field, message) in a spec's `inputs`: each {name, dtype, shape} one of the task's inputs, with its
    dtype and rank, one batch size, text inputs [batch, seq_len] and an image [batch, C, image_size, image_size]."""
    allowed = TASK_INPUTS[task]
    if not items:
        return "inputs", f"must list at least one input; task {task!r} takes {', '.join(allowed)}"
    seen: list[str] = []
    for index, item in enumerate(items):
        where = f"inputs[{index}]"
        if not isinstance(item, dict) or set(item) != {"name", "dtype", "shape"}:
            return where, 'must be an object with exactly "name", "dtype" and "shape"'
        name, dtype, shape = item["name"], item["dtype"], item["shape"]
        if name not in allowed:
            close = did_you_mean(name, allowed) if isinstance(name, str) else ""
            inputs = ", ".join(allowed)
            return f"{where}.name", f"{name!r} is not an input of task {task!r}; its inputs: {inputs}{close}"
        if name in seen:
            return f"{where}.name", f"{name!r} is declared twice"
        seen.append(name)
        expected_dtype, ranks = INPUT_KINDS[name]
        if dtype != expected_dtype:
            return f"{where}.dtype", f"{name} is {expected_dtype}, got {dtype!r}"
        sizes_ok = isinstance(shape, list) and all(type(size) is int and 1 <= size <= 10**7 for size in shape)
        if not sizes_ok or len(shape) not in ranks:
            rank = " or ".join(str(r) for r in ranks)
            return f"{where}.shape", f"{name} has {rank} dimensions, each from 1 to 10000000, got {shape!r}"
        batch = found.get("batch_size", items[0]["shape"][0] if isinstance(items[0], dict) else 1)
        if shape[0] != batch:
            return f"{where}.shape", f"the first dimension is the batch size, {batch}, got {shape[0]}"
        if name in TEXT_INPUTS and shape[1] != found.get("seq_len", shape[1]):
            return f"{where}.shape", f"{name} is [batch_size, seq_len] = [{batch}, {found['seq_len']}], got {shape}"
        if name in TEXT_INPUTS and shape != next(i["shape"] for i in items if i["name"] in TEXT_INPUTS):
            return f"{where}.shape", "every token input has the shape of the first one"
        if name == IMAGE_INPUT and (shape[2] != shape[3] or shape[2] != found.get("image_size", shape[2])):
            side = found.get("image_size", "image_size")
            return f"{where}.shape", f"the image is square, [batch_size, channels, {side}, {side}], got {shape}"
    if set(allowed) & set(TEXT_INPUTS) and set(seen) & set(TEXT_INPUTS):
        needed = INPUT_NAMES if task in WRAPPED_TASKS else ("input_ids",)
        missing = [name for name in needed if name not in seen]
        if missing:
            return "inputs", f"task {task!r} needs {', '.join(needed)}; missing: {', '.join(missing)}"
    if len({name in TEXT_INPUTS for name in seen}) > 1 or len([n for n in seen if n not in TEXT_INPUTS]) > 1:
        return "inputs", f"one kind of input: token ids (with their mask and types), or one of {', '.join(allowed)}"
    return None


def declared_inputs(items: list[dict[str, Any]]) -> tuple[InputSpec, ...]:
    """A spec file's `inputs` (checked by `_inputs_problem`) as InputSpecs."""
    return tuple(InputSpec(item["name"], item["dtype"], tuple(item["shape"])) for item in items)


def _complete(given: dict[str, Any], data: dict[str, Any], folder: Path) -> dict[str, Any]:
    """Declared inputs (checked: the sizes they fix are the spec's), and a text prompt's stand-in length."""
    if data.get("inputs"):
        inputs = declared_inputs(data["inputs"])
        given["declared_inputs"] = inputs
        given.setdefault("batch_size", inputs[0].shape[0])
        if inputs[0].name in TEXT_INPUTS:
            given.setdefault("seq_len", inputs[0].shape[1])
        if inputs[0].name == IMAGE_INPUT:
            given.setdefault("image_size", inputs[0].shape[2])
    if given.get("task") == GENERATION_TASK:
        given.setdefault("output", GENERATION_OUTPUT)
    if given.get("task") == GENERATION_TASK and "prompt" in given:  # seq_len: the stand-in without a tokenizer
        context = given.get("context") or DEFAULT_CONTEXT
        given.setdefault("seq_len", _fallback_prompt_len(context, given.get("new_tokens", DEFAULT_NEW_TOKENS)))
    return given


def huggingface_pretrained(spec: ModelSpec) -> Availability:
    """No model_id (the tiny models) is random with nothing to warn about."""
    model_id = spec.options_of(HuggingFaceOptions).model_id
    if not model_id:
        return Availability(False, "the spec has no model_id", expected=False)
    return Availability(*pretrained_available(model_id))


HUGGINGFACE = register_source(
    ModelSource(
        "huggingface",
        "orchestrator.lowering.sources.builders.huggingface:HUGGINGFACE",
        _HUGGINGFACE_FIELDS,
        ("model_type", "task"),
        _huggingface_problem,
        pretrained=huggingface_pretrained,
        complete=_complete,
        options=HuggingFaceOptions,
    )
)
