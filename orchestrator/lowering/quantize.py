"""Quantized XNNPACK variants: int8 dynamic, int8 static (calibrated) and 8da4w, and what each one quantized.

The flows are the ones ExecuTorch 1.5 documents: int8 through the XNNPACK quantizer with torchao's
`prepare_pt2e`/`convert_pt2e`, and 8-bit dynamic activations with 4-bit grouped weights through torchao's
`quantize_`. Two problems of the shipped packages are handled here, without patching them:

- the XNNPACK quantizer's annotation transform turns *every* scalar operand of add/mul into a float tensor,
  including integer index arithmetic (`arange(...) + 0` in transformers' mask code, GPT-2's position ids), and
  calibration then fails ("tensors used as indices must be long..."). `IntegerSafeXnnpackQuantizer` leaves
  integer add/mul alone;
- HuggingFace GPT-2's `Conv1D` exports as `addmm`, which neither flow quantizes: `swap_conv1d` replaces each one
  by the equivalent `nn.Linear` (transposed weight) first.

`SCHEMES` is the one registry of schemes: the CLI's `--quantize`, the nightly matrix, the lowering, the sidecar's
claims and the reports all derive from it, so adding a scheme touches this file (and its tests) only. Backend names
(`xnnpack-<scheme>`) are built and read back in variants.py. Nothing here imports torch at module level: the
registry is read without it.
"""

from __future__ import annotations

import copy
import functools
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from orchestrator import strictjson
from orchestrator.errors import UsageError
from orchestrator.fsutil import read_json
from orchestrator.programs.plan import read_program_plan
from orchestrator.programs.xnn import XNNPACK_BACKEND, xnn_graph_buffer

GROUP_SIZE = 32  # 8da4w weight group along the input features
LLM_GROUP_SIZE = 128  # the ExecuTorch LLM recipe's group (`-qmode 8da4w -G 128`)
CALIBRATION_SAMPLES = 8  # generated samples when the user gives no calibration file

# XNNPACK datatype codes (schema.fbs XNNDatatype) -> names.
XNN_DATATYPES = {
    0: "invalid", 1: "fp32", 2: "fp16", 3: "qint8", 4: "quint8", 5: "qint32", 6: "qcint8", 7: "qcint32",
    8: "qcint4", 9: "qdint8", 10: "qbint4", 11: "qpint8", 12: "int32", 13: "pfp32", 14: "bf16",
}  # fmt: skip
FLOAT_DATATYPES = frozenset({"fp32", "fp16", "bf16", "pfp32"})

# How a scheme turns a (deep-copied, Conv1D-swapped) eager model into an exported program: (model, example_args,
# calibration samples, PT2E quantizer override) -> program. What it quantized is read from that program's graph.
Apply = Callable[[Any, tuple, list[tuple] | None, Any], Any]


@dataclass(frozen=True)
class LlmRecipe:
    """How a scheme quantizes a text-generation program, as ExecuTorch's LLM recipe does: torchao `quantize_` on the
    eager HuggingFace model, in place, before generation.py exports it with its KV cache."""

    method: str  # what it does, as the sidecar records it
    apply: Callable[[Any], None]  # (model) -> None; module-level (or a partial of one): workers unpickle it


@dataclass(frozen=True)
class Scheme:
    """One `--quantize` choice. `none` is fp32: no `apply`, and its programs keep their plain backend names.

    A scheme without `llm` is refused for a text-generation program (exit 64), never given another scheme's recipe.
    `peers` are the schemes whose runs (same model, same board) measure what quantizing this scheme's program would
    save, in the advisor's order of preference."""

    name: str
    method: str  # how it quantizes, as the sidecar records it
    fully_connected: str  # what its XNNPACK FullyConnected nodes must be (input x weight): the sidecar's check
    convolution: str  # the same for XNNPACK Convolution nodes
    relative_cost: float  # lowering seconds relative to fp32 XNNPACK, until a lowering of the variant measured them
    apply: Apply | None = None
    calibrated: bool = False  # fitted on calibration samples (`--calibration FILE`, else generated ones)
    group_size: int | None = None  # grouped int4 weights: the group along the input features
    llm: LlmRecipe | None = None  # its recipe for a text-generation program; None: refused for one
    peers: tuple[str, ...] = ()  # names of schemes in SCHEMES

    @property
    def quantized(self) -> bool:
        return self.apply is not None

    @property
    def label(self) -> str:
        """How reports name it: `fp32` for none."""
        return self.name if self.quantized else "fp32"


