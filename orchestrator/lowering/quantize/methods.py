"""How the schemes quantize an eager model, the flows ExecuTorch 1.5 documents: int8 through the XNNPACK quantizer
with torchao's `prepare_pt2e`/`convert_pt2e`, and 8-bit dynamic activations with 4-bit grouped weights through
torchao's `quantize_` (and its LLM recipes). Two problems of the shipped packages are handled here, without
patching them:

- the XNNPACK quantizer's annotation transform turns *every* scalar operand of add/mul into a float tensor,
  including integer index arithmetic (`arange(...) + 0` in transformers' mask code, GPT-2's position ids), and
  calibration then fails ("tensors used as indices must be long..."). `IntegerSafeXnnpackQuantizer` leaves
  integer add/mul alone;
- HuggingFace GPT-2's `Conv1D` exports as `addmm`, which neither flow quantizes: `swap_conv1d` replaces each one
  by the equivalent `nn.Linear` (transposed weight) first.

Torch is imported inside each function: schemes.py names these without it.
"""

from __future__ import annotations

import functools
from typing import Any

GROUP_SIZE = 32  # 8da4w weight group along the input features
LLM_GROUP_SIZE = 128  # the ExecuTorch LLM recipe's group (`-qmode 8da4w -G 128`)


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
# The flows: (model, example_args, calibration samples, PT2E quantizer override) -> exported program


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


def keeping_float(quantizer: Any, keep_float: tuple[str, ...]) -> Any:
    """`quantizer` annotating nothing inside the layers `keep_float` names (module paths): they stay fp32."""
    if keep_float:
        from torchao.quantization.pt2e.quantizer.utils import get_module_name_filter

        kept = [get_module_name_filter(name) for name in keep_float]
        quantizer.set_filter_function(lambda node: not any(inside(node) for inside in kept))
    return quantizer


def int8_dynamic(
    model: Any, example_args: tuple, _calibration: list[tuple] | None, quantizer: Any, keep_float: tuple[str, ...] = ()
) -> Any:
    quantizer = quantizer or keeping_float(integer_safe_quantizer(is_dynamic=True), keep_float)
    return _pt2e(model, example_args, [example_args], quantizer)


def int8_static(
    model: Any, example_args: tuple, calibration: list[tuple] | None, quantizer: Any, keep_float: tuple[str, ...] = ()
) -> Any:
    samples = calibration or [example_args]
    quantizer = quantizer or keeping_float(integer_safe_quantizer(is_dynamic=False), keep_float)
    return _pt2e(model, example_args, samples, quantizer)


def quantize_8da4w(
    model: Any,
    example_args: tuple,
    _calibration: list[tuple] | None,
    _quantizer: Any,
    keep_float: tuple[str, ...] = (),
    *,
    group: int = GROUP_SIZE,
) -> Any:
    import torch

    apply_8da4w(model, group, keep_float)
    with torch.no_grad():
        return torch.export.export(model, example_args, strict=False)


def apply_8da4w(model: Any, group: int = GROUP_SIZE, keep_float: tuple[str, ...] = ()) -> None:
    """torchao `quantize_` on every linear whose input features divide into groups (the others stay float), but
    those `keep_float` names."""
    import torch
    from torchao.quantization import Int8DynamicActivationIntxWeightConfig, quantize_
    from torchao.quantization.granularity import PerGroup

    def groupable(child: Any, fqn: str) -> bool:
        return isinstance(child, torch.nn.Linear) and child.in_features % group == 0 and fqn not in keep_float

    int4 = torch.int4  # type: ignore[attr-defined]  # torch's stubs lack the sub-byte dtypes it has had since 2.5
    config = Int8DynamicActivationIntxWeightConfig(weight_dtype=int4, weight_granularity=PerGroup(group))
    quantize_(model, config, filter_fn=groupable)


EMBEDDING_BITS = (8, 4)  # the embedding tables the runner's kernels_quantized gathers from (embedding_byte, _4bit)


