"""The tied head stored once: `etlab::shared_head`, a language model's output projection computed from its
quantized embedding table, the very tensor ExecuTorch's embedding gather reads, so a program holds the table once.

The native runner registers the same operator (board/runner/src/kernels/shared_head.cpp); this module is what
torch.export traces and what tests check the runner's kernel against.

    shared_head(input [..., K] float32, table, scales float32 [N] or [N, G], int bits) -> [..., N] float32
        input @ dequantize(table).T, where the table is stored as ExecuTorch's quantized embeddings store it
        (executorch/exir/passes/_quant_patterns_and_replacements.py, symmetric: no zero points):
        bits 8: `quantized_decomposed::embedding_byte`'s int8 rows [N, K];
        bits 4: `quantized_decomposed::embedding_4bit`'s packed rows, uint8 [N, K / 2]: byte j of a row holds
                value 2j in its high nibble and 2j + 1 in its low one, each stored as value + 8 (-8..7 -> 0..15).
        A row's scales split it into G groups of K / G values (G = 1 for a 1-D scales); value = q * scale.
        Activations are quantized dynamically, as "8da" means: each input row to int8 (symmetric, scale max|x| / 127,
        rounded to nearest even), and out = scale_x * sum over groups of scale_g * (x_q . q), the dot products exact
        integers (the runner's kernel: int8 x int8 multiply-adds, no dot-product extension needed).

`share_tied_head` rewrites a tied HuggingFace model before export: its input embedding gathers through
`quantized_decomposed::embedding_4bit` / `embedding_byte` from a table packed here from torchao's quantized tensor
(the values quant fusion would have packed), and its output embedding calls `etlab::shared_head` on the same
buffers: torch.export sees one constant used by both. Importing this module registers the operator.
"""

from __future__ import annotations

from typing import Any

import torch
from executorch.exir.passes import _quant_patterns_and_replacements  # noqa: F401  # defines embedding_4bit/_byte

SHARED_BITS = (8, 4)

_LIBRARY = torch.library.Library("etlab", "FRAGMENT")
_LIBRARY.define("shared_head(Tensor input, Tensor table, Tensor scales, int bits) -> Tensor")
_LIBRARY.define("shared_head.out(Tensor input, Tensor table, Tensor scales, int bits, *, Tensor(a!) out) -> Tensor(a!)")