# --------------------------------------------------------------------------------------------------------------
# The model side: Conv1D → Linear, and which linears exist


def swap_conv1d(module: Any) -> list[str]:
    """Replace every HuggingFace `Conv1D` by the equivalent `nn.Linear`, in place; returns the swapped names."""
    import torch

    swapped = []
    for name, child in list(module.named_modules()):
        if type(child).__name__ != "Conv1D" or not hasattr(child, "nf"):
            continue
        weight = child.weight.detach()  # Conv1D stores [in, out]; Linear wants [out, in]
        linear = torch.nn.Linear(weight.shape[0], weight.shape[1], bias=child.bias is not None)
        with torch.no_grad():
            linear.weight.copy_(weight.t().contiguous())
            if child.bias is not None:
                linear.bias.copy_(child.bias.detach())
        parent_name, _, attr = name.rpartition(".")
        parent = module.get_submodule(parent_name) if parent_name else module
        setattr(parent, attr, linear)
        swapped.append(name)
    return swapped


def weighted_layers(module: Any) -> list[str]:
    """Names of the layers that compute a linear or a convolution (nn.Linear, Conv1D left unswapped, nn.ConvNd)."""
    import torch

    kinds = (torch.nn.Linear, torch.nn.modules.conv._ConvNd)
    return [
        name
        for name, child in module.named_modules()
        if isinstance(child, kinds) or (type(child).__name__ == "Conv1D" and hasattr(child, "nf"))
    ]


# --------------------------------------------------------------------------------------------------------------
# The integer-scalar workaround


def integer_safe_quantizer(is_dynamic: bool) -> Any:
    """An XNNPACK quantizer (symmetric, per-channel) whose scalar transform spares integer arithmetic."""
    from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import (
        XNNPACKQuantizer,
        get_symmetric_quantization_config,
    )

    class IntegerSafeXnnpackQuantizer(XNNPACKQuantizer):
        """`transform_for_annotation` turns only floating-point add/mul scalars into tensor constants, and the
        attention-mask adds stay in float."""

        def transform_for_annotation(self, model: Any) -> Any:
            return convert_float_scalars_to_attrs(model)

        def annotate(self, model: Any) -> Any:
            keep_softmax_inputs_float(model)
            return super().annotate(model)

    quantizer = IntegerSafeXnnpackQuantizer()
    quantizer.set_global(get_symmetric_quantization_config(is_per_channel=True, is_dynamic=is_dynamic))
    return quantizer


def shipped_quantizer(is_dynamic: bool) -> Any:
    """The XNNPACK quantizer as shipped (for the test that shows why the workaround exists)."""
    from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import (
        XNNPACKQuantizer,
        get_symmetric_quantization_config,
    )

    quantizer = XNNPACKQuantizer()
    quantizer.set_global(get_symmetric_quantization_config(is_per_channel=True, is_dynamic=is_dynamic))
    return quantizer


def _is_float_node(node: Any) -> bool:
    import torch

    value = node.meta.get("val") if hasattr(node, "meta") else None
    dtype = getattr(value, "dtype", None)
    return dtype is not None and dtype.is_floating_point and dtype != torch.bool


_SOFTMAX_TARGETS = ("aten._softmax.default", "aten.softmax.int", "aten._safe_softmax.default")


def keep_softmax_inputs_float(model: Any) -> None:
    """Mark every add/mul that feeds a softmax as annotated with nothing, so the quantizer leaves it in float.

    In eager attention that add carries the mask (about -3.4e38): one int8 per-tensor scale for it crushes every
    attention score to zero. The SDPA op hid it from the quantizer; eager attention (models.delegable) does not.
    """
    import torch
    from torchao.quantization.pt2e.quantizer import QuantizationAnnotation
    from torchao.quantization.pt2e.quantizer.quantizer import Q_ANNOTATION_KEY

    binary = (torch.ops.aten.add.Tensor, torch.ops.aten.mul.Tensor)
    for node in model.graph.nodes:
        if node.op != "call_function" or node.target not in binary:
            continue
        if any(str(user.target) in _SOFTMAX_TARGETS for user in node.users):
            node.meta[Q_ANNOTATION_KEY] = QuantizationAnnotation(_annotated=True)