def llm_8da4w(model: Any, group: int, embedding_bits: int = 8, share_head: bool = False) -> None:
    """8-bit per-row (or 4-bit grouped) embeddings, then int4 grouped linears (`-qmode 8da4w -E 8,0` / `-E 4,32`);
    a linear whose input features the group does not divide is padded to a multiple of it (pad_linears), as
    ExecuTorch's LLM quantizer pads them. `share_head`: a tied head (tie_word_embeddings) reads the embedding's
    quantized table through `etlab::shared_head` (shared_head.py) instead of a 4-bit copy of its own; an untied
    model is unchanged."""
    tied = False
    if share_head:
        from orchestrator.lowering.quantize import shared_head  # torch and the operator's registration: on use

        # embedding_4bit packs two values a byte: an odd width cannot share its 4-bit table
        tied = shared_head.is_tied(model) and (
            embedding_bits == 8 or model.get_input_embeddings().embedding_dim % 2 == 0
        )
    quantize_embeddings(model, embedding_bits, GROUP_SIZE)
    if tied:
        shared_head.share_tied_head(model, embedding_bits)
    pad_linears(model, group)
    apply_8da4w(model, group)


def quantize_embeddings(model: Any, bits: int, group: int) -> None:
    """Every nn.Embedding's table in `bits` weights: 8 bits one scale per row; 4 bits one per `group` of a row
    (per row where the group does not divide it), which ExecuTorch's quant fusion turns into
    quantized_decomposed::embedding_byte / embedding_4bit, kernels the runner links."""
    import torch
    from torchao.quantization import IntxWeightOnlyConfig, quantize_
    from torchao.quantization.granularity import PerAxis, PerGroup

    if bits not in EMBEDDING_BITS:
        raise ValueError(f"embedding tables of {bits} bits: the runner gathers from {EMBEDDING_BITS} only")
    for name, child in list(model.named_modules()):
        if not isinstance(child, torch.nn.Embedding):
            continue
        grouped = bits == 4 and child.embedding_dim % group == 0
        dtype = torch.int8 if bits == 8 else torch.int4  # type: ignore[attr-defined]  # sub-byte dtypes: see above
        config = IntxWeightOnlyConfig(weight_dtype=dtype, granularity=PerGroup(group) if grouped else PerAxis(0))
        quantize_(model, config, filter_fn=lambda module, fqn, name=name: fqn == name)


def pad_linears(model: Any, group: int) -> list[str]:
    """Replace every nn.Linear whose input features `group` does not divide by a PaddedLinear, in place; returns the
    padded names. Without it 4-bit grouped weights skip such a linear: SmolLM2's 576 features and groups of 128 left
    181 of its 211 linears in float (bench/README.md)."""
    import torch

    padded = []
    for name, child in list(model.named_modules()):
        if type(child) is not torch.nn.Linear or child.in_features % group == 0:
            continue
        parent_name, _, attr = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, attr, padded_linear(child, group))
        padded.append(name)
    return padded


def padded_linear(linear: Any, group: int) -> Any:
    """An nn.Linear whose weight has zero columns appended up to a multiple of `group`, and which pads its input
    with as many zeros: the same products, and features the group divides. Its `padded_from` is the original width."""
    import torch

    width = -(-linear.in_features // group) * group
    padded = _padded_linear_class()(width, linear.out_features, bias=linear.bias is not None)
    padded.padded_from = linear.in_features
    with torch.no_grad():
        padded.weight.zero_()
        padded.weight[:, : linear.in_features].copy_(linear.weight.detach())
        if linear.bias is not None:
            padded.bias.copy_(linear.bias.detach())
    return padded


@functools.cache
def _padded_linear_class() -> type:
    import torch

    class PaddedLinear(torch.nn.Linear):
        padded_from: int

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            x = torch.nn.functional.pad(x, (0, self.in_features - self.padded_from))
            return torch.nn.functional.linear(x, self.weight, self.bias)

    return PaddedLinear


def padded_layers(model: Any) -> list[str]:
    """The names of the linears pad_linears padded (what a report lists beside what stayed float)."""
    return sorted(name for name, child in model.named_modules() if hasattr(child, "padded_from"))


def llm_8da8w(model: Any) -> None:
    """int8 per-channel linears with dynamic int8 activations (8da8w); embeddings stay float."""
    import torch
    from torchao.quantization import Int8DynamicActivationIntxWeightConfig, quantize_
    from torchao.quantization.granularity import PerAxis

    linears = Int8DynamicActivationIntxWeightConfig(weight_dtype=torch.int8, weight_granularity=PerAxis(0))
    quantize_(model, linears, filter_fn=lambda child, _: isinstance(child, torch.nn.Linear))