def _check(input: torch.Tensor, table: torch.Tensor, scales: torch.Tensor, bits: int) -> tuple[int, int]:
    """(rows N, features K) after the checks the runner's kernel makes too."""
    torch._check(bits in SHARED_BITS, lambda: f"shared_head: bits must be 8 or 4, got {bits}")
    torch._check(table.dim() == 2, lambda: "shared_head: the table must be 2-D")
    wanted = torch.int8 if bits == 8 else torch.uint8
    torch._check(table.dtype == wanted, lambda: f"shared_head: a {bits}-bit table is {wanted}, got {table.dtype}")
    torch._check(input.dtype == torch.float32 and scales.dtype == torch.float32, lambda: "shared_head: float32 only")
    rows, features = table.size(0), table.size(1) * (8 // bits)
    torch._check(input.dim() >= 1 and input.size(-1) == features, lambda: "shared_head: input features differ")
    torch._check(scales.dim() in (1, 2) and scales.size(0) == rows, lambda: "shared_head: one scale row per row")
    groups = scales.size(1) if scales.dim() == 2 else 1
    torch._check(groups >= 1 and features % groups == 0, lambda: "shared_head: the groups must divide the features")
    return rows, features


def dequantize(table: torch.Tensor, scales: torch.Tensor, bits: int) -> torch.Tensor:
    """The float32 table [N, K] the quantized one stands for."""
    values = unpack(table, bits).to(torch.float32)
    grouped = scales.reshape(table.size(0), -1)
    group = values.size(1) // grouped.size(1)
    return values * grouped.repeat_interleave(group, dim=1)


def quantize_rows(input: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row to int8 values (as float32) and its scale [..., 1]: round(x * (127 / max|x|)), max|x| / 127."""
    largest = input.abs().amax(dim=-1, keepdim=True)
    inverse = torch.where(largest > 0, torch.tensor(127.0) / largest, torch.zeros_like(largest))
    return torch.round(input * inverse).clamp(-127, 127), largest / 127.0


def unpack(table: torch.Tensor, bits: int) -> torch.Tensor:
    """The table's integer values [N, K], int16."""
    if bits == 8:
        return table.to(torch.int16)
    high = (table >> 4).to(torch.int16) - 8
    low = (table & 15).to(torch.int16) - 8
    return torch.stack((high, low), dim=-1).reshape(table.size(0), -1)


def shared_head_reference(input: torch.Tensor, table: torch.Tensor, scales: torch.Tensor, bits: int) -> torch.Tensor:
    rows, features = _check(input, table, scales, bits)
    values, row_scales = quantize_rows(input)
    grouped = scales.reshape(rows, -1).to(torch.float64)
    groups = grouped.size(1)
    weights = unpack(table, bits).to(torch.float64).reshape(rows, groups, features // groups)
    activations = values.to(torch.float64).reshape(*input.shape[:-1], groups, features // groups)
    sums = torch.einsum("...gk,ngk->...ng", activations, weights)  # exact integers
    return ((sums * grouped).sum(-1) * row_scales.to(torch.float64)).to(torch.float32)


def _fake(input: torch.Tensor, table: torch.Tensor, scales: torch.Tensor, bits: int) -> torch.Tensor:
    rows, _ = _check(input, table, scales, bits)
    return input.new_empty((*input.shape[:-1], rows))


def _out(input: torch.Tensor, table: torch.Tensor, scales: torch.Tensor, bits: int, *, out: torch.Tensor):
    out.copy_(shared_head_reference(input, table, scales, bits))
    return out


def _out_fake(input: torch.Tensor, table: torch.Tensor, scales: torch.Tensor, bits: int, *, out: torch.Tensor):
    _check(input, table, scales, bits)
    return out


_LIBRARY.impl("shared_head", shared_head_reference, "CompositeExplicitAutograd")
_LIBRARY.impl("shared_head", _fake, "Meta")
_LIBRARY.impl("shared_head.out", _out, "CompositeExplicitAutograd")
_LIBRARY.impl("shared_head.out", _out_fake, "Meta")

shared_head = torch.ops.etlab.shared_head.default


def pack_4bit(values: torch.Tensor) -> torch.Tensor:
    """int8 values -8..7 [N, K] -> embedding_4bit's packed uint8 [N, K / 2] (ExecuTorch's `_pack_embedding_weight`)."""
    shifted = (values.to(torch.int16) + 8).to(torch.uint8).reshape(values.size(0), -1, 2)
    return (shifted[:, :, 0] << 4) | shifted[:, :, 1]


class SharedTable(torch.nn.Module):
    """A quantized embedding table as ExecuTorch's embedding kernels read it: `table` (int8 rows, or packed 4-bit
    rows) and `scales` [N, G], float32, symmetric. Its forward is the gather; `head` the projection onto it."""

    def __init__(self, table: torch.Tensor, scales: torch.Tensor, bits: int) -> None:
        super().__init__()
        self.bits = bits
        self.register_buffer("table", table)
        self.register_buffer("scales", scales)

    @property
    def quantized_table_bits(self) -> int:
        return self.bits

    def forward(self, indices: torch.Tensor) -> torch.Tensor:
        if self.bits == 4:
            return torch.ops.quantized_decomposed.embedding_4bit.default(self.table, self.scales, None, -8, 7, indices)
        return torch.ops.quantized_decomposed.embedding_byte.default(self.table, self.scales, None, -128, 127, indices)


class SharedHead(torch.nn.Module):
    """The tied output projection, reading `embedding`'s table: the same buffers, registered under this module's
    name too (torch.export lifts a tensor once however many modules hold it)."""

    def __init__(self, embedding: SharedTable) -> None:
        super().__init__()
        self.bits = embedding.bits
        self.shares = True  # what the report looks for (quantized.shared_head_lines)
        table, scales = embedding.table, embedding.scales
        assert isinstance(table, torch.Tensor) and isinstance(scales, torch.Tensor)
        self.register_buffer("table", table)
        self.register_buffer("scales", scales)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return shared_head(hidden, self.table, self.scales, self.bits)


def is_tied(model: Any) -> bool:
    """A HuggingFace model whose output embedding is its input embedding's weight (tie_word_embeddings)."""
    get_input = getattr(model, "get_input_embeddings", None)
    get_output = getattr(model, "get_output_embeddings", None)
    if get_input is None or get_output is None:
        return False
    embedding, head = get_input(), get_output()
    return (
        isinstance(embedding, torch.nn.Embedding)
        and type(head) is torch.nn.Linear
        and head.bias is None
        and head.weight is embedding.weight
    )


def share_tied_head(model: Any, bits: int) -> None:
    """The tied model's embedding, already quantized by torchao (quantize_embeddings), replaced by a SharedTable of
    its own values and scales, and its head by a SharedHead over them (the report names the pair:
    quantized.shared_head_lines). Call `is_tied` before quantizing: quantize_ unties them."""
    embedding = model.get_input_embeddings()
    weight = embedding.weight
    qdata, scales, zero_point = (getattr(weight, name, None) for name in ("qdata", "scale", "zero_point"))
    if qdata is None or scales is None:
        raise ValueError("share_tied_head: the embedding table is not torchao's quantized tensor")
    if zero_point is not None and bool((zero_point != 0).any()):
        raise ValueError("share_tied_head: the table has zero points (asymmetric); etlab's head takes none")
    values = qdata.detach().to(torch.int8)
    scales = scales.detach().to(torch.float32).reshape(values.size(0), -1).contiguous()
    table = pack_4bit(values) if bits == 4 else values.contiguous()
    shared = SharedTable(table, scales, bits)
    model.set_input_embeddings(shared)
    model.set_output_embeddings(SharedHead(shared))