def convert_float_scalars_to_attrs(model: Any) -> Any:
    """As the quantizer's `_convert_scalars_to_attrs`, but only for add/mul whose result is floating point.

    Integer add/mul (index arithmetic) keep their Python scalars: made float, they break indexing ops.
    """
    import torch
    from executorch.backends.xnnpack.quantizer.xnnpack_quantizer_utils import get_new_attr_name_with_prefix

    for node in model.graph.nodes:
        if node.op != "call_function" or node.target not in (torch.ops.aten.add.Tensor, torch.ops.aten.mul.Tensor):
            continue
        if not _is_float_node(node):
            continue
        new_args = []
        for arg in node.args:
            if isinstance(arg, torch.fx.Node):
                new_args.append(arg)
                continue
            name = get_new_attr_name_with_prefix("_tensor_constant_")(model)
            constant = torch.tensor(float(arg))
            model.register_buffer(name, constant)
            with model.graph.inserting_before(node):
                attr = model.graph.create_node("get_attr", name, (), {})
                attr.meta["val"] = node.meta["val"].fake_mode.from_tensor(constant, static_shapes=True)
            new_args.append(attr)
        node.args = tuple(new_args)
    model.recompile()
    return model


# --------------------------------------------------------------------------------------------------------------
# Applying a scheme


@dataclass
class Quantized:
    """A quantized program ready for `to_edge_transform_and_lower`, and how it came about."""

    program: Any  # torch.export.ExportedProgram
    report: dict[str, Any]


def quantize(
    module: Any,
    example_args: tuple,
    scheme: Scheme,
    *,
    calibration: list[tuple] | None = None,
    calibration_source: str | None = None,
    quantizer: Any = None,
    apply: Apply | None = None,
) -> Quantized:
    """Quantize an eager module (a copy; the original is untouched) and export it.

    `calibration` is a list of argument tuples for a calibrated scheme; `quantizer` overrides the PT2E quantizer
    (tests); `apply` the scheme's own way of quantizing and exporting (a text-generation program's, generation.py).
    The linears and convolutions are counted in the quantized program's graph, so a module without nn.Linear or
    nn.Conv layers (a user's .pt2, unlifted) is counted too.
    """
    if scheme.apply is None:
        raise ValueError(f"not a quantization scheme: {scheme.name!r}")
    model = copy.deepcopy(module).eval()
    swapped = swap_conv1d(model)
    program = (apply or scheme.apply)(model, example_args, calibration, quantizer)
    operations = graph_operations(program.graph, weighted_layers(model))
    linears = [op for op in operations if op.kind == LINEAR]
    convolutions = [op for op in operations if op.kind == CONVOLUTION]
    report = {
        "scheme": scheme.name,
        "method": scheme.method,
        "conv1d_swapped_to_linear": len(swapped),
        "linear_layers": len(linears),
        "quantized_linears": sum(op.quantized for op in linears),
        "float_linears": _float_names(linears),
        "convolutions": len(convolutions),
        "quantized_convolutions": sum(op.quantized for op in convolutions),
        "float_convolutions": _float_names(convolutions),
        "calibration": _calibration_record(scheme, calibration, calibration_source),
    }
    embeddings = embedding_layers(model)
    if any(quantized for _, quantized in embeddings):  # 8-bit embeddings (a language model's recipe)
        report["embeddings"] = len(embeddings)
        report["quantized_embeddings"] = sum(quantized for _, quantized in embeddings)
        report["float_embeddings"] = sorted(name for name, quantized in embeddings if not quantized)
    return Quantized(program, report)


def embedding_layers(module: Any) -> list[tuple[str, bool]]:
    """Every nn.Embedding, and whether its weight was quantized (torchao swaps in a quantized tensor subclass)."""
    import torch

    return [
        (name, type(child.weight) is not torch.nn.Parameter and type(child.weight) is not torch.Tensor)
        for name, child in module.named_modules()
        if isinstance(child, torch.nn.Embedding)
    ]


def _pt2e(model: Any, example_args: tuple, samples: list[tuple], quantizer: Any) -> Any:
    """PT2E: prepare, run the samples through the observers, convert, export."""
    import torch
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    captured = torch.export.export(model, example_args, strict=False).module()
    prepared = prepare_pt2e(captured, quantizer)
    with torch.no_grad():
        for sample in samples:
            prepared(*sample)
    converted = convert_pt2e(prepared)
    with torch.no_grad():
        return torch.export.export(converted, example_args, strict=False)


