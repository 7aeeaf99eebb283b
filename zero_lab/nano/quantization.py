"""Block-wise symmetric int8 quantization, ZeRO++'s weight format (qwZ): pure torch, no processes.

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
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

TARGET_BLOCK_SIZE = 8000  # official: "the optimal size is 4k, so we set the target to be below 8k"
LEVELS = 128  # 2^8 / 2: int8's positive range, the absmax's place
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


def quantize(tensor: torch.Tensor) -> QuantizedBlocks:
    """Phases 1-3 of the module docstring for a flat tensor."""
    import torch  # here, not above: `explain` reads block_count without loading torch
    blocks = tensor.reshape(block_count(tensor.numel()), -1).float()
    absmax = blocks.abs().amax(dim=1, keepdim=True)
    scales = torch.where(absmax > 0, absmax / LEVELS, torch.ones_like(absmax))
    values = torch.round(blocks / scales).clamp_(-LEVELS, LEVELS - 1).to(torch.int8)
    return QuantizedBlocks(values.reshape(-1), scales.reshape(-1))


def dequantize(values: torch.Tensor, scales: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """Every int8 value times its block's scale, written into `out` (any float dtype); the blocks
    are consecutive and equal, scales.numel() of them (several ranks' blocks end to end)."""
    blocks = values.view(scales.numel(), -1)
    out.view(scales.numel(), -1).copy_(blocks.float() * scales.view(-1, 1))
    return out


def max_error(tensor: torch.Tensor) -> torch.Tensor:
    """The bound on |x - dequantize(quantize(x))| per element: its block's absmax / 128."""
    blocks = tensor.reshape(block_count(tensor.numel()), -1).float()
    return (blocks.abs().amax(dim=1, keepdim=True) / LEVELS).expand_as(blocks).reshape(-1)
