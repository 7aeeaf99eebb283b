"""Block-wise symmetric quantization, ZeRO++'s formats: int8 weights (qwZ) and int4 gradients (qgZ).
Pure torch, no processes.

Weights (qwZ, 8 bits):

The format is official DeepSpeed's (`CUDAQuantizer` in runtime/zero/partition_parameters.py and
the Symmetric `Params` of ops/csrc/includes/quantization_utils.h, 8 bits):
    Phase 1 (blocks): a rank's partition of n elements is cut into `block_count(n)` equal,
            consecutive blocks of about 4,000-8,000 elements each.
    Phase 2 (scale): per block, absmax = max |x|; the kernel multiplies by 2^8 / (2 absmax) =
            128 / absmax and stores the inverse, scale = absmax / 128, as one fp32 number (1.0 for
            an all-zero block).
    Phase 3 (values): q = clamp(round(x / scale), -128, 127), one int8 per element (round half
            to even, as CUDA's __float2int_rn).
    What travels: the n int8 values and the block_count(n) fp32 scales, in two all-gathers; the
    receiver multiplies every q by its block's scale (`dequantize`).
Error bound, per element: |x - q scale| <= scale / 2 = absmax / 256, except the block's largest
positive element, which rounds to 128 and is clamped to 127: error <= scale = absmax / 128. So
every element is within absmax(block) / 128 of its value (`max_error`), and all but that one
within absmax / 256.
Where nano differs: official's kernel first converts the values to fp16 (its CUDA kernel reads
__half); nano quantizes the parameters' own dtype, which only removes fp16's rounding (2^-11
relative, 8x smaller than int8's step). Official asserts n % (8 x blocks) == 0 (the kernel's 8-wide
loads); where n is not a multiple of 8, nano drops the factor 8 and asks only that the blocks divide n.

Gradients (qgZ, 4 bits; official's `swizzle_quant` / `quantized_reduction` / `dequantize` with
num_bits 4 and the same Symmetric `Params`):
    Phase 1 (chunks): one row per destination rank, each the destination's share of a gradient
            bucket padded with zeros to a common `gradient_chunk` length C, cut into B blocks of
            C / B elements (an even number, at most GRADIENT_BLOCK).
    Phase 2 (scale): per block, scale = absmax / 8 as one fp32 number (the kernel's 2^4 / (2 absmax),
            stored inverted; 1.0 for an all-zero block).
    Phase 3 (values): q = clamp(round(x / scale), -8, 7), two per byte: element 2i in the high
            nibble, 2i + 1 in the low one (official's `PackedInt4{high, low}` bit fields, which its
            dequantizer reads back as byte >> 4 and byte & 0xf).
Error bound, per element: absmax(block) / 8 (the clamped +absmax), every other within absmax / 16.
Where nano differs: official's groups come from the tensor's shape (max(rows, cols, world size)
groups per parameter, 2-D parameters only); nano reduces flat buckets, so its blocks are a fixed
size, GRADIENT_BLOCK elements at most (about a row of a small model's weight matrix), per
destination share.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

TARGET_BLOCK_SIZE = 8000  # official: "the optimal size is 4k, so we set the target to be below 8k"
LEVELS = 128  # 2^8 / 2: int8's positive range, the absmax's place
GRADIENT_BITS = 4  # qgZ: official's all_to_all_quant_reduce quantizes to 4 bits
GRADIENT_LEVELS = 8  # 2^4 / 2: int4's positive range, the absmax's place
GRADIENT_BLOCK = 1024  # nano: the most elements one gradient block holds (see the module docstring)
VECTOR = 8  # official's kernel loads 8 elements at a time; a block is a multiple of it when n allows


@functools.lru_cache(maxsize=None)
def block_count(numel: int) -> int:
    """How many blocks a partition of `numel` elements is quantized in: official's adaptive rule.
    Start at ceil(numel / 8000) blocks, take the first count whose blocks hold a multiple of 8
    elements, then halve the blocks while they stay a multiple of 8 and larger than 8,000."""
    if numel <= 0:
        return 0
    vector = VECTOR if numel % VECTOR == 0 else 1  # nano: any n (see the module docstring)
    blocks = -(-numel // TARGET_BLOCK_SIZE)
    while blocks < numel and numel % (vector * blocks):
        blocks += 1
    while numel % (vector * blocks * 2) == 0 and numel / blocks > TARGET_BLOCK_SIZE:
        blocks *= 2
    return blocks


@dataclass
class QuantizedBlocks:
    """One partition in the wire format: int8 values and one fp32 scale per block."""

    values: torch.Tensor  # int8, numel elements
    scales: torch.Tensor  # float32, block_count(numel) elements


def block_scales(blocks: torch.Tensor, levels: int) -> torch.Tensor:
    """Phase 2 for blocks along the last dimension: absmax / levels in fp32, 1.0 for an all-zero
    block (the absmax read without an |x| copy of the blocks)."""
    import torch  # here, not above: `explain` reads the arithmetic below without loading torch
    low, high = torch.aminmax(blocks, dim=-1, keepdim=True)
    absmax = torch.maximum(high.float(), low.float().neg())
    return torch.where(absmax > 0, absmax / levels, torch.ones_like(absmax))


def quantize(tensor: torch.Tensor) -> QuantizedBlocks:
    """Phases 1-3 of the module docstring for a flat tensor. Its temporary is one fp32 copy of the
    blocks divided by their scales (`weight_gather_temporary_bytes`)."""
    import torch
    blocks = tensor.reshape(block_count(tensor.numel()), -1)
    scales = block_scales(blocks, LEVELS)
    scaled = blocks / scales  # fp32 whatever the tensor's dtype
    values = scaled.round_().clamp_(-LEVELS, LEVELS - 1).to(torch.int8)
    return QuantizedBlocks(values.reshape(-1), scales.reshape(-1))


def dequantize(values: torch.Tensor, scales: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """Every int8 value times its block's scale, written into `out` (any float dtype) in place: no
    float copy of the values; the blocks are consecutive and equal, scales.numel() of them (several
    ranks' blocks end to end). The product is taken in fp32 and rounded once to `out`'s dtype."""
    blocks = out.view(scales.numel(), -1)
    blocks.copy_(values.view(scales.numel(), -1))  # int8 -> out's dtype: exact (bf16 holds -128..127)
    blocks.mul_(scales.view(-1, 1))
    return out


def max_error(tensor: torch.Tensor) -> torch.Tensor:
    """The bound on |x - dequantize(quantize(x))| per element: its block's absmax / 128."""
    blocks = tensor.reshape(block_count(tensor.numel()), -1).float()
    return (blocks.abs().amax(dim=1, keepdim=True) / LEVELS).expand_as(blocks).reshape(-1)


def gradient_chunk(largest_share: int) -> tuple[int, int]:
    """Gradient Phase 1: (C, B), the padded row length for shares of at most `largest_share`
    elements and its block count: B = ceil(largest / GRADIENT_BLOCK) blocks of an even size."""
    blocks = max(1, -(-largest_share // GRADIENT_BLOCK))
    block = -(-largest_share // blocks)
    block += block % 2  # two int4 values per byte: a block never splits a byte
    return blocks * max(block, 2), blocks


def quantize_int4(rows: torch.Tensor, blocks: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Gradient Phases 2-3 for fp32 rows of C elements, each in `blocks` blocks: (packed int8 of
    rows x C / 2 bytes, fp32 scales of rows x blocks). Its temporary is one fp32 copy of the rows
    divided by their scales, where the nibbles are packed in place (`gradient_exchange_temporary_bytes`)."""
    import torch
    count = rows.shape[0]
    grouped = rows.float().reshape(count, blocks, -1)
    scales = block_scales(grouped, GRADIENT_LEVELS)
    scaled = grouped / scales
    scaled.round_().clamp_(-GRADIENT_LEVELS, GRADIENT_LEVELS - 1).remainder_(2 * GRADIENT_LEVELS)  # -1 -> 15: a nibble
    pairs = scaled.view(count, -1, 2)
    high = pairs[:, :, 0].mul_(2 * GRADIENT_LEVELS).add_(pairs[:, :, 1])  # value 2i in bits 4-7, 2i + 1 in 0-3
    return high.to(torch.uint8).view(torch.int8), scales.reshape(count, blocks)


def dequantize_int4(packed: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """The fp32 rows (rows x C) of packed int4 values (rows x C / 2 bytes) and their block scales,
    unpacked and scaled in the rows themselves: no temporary beside them."""
    import torch
    count, blocks = packed.shape[0], scales.shape[1]
    rows = torch.empty(count, 2 * packed.shape[1], dtype=torch.float32, device=packed.device)
    pairs, unsigned = rows.view(count, -1, 2), packed.view(torch.uint8)
    pairs[:, :, 0].copy_(unsigned).div_(2 * GRADIENT_LEVELS, rounding_mode="floor")  # bits 4-7
    pairs[:, :, 1].copy_(unsigned).remainder_(2 * GRADIENT_LEVELS)  # bits 0-3
    rows.add_(GRADIENT_LEVELS).remainder_(2 * GRADIENT_LEVELS).sub_(GRADIENT_LEVELS)  # 8..15 -> -8..-1
    rows.view(count, blocks, -1).mul_(scales.unsqueeze(2))
    return rows


def int4_max_error(rows: torch.Tensor, blocks: int) -> torch.Tensor:
    """The bound on |x - dequantize_int4(quantize_int4(x))| per element: its block's absmax / 8."""
    grouped = rows.float().reshape(rows.shape[0], blocks, -1)
    return (grouped.abs().amax(dim=2, keepdim=True) / GRADIENT_LEVELS).expand_as(grouped).reshape(rows.shape)


# What a quantized collective holds while it runs, beside the tensors it reads and fills (the
# partition, the whole buffer, the gradient bucket and share): pure arithmetic, for `zero-lab explain`.

def weight_gather_temporary_bytes(partition_numel: int, group_size: int) -> int:
    """qwZ: the most bytes one gather of a partition of n elements over `group_size` ranks holds
    beside its whole buffer (`nano.zeropp.quantized_weights`): while quantizing, the fp32 scaled copy (4n)
    beside this rank's int8 values and scales; then, while the values travel and are dequantized in
    place, this rank's values and scales beside every rank's."""
    own = partition_numel + block_count(partition_numel) * 4
    return own + max(4 * partition_numel, group_size * own)


def gradient_exchange_temporary_bytes(largest_share: int, world_size: int, ranks_per_node: int) -> int:
    """qgZ: the most bytes one bucket's exchange holds beside the bucket and this rank's share
    (`nano.zeropp.quantized_gradients`, its Phases), every row fp32 and C elements long (`gradient_chunk`):
    the W rows throughout; an exchange of R rows holds, while quantizing, the scaled copy (4RC) and
    the packed values and scales, then the sent and received values and scales and the dequantized
    rows (4RC); between the two exchanges, the node's rows arrived beside their sums over the node."""
    chunk, blocks = gradient_chunk(largest_share)
    nodes = world_size // ranks_per_node

    def exchange(rows: int) -> int:
        sent = rows * chunk // 2 + rows * blocks * 4
        return max(4 * rows * chunk + sent, 2 * sent + 4 * rows * chunk)

    rows, sums = 4 * world_size * chunk, 4 * nodes * chunk
    return rows + max(exchange(world_size), 4 * world_size * chunk + sums, sums + exchange(nodes),
                      2 * sums + 4 * chunk)