def _int8_dynamic(model: Any, example_args: tuple, _calibration: list[tuple] | None, quantizer: Any) -> Any:
    return _pt2e(model, example_args, [example_args], quantizer or integer_safe_quantizer(is_dynamic=True))


def _int8_static(model: Any, example_args: tuple, calibration: list[tuple] | None, quantizer: Any) -> Any:
    samples = calibration or [example_args]
    return _pt2e(model, example_args, samples, quantizer or integer_safe_quantizer(is_dynamic=False))


def _8da4w(
    model: Any, example_args: tuple, _calibration: list[tuple] | None, _quantizer: Any, *, group: int = GROUP_SIZE
) -> Any:
    import torch

    apply_8da4w(model, group)
    with torch.no_grad():
        return torch.export.export(model, example_args, strict=False)


def apply_8da4w(model: Any, group: int = GROUP_SIZE) -> None:
    """torchao `quantize_` on every linear whose input features divide into groups (the others stay float)."""
    import torch
    from torchao.quantization import Int8DynamicActivationIntxWeightConfig, quantize_
    from torchao.quantization.granularity import PerGroup

    def groupable(child: Any, _fqn: str) -> bool:
        return isinstance(child, torch.nn.Linear) and child.in_features % group == 0

    int4 = torch.int4  # type: ignore[attr-defined]  # torch's stubs lack the sub-byte dtypes it has had since 2.5
    config = Int8DynamicActivationIntxWeightConfig(weight_dtype=int4, weight_granularity=PerGroup(group))
    quantize_(model, config, filter_fn=groupable)


def _llm_8da4w(model: Any, group: int) -> None:
    """8-bit per-row embeddings, then int4 grouped linears (`-qmode 8da4w -E 8,0`)."""
    import torch
    from torchao.quantization import IntxWeightOnlyConfig, quantize_
    from torchao.quantization.granularity import PerAxis

    embeddings = IntxWeightOnlyConfig(weight_dtype=torch.int8, granularity=PerAxis(0))
    quantize_(model, embeddings, filter_fn=lambda child, _: isinstance(child, torch.nn.Embedding))
    apply_8da4w(model, group)


def _llm_8da8w(model: Any) -> None:
    """int8 per-channel linears with dynamic int8 activations (8da8w); embeddings stay float."""
    import torch
    from torchao.quantization import Int8DynamicActivationIntxWeightConfig, quantize_
    from torchao.quantization.granularity import PerAxis

    linears = Int8DynamicActivationIntxWeightConfig(weight_dtype=torch.int8, weight_granularity=PerAxis(0))
    quantize_(model, linears, filter_fn=lambda child, _: isinstance(child, torch.nn.Linear))


_DEQUANTIZE = ("dequantize_per_channel", "dequantize_per_tensor", "dequantize_affine", "dequantize")
_PASS_THROUGH = ("t.default", "permute", "transpose", "view", "reshape", "_to_copy", "clone")


def _produced_by_dequantize(node: Any) -> bool:
    import torch

    for _ in range(4):  # weight → (transpose/view)* → dequantize
        if not isinstance(node, torch.fx.Node) or node.op != "call_function":
            return False
        name = str(node.target)
        if any(part in name for part in _DEQUANTIZE):
            return True
        if not any(part in name for part in _PASS_THROUGH) or not node.args:
            return False
        node = node.args[0]
    return False


LINEAR = "linear"
CONVOLUTION = "convolution"
# Graph operators that compute a linear or a convolution -> (kind, index of the weight argument).
_WEIGHTED_OPS = {
    "aten.linear": (LINEAR, 1),
    "aten.addmm": (LINEAR, 2),
    "aten.conv1d": (CONVOLUTION, 1),
    "aten.conv2d": (CONVOLUTION, 1),
    "aten.conv3d": (CONVOLUTION, 1),
    "aten.conv_transpose1d": (CONVOLUTION, 1),
    "aten.conv_transpose2d": (CONVOLUTION, 1),
    "aten.convolution": (CONVOLUTION, 1),
    "aten._convolution": (CONVOLUTION, 1),
}


@dataclass(frozen=True)
class Operation:
    """One linear or convolution of an exported graph: its layer's name and whether its weight is quantized."""

    kind: str  # LINEAR or CONVOLUTION
    layer: str
    quantized: bool


