"""ZeRO++'s block-wise formats (`nano.zeropp.quantization`) against pure-torch round trips written here, one
block at a time, and their error bounds. qwZ's int8: every element within absmax(block) / 128 of its
value, all but a block's largest positive one within absmax / 256. qgZ's int4, two per byte: within
absmax / 8, all but the clamped one within absmax / 16. No processes."""

from __future__ import annotations

import pytest
import torch

from zero_lab.nano.zeropp.quantization import (GRADIENT_BLOCK, block_count, dequantize, dequantize_int4, gradient_chunk,
                                        int4_max_error, max_error, quantize, quantize_int4)


def reference_round_trip(tensor: torch.Tensor, blocks: int, bits: int = 8) -> torch.Tensor:
    """Official's Symmetric kernel, one block at a time: scale 2^bits / (2 absmax), round to nearest,
    clamp to [-2^(bits-1), 2^(bits-1) - 1], multiply back by the stored inverse."""
    out = []
    for block in tensor.float().chunk(blocks):
        absmax = block.abs().max().item()
        multiplier = 2 ** bits / (2 * absmax) if absmax else 1.0
        stored = 1 / multiplier
        out.append(torch.round(block * multiplier).clamp(-2 ** (bits - 1), 2 ** (bits - 1) - 1) * stored)
    return torch.cat(out)


def test_block_count_is_officials_adaptive_rule():
    assert block_count(16_000) == 2  # ceil(16000 / 8000), blocks of 8000 (a multiple of 8)
    assert block_count(8) == 1
    assert block_count(64_000) == 8
    assert block_count(8 * 1001) == 7  # 2 blocks of 4004 are no multiple of 8: the next count that divides is 7
    assert block_count(2 * 3 * 5 * 7 * 11 * 13) == 5  # 30030: 4 blocks do not divide it, 5 do (no multiple of 8: nano drops the factor 8)
    for numel in (8, 200, 4_002, 16_000, 213_600, 2_933_464, 30_030):
        blocks = block_count(numel)
        assert numel % blocks == 0 and numel // blocks <= 16_000  # official's hard limit


@pytest.mark.parametrize("numel", [16, 4_000, 24_000, 30_030, 213_600])
def test_a_round_trip_equals_the_reference_and_stays_within_the_bound(numel):
    generator = torch.Generator().manual_seed(numel)
    tensor = torch.randn(numel, generator=generator) * torch.rand(numel, generator=generator) * 0.05
    blocks = quantize(tensor)
    assert blocks.values.dtype == torch.int8 and blocks.values.numel() == numel
    assert blocks.scales.dtype == torch.float32 and blocks.scales.numel() == block_count(numel)
    back = dequantize(blocks.values, blocks.scales, torch.empty(numel))
    expected = reference_round_trip(tensor, block_count(numel))
    torch.testing.assert_close(back, expected, rtol=1e-6, atol=1e-9)  # the scale's float rounding only
    error = (back - tensor).abs()  # in fp32: the subtraction itself is exact to ~1e-5 of the bound
    bound = max_error(tensor)
    assert bool((error <= bound * (1 + 1e-4)).all())
    half_step = error <= bound / 2 * (1 + 1e-4)
    assert int((~half_step).sum()) <= block_count(numel)  # at most one clamped element per block
    assert error.max() > bound.min() / 16  # int8 is lossy: the round trip is no copy


def test_a_zero_block_and_the_clamped_maximum():
    tensor = torch.cat([torch.zeros(8), torch.tensor([1.0, -1.0, 0.5, 0.25, 0, 0, 0, 0])])
    blocks = quantize(tensor.reshape(-1)[:8])
    assert blocks.scales.tolist() == [1.0] and blocks.values.abs().sum() == 0  # official: scale 1 for a zero block
    blocks = quantize(tensor[8:])
    assert blocks.values.tolist() == [127, -128, 64, 32, 0, 0, 0, 0]  # +absmax clamps to 127, -absmax fits
    back = dequantize(blocks.values, blocks.scales, torch.empty(8))
    assert back[0].item() == pytest.approx(1 - 1 / 128) and back[1].item() == -1.0


def test_several_ranks_blocks_dequantize_end_to_end():
    """A gather's receiver holds every rank's blocks and scales end to end: one dequantize."""
    parts = [torch.randn(4_000, generator=torch.Generator().manual_seed(rank)) for rank in range(3)]
    quantized = [quantize(part) for part in parts]
    values = torch.cat([item.values for item in quantized])
    scales = torch.cat([item.scales for item in quantized])
    whole = dequantize(values, scales, torch.empty(12_000, dtype=torch.bfloat16))
    for rank, part in enumerate(parts):
        alone = dequantize(quantized[rank].values, quantized[rank].scales, torch.empty(4_000, dtype=torch.bfloat16))
        assert torch.equal(whole[rank * 4_000:(rank + 1) * 4_000], alone)


def test_gradient_chunks_are_even_blocks_of_at_most_the_block_size():
    assert gradient_chunk(1) == (2, 1)  # one byte holds two values: a row is never odd
    assert gradient_chunk(GRADIENT_BLOCK) == (GRADIENT_BLOCK, 1)
    assert gradient_chunk(GRADIENT_BLOCK + 1) == (GRADIENT_BLOCK + 4, 2)  # 2 blocks of 513 -> 514
    for largest in (3, 777, 5_000, 123_457):
        chunk, blocks = gradient_chunk(largest)
        assert chunk >= largest and chunk % blocks == 0 and (chunk // blocks) % 2 == 0
        assert chunk // blocks <= GRADIENT_BLOCK and chunk - largest < 2 * blocks  # padding: under 2 per block


@pytest.mark.parametrize("largest", [7, 1_000, 2_500])
def test_an_int4_round_trip_equals_the_reference_and_stays_within_the_bound(largest):
    generator = torch.Generator().manual_seed(largest)
    chunk, blocks = gradient_chunk(largest)
    rows = torch.zeros(3, chunk)
    rows[:, :largest] = torch.randn(3, largest, generator=generator) * torch.rand(3, 1, generator=generator)
    packed, scales = quantize_int4(rows, blocks)
    assert packed.dtype == torch.int8 and packed.shape == (3, chunk // 2)  # two values a byte
    assert scales.dtype == torch.float32 and scales.shape == (3, blocks)
    back = dequantize_int4(packed, scales)
    for row in range(3):
        torch.testing.assert_close(back[row], reference_round_trip(rows[row], blocks, bits=4), rtol=1e-6, atol=1e-9)
    error, bound = (back - rows).abs(), int4_max_error(rows, blocks)
    assert bool((error <= bound * (1 + 1e-5)).all())
    assert int((error > bound / 2 * (1 + 1e-5)).sum()) <= 3 * blocks  # at most one clamped element per block
    assert error.max() > bound.max() / 8  # int4 is lossy: the round trip is no copy


def test_int4_packs_the_first_value_in_the_high_nibble():
    """Official's PackedInt4{high, low} bit fields: value 2i in bits 4-7, 2i + 1 in bits 0-3."""
    packed, scales = quantize_int4(torch.tensor([[8.0, -8.0, 1.0, 0.0]]), 1)  # absmax 8: scale 1
    assert scales.tolist() == [[1.0]]
    assert packed.view(torch.uint8).tolist() == [[0x78, 0x10]]  # +8 clamps to 7; -8 is 0x8; 1, 0
    assert dequantize_int4(packed, scales).tolist() == [[7.0, -8.0, 1.0, 0.0]]
