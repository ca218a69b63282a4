"""What a program's outputs are: class or token logits, or other values (hidden states, features).

The lowering knows it from the spec's task and records it per output in the sidecar (`outputs[].kind`); the
correctness check compares top-1 and top-5 only where an output is logits, and every output by its SQNR and relative
error. Without torch: the results layer reads it too. A new task adds its line to `TASK_OUTPUT_KINDS`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

LOGITS = "logits"  # scores over classes or a vocabulary on the last axis: top-1 and top-5 mean something
VALUES = "values"  # anything else: hidden states, features, embeddings
OUTPUT_KINDS = (LOGITS, VALUES)

TASK_OUTPUT_KINDS: dict[str, str] = {
    "fill-mask": LOGITS,
    "causal-lm": LOGITS,
    "text-classification": LOGITS,
    "token-classification": LOGITS,
    "image-classification": LOGITS,
    "audio-classification": LOGITS,
    "feature-extraction": VALUES,
    "speech-encoder": VALUES,
}

_FLOAT_DTYPES = frozenset({"float16", "bfloat16", "float32", "float64"})


def output_kind(task: str | None) -> str | None:
    """The kind of every output of a model lowered for `task`; None when the task does not say (no task, or a
    program lowered without one)."""
    return TASK_OUTPUT_KINDS.get(task) if task is not None else None


def kind_from_shape(shape: Sequence[int], dtype: str) -> str:
    """The guess for an output whose kind nobody recorded: logits iff a rank-2 float tensor with at least two
    classes on its last axis ([batch, classes])."""
    is_float = str(dtype).removeprefix("torch.") in _FLOAT_DTYPES
    return LOGITS if is_float and len(shape) == 2 and shape[-1] >= 2 else VALUES


class NotTensorOutputs(TypeError):
    """A module returned something other than tensors (nested in tuples, lists, dicts or ModelOutputs)."""


def eager_outputs(result: Any) -> list[Any]:
    """Every tensor in what a module returned, as numpy arrays in the order torch.export flattens them (pytree, so
    the runner's output_0, output_1, ... line up). torch is imported here only: the results layer reads this module.
    """
    import torch
    from torch.utils._pytree import tree_leaves

    leaves = tree_leaves(result)
    strays = sorted({type(leaf).__name__ for leaf in leaves if not isinstance(leaf, torch.Tensor)})
    if strays or not leaves:
        raise NotTensorOutputs(f"returns {', '.join(strays) or 'nothing'} besides tensors; etlab compares tensors")
    return [leaf.detach().cpu().contiguous().numpy() for leaf in leaves]


def output_records(task: str | None, described: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The sidecar's `outputs`: each described output ({name, shape, dtype}) with its kind, from the task where it
    says, else from the shape."""
    kind = output_kind(task)
    return [
        {
            "name": item["name"],
            "kind": kind or kind_from_shape(item["shape"], item["dtype"]),
            "shape": item["shape"],
            "dtype": item["dtype"],
        }
        for item in described
    ]