def graph_operations(graph: Any, layers: list[str] | None = None) -> list[Operation]:
    """Every linear and convolution node of `graph`; quantized when its weight comes out of a dequantize.

    A layer is named from the node's nn_module_stack (mapped onto `layers`, the module's own names, where one
    matches), else by the node's name: a graph without modules still names what stayed float.
    """
    operations = []
    for node in graph.nodes:
        if node.op != "call_function":
            continue
        target = str(node.target).rsplit(".", 1)[0]  # aten.conv2d.default -> aten.conv2d
        found = _WEIGHTED_OPS.get(target)
        if found is None or len(node.args) <= found[1]:
            continue
        kind, weight = found
        stack = node.meta.get("nn_module_stack") or {}
        path = list(stack.values())[-1][0] if stack else node.name
        operations.append(
            Operation(kind, _module_name(str(path), layers or []), _produced_by_dequantize(node.args[weight]))
        )
    return operations


def _float_names(operations: list[Operation]) -> list[str]:
    return sorted({op.layer for op in operations if not op.quantized})


def _module_name(path: str, layers: list[str]) -> str:
    """nn_module_stack paths look like `L['self'].model.lm_head` or `model.lm_head`; map to a layer name."""
    cleaned = path.replace("L['self'].", "").replace("L['self']", "")
    if cleaned in layers:
        return cleaned
    return next((name for name in layers if name and cleaned.endswith("." + name)), cleaned)


def _calibration_record(scheme: Scheme, calibration: list[tuple] | None, source: str | None) -> dict[str, Any] | None:
    if not scheme.calibrated:
        return None
    return {"source": source or "generated", "samples": len(calibration or [])}


# --------------------------------------------------------------------------------------------------------------
# The registry: every scheme, in the order the CLI lists them. Its costs are full-size DistilBERT's lowering
# seconds (bench/README.md: fp32 XNNPACK 23 s, int8-dynamic 37 s, int8-static 53 s, 8da4w 44 s).

_QUANTIZED_SCHEMES = (
    Scheme(
        "int8-dynamic",
        "PT2E: XNNPACKQuantizer (symmetric, per-channel int8 weights, dynamic int8 activations), "
        "prepare_pt2e/convert_pt2e",
        fully_connected="qdint8 x qcint8",
        convolution="qdint8 x qcint8",  # some Conv2d only: depthwise and 1-D ones stay fp32 (README)
        relative_cost=1.6,
        apply=_int8_dynamic,
        llm=LlmRecipe(
            "torchao quantize_: Int8DynamicActivationIntxWeightConfig(int8 weights, PerAxis(0)) linears (8da8w)",
            _llm_8da8w,
        ),
    ),
    Scheme(
        "int8-static",
        "PT2E: XNNPACKQuantizer (symmetric, per-channel int8 weights, static int8 activations), "
        "prepare_pt2e + calibration + convert_pt2e",
        fully_connected="qint8 x qcint8",
        convolution="qint8 x qcint8",
        relative_cost=2.3,
        apply=_int8_static,
        calibrated=True,
    ),
    *(
        Scheme(
            name,
            f"torchao quantize_: Int8DynamicActivationIntxWeightConfig(int4 weights, PerGroup({group}))",
            fully_connected="qdint8 x qbint4",
            convolution="fp32 x fp32",  # quantize_ here takes linears only
            relative_cost=1.9,
            apply=functools.partial(_8da4w, group=group),  # a module-level function: workers unpickle it
            group_size=group,
            llm=LlmRecipe(
                "torchao quantize_ (ExecuTorch's LLM recipe): IntxWeightOnlyConfig(int8, PerAxis(0)) embeddings, "
                f"then Int8DynamicActivationIntxWeightConfig(int4 weights, PerGroup({group})) linears",
                functools.partial(_llm_8da4w, group=group),
            ),
        )
        for name, group in (("8da4w", GROUP_SIZE), ("8da4w-g128", LLM_GROUP_SIZE))
    ),
)
# fp32's peers: every quantized scheme, int8-dynamic first (the registry's order).
FP32 = Scheme(
    "none", "none (fp32)", fully_connected="fp32 x fp32", convolution="fp32 x fp32", relative_cost=1.0,
    peers=tuple(scheme.name for scheme in _QUANTIZED_SCHEMES),
)  # fmt: skip
SCHEMES: dict[str, Scheme] = {scheme.name: scheme for scheme in (FP32, *_QUANTIZED_SCHEMES)}
QUANTIZED = tuple(scheme for scheme in SCHEMES.values() if scheme.quantized)
LLM_SCHEMES = tuple(scheme for scheme in QUANTIZED if scheme.llm is not None)  # those a text-generation program takes


# --------------------------------------------------------------------------------------------------------------
# Calibration data


class CalibrationError(UsageError):
    """A calibration file that cannot be used (exit 64); the message starts with the file's path."""


def generated_calibration(reference_args: tuple, vocab_size: int, samples: int = CALIBRATION_SAMPLES) -> list[tuple]:
    """Deterministic samples shaped like the reference inputs: random token ids, varied real lengths, every row of a
    batch alike; inputs after the ids and the mask (token_type_ids) as the reference has them."""
    import torch

    input_ids, attention_mask, *others = reference_args
    generator = torch.Generator().manual_seed(1234)
    seq_len = input_ids.shape[1]
    result = [reference_args]
    low = min(1000, vocab_size // 2)
    for index in range(samples - 1):
        real = max(1, seq_len * (index + 2) // (samples + 1))
        ids = torch.zeros_like(input_ids)
        ids[:, :real] = torch.randint(low, vocab_size, (real,), generator=generator)
        # Keep a [MASK] where the reference has one, so fill-mask models see it.
        mask_positions = (input_ids[0] != 0) & (input_ids[0] < low)
        ids[:, mask_positions] = input_ids[:, mask_positions]
        mask = torch.zeros_like(attention_mask)
        mask[:, : max(real, int(mask_positions.nonzero().max()) + 1 if mask_positions.any() else real)] = 1
        result.append((ids, mask, *others))
    return result


def shaped_like(samples: list[tuple], reference_args: tuple) -> list[tuple]:
    """Samples of one row (token ids and mask, an image) made the reference's shape: repeated over its batch, and
    the inputs after theirs (token_type_ids) taken from the reference."""
    batch = reference_args[0].shape[0]
    return [
        (*(t.expand(batch, *t.shape[1:]).contiguous() for t in sample), *reference_args[len(sample) :])
        for sample in samples
    ]


def calibration_from_file(path: Path, seq_len: int, vocab_size: int) -> list[tuple]:
    """Samples from an ETLT file (input_ids [N, seq] and optionally attention_mask) or JSON token-id lists.

    Everything is checked here, before any lowering starts (lower.py calls this first in the main process): a
    mistake is a CalibrationError naming the file (the command layer adds its option), never an exception from
    inside the calibration.
    """
    import torch

    where = str(path)
    if not path.is_file():
        raise CalibrationError(f"{where}: no such file")
    rows = _json_rows(path, where) if path.suffix.lower() == ".json" else _etlt_rows(path, where)
    result = []
    for number, (ids, mask) in enumerate(rows):
        if any(t < 0 or t >= vocab_size for t in ids):
            raise CalibrationError(f"{where}: sample {number} has token ids outside 0..{vocab_size - 1}")
        if mask is not None:
            real = sum(mask)
            if real == 0 or not all(mask[:real]) or any(mask[real:]):
                raise CalibrationError(
                    f"{where}: sample {number}: attention_mask must be 1s for the real tokens, then 0s (padding "
                    "on the right), with at least one 1"
                )
        ids = ids[:seq_len]
        real = len(ids) if mask is None else min(seq_len, sum(mask))
        padded = torch.zeros((1, seq_len), dtype=torch.int64)
        padded[0, : len(ids)] = torch.tensor(ids, dtype=torch.int64)
        attention = torch.zeros((1, seq_len), dtype=torch.int64)
        attention[0, : max(1, real)] = 1
        result.append((padded, attention))
    if len(result) < 2:
        raise CalibrationError(f"{where}: give several samples (found {len(result)}); calibration needs variety")
    return result


def calibration_samples(path: Path, inputs: Sequence[tuple[str, str, Sequence[int]]], model: str) -> list[tuple]:
    """Samples for a model of any inputs (images, audio, a factory's) from an ETLT file: one tensor per input
    (`inputs`: name, dtype, shape), named as it, of its dtype and its shape behind a leading sample axis.

    A file that does not match is a CalibrationError naming the file and saying what the model takes.
    """
    import numpy as np
    import torch

    # here, not at the top: numpy, which the scheme registry's readers (fab's start-up) do not need
    from orchestrator.tensorfile import TensorFileError, read_tensors

    where = str(path)
    wanted = ", ".join(f"{name} {dtype} [N, {', '.join(map(str, shape))}]" for name, dtype, shape in inputs)
    needs = f"{model} takes {len(inputs)} input(s); its calibration file is an ETLT file of {wanted} (N samples)"
    if path.suffix.lower() == ".json":
        raise CalibrationError(f"{where}: token-id lists are for token models; {needs}")
    try:
        tensors = {t.name: t.array for t in read_tensors(path)}
    except TensorFileError as exc:
        raise CalibrationError(f"{where}: {exc}; {needs}") from None
    if set(tensors) != {name for name, _, _ in inputs}:
        raise CalibrationError(f"{where}: holds {', '.join(sorted(tensors)) or 'nothing'}; {needs}")
    counts = set()
    for name, dtype, shape in inputs:
        array = tensors[name]
        if str(array.dtype) != dtype or tuple(array.shape[1:]) != tuple(shape):
            got = f"{array.dtype} [{', '.join(map(str, array.shape))}]"
            raise CalibrationError(f"{where}: {name} is {got}; {needs}")
        if array.dtype.kind == "f" and not np.isfinite(array).all():
            raise CalibrationError(f"{where}: {name} holds NaN or infinite values")
        counts.add(array.shape[0])
    if len(counts) != 1:
        raise CalibrationError(f"{where}: its tensors hold different numbers of samples; {needs}")
    samples = counts.pop()
    if samples < 2:
        raise CalibrationError(f"{where}: give several samples (found {samples}); calibration needs variety")
    return [tuple(torch.from_numpy(tensors[name][index].copy()) for name, _, _ in inputs) for index in range(samples)]


def _token_ids(value: Any) -> list[int] | None:
    """A non-empty list of integer token ids (not booleans, not floats), or None."""
    if not isinstance(value, list) or not value:
        return None
    if not all(isinstance(t, int) and not isinstance(t, bool) for t in value):
        return None
    return value


def _json_rows(path: Path, where: str) -> list[tuple[list[int], list[int] | None]]:
    try:
        data = read_json(path)
    except strictjson.JsonDataError as exc:
        raise CalibrationError(f"{where}: {exc.field + ': ' if exc.field else ''}{exc.problem}") from None
    except OSError as exc:
        raise CalibrationError(f"{where}: unreadable ({exc})") from None
    samples = data.get("samples", data) if isinstance(data, dict) else data
    if not isinstance(samples, list) or not samples:
        raise CalibrationError(f"{where}: expected a list of token-id lists (or {{'samples': [...]}})")
    rows: list[tuple[list[int], list[int] | None]] = []
    for number, sample in enumerate(samples):
        ids = _token_ids(sample.get("input_ids") if isinstance(sample, dict) else sample)
        if ids is None:
            raise CalibrationError(f"{where}: sample {number} is not a non-empty list of integer token ids")
        mask = sample.get("attention_mask") if isinstance(sample, dict) else None
        if mask is not None and (_token_ids(mask) is None or len(mask) != len(ids) or set(mask) - {0, 1}):
            raise CalibrationError(
                f"{where}: sample {number}: attention_mask must be a list of 0s and 1s as long as input_ids"
            )
        rows.append((ids, mask))
    return rows


def _etlt_rows(path: Path, where: str) -> list[tuple[list[int], list[int] | None]]:
    import numpy as np

    # here, not at the top: numpy, which the scheme registry's readers (fab's start-up) do not need
    from orchestrator.tensorfile import TensorFileError, read_tensors

    try:
        tensors = {t.name: t.array for t in read_tensors(path)}
    except TensorFileError as exc:
        raise CalibrationError(f"{where}: {exc}") from None
    ids_array = tensors.get("input_ids")
    if (
        ids_array is None
        or ids_array.ndim != 2
        or 0 in ids_array.shape
        or not np.issubdtype(ids_array.dtype, np.integer)
    ):
        raise CalibrationError(
            f"{where}: needs an integer tensor 'input_ids' of shape [samples, seq_len], both at least 1"
        )
    masks = tensors.get("attention_mask")
    if masks is not None:
        integer = np.issubdtype(masks.dtype, np.integer) or masks.dtype == np.bool_
        if not integer or masks.shape != ids_array.shape or not np.isin(masks, (0, 1)).all():
            raise CalibrationError(
                f"{where}: attention_mask must be an integer tensor of 0s and 1s shaped like input_ids "
                f"{list(ids_array.shape)}, got {masks.dtype} {list(masks.shape)}"
            )
    return [
        ([int(v) for v in ids_array[index]], None if masks is None else [int(v) for v in masks[index]])
        for index in range(ids_array.shape[0])
    ]


# --------------------------------------------------------------------------------------------------------------
# Reading what the lowered program really contains


def fully_connected_types(pte: Path) -> Counter[str]:
    """FullyConnected nodes of every XNNPACK delegate of `forward`, counted by `input x weight` datatype."""
    return xnn_node_types(pte)[0]


def convolution_types(pte: Path) -> Counter[str]:
    """Convolution nodes (Conv2d and DepthwiseConv2d) of every XNNPACK delegate of `forward`, by datatype."""
    return xnn_node_types(pte)[1]


def xnn_node_types(pte: Path) -> tuple[Counter[str], Counter[str]]:
    """FullyConnected and Convolution nodes of every XNNPACK delegate of `forward`, counted by `input x weight`
    datatype."""
    from pte_adapter_model_explorer.executorch_flatbuffer import xnnpack_generated as xg

    convolutions = (xg.XNodeUnion.XNNConv2d, xg.XNodeUnion.XNNDepthwiseConv2d)
    fully_connected: Counter[str] = Counter()
    convolution: Counter[str] = Counter()
    plan = read_program_plan(pte, "forward")
    for instruction in plan.instructions:
        if instruction.backend != XNNPACK_BACKEND or instruction.delegate is None:
            continue
        buffer = xnn_graph_buffer(instruction.delegate, pte)
        graph = xg.XNNGraph.GetRootAs(buffer, 0)
        datatypes = {}
        for index in range(graph.XvaluesLength()):
            datatypes.update(_value_datatype(xg, graph.Xvalues(index)))
        for index in range(graph.XnodesLength()):
            xnode = graph.Xnodes(index)
            kind = xnode.XnodeUnionType()
            if kind == xg.XNodeUnion.XNNFullyConnected:
                node: Any = xg.XNNFullyConnected()
                counts = fully_connected
            elif kind in convolutions:
                node = xg._XNNNodeConv()
                counts = convolution
            else:
                continue
            node.Init(xnode.XnodeUnion().Bytes, xnode.XnodeUnion().Pos)
            counts[f"{datatypes.get(node.Input1Id(), '?')} x {datatypes.get(node.FilterId(), '?')}"] += 1
    return fully_connected, convolution


def _value_datatype(xg: Any, value: Any) -> dict[int, str]:
    kind, table = value.XvalueUnionType(), value.XvalueUnion()
    if table is None:
        return {}
    if kind == xg.XValueUnion.XNNQuantizedTensorValue:
        quantized = xg.XNNQuantizedTensorValue()
        quantized.Init(table.Bytes, table.Pos)
        tensor = quantized.TensorValue()
    elif kind == xg.XValueUnion.XNNTensorValue:
        tensor = xg.XNNTensorValue()
        tensor.Init(table.Bytes, table.Pos)
    else:
        return {}
    if tensor is None:
        return {}
    return {tensor.IdOut(): XNN_DATATYPES.get(tensor.Datatype(), f"type{tensor.Datatype()}")}


def node_report(pte: Path, scheme: Scheme, fallback_histogram: dict[str, int]) -> dict[str, Any]:
    """What the lowered program holds: FC and convolution nodes by datatype inside the delegates, and linears and
    convolutions left outside."""
    types, convolutions = xnn_node_types(pte)
    quantized = sum(n for kind, n in types.items() if kind.split(" x ")[-1] not in FLOAT_DATATYPES)
    quantized_conv = sum(n for kind, n in convolutions.items() if kind.split(" x ")[-1] not in FLOAT_DATATYPES)
    outside = {op: n for op, n in fallback_histogram.items() if any(k in op for k in ("addmm", "linear", ".mm."))}
    conv_outside = {op: n for op, n in fallback_histogram.items() if "convolution" in op}
    return {
        "fully_connected": dict(sorted(types.items())),
        "quantized_fully_connected": quantized,
        "float_fully_connected": sum(types.values()) - quantized,
        "expected_fully_connected": scheme.fully_connected,
        "linears_outside_delegates": outside,
        "convolution": dict(sorted(convolutions.items())),
        "quantized_convolution": quantized_conv,
        "float_convolution": sum(convolutions.values()) - quantized_conv,
        "expected_convolution": scheme.convolution,
        "convolutions_outside_delegates": conv_outside,
    }
